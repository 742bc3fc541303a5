// Sampler and generate(): llama2.c run.c's sampling and generation loop, reimplemented so that
// the same logits, temperature, top-p and seed pick the same tokens as run.c.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "llmq/sampler.hpp"

namespace llmq {

Sampler::Sampler(int64_t vocab_size, float temperature, float topp, uint64_t seed)
    : vocab_size_(vocab_size), temperature_(temperature), topp_(topp), state_(seed) {
  candidates_.reserve(static_cast<size_t>(std::max<int64_t>(vocab_size, 0)));
}

// xorshift64* (run.c's random_u32). A zero state stays zero: generate() refuses seed 0.
uint32_t Sampler::random_u32() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return static_cast<uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
}

// 24 random bits scaled into [0, 1).
float Sampler::random_f32() { return static_cast<float>(random_u32() >> 8) / 16777216.0f; }

namespace {

int32_t argmax(const float* p, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] > p[best]) best = i;  // strict: the first maximum wins, as run.c
  return static_cast<int32_t>(best);
}

void softmax(float* x, int64_t n) {
  float max_val = x[0];
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_val);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

// Multinomial draw: the first index whose running cdf exceeds coin.
int32_t sample_mult(const float* p, int64_t n, float coin) {
  float cdf = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    cdf += p[i];
    if (coin < cdf) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(n - 1);  // rounding: the cdf ended just below coin
}

}  // namespace

int32_t Sampler::sample(float* logits) {
  const int64_t n = vocab_size_;
  if (temperature_ == 0.0f) return argmax(logits, n);
  for (int64_t i = 0; i < n; ++i) logits[i] /= temperature_;
  softmax(logits, n);
  const float coin = random_f32();
  if (topp_ <= 0.0f || topp_ >= 1.0f) return sample_mult(logits, n, coin);

  // Top-p: candidates below cutoff cannot be in the nucleus (the rest could not sum to topp),
  // dropping them first makes the sort short.
  const float cutoff = (1.0f - topp_) / static_cast<float>(n - 1);
  candidates_.clear();
  for (int64_t i = 0; i < n; ++i)
    if (logits[i] >= cutoff) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  // run.c sorts with qsort by descending probability, a comparator that calls equal ones equal,
  // so the order of ties is whatever that qsort leaves. We break ties by ascending index
  // (deterministic, and what glibc's merge-sorting qsort gives too, being stable over candidates
  // collected in index order). The result equals run.c's wherever the probabilities differ.
  std::sort(candidates_.begin(), candidates_.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  const int64_t n0 = static_cast<int64_t>(candidates_.size());
  float cumulative = 0.0f;
  int64_t last = n0 - 1;
  for (int64_t i = 0; i < n0; ++i) {
    cumulative += candidates_[i].first;
    if (cumulative > topp_) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (int64_t i = 0; i <= last; ++i) {
    cdf += candidates_[i].first;
    if (r < cdf) return candidates_[i].second;
  }
  return candidates_[last].second;
}

Status generate(Transformer* model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                std::vector<int32_t>* out, GenerateStats* stats) {
  if (model == nullptr || out == nullptr) return invalid_argument("generate: model or out is null");
  if (prompt.empty()) return invalid_argument("generate: prompt is empty (it starts with BOS, or the token a text starts after)");
  if (!(options.temperature >= 0.0f)) return invalid_argument("generate: temperature must be >= 0");
  if (!(options.topp >= 0.0f && options.topp <= 1.0f)) return invalid_argument("generate: topp must be in [0, 1]");
  if (options.temperature > 0.0f && options.seed == 0)
    return invalid_argument("generate: sampling (temperature > 0) needs a nonzero seed");
  if (options.steps < 0) return invalid_argument("generate: steps must be >= 0");
  const ModelConfig& c = model->config();
  // run.c: steps 0 or past the context means the whole context.
  const int64_t steps = options.steps == 0 || options.steps > c.max_seq_len ? c.max_seq_len : options.steps;

  Sampler sampler(c.vocab_size, options.temperature, options.topp, options.seed);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  GenerateStats st;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto prompt_end = start;
  out->clear();
  model->reset();
  int32_t token = prompt[0];
  for (int64_t pos = 0; pos < steps; ++pos) {
    LLMQ_RETURN_IF_ERROR(model->forward(&token, 1, pos, logits.data()));
    const bool forced = pos < n_prompt - 1;  // still reading the prompt
    if (!forced && pos == n_prompt - 1) {
      prompt_end = Clock::now();
      st.prompt_tokens = n_prompt;
    }
    const int32_t next = forced ? prompt[static_cast<size_t>(pos + 1)] : sampler.sample(logits.data());
    if (!forced && (next == c.bos_token ||  // run.c: BOS delimits sequences
                    std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) != options.stop_tokens.end())) {
      st.stop_token = next;
      break;
    }
    if (next == c.bos_token) break;
    if (!forced) {
      out->push_back(next);
      if (options.on_token) options.on_token(next);
    }
    token = next;
  }
  if (stats != nullptr) {
    if (st.prompt_tokens == 0) prompt_end = Clock::now();  // steps ran out inside the prompt
    st.prompt_seconds = std::chrono::duration<double>(prompt_end - start).count();
    st.decode_seconds = std::chrono::duration<double>(Clock::now() - prompt_end).count();
    st.generated_tokens = static_cast<int64_t>(out->size());
    *stats = st;
  }
  return {};
}

}  // namespace llmq
