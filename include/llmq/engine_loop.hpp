// The engine behind a queue, for a server: one thread owns the Engine and steps it while any request
// is live; other threads submit and cancel requests at any time and receive each request's tokens
// through its own callback as they are sampled (token streaming). What a server needs and the
// single-threaded Engine does not give: requests arriving from many connections, a client that
// disconnects cancelling its request (and so freeing its KV blocks) at any point, and a shutdown that
// either drains what is running or cancels it.
//
// Callbacks run on the loop's thread, outside its locks: a callback may call cancel() or submit().
// A callback that throws has its request cancelled (the exception goes no further). submit() and
// cancel() wait for a step in progress to end (the loop holds its lock while the engine steps).
// After a failed step the engine is left as the failure left it: every request ends, and the loop
// refuses new ones with the error.
// Every submitted request gets exactly one final event (finish != kNone): its last token's, or a
// cancellation's (token -1), or an error's (the step failed; token -1, kCancelled, and the error is
// what error() returns). No callback runs after stop() returns.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "llmq/engine.hpp"
#include "llmq/status.hpp"

namespace llmq::engine {

// One event of a request: a token (finish kNone), its last token (finish kStop / kLength), or the
// end without a token (token -1: kCancelled, by cancel(), stop() or a failed step).
using StreamFn = std::function<void(const TokenEvent& event)>;

class EngineLoop {
 public:
  // Starts the loop's thread over `engine` (which must outlive the loop and is used by nothing else
  // from now on).
  static Status start(Engine* engine, std::unique_ptr<EngineLoop>* out);
  ~EngineLoop();  // stop(false)
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request; Engine::add's refusals come back here, at once (a full waiting queue is
  // kResourceExhausted: the caller answers "busy", it never blocks), and so does every call after
  // stop() or a failed step. `on_event` must not be empty.
  Status submit(RequestSpec spec, const SamplingParams& sampling, StreamFn on_event, int64_t* id);
  // Cancels a live request (its blocks are freed at once, between steps; its callback gets the
  // final kCancelled event from the loop's thread). Unknown or ended ids are refused.
  Status cancel(int64_t id);
  // drain: finish every queued and running request, then stop; else cancel them all. Idempotent.
  void stop(bool drain);

  // Requests submitted and not yet ended; the first error a step returned (ok while none).
  int64_t live() const;
  Status error() const;
  // The scheduler's counters and the pool, read under the loop's lock (for metrics).
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
  using Stream = std::shared_ptr<StreamFn>;
  using Delivery = std::vector<std::pair<Stream, TokenEvent>>;
  EngineLoop() = default;
  void run();
  void end_all(Delivery* out);  // every live request cancelled in the engine, its final event queued

  Engine* engine_ = nullptr;
  mutable std::mutex mu_;           // guards everything below and every call into engine_
  std::condition_variable wake_;    // work arrived, or stop
  void deliver(Delivery* d);  // calls each callback, the lock not held
  std::map<int64_t, Stream> streams_;  // live requests
  Delivery pending_;                   // final events of cancels, delivered by the loop
  bool stopping_ = false, draining_ = false, stopped_ = false;
  Status error_;
  std::thread thread_;
  std::mutex stop_mu_;  // serialises stop() callers (the join)
};

}  // namespace llmq::engine
