// Per-row sampling on the device (src/runtime/row_sampling.cu) against its host reference
// (row_sampling_reference.cpp, the definition in row_sampling.hpp):
//   1. greedy rows and top_k = 1 rows are the argmax exactly (ties to the lowest id);
//   2. sampled rows (temperatures 0.7 / 1.0 / 1.3 / 2.0, top_p 0.5 / 0.9 / 0.95, top_k 1 / 40 / 1000,
//      each row its own seed and draw) draw the reference's token in >= 99% of rows, and every row
//      that differs is a near-tie: the reference's u * kept weight, or its top-p threshold, within
//      1e-4 of the kept weight from a boundary of the running weights (the device's float exp2f and
//      integer weights against the reference's double exp). Vocabularies 1000, 32000, 151936 and
//      202048; a quarter of the rows have logits on a 0.25 grid, so top-k and top-p cut inside ties;
//   3. a row's token does not depend on its position in the batch, on the rows beside it, on how
//      many CTAs share the row (the batch size sets it), or on the run (the batch permuted, rows
//      alone, padded, run twice), and a CUDA graph replays it;
//   4. 20000 draws of one row's parameters on a 50-token vocabulary follow the reference's exact
//      renormalised top-k / top-p distribution (chi-square, false failure p ~ 1e-6 per case), and
//      no token outside the kept set is ever drawn;
//   5. non-finite logits as the definition says (NaN never drawn, +Inf tokens share the mass);
//   6. bad arguments are refused.
// Skips visibly without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_support.hpp"
#include "row_sampling_support.hpp"
#include "runtime/row_sampling.hpp"
#include "support.hpp"

namespace llmq {
namespace {

using runtime::RowSamplingParams;
using runtime::RowSamplingTrace;
using testing::DeviceBuffer;

constexpr double kNearTie = 1e-4;       // relative to the kept weight (see the header comment)
constexpr double kMinAgreement = 0.99;  // of sampled rows

RowSamplingParams params(float temperature, float top_p, int32_t top_k, uint64_t seed, int64_t draw) {
  RowSamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.seed = seed;
  p.draw = draw;
  return p;
}

std::string describe(const RowSamplingParams& p) {
  return "T " + std::to_string(p.temperature) + " top_p " + std::to_string(p.top_p) + " top_k " + std::to_string(p.top_k) +
         " seed " + std::to_string(p.seed) + " draw " + std::to_string(p.draw);
}

// Runs sample_rows_each over `logits` ([params.size(), vocab]) on `stream`; tokens poisoned first.
void run_device(const std::vector<float>& logits, int64_t vocab, const std::vector<RowSamplingParams>& params,
                std::vector<int32_t>* tokens) {
  const int64_t rows = static_cast<int64_t>(params.size());
  DeviceBuffer<float> d_logits(logits.size());
  DeviceBuffer<RowSamplingParams> d_params(params.size());
  DeviceBuffer<int32_t> d_tokens(params.size());
  ASSERT_TRUE(d_logits.ok() && d_params.ok() && d_tokens.ok());
  CUDA_ASSERT(d_logits.upload(logits));
  CUDA_ASSERT(d_params.upload(params));
  CUDA_ASSERT(d_tokens.fill_bytes(0xFF));
  const int64_t ws = runtime::sample_rows_each_workspace_bytes(rows, vocab);
  DeviceBuffer<uint8_t> d_ws(static_cast<size_t>(ws));
  const Status st = runtime::sample_rows_each(d_logits.get(), rows, vocab, d_params.get(), d_tokens.get(), d_ws.get(), ws,
                                              nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  CUDA_ASSERT(d_tokens.download(tokens));
}

// Logits of `rows` rows: N(0, 2) (no zeros), with outlier tokens far above (peaked rows), a few
// above (mild) or none, by row; rows with grid set (r % 4 == 3) rounded to multiples of 0.25 so that
// many logits tie.
std::vector<float> make_logits(int64_t rows, int64_t vocab, uint64_t seed) {
  std::vector<float> all;
  all.reserve(static_cast<size_t>(rows * vocab));
  std::mt19937_64 rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row = testing::normal_vector(vocab, seed * 1000 + static_cast<uint64_t>(r), 2.0f);
    const float lift = r % 3 == 0 ? 14.0f : (r % 3 == 1 ? 5.0f : 0.0f);
    for (int o = 0; o < 6 && lift > 0.0f; ++o)
      row[rng() % static_cast<uint64_t>(vocab)] += lift * (0.5f + 0.5f * static_cast<float>(rng() % 1000) / 1000.0f);
    if (r % 4 == 3)
      for (float& v : row) {
        v = std::round(v * 4.0f) / 4.0f;
        if (v == 0.0f) v = 0.125f;
      }
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

// The mix of the brief: greedy, temperatures, top-p, top-k 1 / 40 / 1000, each row its own seed
// and draw (some draws past 2^32).
std::vector<RowSamplingParams> mixed_params(int64_t rows, uint64_t seed) {
  const RowSamplingParams kinds[] = {
      params(0.0f, 1.0f, 0, 0, 0),   params(0.7f, 1.0f, 0, 0, 0),  params(1.3f, 1.0f, 0, 0, 0),
      params(0.7f, 0.9f, 0, 0, 0),   params(1.3f, 0.9f, 0, 0, 0),  params(1.0f, 1.0f, 1, 0, 0),
      params(0.7f, 1.0f, 40, 0, 0),  params(1.3f, 0.9f, 40, 0, 0), params(1.0f, 0.5f, 0, 0, 0),
      params(1.3f, 1.0f, 1000, 0, 0), params(0.7f, 0.9f, 40, 0, 0), params(2.0f, 0.95f, 0, 0, 0)};
  const int64_t n = static_cast<int64_t>(sizeof(kinds) / sizeof(kinds[0]));
  std::vector<RowSamplingParams> out;
  for (int64_t r = 0; r < rows; ++r) {
    RowSamplingParams p = kinds[(r * 5) % n];
    p.seed = seed * 7919 + static_cast<uint64_t>(r) * 104729 + 1;
    p.draw = r % 5 == 4 ? (int64_t{1} << 33) + r : r * 37;
    out.push_back(p);
  }
  return out;
}

int32_t host_argmax(const float* row, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}

TEST(CudaRowSampling, MatchesTheReferenceExceptAtNearTies) {
  LLMQ_REQUIRE_GPU();
  const int64_t kRows = 64;
  int64_t sampled = 0, agreed = 0;
  for (int64_t vocab : {int64_t{1000}, int64_t{32000}, int64_t{151936}, int64_t{202048}}) {
    const uint64_t seed = static_cast<uint64_t>(vocab);
    const std::vector<float> logits = make_logits(kRows, vocab, seed);
    const std::vector<RowSamplingParams> ps = mixed_params(kRows, seed);
    std::vector<int32_t> tokens;
    run_device(logits, vocab, ps, &tokens);
    if (HasFatalFailure()) return;
    for (int64_t r = 0; r < kRows; ++r) {
      const float* row = logits.data() + r * vocab;
      SCOPED_TRACE(testing::repro(seed, r, vocab, describe(ps[r]) + (r % 4 == 3 ? " (0.25 grid)" : "")));
      const RowSamplingTrace ref = runtime::trace_row_sampling(row, vocab, ps[r]);
      if (ref.greedy) {  // 1: greedy and top_k = 1 rows: the argmax exactly
        EXPECT_EQ(tokens[r], host_argmax(row, vocab));
        EXPECT_EQ(tokens[r], ref.token);
        continue;
      }
      ++sampled;
      ASSERT_GE(tokens[r], 0);
      ASSERT_LT(tokens[r], vocab);
      if (tokens[r] == ref.token) {
        ++agreed;
        continue;
      }
      // 2: a differing row must be a near-tie, and the device's token must be one the reference keeps.
      EXPECT_TRUE(ref.draw_margin < kNearTie || ref.nucleus_margin < kNearTie)
          << "device " << tokens[r] << ", reference " << ref.token << ", draw margin " << ref.draw_margin
          << ", nucleus margin " << ref.nucleus_margin;
      EXPECT_TRUE(std::binary_search(ref.kept.begin(), ref.kept.end(), tokens[r]) || ref.nucleus_margin < kNearTie)
          << "device token " << tokens[r] << " is outside the reference's kept set";
    }
  }
  ASSERT_GT(sampled, 0);
  EXPECT_GE(static_cast<double>(agreed), kMinAgreement * static_cast<double>(sampled))
      << agreed << " of " << sampled << " sampled rows agree with the reference";
  std::printf("[ INFO     ] %lld of %lld sampled rows drew the reference's token\n", static_cast<long long>(agreed),
              static_cast<long long>(sampled));
}

TEST(CudaRowSampling, TopKOneAndGreedyAreTheArgmaxWithTiesToTheLowestId) {
  LLMQ_REQUIRE_GPU();
  const int64_t vocab = 151936, rows = 6;
  std::vector<float> logits = make_logits(rows, vocab, 3);
  // Rows 0-2: the maximum tied at three ids; rows 3-5 as drawn.
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i : {int64_t{70000}, int64_t{150000}, int64_t{5 + r}}) logits[r * vocab + i] = 40.0f;
  std::vector<RowSamplingParams> ps;
  for (int64_t r = 0; r < rows; ++r)
    ps.push_back(r % 2 == 0 ? params(0.0f, 1.0f, 0, 3, r) : params(1.5f, 0.9f, 1, 3 + static_cast<uint64_t>(r), r));
  std::vector<int32_t> tokens;
  run_device(logits, vocab, ps, &tokens);
  if (HasFatalFailure()) return;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(tokens[r], host_argmax(logits.data() + r * vocab, vocab)) << "row " << r;
    if (r < 3) EXPECT_EQ(tokens[r], 5 + r) << "row " << r;
  }
}

TEST(CudaRowSampling, ARowsTokenDependsOnItsRowAndParametersOnly) {
  LLMQ_REQUIRE_GPU();
  const int64_t vocab = 32000, rows = 48;
  const std::vector<float> logits = make_logits(rows, vocab, 21);
  const std::vector<RowSamplingParams> ps = mixed_params(rows, 21);
  std::vector<int32_t> first, again;
  run_device(logits, vocab, ps, &first);
  if (HasFatalFailure()) return;
  run_device(logits, vocab, ps, &again);
  if (HasFatalFailure()) return;
  EXPECT_EQ(first, again) << "two runs of the same batch";

  // The batch permuted, and padded with other rows (other logits, other parameters) around it.
  std::vector<int64_t> perm(rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(4));
  const std::vector<float> others = make_logits(rows, vocab, 99);
  const std::vector<RowSamplingParams> other_ps = mixed_params(rows, 99);
  std::vector<float> mixed_logits;
  std::vector<RowSamplingParams> mixed;
  std::vector<int64_t> where(rows);
  for (int64_t j = 0; j < rows; ++j) {
    mixed_logits.insert(mixed_logits.end(), others.begin() + j * vocab, others.begin() + (j + 1) * vocab);
    mixed.push_back(other_ps[j]);
    where[perm[j]] = static_cast<int64_t>(mixed.size());
    mixed_logits.insert(mixed_logits.end(), logits.begin() + perm[j] * vocab, logits.begin() + (perm[j] + 1) * vocab);
    mixed.push_back(ps[perm[j]]);
  }
  std::vector<int32_t> shuffled;
  run_device(mixed_logits, vocab, mixed, &shuffled);
  if (HasFatalFailure()) return;
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(shuffled[where[r]], first[r]) << "row " << r << ": " << describe(ps[r]);

  // Each row alone.
  for (int64_t r = 0; r < rows; r += 7) {
    std::vector<int32_t> alone;
    run_device(std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab), vocab, {ps[r]}, &alone);
    if (HasFatalFailure()) return;
    EXPECT_EQ(alone[0], first[r]) << "row " << r << " alone: " << describe(ps[r]);
  }
}

// A row is split over a cluster of CTAs while the batch is small (8 for 16 rows of 202048, 2 for
// 66, 1 for 216 on an H100/H200): the token must not change with the split.
TEST(CudaRowSampling, TheSplitOfARowOverCtasChangesNothing) {
  LLMQ_REQUIRE_GPU();
  const int64_t vocab = 202048, rows = 16;
  const std::vector<float> logits = make_logits(rows, vocab, 8);
  const std::vector<RowSamplingParams> ps = mixed_params(rows, 8);
  std::vector<int32_t> small;
  run_device(logits, vocab, ps, &small);
  if (HasFatalFailure()) return;
  for (int64_t padding : {int64_t{50}, int64_t{200}}) {
    std::vector<float> more = logits;
    std::vector<RowSamplingParams> more_ps = ps;
    const std::vector<float> pad = make_logits(padding, vocab, 9);
    more.insert(more.end(), pad.begin(), pad.end());
    const std::vector<RowSamplingParams> pad_ps = mixed_params(padding, 9);
    more_ps.insert(more_ps.end(), pad_ps.begin(), pad_ps.end());
    std::vector<int32_t> big;
    run_device(more, vocab, more_ps, &big);
    if (HasFatalFailure()) return;
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(big[r], small[r]) << "row " << r << " in a batch of " << rows + padding << ": " << describe(ps[r]);
  }
}

// The unusable-row flag sampling sets as it reads the logits (flag_unusable_rows' test): set by a
// row with a NaN, an Inf, or one value throughout, among the first *valid_rows; not by the other
// rows, nor by a constant row past *valid_rows (a graph's padding row); and the tokens are those
// of the same call without the flag. At a small batch (teams of CTAs on sm_90) and a large one.
TEST(CudaRowSampling, FlagsUnusableRowsInTheSamePass) {
  LLMQ_REQUIRE_GPU();
  for (const int64_t rows : {int64_t{6}, int64_t{160}}) {
    const int64_t vocab = 32000;
    const std::vector<RowSamplingParams> ps = mixed_params(rows, 9);
    const std::vector<float> clean = make_logits(rows, vocab, 9);
    std::vector<int32_t> want;
    run_device(clean, vocab, ps, &want);
    if (HasFatalFailure()) return;
    struct Case {
      const char* what;
      int64_t row;     // the row spoiled, -1 none
      int kind;        // 0 NaN, 1 +Inf, 2 constant
      int32_t valid;   // *valid_rows
      int32_t flag;    // expected
    };
    const Case cases[] = {{"clean", -1, 0, static_cast<int32_t>(rows), 0},
                          {"NaN in the last slice", 1, 0, static_cast<int32_t>(rows), 1},
                          {"+Inf", 2, 1, static_cast<int32_t>(rows), 1},
                          {"constant row", 3, 2, static_cast<int32_t>(rows), 1},
                          {"constant padding row", rows - 1, 2, static_cast<int32_t>(rows - 1), 0}};
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.what) + " rows=" + std::to_string(rows));
      std::vector<float> logits = clean;
      if (c.row >= 0) {
        float* r = logits.data() + c.row * vocab;
        if (c.kind == 0) r[vocab - 3] = std::numeric_limits<float>::quiet_NaN();
        if (c.kind == 1) r[vocab / 2] = std::numeric_limits<float>::infinity();
        if (c.kind == 2) std::fill(r, r + vocab, 0.75f);
      }
      DeviceBuffer<float> d_logits(logits.size());
      DeviceBuffer<RowSamplingParams> d_params(ps.size());
      DeviceBuffer<int32_t> d_tokens(ps.size()), d_flag(1), d_valid(1);
      ASSERT_TRUE(d_logits.ok() && d_params.ok() && d_tokens.ok() && d_flag.ok() && d_valid.ok());
      CUDA_ASSERT(d_logits.upload(logits));
      CUDA_ASSERT(d_params.upload(ps));
      CUDA_ASSERT(d_flag.fill_bytes(0));
      CUDA_ASSERT(d_valid.upload(std::vector<int32_t>{c.valid}));
      const Status st = runtime::sample_rows_each(d_logits.get(), rows, vocab, d_params.get(), d_tokens.get(), nullptr, 0,
                                                  nullptr, d_flag.get(), d_valid.get());
      ASSERT_TRUE(st.ok()) << st.to_string();
      CUDA_ASSERT(cudaDeviceSynchronize());
      std::vector<int32_t> flag, tokens;
      CUDA_ASSERT(d_flag.download(&flag));
      CUDA_ASSERT(d_tokens.download(&tokens));
      EXPECT_EQ(flag[0], c.flag);
      if (c.row < 0) EXPECT_EQ(tokens, want) << "the flag changed the tokens";
      for (int64_t r = 0; r < rows; ++r)
        if (r != c.row) EXPECT_EQ(tokens[static_cast<size_t>(r)], want[static_cast<size_t>(r)]) << "row " << r;
    }
  }
}

TEST(CudaRowSampling, ReplaysInACudaGraph) {
  LLMQ_REQUIRE_GPU();
  const int64_t vocab = 151936, rows = 32;
  const std::vector<float> logits = make_logits(rows, vocab, 5);
  const std::vector<RowSamplingParams> ps = mixed_params(rows, 5);
  std::vector<int32_t> eager;
  run_device(logits, vocab, ps, &eager);
  if (HasFatalFailure()) return;
  DeviceBuffer<float> d_logits(logits.size());
  DeviceBuffer<RowSamplingParams> d_params(ps.size());
  DeviceBuffer<int32_t> d_tokens(ps.size());
  CUDA_ASSERT(d_logits.upload(logits));
  CUDA_ASSERT(d_params.upload(ps));
  CUDA_ASSERT(d_tokens.fill_bytes(0xFF));
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status st = runtime::sample_rows_each(d_logits.get(), rows, vocab, d_params.get(), d_tokens.get(), nullptr, 0, stream);
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.ok()) << st.to_string();
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    CUDA_ASSERT(d_tokens.fill_bytes(0xFF));
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    std::vector<int32_t> replayed;
    CUDA_ASSERT(d_tokens.download(&replayed));
    EXPECT_EQ(replayed, eager) << "replay " << replay;
  }
  // How long a step's sampling takes (reported, not checked): the graph replayed 20 times.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 20.0;
  std::printf("[ INFO     ] %lld rows x %lld vocab (mixed parameters): %.1f us a call\n", static_cast<long long>(rows),
              static_cast<long long>(vocab), us);
  CUDA_ASSERT(cudaGraphExecDestroy(exec));
  CUDA_ASSERT(cudaGraphDestroy(graph));
  CUDA_ASSERT(cudaStreamDestroy(stream));
}

TEST(CudaRowSampling, TwentyThousandDrawsFollowTheRenormalisedDistribution) {
  LLMQ_REQUIRE_GPU();
  const int64_t vocab = 50, draws = 20000;
  const std::vector<float> row = testing::normal_vector(vocab, 11, 1.5f);
  std::vector<float> logits;
  for (int64_t d = 0; d < draws; ++d) logits.insert(logits.end(), row.begin(), row.end());
  const RowSamplingParams cases[] = {params(0.8f, 0.9f, 20, 77, 0), params(1.3f, 1.0f, 0, 78, 0),
                                     params(1.0f, 0.6f, 0, 79, 0), params(0.7f, 1.0f, 7, 80, 0),
                                     params(1.2f, 0.8f, 10, 81, 0)};
  for (const RowSamplingParams& base : cases) {
    SCOPED_TRACE(describe(base));
    std::vector<RowSamplingParams> ps(static_cast<size_t>(draws), base);
    for (int64_t d = 0; d < draws; ++d) ps[d].draw = d;
    std::vector<int32_t> tokens;
    run_device(logits, vocab, ps, &tokens);
    if (HasFatalFailure()) return;
    const RowSamplingTrace exact = runtime::trace_row_sampling(row.data(), vocab, base);
    EXPECT_TRUE(testing::matches_distribution(tokens, exact, describe(base)));
    int64_t same = 0;
    for (int64_t d = 0; d < draws; ++d) same += tokens[d] == runtime::sample_row_reference(row.data(), vocab, ps[d]);
    EXPECT_GE(static_cast<double>(same), kMinAgreement * static_cast<double>(draws)) << same << " of " << draws;
  }
}

TEST(CudaRowSampling, NonFiniteLogits) {
  LLMQ_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t vocab = 4096;
  std::vector<std::vector<float>> rows;
  std::vector<float> r0 = testing::normal_vector(vocab, 1, 2.0f);  // NaN sprinkled, one at the top
  for (int64_t i = 0; i < vocab; i += 17) r0[i] = nan;
  r0[100] = nan;
  rows.push_back(r0);
  std::vector<float> r1 = testing::normal_vector(vocab, 2, 2.0f);  // two +Inf tokens share the mass
  r1[7] = inf;
  r1[3000] = inf;
  rows.push_back(r1);
  std::vector<float> r2 = testing::normal_vector(vocab, 3, 2.0f);  // -Inf tokens never drawn
  for (int64_t i = 0; i < vocab; i += 2) r2[i] = -inf;
  rows.push_back(r2);
  rows.push_back(std::vector<float>(vocab, nan));  // nothing to weigh: token 0
  const RowSamplingParams kinds[] = {params(0.0f, 1.0f, 0, 1, 0), params(1.0f, 1.0f, 0, 1, 0), params(1.3f, 0.9f, 0, 1, 0),
                                     params(0.8f, 1.0f, 40, 1, 0)};
  std::vector<float> logits;
  std::vector<RowSamplingParams> ps;
  for (size_t r = 0; r < rows.size(); ++r)
    for (const RowSamplingParams& k : kinds)
      for (int64_t d = 0; d < 16; ++d) {
        logits.insert(logits.end(), rows[r].begin(), rows[r].end());
        RowSamplingParams p = k;
        p.seed = 500 + r;
        p.draw = d;
        ps.push_back(p);
      }
  std::vector<int32_t> tokens;
  run_device(logits, vocab, ps, &tokens);
  if (HasFatalFailure()) return;
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float>& row = rows[i / (16 * 4)];
    SCOPED_TRACE("row kind " + std::to_string(i / 64) + ": " + describe(ps[i]));
    const RowSamplingTrace ref = runtime::trace_row_sampling(row.data(), vocab, ps[i]);
    EXPECT_FALSE(std::isnan(row[tokens[i]]) && i / 64 != 3) << "a NaN token drawn";
    if (i / 64 == 1 && !ref.greedy) EXPECT_TRUE(tokens[i] == 7 || tokens[i] == 3000) << tokens[i];
    if (i / 64 == 2) EXPECT_NE(row[tokens[i]], -inf);
    if (i / 64 == 3) EXPECT_EQ(tokens[i], 0);
    if (ref.greedy || (ref.draw_margin >= kNearTie && ref.nucleus_margin >= kNearTie)) EXPECT_EQ(tokens[i], ref.token);
  }
}

TEST(CudaRowSampling, RefusesBadArguments) {
  const Status rows = runtime::sample_rows_each(nullptr, -1, 10, nullptr, nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(rows.code(), StatusCode::kInvalidArgument) << rows.to_string();
  const Status vocab = runtime::sample_rows_each(nullptr, 1, 0, nullptr, nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(vocab.code(), StatusCode::kInvalidArgument) << vocab.to_string();
  const Status huge = runtime::sample_rows_each(nullptr, 1, int64_t{1} << 31, nullptr, nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(huge.code(), StatusCode::kInvalidArgument) << huge.to_string();
  const Status null = runtime::sample_rows_each(nullptr, 1, 10, nullptr, nullptr, nullptr, 0, nullptr);
  EXPECT_EQ(null.code(), StatusCode::kInvalidArgument) << null.to_string();
  EXPECT_TRUE(runtime::sample_rows_each(nullptr, 0, 10, nullptr, nullptr, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace llmq
