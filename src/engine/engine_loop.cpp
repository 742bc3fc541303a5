// EngineLoop (engine_loop.hpp): the engine's thread and the queue in front of it.
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
  try {
    loop->thread_ = std::thread([l = loop.get()] { l->run(); });
  } catch (const std::system_error& e) {
    return Status(StatusCode::kResourceExhausted, std::string("EngineLoop::start: no thread for the engine: ") + e.what());
  }
  *out = std::move(loop);
  return {};
}

EngineLoop::~EngineLoop() { stop(false); }

Status EngineLoop::submit(RequestSpec spec, const SamplingParams& sampling, StreamFn on_event, int64_t* id) {
  if (!on_event || id == nullptr) return invalid_argument("submit: on_event and id must be set");
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.ok()) return error_;
  if (stopping_) return Status(StatusCode::kResourceExhausted, "the engine is shutting down");
  int64_t rid = 0;
  LLMQ_RETURN_IF_ERROR(engine_->add(std::move(spec), sampling, &rid));
  streams_[rid] = std::make_shared<StreamFn>(std::move(on_event));
  *id = rid;
  wake_.notify_one();
  return {};
}

Status EngineLoop::cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return invalid_argument("cancel: request " + std::to_string(id) + " is not live");
  LLMQ_RETURN_IF_ERROR(engine_->cancel(id));
  pending_.emplace_back(std::move(it->second), TokenEvent{id, -1, FinishReason::kCancelled, nullptr});
  streams_.erase(it);
  wake_.notify_one();
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
  return engine_->scheduler().stats();
}
int64_t EngineLoop::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_->scheduler().waiting();
}
int64_t EngineLoop::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_->scheduler().running();
}
EngineLoop::Snapshot EngineLoop::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  const Scheduler& s = engine_->scheduler();
  Snapshot out;
  out.running = s.running();
  out.waiting = s.waiting();
  out.kv_blocks_total = s.pool().usable_blocks();
  out.kv_blocks_used = out.kv_blocks_total - s.pool().free_blocks();
  out.stats = s.stats();
  return out;
}

void EngineLoop::end_all(Delivery* out) {
  for (auto& [rid, stream] : streams_) {
    (void)engine_->cancel(rid);  // after a failed step the engine may refuse; the request ends here anyway
    out->emplace_back(std::move(stream), TokenEvent{rid, -1, FinishReason::kCancelled, nullptr});
  }
  streams_.clear();
}

void EngineLoop::deliver(Delivery* d) {
  for (auto& [stream, event] : *d) {
    try {
      (*stream)(event);
    } catch (...) {
      // The request's reader is gone: end it (its final event goes to the same callback, which
      // may throw again; that is caught here too).
      if (event.finish == FinishReason::kNone) (void)cancel(event.request);
    }
  }
  d->clear();
}

void EngineLoop::run() {
  std::unique_lock<std::mutex> lock(mu_);
  Delivery out;
  for (;;) {
    if (!pending_.empty()) {
      out.swap(pending_);
      lock.unlock();
      deliver(&out);
      lock.lock();
      continue;
    }
    if (stopping_ && !draining_) end_all(&out);
    if (engine_->idle() || !error_.ok()) {
      if (out.empty() && stopping_) break;
      if (out.empty()) {
        wake_.wait(lock);
        continue;
      }
    } else {
      std::vector<TokenEvent> events;
      Status st;
      try {
        st = engine_->step(&events);
      } catch (const std::exception& e) {  // nothing leaves the loop's thread (std::terminate)
        st = Status(StatusCode::kInternal, std::string("engine step: ") + e.what());
      }
      if (!st.ok()) {
        error_ = st;
        stopping_ = true;
        draining_ = false;
        end_all(&out);
      }
      for (const TokenEvent& e : events) {
        auto it = streams_.find(e.request);
        if (it == streams_.end()) continue;
        out.emplace_back(it->second, e);
        if (e.finish != FinishReason::kNone) streams_.erase(it);
      }
    }
    lock.unlock();
    deliver(&out);
    lock.lock();
  }
}

}  // namespace llmq::engine
