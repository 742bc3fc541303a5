// Scheduler (scheduler.hpp).
#include "llmq/scheduler.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace llmq::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kNone: break;
  }
  return "";
}

Status Scheduler::create(KvBlockPool* pool, const SchedulerOptions& o, std::unique_ptr<Scheduler>* out) {
  if (pool == nullptr || out == nullptr) return invalid_argument("pool, out: must not be null");
  if (o.max_batched_tokens < 1) return invalid_argument("max_batched_tokens: must be >= 1, got " + std::to_string(o.max_batched_tokens));
  if (o.max_running < 1) return invalid_argument("max_running: must be >= 1, got " + std::to_string(o.max_running));
  if (o.max_waiting < 0) return invalid_argument("max_waiting: must be >= 0, got " + std::to_string(o.max_waiting));
  if (o.max_model_len < 1) return invalid_argument("max_model_len: must be >= 1, got " + std::to_string(o.max_model_len));
  out->reset(new Scheduler(pool, o));
  return {};
}

Status Scheduler::add(RequestSpec spec, int64_t* id) {
  if (id == nullptr) return invalid_argument("id: null");
  const int64_t prompt = static_cast<int64_t>(spec.prompt.size());
  if (prompt == 0) return invalid_argument("prompt: empty (a request needs at least one token)");
  if (spec.max_new_tokens < 1) return invalid_argument("max_new_tokens: must be >= 1, got " + std::to_string(spec.max_new_tokens));
  if (prompt >= options_.max_model_len)
    return invalid_argument("prompt: " + std::to_string(prompt) + " tokens, the model's context holds " +
                            std::to_string(options_.max_model_len) + " (with at least one output token)");
  const int64_t positions = max_positions(spec);
  if (blocks_for(positions) > pool_->usable_blocks())
    return invalid_argument("request: " + std::to_string(positions) + " positions need " + std::to_string(blocks_for(positions)) +
                            " KV blocks of " + std::to_string(pool_->block_size()) + " tokens, the whole cache holds " +
                            std::to_string(pool_->usable_blocks()));
  if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting)
    return {StatusCode::kResourceExhausted,
            "queue full: " + std::to_string(waiting_.size()) + " requests waiting (the limit)"};
  Sequence s;
  s.tokens = spec.prompt;
  s.spec = std::move(spec);
  *id = next_id_++;
  live_.emplace(*id, std::move(s));
  waiting_.push_back(*id);
  return {};
}

int64_t Scheduler::max_positions(const RequestSpec& spec) const {
  // (max_new_tokens clamped first: a client's "unlimited" INT64_MAX must not overflow the sum.)
  const int64_t new_tokens = std::min(spec.max_new_tokens, options_.max_model_len);
  return std::min(options_.max_model_len - 1, static_cast<int64_t>(spec.prompt.size()) + new_tokens - 1);
}

int64_t Scheduler::blocks_to_come(const Sequence& s) const {
  return std::max<int64_t>(0, blocks_for(max_positions(s.spec)) - static_cast<int64_t>(s.table.size()));
}

const std::vector<int32_t>* Scheduler::tokens_of(int64_t id) const {
  const auto it = live_.find(id);
  return it == live_.end() ? nullptr : &it->second.tokens;
}

bool Scheduler::grow(Sequence& s, int64_t positions) {
  const int64_t need = blocks_for(positions) - static_cast<int64_t>(s.table.size());
  return need <= 0 || pool_->allocate(need, &s.table).ok();
}

void Scheduler::preempt(int64_t id) {
  Sequence& s = live_.at(id);
  (void)pool_->release(s.table);  // the scheduler's own table: always held
  s.table.clear();
  s.computed = 0;
  s.published = 0;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_front(id);
  ++stats_.preemptions;
}

void Scheduler::release(int64_t id) {
  (void)pool_->release(live_.at(id).table);
  live_.erase(id);
}

void Scheduler::finish(int64_t id) {
  Sequence& s = live_.at(id);
  (void)pool_->release(s.table);
  const auto r = std::find(running_.begin(), running_.end(), id);
  if (r != running_.end()) running_.erase(r);
  const auto w = std::find(waiting_.begin(), waiting_.end(), id);
  if (w != waiting_.end()) waiting_.erase(w);
  live_.erase(id);
}

Status Scheduler::cancel(int64_t id) {
  if (live_.find(id) == live_.end() || cancelling_.count(id) != 0)
    return invalid_argument("cancel: request " + std::to_string(id) + " is not waiting or running");
  if (in_flight_) {  // the plan's chunks point at its tokens and table: freed by update()
    cancelling_.insert(id);
    return {};
  }
  finish(id);
  return {};
}

StepChunk Scheduler::chunk_of(int64_t id, Sequence& s, int64_t count) const {
  StepChunk c;
  c.request = id;
  c.start = s.computed;
  c.count = count;
  c.sample = s.computed + count == static_cast<int64_t>(s.tokens.size());
  c.tokens = s.tokens.data();
  c.table = s.table.data();
  c.table_blocks = static_cast<int64_t>(s.table.size());
  return c;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.chunks.reserve(std::min(running_.size() + waiting_.size(), static_cast<size_t>(options_.max_running)));
  int64_t budget = options_.max_batched_tokens;
  // A preemption only removes the newest running sequence, never one placed before it in this step,
  // so a chunk made when its sequence is placed stays valid.
  const auto add_chunk = [&](int64_t id, Sequence& s, int64_t count) {
    const StepChunk c = chunk_of(id, s, count);
    plan.tokens += c.count;
    plan.samples += c.sample ? 1 : 0;
    plan.chunks.push_back(c);
  };
  // Running sequences, oldest first. A preemption removes the newest from running_.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const int64_t id = running_[i];
    Sequence& s = live_.at(id);
    const int64_t count = std::min(budget, static_cast<int64_t>(s.tokens.size()) - s.computed);
    bool self_preempted = false;
    while (!grow(s, s.computed + count)) {
      const int64_t victim = running_.back();
      preempt(victim);
      ++plan.preempted;
      if (victim == id) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // it was the newest: nothing after it is running
    add_chunk(id, s, count);
    budget -= count;
    ++i;
  }
  // no_preemption: the blocks the running sequences may still take, which admissions must leave free.
  int64_t promised = 0;
  if (options_.no_preemption)
    for (const int64_t id : running_) promised += blocks_to_come(live_.at(id));
  // Waiting sequences, front first, unless this step had to preempt.
  while (plan.preempted == 0 && budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < options_.max_running) {
    const int64_t id = waiting_.front();
    Sequence& s = live_.at(id);
    int64_t hit = 0;
    if (options_.prefix_caching && s.table.empty())
      hit = pool_->match_prefix(s.tokens.data(), static_cast<int64_t>(s.tokens.size()), &s.table);
    s.computed = hit;
    s.published = hit / pool_->block_size();
    const int64_t count = std::min(budget, static_cast<int64_t>(s.tokens.size()) - s.computed);
    // (The hits taken above are out of the free count already: a free published block they took
    // back is one block fewer for the promise.)
    const bool promise_kept = !options_.no_preemption || promised + blocks_to_come(s) <= pool_->free_blocks();
    if (!promise_kept || !grow(s, s.computed + count)) {  // no room: give the hits back and wait
      (void)pool_->release(s.table);
      s.table.clear();
      s.computed = s.published = 0;
      break;
    }
    if (!s.admitted_before) {
      stats_.prompt_tokens += static_cast<int64_t>(s.tokens.size());
      stats_.prefix_hit_tokens += hit;
      s.admitted_before = true;
    }
    waiting_.pop_front();
    running_.push_back(id);
    add_chunk(id, s, count);
    budget -= count;
    if (options_.no_preemption) promised += blocks_to_come(s);
  }
  in_flight_ = !plan.chunks.empty();
  stats_.peak_blocks = std::max(stats_.peak_blocks, pool_->usable_blocks() - pool_->free_blocks());
  return plan;
}

Status Scheduler::update(const StepPlan& plan, const std::vector<int32_t>& sampled, std::vector<TokenEvent>* events) {
  if (events == nullptr) return invalid_argument("events: null");
  if (static_cast<int64_t>(sampled.size()) != plan.samples)
    return invalid_argument("sampled: " + std::to_string(sampled.size()) + " tokens for a plan with " +
                            std::to_string(plan.samples) + " samples");
  in_flight_ = false;
  size_t next = 0;
  const int64_t bs = pool_->block_size();
  // Requests that ended in this step leave running_ in one pass at the end (many end in the same
  // step when their lengths are alike: one search of running_ each would be quadratic).
  std::vector<int64_t> ended;
  const auto leave_running = [&] {  // running_ in order, without the ended (each was running: it had a chunk)
    if (ended.empty()) return;
    std::sort(ended.begin(), ended.end());
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [&](int64_t id) { return std::binary_search(ended.begin(), ended.end(), id); }),
                   running_.end());
    ended.clear();
  };
  for (const StepChunk& c : plan.chunks) {
    const auto it = live_.find(c.request);
    if (it == live_.end() || cancelling_.count(c.request) != 0) {  // cancelled meanwhile: its token is dropped
      next += c.sample ? 1 : 0;
      continue;
    }
    if (it->second.computed != c.start) {
      leave_running();  // those that ended before it are gone from live_: keep running_ the same
      return invalid_argument("plan: request " + std::to_string(c.request) + " has changed since it was scheduled");
    }
    Sequence& s = it->second;
    s.computed += c.count;
    stats_.computed_tokens += c.count;
    if (options_.prefix_caching)  // full computed blocks become findable
      for (; s.published < s.computed / bs; ++s.published) {
        const int64_t b = s.published;
        (void)pool_->publish(s.table[b], b == 0 ? kNullBlock : s.table[b - 1], &s.tokens[b * bs]);
      }
    if (!c.sample) continue;
    const int32_t token = sampled[next++];
    s.tokens.push_back(token);
    ++s.generated;
    TokenEvent e;
    e.request = c.request;
    e.token = token;
    if (std::find(s.spec.stop_ids.begin(), s.spec.stop_ids.end(), token) != s.spec.stop_ids.end())
      e.finish = FinishReason::kStop;
    else if (s.generated >= s.spec.max_new_tokens || static_cast<int64_t>(s.tokens.size()) >= options_.max_model_len)
      e.finish = FinishReason::kLength;
    events->push_back(e);
    if (e.finish != FinishReason::kNone) {
      release(c.request);
      ended.push_back(c.request);
    }
  }
  leave_running();
  for (const int64_t id : cancelling_)
    if (live_.count(id) != 0) finish(id);
  cancelling_.clear();
  return {};
}

}  // namespace llmq::engine
