// Shared by the whole-model quantization tests (test_model_quantize.cpp, test_calibration.cpp,
// test_evaluate.cpp, test_model_export.cpp): tolerances, small seeded models (dense and MoE, cached),
// calibration, and file helpers. Each test program includes it once (every test file is its own
// executable).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>
#include "llmq/calibration.hpp"
#include "llmq/evaluate.hpp"
#include "llmq/export.hpp"
#include "llmq/gemm.hpp"
#include "llmq/model.hpp"
#include "llmq/model_io.hpp"
#include "llmq/quantize_tensor.hpp"
#include "llmq/quantized_model.hpp"
#include "llmq/safetensors.hpp"
#include "llmq/scheme.hpp"
#include "llmq/transformer.hpp"
#include "support.hpp"

namespace llmq {
namespace {


namespace fs = std::filesystem;
using json = nlohmann::json;

// SmoothQuant rescales norm gains and weight columns: the float function is unchanged up to the
// rounding of x * (g / s) * (w * s) against x * g * w: max |diff| / max |logit|.
constexpr double kSmoothingRelTolerance = 1e-4;
// Factors computed here in double vs the library's (double math, float result).
constexpr double kSmoothFactorRelTolerance = 1e-6;
// On the default model's outlier channels (gains 20-50x), alpha = 0.5 must shrink the q input's
// largest smoothed channel by at least this factor.
constexpr double kMinOutlierReduction = 4.0;
// Mean KL(float || quantized) per scheme, as a fraction of KL(float || uniform) (2.0-3.7 nats on
// these models). Small models are far more sensitive than large trained ones: on the seeded default
// model +-1% uniform weight noise alone gives KL ~5e-3, and FP8 weight-only (whose backend equals
// the float model on dequantized weights) ~0.1; stories260K measures 0.33-0.55 for FP8 (3 mantissa
// bits) and ~0.04 for INT8 (measured fractions: FP8 <= 0.23, INT8 <= 0.08). A broken scale or
// layout gives KL of the order of the uniform one.
constexpr double kMaxKlFractionOfUniform = 0.3;
constexpr double kMaxInt8KlFractionOfUniform = 0.12;
// INT8 SmoothQuant vs plain INT8 W8A8 on the outlier-heavy default model: KL at least this much lower.
constexpr double kMinSmoothQuantInt8Gain = 3.0;
// ...and the argmax mostly survives (measured >= 0.54 over 48 tokens; a model that knows nothing: ~0).
constexpr double kMinSchemeTop1 = 0.35;
// The quantized model vs the float model on dequantized operands: only the GEMM's summation order
// differs (1e-7 per linear), but an activation that moves across an 8-bit rounding boundary changes
// the next layer's input (flips measured up to KL 9e-4 on the default models), so compare
// distributions, 20-100x below quantization's own KL; weight-only has no such boundary.
constexpr double kFakeQuantMaxKl = 5e-3;
constexpr double kWeightOnlyFakeQuantRelTolerance = 1e-4;
// A static scale recomputed here (absmax / 448 in double, rounded to float) vs the library's.
constexpr double kStaticScaleRelTolerance = 1e-6;
// stories260K's q/k rows are permuted to rotate-half on export (the exported checkpoint equals the
// permuted model quantized in memory bit for bit); against the llama2.c layout only the q.k sums are
// reordered, which can move an activation across an 8-bit rounding boundary (measured: KL <= 5e-4,
// logits <= 6% of the largest, fp8-mse the worst), so that comparison is of distributions.
constexpr double kPermutedRoundTripMaxKl = 1e-3;
constexpr double kPermutedRoundTripRelTolerance = 0.1;
// Float model through an HF directory of permuted q/k (no quantization): only summation order.
constexpr double kPermutedFloatRelTolerance = 1e-5;

constexpr int64_t kCalibrationSequences = 3;
constexpr int64_t kCalibrationLength = 40;
constexpr int64_t kEvalLength = 48;
constexpr uint64_t kCalibrationSeed = 101;
constexpr uint64_t kEvalSeed = 202;

std::string stories_path() { return testing::testdata_dir() + "/../models/stories260K.bin"; }
bool have_stories() { return std::ifstream(stories_path(), std::ios::binary).good(); }
std::string skip_reason() { return testing::test_data_absent(stories_path()); }

// dim 144 and hidden 136 are not multiples of 128: block schemes get partial edge blocks in both
// directions (136 = 128 + 8), and vocab 160 gives lm_head two row blocks.
DefaultModelOptions small_options(int64_t n_experts) {
  DefaultModelOptions o;
  o.dim = 144;
  o.hidden_dim = 136;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.vocab_size = 160;
  o.max_seq_len = 128;
  o.n_experts = n_experts;
  o.n_experts_per_token = 2;
  o.seed = 7;
  return o;
}
// The same models with every linear a whole number of 128x128 blocks (head_dim 64, 2 KV heads): what
// llmq exports in the fp8 block format (it refuses partial edge blocks; see export.cpp).
constexpr int64_t kAligned = -2, kAlignedMoe = -3;
DefaultModelOptions aligned_options(int64_t n_experts) {
  DefaultModelOptions o = small_options(n_experts);
  o.dim = 256;
  o.hidden_dim = 256;
  return o;
}
const char* kind_name(int64_t which) {
  switch (which) {
    case kAligned: return "dense, 128-aligned (aligned_options)";
    case kAlignedMoe: return "moe(4 experts, top-2), 128-aligned (aligned_options)";
    default: return which > 0 ? "moe(4 experts, top-2)" : "dense";
  }
}
bool is_block(const Scheme& s) { return s.weight.granularity == Granularity::kPerBlock; }
// Which small model a scheme is exported from: the block format needs the aligned ones.
int64_t exportable(const Scheme& s, int64_t experts) {
  if (!is_block(s) || experts < 0) return experts;
  return experts == 0 ? kAligned : kAlignedMoe;
}

// A temporary directory per test (tests/support.hpp), named after this suite.
class TempDir : public llmq::testing::TempDir {
 public:
  TempDir() : llmq::testing::TempDir("llmq_mq") {}
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// [BOS] + a sampled continuation: the kind of text the model itself produces. A sample ends early
// when the model samples BOS, so take the first of a few seeded samples that is long enough.
std::vector<int32_t> sampled_tokens(const ModelWeights& model, int64_t length, uint64_t seed) {
  constexpr int64_t kCandidates = 8;
  std::vector<std::vector<int32_t>> seqs;
  const Status st = sample_token_sequences(model, kCandidates, length, seed, &seqs);
  EXPECT_TRUE(st.ok()) << st.to_string();
  size_t pick = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].size() > seqs[pick].size()) pick = i;
    if (static_cast<int64_t>(seqs[i].size()) * 4 >= length * 3) {
      pick = i;
      break;
    }
  }
  std::vector<int32_t> t = {model.config.bos_token};
  if (!seqs.empty()) t.insert(t.end(), seqs[pick].begin(), seqs[pick].end());
  return t;
}

CalibrationStats calibrated(const ModelWeights& model) {
  CalibrationStats stats;
  for (int64_t i = 0; i < kCalibrationSequences; ++i) {
    const std::vector<int32_t> t = sampled_tokens(model, kCalibrationLength, kCalibrationSeed + static_cast<uint64_t>(i));
    const Status st = calibrate(model, t, static_cast<int64_t>(t.size()), &stats);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  return stats;
}

// The small models, their calibration and their quantized versions (default options) are built
// once per test binary and only read afterwards: fp8-mse's weight search alone takes about a second
// per model, and most tests need every scheme.
struct SmallModel {
  ModelWeights model;
  CalibrationStats stats;
  std::map<std::string, QuantizedModel> quantized;  // by scheme name
};
// experts >= 0: the seeded default model with that many experts; kStories: stories260K (the
// caller checks have_stories() first).
constexpr int64_t kStories = -1;
SmallModel& small_model(int64_t experts) {
  static std::map<int64_t, std::unique_ptr<SmallModel>> cache;
  std::unique_ptr<SmallModel>& slot = cache[experts];
  if (!slot) {
    slot = std::make_unique<SmallModel>();
    if (experts == kStories) {
      const Status st = load_llama2c(stories_path(), &slot->model);
      EXPECT_TRUE(st.ok()) << st.to_string();
    } else if (experts == kAligned || experts == kAlignedMoe) {
      slot->model = make_default_model(aligned_options(experts == kAligned ? 0 : 4));
    } else {
      slot->model = make_default_model(small_options(experts));
    }
    slot->stats = calibrated(slot->model);
  }
  return *slot;
}
const QuantizedModel& quantized(int64_t experts, const Scheme& scheme) {
  SmallModel& m = small_model(experts);
  auto it = m.quantized.find(scheme.name);
  if (it == m.quantized.end()) {
    QuantizedModel qm;
    const Status st = quantize_model(m.model, scheme, &m.stats, {}, &qm);
    EXPECT_TRUE(st.ok()) << "quantize_model " << scheme.name << ": " << st.to_string();
    it = m.quantized.emplace(scheme.name, std::move(qm)).first;
  }
  return it->second;
}

std::vector<float> logits_of(const ModelWeights& w, LinearBackend* backend, const std::vector<int32_t>& tokens) {
  Transformer t(w, backend);
  std::vector<float> out(tokens.size() * static_cast<size_t>(w.config.vocab_size), std::nanf(""));
  const Status st = t.forward(tokens.data(), static_cast<int64_t>(tokens.size()), 0, out.data());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// max |a - b| / max |b|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    s = std::max(s, std::fabs(static_cast<double>(b[i])));
  }
  return d / s;
}

EvalAccumulator::Summary compare(const std::vector<float>& base, const std::vector<float>& cand,
                                 const std::vector<int32_t>& tokens, int64_t vocab) {
  EvalAccumulator acc;
  for (size_t p = 0; p + 1 < tokens.size(); ++p) {
    const Status st = acc.add(base.data() + p * vocab, cand.data() + p * vocab, vocab, tokens[p + 1]);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  return acc.summarize();
}

std::map<std::string, const Linear*> linears_by_name(const ModelWeights& w) {
  std::map<std::string, const Linear*> m;
  for (const Linear* l : w.linears()) m[l->id.hf_name(w.config)] = l;
  return m;
}

std::vector<float> column_absmax_of(const Tensor& w) {
  const int64_t rows = w.shape()[0], cols = w.shape()[1];
  std::vector<float> m(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m[c] = std::max(m[c], std::fabs(w.data_as<float>()[r * cols + c]));
  return m;
}

// fp8-mse writes fp8-dynamic's layout; its weight search is the slowest step of this binary
// (seconds per model under ASan), so exports beyond the dense model's skip it.
bool slow_weight_search(const Scheme& s) {
  return s.weight.method == ScaleMethod::kMseSearch && s.weight.candidates == CandidateSet::kGrid;
}

bool is_static(const Scheme& s) { return s.quantize_activations && s.activation.source == ScaleSource::kStatic; }

std::string scheme_repro(const Scheme& s, int64_t n_experts) {
  return "REPRO scheme=" + s.name + " model=" + kind_name(n_experts) + " (seed 7)";
}

// =============================================================================================
// Schemes

}  // namespace
}  // namespace llmq
