// Seeded synthetic activations and weights (see llmq/synthetic.hpp). std::mt19937_64 and the
// Box-Muller transform written out, so the numbers are the same with every standard library.
#include "llmq/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace llmq {
namespace {

class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  double uniform() { return (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  double next() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

std::vector<float> synthetic_activations(int64_t rows, int64_t cols, uint64_t seed,
                                         const SyntheticOptions& options) {
  Normal channels(options.channel_seed);
  std::vector<double> channel_gain(static_cast<size_t>(cols), 1.0);
  for (auto& gain : channel_gain)
    if (channels.uniform() < options.outlier_fraction) gain = options.outlier_gain * (0.5 + channels.uniform());
  Normal g(seed);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const double token_gain = std::exp(0.3 * g.next());  // log-normal spread across tokens
    for (int64_t c = 0; c < cols; ++c) {
      double v = g.next() * token_gain * channel_gain[static_cast<size_t>(c)];
      if (g.uniform() < options.spike_probability) v *= options.spike_gain;
      x[static_cast<size_t>(r * cols + c)] = static_cast<float>(v);
    }
  }
  return x;
}

std::vector<float> synthetic_weights(int64_t rows, int64_t cols, uint64_t seed) {
  Normal g(seed ^ 0x5eedULL);
  const double sigma = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(cols, 1)));
  std::vector<double> channel_gain(static_cast<size_t>(cols), 1.0);
  for (auto& gain : channel_gain)
    if (g.uniform() < 0.005) gain = 4.0;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      w[static_cast<size_t>(r * cols + c)] = static_cast<float>(g.next() * sigma * channel_gain[static_cast<size_t>(c)]);
  return w;
}

}  // namespace llmq
