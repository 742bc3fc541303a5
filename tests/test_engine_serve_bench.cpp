// The serving benchmark's pieces (include/llmq/serve_workload.hpp, serve_metrics.hpp): seeded
// workloads (fixed lengths exact; sharegpt-like lengths clamped and near their stated medians;
// Poisson arrivals at their rate) and the latency figures (TTFT, TPOT, ITL, E2E, percentiles as
// numpy's linear interpolation) on timelines worked out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "llmq/serve_metrics.hpp"
#include "llmq/serve_workload.hpp"

namespace llmq::engine {
namespace {

TEST(ServeWorkload, FixedLengthsAreExactAndSeeded) {
  WorkloadOptions o;
  o.dataset = "fixed:128/64";
  o.requests = 50;
  o.vocab_size = 512;
  std::vector<WorkloadRequest> a, b;
  ASSERT_TRUE(make_workload(o, &a).ok());
  ASSERT_TRUE(make_workload(o, &b).ok());
  ASSERT_EQ(a.size(), 50u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt.size(), 128u);
    EXPECT_EQ(a[i].output_tokens, 64);
    EXPECT_EQ(a[i].arrival_s, 0.0);  // offline
    EXPECT_EQ(a[i].prompt, b[i].prompt) << "seeded";
    for (const int32_t t : a[i].prompt) ASSERT_TRUE(t >= 3 && t < 512);
  }
  EXPECT_NE(a[0].prompt, a[1].prompt);
  o.seed = 2;
  ASSERT_TRUE(make_workload(o, &b).ok());
  EXPECT_NE(a[0].prompt, b[0].prompt);
  o.max_model_len = 100;  // clamped to fit, one output token at least
  ASSERT_TRUE(make_workload(o, &b).ok());
  EXPECT_EQ(b[0].prompt.size(), 99u);
  EXPECT_EQ(b[0].output_tokens, 1);
}

TEST(ServeWorkload, ShareGptLikeLengthsAndPoissonArrivalsFollowTheirStatedParameters) {
  WorkloadOptions o;
  o.dataset = "sharegpt-like";
  o.requests = 20000;
  o.vocab_size = 1000;
  o.rate = 8.0;
  std::vector<WorkloadRequest> w;
  ASSERT_TRUE(make_workload(o, &w).ok());
  std::vector<double> in, out;
  for (const WorkloadRequest& r : w) {
    ASSERT_GE(r.prompt.size(), 4u);
    ASSERT_LE(r.prompt.size(), 1024u);
    ASSERT_GE(r.output_tokens, 4);
    ASSERT_LE(r.output_tokens, 1024);
    in.push_back(static_cast<double>(r.prompt.size()));
    out.push_back(static_cast<double>(r.output_tokens));
  }
  // Medians 120 / 110 (the log-normals' exp(mu)); 20000 draws put them within a few tokens.
  EXPECT_NEAR(percentile(in, 50), 120.0, 5.0);
  EXPECT_NEAR(percentile(out, 50), 110.0, 5.0);
  for (size_t i = 1; i < w.size(); ++i) ASSERT_GE(w[i].arrival_s, w[i - 1].arrival_s);
  // Poisson at 8/s: the mean gap 1/8 s (standard error 0.125 / sqrt(20000) ~ 0.0009).
  EXPECT_NEAR(w.back().arrival_s / static_cast<double>(w.size()), 0.125, 0.004);
  o.rate = std::numeric_limits<double>::infinity();
  ASSERT_TRUE(make_workload(o, &w).ok());
  EXPECT_EQ(w.back().arrival_s, 0.0);
}

TEST(ServeWorkload, RefusesBadOptionsNamingThem) {
  std::vector<WorkloadRequest> w;
  WorkloadOptions o;
  o.vocab_size = 100;
  for (const char* bad : {"fixed:0/8", "fixed:8", "fixed:a/b", "fixed:8/-1", "sharegpt", ""}) {
    o.dataset = bad;
    const Status st = make_workload(o, &w);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("dataset"), std::string::npos) << st.to_string();
  }
  o.dataset = "fixed:8/8";
  o.rate = -1;
  EXPECT_NE(make_workload(o, &w).message().find("rate"), std::string::npos);
  o.rate = std::nan("");
  EXPECT_NE(make_workload(o, &w).message().find("rate"), std::string::npos);
  o.rate = 0;
  o.requests = 0;
  EXPECT_NE(make_workload(o, &w).message().find("requests"), std::string::npos);
  o.requests = 1000000;  // a million prompts of 1000 tokens: refused before any is drawn
  o.dataset = "fixed:1000/8";
  EXPECT_NE(make_workload(o, &w).message().find("more than the 2^28 a workload may hold"), std::string::npos);
  o.dataset = "fixed:8/8";
  o.requests = 1;
  o.vocab_size = 3;
  EXPECT_NE(make_workload(o, &w).message().find("vocab_size"), std::string::npos);
}

TEST(ServeMetrics, PercentilesInterpolateAsNumpy) {
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 90), 7.0);
}

TEST(ServeMetrics, TimelinesGiveTheirTtftTpotItlAndThroughput) {
  // Request A arrives at 0, tokens at 1, 2, 4; B arrives at 1, tokens at 3, 3.5; C at 2, one
  // token at 6.
  std::vector<RequestTimeline> t = {{0.0, 10, {1.0, 2.0, 4.0}}, {1.0, 20, {3.0, 3.5}}, {2.0, 30, {6.0}}};
  ServeMetrics m;
  ASSERT_TRUE(serve_metrics(t, &m).ok());
  EXPECT_EQ(m.requests, 3);
  EXPECT_EQ(m.prompt_tokens, 60);
  EXPECT_EQ(m.output_tokens, 6);
  EXPECT_DOUBLE_EQ(m.duration_s, 6.0);
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s, 1.0);
  EXPECT_DOUBLE_EQ(m.total_tokens_per_s, 11.0);
  EXPECT_DOUBLE_EQ(m.requests_per_s, 0.5);
  // TTFT 1, 2, 4; TPOT (4-1)/2 = 1.5 and 0.5 (C has one token: none); ITL 1, 2, 0.5; E2E 4, 2.5, 4.
  EXPECT_EQ(m.ttft_s.count, 3);
  EXPECT_DOUBLE_EQ(m.ttft_s.mean, 7.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.ttft_s.median, 2.0);
  EXPECT_DOUBLE_EQ(m.ttft_s.max, 4.0);
  EXPECT_EQ(m.tpot_s.count, 2);
  EXPECT_DOUBLE_EQ(m.tpot_s.mean, 1.0);
  EXPECT_EQ(m.itl_s.count, 3);
  EXPECT_DOUBLE_EQ(m.itl_s.median, 1.0);
  EXPECT_DOUBLE_EQ(m.e2e_s.p90, 4.0);
  EXPECT_DOUBLE_EQ(m.e2e_s.median, 4.0);
}

TEST(ServeMetrics, RefusesTimelinesThatCannotHappen) {
  ServeMetrics m;
  EXPECT_FALSE(serve_metrics({}, &m).ok());
  EXPECT_FALSE(serve_metrics({{0.0, 1, {}}}, &m).ok());               // no token
  EXPECT_FALSE(serve_metrics({{2.0, 1, {1.0}}}, &m).ok());            // before its arrival
  EXPECT_FALSE(serve_metrics({{0.0, 1, {2.0, 1.0}}}, &m).ok());       // not ascending
}

}  // namespace
}  // namespace llmq::engine
