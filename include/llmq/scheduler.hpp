// The serving engine's scheduler (host side, no device work): requests join and leave at any step;
// each step moves every scheduled sequence's computed-token count toward its length under a token
// budget, so there are no prefill and decode phases (a long prompt is prefilled in chunks beside the
// decodes of running sequences). The step's plan says, per sequence, which positions to compute
// through which KV block table and whether to sample; update() then takes the sampled tokens.
//
// Order: running sequences first, oldest first (a decode costs one token, a prefill its next chunk);
// then waiting ones, front first, each after a prefix-cache lookup. When a running sequence needs a
// block and none is free, the newest running sequence is preempted: its blocks are released, its
// computed count goes back to 0 (it keeps its generated tokens and recomputes them; the prefix
// cache usually makes that cheap) and it goes to the front of the waiting queue; a step that
// preempted admits nothing new. A request whose tokens can never fit the cache, or are longer than
// the model's context, is refused when it is added; so is one past the waiting-queue limit.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "llmq/kv_block_pool.hpp"
#include "llmq/status.hpp"

namespace llmq::engine {

struct SchedulerOptions {
  int64_t max_batched_tokens = 2048;  // positions computed per step (prefill chunks + decodes)
  int64_t max_running = 128;          // sequences in one step
  int64_t max_waiting = 1024;         // requests queued; add() past it is refused
  int64_t max_model_len = 0;          // positions per sequence, prompt and output (required)
  bool prefix_caching = true;
  // Admission without eviction (TensorRT-LLM's "guaranteed no evict"): a waiting request is
  // admitted only while the free blocks cover what every running sequence and it may still need,
  // up to each one's longest output (max_new_tokens, or the context); so no step ever preempts.
  // Fewer requests run at once when outputs end early; a request's tokens are the same either way.
  bool no_preemption = false;
};

struct RequestSpec {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  std::vector<int32_t> stop_ids;  // a sampled token in this list ends the request (it is emitted)
};

enum class FinishReason { kNone, kStop, kLength, kCancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "" (none)

// One sequence's share of a step: compute positions [start, start + count) of its tokens.
struct StepChunk {
  int64_t request = 0;
  int64_t start = 0;
  int64_t count = 0;
  bool sample = false;                 // the chunk ends at the sequence's last token: sample the next
  const int32_t* tokens = nullptr;     // the sequence's tokens (valid until update())
  const BlockId* table = nullptr;      // its block table, covering positions [0, start + count)
  int64_t table_blocks = 0;
};

struct StepPlan {
  std::vector<StepChunk> chunks;
  int64_t tokens = 0;      // sum of the chunks' counts
  int64_t samples = 0;     // chunks with sample set (update() takes that many tokens, in order)
  int64_t preempted = 0;   // sequences preempted while planning this step
};

// The log-probabilities a request asked for with each token (SamplingParams::logprobs >= 0): of
// the model's distribution before temperature, top-k and top-p (log_softmax of the logits; the
// definition is runtime/row_logprobs.hpp's).
struct TokenLogprobs {
  float token = 0.0f;            // the sampled token's
  std::vector<int32_t> top_ids;  // the request's top K, most likely first (equal logits: lower id first)
  std::vector<float> top;        // their log-probabilities
};

// What update() reports for each sampled token.
struct TokenEvent {
  int64_t request = 0;
  int32_t token = 0;
  FinishReason finish = FinishReason::kNone;  // set on the request's last token
  std::shared_ptr<const TokenLogprobs> logprobs;  // set by the engine when the request asked (shared: events are copied)
};

struct SchedulerStats {
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;       // of requests admitted for the first time
  int64_t prefix_hit_tokens = 0;   // of those, found in the prefix cache
  int64_t computed_tokens = 0;     // positions computed over all steps (recomputation included)
  int64_t peak_blocks = 0;         // the most blocks held at once (as a plan goes out: its sequences' blocks included)
};

class Scheduler {
 public:
  // `pool` must outlive the scheduler; its block size is the scheduler's.
  static Status create(KvBlockPool* pool, const SchedulerOptions& options, std::unique_ptr<Scheduler>* out);

  // Queues a request; its id (ascending from 0) in *id. Refused: an empty prompt, max_new_tokens
  // < 1, a prompt that leaves no room in max_model_len for an output token, more blocks than the
  // whole cache holds (both numbers said), or a full queue (kResourceExhausted). Generation stops at
  // max_new_tokens, a stop id, or when the sequence fills max_model_len.
  Status add(RequestSpec spec, int64_t* id);
  // Ends a request wherever it is (waiting or running), freeing its blocks. Between schedule() and
  // update() it takes effect in update() (the plan's chunks point at the request's tokens and
  // table until then; its sampled token is dropped). An unknown or finished id is refused.
  Status cancel(int64_t id);

  StepPlan schedule();
  // The plan's sampled tokens, one per chunk with sample set, in chunk order. Events (one per
  // token) are appended to *events; finished requests leave and free their blocks.
  Status update(const StepPlan& plan, const std::vector<int32_t>& sampled, std::vector<TokenEvent>* events);

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  const SchedulerStats& stats() const { return stats_; }
  const KvBlockPool& pool() const { return *pool_; }
  // The tokens of a live request (prompt and generated so far), or null.
  const std::vector<int32_t>* tokens_of(int64_t id) const;

 private:
  struct Sequence {
    RequestSpec spec;
    std::vector<int32_t> tokens;  // prompt, then generated
    int64_t computed = 0;         // positions whose KV is in the cache
    int64_t published = 0;        // full blocks offered to the prefix cache
    int64_t generated = 0;
    bool admitted_before = false;
    std::vector<BlockId> table;
  };

  Scheduler(KvBlockPool* pool, const SchedulerOptions& options) : pool_(pool), options_(options) {}
  int64_t blocks_for(int64_t positions) const { return (positions + pool_->block_size() - 1) / pool_->block_size(); }
  // The positions a request may reach: every token but the last one sampled has its KV computed,
  // and the last token of a full context sits at position max_model_len - 1.
  int64_t max_positions(const RequestSpec& spec) const;
  // Blocks a sequence may still take before it ends (no_preemption's promise to it).
  int64_t blocks_to_come(const Sequence& s) const;
  bool grow(Sequence& s, int64_t positions);  // blocks to cover `positions`; false when none free
  void preempt(int64_t id);
  void finish(int64_t id);  // leaves and frees its blocks
  void release(int64_t id);  // finish without leaving running_ / waiting_ (the caller removes it)
  StepChunk chunk_of(int64_t id, Sequence& s, int64_t count) const;

  KvBlockPool* pool_;
  SchedulerOptions options_;
  // By id; looked up for every chunk of every step (a hash map: at 1024 running sequences an ordered
  // map's lookups were a third of the host's step). Nodes stay put, so the plan's pointers into a
  // Sequence's tokens and table do too.
  std::unordered_map<int64_t, Sequence> live_;
  std::vector<int64_t> running_;  // oldest first
  std::deque<int64_t> waiting_;   // front first
  bool in_flight_ = false;        // a plan is out: schedule() ran, update() has not
  std::set<int64_t> cancelling_;  // cancelled while a plan was out: finished in update()
  int64_t next_id_ = 0;
  SchedulerStats stats_;
};

}  // namespace llmq::engine
