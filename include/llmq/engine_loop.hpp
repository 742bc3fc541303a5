// The engine behind a queue, for a server: one thread owns the Engine and steps it while any request
// is live; other threads submit and cancel requests at any time and receive each request's tokens
// through its own callback as they are sampled (token streaming). What a server needs and the
// single-threaded Engine does not give: requests arriving from many connections, a client that
// disconnects cancelling its request (and so freeing its KV blocks) at any point, and a shutdown that
// either drains what is running or cancels it.
//
// Two threads: the loop's, which alone calls into the Engine, and a delivery thread, which runs the
// callbacks (outside every lock: a callback may call cancel() or submit()) in the order the events
// were produced. The loop hands each step's events over and goes on to the next step at once, so
// callbacks (a server's pushes to 256 connections) are not on the step's path. A callback that
// throws has its request cancelled (the exception goes no further).
// The engine steps without the loop's lock held: submit() hands its request to the loop, which adds
// it between two steps (a submitter waits at most for the step in progress, however many others are
// submitting), and cancel() ends the request at once for its reader (its final event is queued, and
// its tokens still queued are dropped) and in the engine before the next step, which frees its
// blocks. Holding one lock across each step instead let the loop's thread take it back step after
// step while submitters waited: seconds before a first token at 16 concurrent clients (H100,
// 2026-11-27).
// After a failed step the engine is left as the failure left it: every request ends, and the loop
// refuses new ones with the error.
// Every submitted request gets exactly one final event (finish != kNone), and no event after it: its
// last token's, or a cancellation's (token -1), or an error's (the step failed; token -1,
// kCancelled, and the error is what error() returns). No callback runs after stop() returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "llmq/engine.hpp"
#include "llmq/status.hpp"

namespace llmq::engine {

// One event of a request: a token (finish kNone), its last token (finish kStop / kLength), or the
// end without a token (token -1: kCancelled, by cancel(), stop() or a failed step).
using StreamFn = std::function<void(const TokenEvent& event)>;

class EngineLoop {
 public:
  // Starts the loop's and the delivery thread over `engine` (which must outlive the loop and is used
  // by nothing else from now on).
  static Status start(Engine* engine, std::unique_ptr<EngineLoop>* out);
  ~EngineLoop();  // stop(false); like stop(), never from a callback
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Hands a request to the loop and returns once the loop has added it, at most one step later;
  // Engine::add's refusals come back here (a full waiting queue is kResourceExhausted: the caller
  // answers "busy", it never waits for room), and so does every call after stop() or a failed step.
  // `on_event` must not be empty; it may run before submit() returns (the event names the request).
  Status submit(RequestSpec spec, const SamplingParams& sampling, StreamFn on_event, int64_t* id);
  // Cancels a live request: once cancel() returns ok its callback is called once more, with the
  // final kCancelled event (a callback running meanwhile is waited for), and its blocks are freed
  // before the next step. Refused for unknown ids and for requests whose final event was delivered.
  Status cancel(int64_t id);
  // drain: finish every queued and running request, then stop; else cancel them all. Idempotent.
  // Never from a callback (it waits for the delivery thread, which runs them).
  void stop(bool drain);

  // Requests submitted whose final event has not been delivered; the first error a step returned
  // (ok while none).
  int64_t live() const;
  Status error() const;
  // The scheduler's counters and the pool as the loop last saw them (after its last add, cancel or
  // step), for metrics.
  SchedulerStats stats() const;
  int64_t waiting() const;
  int64_t running() const;
  // All of them at one instant (one lock), for the server's /metrics: KV blocks used are the
  // usable blocks not free (a free block that still holds a cached prefix counts as free).
  struct Snapshot {
    int64_t running = 0, waiting = 0, kv_blocks_used = 0, kv_blocks_total = 0;
    SchedulerStats stats;
  };
  Snapshot snapshot() const;

 private:
  // A live request's callback and where it stands. A request stays in streams_ until its final event
  // has been delivered, so that a reader who cancels after the engine ended it (its tokens still
  // queued) gets no more tokens and a kCancelled end, as one who cancels earlier does.
  struct StreamState {
    StreamFn fn;
    std::mutex mu;  // held by the delivery thread around each call of fn, and by cancel(); before mu_
    std::atomic<bool> cancelled{false};  // by cancel(): only its kCancelled end is delivered
    bool ended = false;                  // its final event is queued (guarded by mu_)
    bool final_delivered = false;        // guarded by mu (set by the delivery thread)
  };
  using Stream = std::shared_ptr<StreamState>;
  using Delivery = std::vector<std::pair<Stream, TokenEvent>>;
  // A request handed to the loop by submit(); the loop adds it and answers through `done`.
  struct Submission {
    RequestSpec spec;
    SamplingParams sampling;
    Stream stream;
    Status status;
    int64_t id = -1;
    bool done = false;
  };
  EngineLoop() = default;
  void run();      // the loop's thread
  void deliver();  // the delivery thread
  // Loop thread, the lock not held: adds one request to the engine (or refuses it with the loop's
  // error or its shutdown); a request added is live (in streams_) before `done` is set.
  void add(Submission* s);
  void end_all();  // every live request cancelled in the engine, its final event queued; lock held
  void publish();  // the engine's counters into snapshot_; lock held, the engine not stepping
  void queue(Delivery* d);  // hands events to the delivery thread (in order)

  Engine* engine_ = nullptr;  // called from the loop's thread only (and by start() before it)
  std::thread::id delivery_id_;

  mutable std::mutex mu_;           // guards everything below up to delivery_mu_
  std::condition_variable wake_;    // work arrived, or stop
  std::condition_variable added_;   // a submission was answered
  std::vector<Submission*> inbox_;  // submitted, not yet added (each owned by its waiting submitter)
  std::vector<int64_t> cancels_;    // cancelled by cancel(), not yet in the engine
  std::unordered_map<int64_t, Stream> streams_;  // requests whose final event is not delivered yet (found per event, under mu_)
  bool stopping_ = false, draining_ = false;
  Status error_;
  Snapshot snapshot_;

  std::mutex delivery_mu_;  // taken after mu_ when both are
  std::condition_variable delivery_wake_;
  Delivery delivery_;          // events not yet delivered, in order
  bool loop_done_ = false;     // the loop has ended: deliver what is queued, then end
  std::thread thread_, delivery_thread_;
  std::mutex stop_mu_;  // serialises stop() callers (the joins)
};

}  // namespace llmq::engine
