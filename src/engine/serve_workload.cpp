// make_workload (serve_workload.hpp).
#include "llmq/serve_workload.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace llmq::engine {

namespace {

Status parse_fixed(const std::string& spec, int64_t* in, int64_t* out) {
  const std::string body = spec.substr(6);  // after "fixed:"
  const size_t slash = body.find('/');
  const auto number = [](const std::string& s, int64_t* v) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *v = std::stoll(s);
    return *v >= 1;
  };
  if (slash == std::string::npos || !number(body.substr(0, slash), in) || !number(body.substr(slash + 1), out))
    return invalid_argument("dataset: '" + spec + "' is not fixed:INPUT/OUTPUT with lengths >= 1 (e.g. fixed:128/128)");
  return {};
}

}  // namespace

Status make_workload(const WorkloadOptions& o, std::vector<WorkloadRequest>* out) {
  if (out == nullptr) return invalid_argument("out: null");
  if (o.requests < 1 || o.requests > 10000000)
    return invalid_argument("requests: must be in [1, 10^7], got " + std::to_string(o.requests));
  if (std::isnan(o.rate) || o.rate < 0) return invalid_argument("rate: must be >= 0 (0 or inf: all at once), got " + std::to_string(o.rate));
  if (o.first_token < 0 || o.vocab_size <= o.first_token)
    return invalid_argument("vocab_size: " + std::to_string(o.vocab_size) + " leaves no prompt token past " +
                            std::to_string(o.first_token));
  const bool fixed = o.dataset.rfind("fixed:", 0) == 0;
  int64_t fixed_in = 0, fixed_out = 0;
  if (fixed) {
    LLMQ_RETURN_IF_ERROR(parse_fixed(o.dataset, &fixed_in, &fixed_out));
  } else if (o.dataset != "sharegpt-like") {
    return invalid_argument("dataset: '" + o.dataset + "' (fixed:INPUT/OUTPUT or sharegpt-like)");
  }
  // The prompts are held in memory: bounded before anything is drawn.
  const int64_t longest = fixed ? fixed_in : 1024;
  constexpr int64_t kMaxTokens = int64_t{1} << 28;
  if (longest > kMaxTokens / o.requests)
    return invalid_argument("requests: " + std::to_string(o.requests) + " prompts of up to " + std::to_string(longest) +
                            " tokens are more than the 2^28 a workload may hold");
  std::mt19937_64 rng(o.seed);
  std::lognormal_distribution<double> in_len(std::log(120.0), 1.0), out_len(std::log(110.0), 0.9);
  std::uniform_int_distribution<int32_t> token(o.first_token, static_cast<int32_t>(o.vocab_size - 1));
  const bool offline = o.rate == 0 || std::isinf(o.rate);
  std::exponential_distribution<double> gap(offline ? 1.0 : o.rate);
  const auto clamp_len = [](double v) { return std::clamp<int64_t>(static_cast<int64_t>(std::llround(v)), 4, 1024); };
  out->clear();
  out->reserve(static_cast<size_t>(o.requests));
  double t = 0;
  for (int64_t i = 0; i < o.requests; ++i) {
    WorkloadRequest r;
    int64_t n_in = fixed ? fixed_in : clamp_len(in_len(rng));
    int64_t n_out = fixed ? fixed_out : clamp_len(out_len(rng));
    if (o.max_model_len > 1) {  // leave room for at least one output token
      n_in = std::min(n_in, o.max_model_len - 1);
      n_out = std::min(n_out, o.max_model_len - n_in);
    }
    r.prompt.resize(static_cast<size_t>(n_in));
    for (int32_t& id : r.prompt) id = token(rng);
    r.output_tokens = n_out;
    if (!offline) t += gap(rng);
    r.arrival_s = t;
    out->push_back(std::move(r));
  }
  return {};
}

}  // namespace llmq::engine
