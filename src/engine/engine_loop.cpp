// EngineLoop (engine_loop.hpp): the engine's thread, the queue in front of it and the delivery
// thread behind it.
#include "llmq/engine_loop.hpp"

#include <exception>
#include <string>
#include <system_error>
#include <utility>

namespace llmq::engine {

Status EngineLoop::start(Engine* engine, std::unique_ptr<EngineLoop>* out) {
  if (engine == nullptr || out == nullptr) return invalid_argument("EngineLoop::start: engine and out must not be null");
  std::unique_ptr<EngineLoop> loop(new EngineLoop());
  loop->engine_ = engine;
  loop->publish();  // the counters are right before the first step
  try {
    loop->delivery_thread_ = std::thread([l = loop.get()] { l->deliver(); });
    loop->delivery_id_ = loop->delivery_thread_.get_id();
  } catch (const std::system_error& e) {
    return Status(StatusCode::kResourceExhausted, std::string("EngineLoop::start: no thread for the callbacks: ") + e.what());
  }
  try {
    loop->thread_ = std::thread([l = loop.get()] { l->run(); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard<std::mutex> lock(loop->delivery_mu_);
      loop->loop_done_ = true;
      loop->delivery_wake_.notify_all();
    }
    loop->delivery_thread_.join();
    return Status(StatusCode::kResourceExhausted, std::string("EngineLoop::start: no thread for the engine: ") + e.what());
  }
  *out = std::move(loop);
  return {};
}

EngineLoop::~EngineLoop() { stop(false); }

Status EngineLoop::submit(RequestSpec spec, const SamplingParams& sampling, StreamFn on_event, int64_t* id) {
  if (!on_event || id == nullptr) return invalid_argument("submit: on_event and id must be set");
  Submission sub;
  sub.spec = std::move(spec);
  sub.sampling = sampling;
  sub.stream = std::make_shared<StreamState>();
  sub.stream->fn = std::move(on_event);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    if (stopping_) return Status(StatusCode::kResourceExhausted, "the engine is shutting down");
    inbox_.push_back(&sub);
    wake_.notify_one();
    added_.wait(lock, [&sub] { return sub.done; });
  }
  if (!sub.status.ok()) return sub.status;
  *id = sub.id;
  return {};
}

void EngineLoop::add(Submission* s) {
  Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) st = error_;
    else if (stopping_ && !draining_) st = Status(StatusCode::kResourceExhausted, "the engine is shutting down");
  }
  int64_t rid = -1;
  // Nothing leaves the loop's thread (that would be std::terminate): the submitter gets the error.
  if (st.ok()) {
    try {
      st = engine_->add(std::move(s->spec), s->sampling, &rid);
    } catch (const std::exception& e) {
      st = Status(StatusCode::kInternal, std::string("adding the request: ") + e.what());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (st.ok()) {
    try {
      streams_[rid] = s->stream;
      s->id = rid;
    } catch (const std::exception& e) {
      (void)engine_->cancel(rid);
      st = Status(StatusCode::kInternal, std::string("adding the request: ") + e.what());
    }
    publish();
  }
  s->status = st;
  s->done = true;
}

Status EngineLoop::cancel(int64_t id) {
  const auto not_live = [id] { return invalid_argument("cancel: request " + std::to_string(id) + " is not live"); };
  Stream stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(id);
    if (it == streams_.end() || it->second->cancelled.load()) return not_live();
    stream = it->second;
  }
  // A callback of this request running on the delivery thread is waited for (so none runs after
  // this returns but the kCancelled end); from a callback, the delivery thread is already between
  // two calls of every other request's callback, and inside this one's.
  std::unique_lock<std::mutex> stream_lock(stream->mu, std::defer_lock);
  if (std::this_thread::get_id() != delivery_id_) stream_lock.lock();
  std::lock_guard<std::mutex> lock(mu_);
  if (stream->final_delivered || stream->cancelled.load()) return not_live();
  stream->cancelled.store(true);
  if (!stream->ended) {
    cancels_.push_back(id);  // still in the engine
    wake_.notify_one();
  }
  stream->ended = true;
  Delivery final_event;
  final_event.emplace_back(stream, TokenEvent{id, -1, FinishReason::kCancelled, nullptr});
  queue(&final_event);
  return {};
}

void EngineLoop::stop(bool drain) {
  {
    // Before the join lock: a hard stop must reach a loop that a draining stop is waiting on.
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) draining_ = drain;
    else if (!drain) draining_ = false;  // a second, harder stop
    stopping_ = true;
    wake_.notify_all();
  }
  std::lock_guard<std::mutex> serial(stop_mu_);
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(delivery_mu_);
    loop_done_ = true;
    delivery_wake_.notify_all();
  }
  if (delivery_thread_.joinable()) delivery_thread_.join();
}

int64_t EngineLoop::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(streams_.size());
}
Status EngineLoop::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}
SchedulerStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_.stats;
}
int64_t EngineLoop::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_.waiting;
}
int64_t EngineLoop::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_.running;
}
EngineLoop::Snapshot EngineLoop::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void EngineLoop::publish() {
  const Scheduler& s = engine_->scheduler();
  snapshot_.running = s.running();
  snapshot_.waiting = s.waiting();
  snapshot_.kv_blocks_total = s.pool().usable_blocks();
  snapshot_.kv_blocks_used = snapshot_.kv_blocks_total - s.pool().free_blocks();
  snapshot_.stats = s.stats();
}

void EngineLoop::end_all() {
  Delivery finals;
  for (auto& [rid, stream] : streams_) {
    if (stream->ended) continue;  // its final event is queued already
    (void)engine_->cancel(rid);   // after a failed step the engine may refuse; the request ends here anyway
    stream->ended = true;
    finals.emplace_back(stream, TokenEvent{rid, -1, FinishReason::kCancelled, nullptr});
  }
  queue(&finals);
}

void EngineLoop::queue(Delivery* d) {
  if (d->empty()) return;
  std::lock_guard<std::mutex> lock(delivery_mu_);
  if (delivery_.empty()) delivery_.swap(*d);
  else delivery_.insert(delivery_.end(), std::make_move_iterator(d->begin()), std::make_move_iterator(d->end()));
  d->clear();
  delivery_wake_.notify_one();
}

void EngineLoop::deliver() {
  Delivery batch;
  std::unique_lock<std::mutex> lock(delivery_mu_);
  for (;;) {
    delivery_wake_.wait(lock, [this] { return !delivery_.empty() || loop_done_; });
    if (delivery_.empty()) break;  // loop_done_, and everything delivered
    batch.swap(delivery_);
    lock.unlock();
    for (auto& [stream, event] : batch) {
      std::lock_guard<std::mutex> stream_lock(stream->mu);
      // After the final event nothing; after cancel() only its kCancelled end (a token or an end
      // queued before the reader cancelled is dropped).
      if (stream->final_delivered) continue;
      if (stream->cancelled.load() && event.finish != FinishReason::kCancelled) continue;
      try {
        stream->fn(event);
      } catch (...) {
        // The request's reader is gone: end it (its final event goes to the same callback, which
        // may throw again; that is caught here too).
        if (event.finish == FinishReason::kNone) (void)cancel(event.request);
      }
      if (event.finish != FinishReason::kNone) {
        stream->final_delivered = true;
        std::lock_guard<std::mutex> live_lock(mu_);
        streams_.erase(event.request);
      }
    }
    batch.clear();
    lock.lock();
  }
}

void EngineLoop::run() {
  std::unique_lock<std::mutex> lock(mu_);
  Delivery out;
  std::vector<Submission*> inbox;
  for (;;) {
    // Between steps: what other threads handed over since the last step (once per step, so that
    // a stream of submissions cannot hold the steps back), the lock released while the engine takes
    // it (a submitter waits for this, not for the lock).
    if (!inbox_.empty() || !cancels_.empty()) {
      inbox.swap(inbox_);
      std::vector<int64_t> cancels;
      cancels.swap(cancels_);
      for (const int64_t rid : cancels) (void)engine_->cancel(rid);  // refused when it ended in the last step
      if (!cancels.empty()) publish();
      lock.unlock();
      for (Submission* s : inbox) add(s);
      lock.lock();
      inbox.clear();
      added_.notify_all();
    }
    if (stopping_ && !draining_ && !engine_->idle()) {
      end_all();
      publish();
    }
    if (engine_->idle() || !error_.ok()) {
      // Whatever came in while the lock was released is taken before waiting or ending.
      if (!inbox_.empty() || !cancels_.empty()) continue;
      if (stopping_) break;
      wake_.wait(lock);
      continue;
    }
    std::vector<TokenEvent> events;
    Status st;
    lock.unlock();
    try {
      st = engine_->step(&events);
    } catch (const std::exception& e) {  // nothing leaves the loop's thread (std::terminate)
      st = Status(StatusCode::kInternal, std::string("engine step: ") + e.what());
    } catch (...) {
      st = Status(StatusCode::kInternal, "engine step: an unknown exception");
    }
    lock.lock();
    if (!st.ok()) {
      error_ = st;
      stopping_ = true;
      draining_ = false;
    }
    // A request cancelled during the step has its final event queued already: its events go nowhere.
    for (const TokenEvent& e : events) {
      auto it = streams_.find(e.request);
      if (it == streams_.end() || it->second->cancelled.load()) continue;
      out.emplace_back(it->second, e);
      if (e.finish != FinishReason::kNone) it->second->ended = true;
    }
    queue(&out);                // this step's tokens first, then (a failed step) each request's final event
    if (!st.ok()) end_all();
    publish();
  }
}

}  // namespace llmq::engine
