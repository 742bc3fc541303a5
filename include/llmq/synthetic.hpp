// Seeded synthetic tensors shaped like real LLM data: Gaussian bulk, a few outlier channels
// (x20..x60, as in LLM.int8() and SmoothQuant's observations), per-token magnitude spread and a
// heavy tail. Used by the CLI report and, later, the default model llmq generates itself.
#pragma once

#include <cstdint>
#include <vector>

namespace llmq {

struct SyntheticOptions {
  float outlier_fraction = 0.01f;  // fraction of columns that are outlier channels
  float outlier_gain = 40.0f;      // their typical magnitude relative to the bulk
  float spike_probability = 1e-3f; // isolated heavy-tail spikes
  float spike_gain = 8.0f;
  // Which columns are outlier channels is a property of the model, not of the batch: batches
  // drawn with different `seed`s share the channels chosen by `channel_seed`.
  uint64_t channel_seed = 0xC4A77E15ULL;
};

// Activations X [rows, cols]: rows are tokens, outlier channels are columns.
std::vector<float> synthetic_activations(int64_t rows, int64_t cols, uint64_t seed,
                                         const SyntheticOptions& options = {});
// Weights W [rows, cols] (out x in): N(0, 1/sqrt(cols)) with a few large input channels.
std::vector<float> synthetic_weights(int64_t rows, int64_t cols, uint64_t seed);

}  // namespace llmq
