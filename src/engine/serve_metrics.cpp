// Serving metrics (serve_metrics.hpp).
#include "llmq/serve_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace llmq::engine {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

LatencySummary summarize(const std::vector<double>& v) {
  LatencySummary s;
  s.count = static_cast<int64_t>(v.size());
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.median = percentile(v, 50);
  s.p90 = percentile(v, 90);
  s.p99 = percentile(v, 99);
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}

Status serve_metrics(const std::vector<RequestTimeline>& requests, ServeMetrics* out) {
  if (out == nullptr) return invalid_argument("out: null");
  if (requests.empty()) return invalid_argument("requests: none");
  ServeMetrics m;
  std::vector<double> ttft, tpot, itl, e2e;
  double start = requests[0].arrival_s, end = start;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestTimeline& r = requests[i];
    if (r.token_s.empty()) return invalid_argument("request " + std::to_string(i) + ": no output token");
    if (r.token_s.front() < r.arrival_s) return invalid_argument("request " + std::to_string(i) + ": a token before its arrival");
    for (size_t k = 1; k < r.token_s.size(); ++k) {
      if (r.token_s[k] < r.token_s[k - 1]) return invalid_argument("request " + std::to_string(i) + ": token times not ascending");
      itl.push_back(r.token_s[k] - r.token_s[k - 1]);
    }
    const int64_t times = static_cast<int64_t>(r.token_s.size());
    if (r.output_tokens != 0 && r.output_tokens < times)
      return invalid_argument("request " + std::to_string(i) + ": output_tokens " + std::to_string(r.output_tokens) +
                              " is fewer than its " + std::to_string(times) + " token times");
    const int64_t n = r.output_tokens != 0 ? r.output_tokens : times;
    ttft.push_back(r.token_s.front() - r.arrival_s);
    if (n >= 2) tpot.push_back((r.token_s.back() - r.token_s.front()) / static_cast<double>(n - 1));
    e2e.push_back(r.token_s.back() - r.arrival_s);
    start = std::min(start, r.arrival_s);
    end = std::max(end, r.token_s.back());
    m.prompt_tokens += r.prompt_tokens;
    m.output_tokens += n;
  }
  m.requests = static_cast<int64_t>(requests.size());
  m.duration_s = end - start;
  if (m.duration_s > 0) {
    m.output_tokens_per_s = static_cast<double>(m.output_tokens) / m.duration_s;
    m.total_tokens_per_s = static_cast<double>(m.output_tokens + m.prompt_tokens) / m.duration_s;
    m.requests_per_s = static_cast<double>(m.requests) / m.duration_s;
  }
  m.ttft_s = summarize(ttft);
  m.tpot_s = summarize(tpot);
  m.itl_s = summarize(itl);
  m.e2e_s = summarize(e2e);
  *out = m;
  return {};
}

}  // namespace llmq::engine
