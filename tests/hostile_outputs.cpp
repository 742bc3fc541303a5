// The hostile-input suite (issue 21), part 3: nothing lost. An output path may replace only a
// previous llmq output of its kind, never an input, a file inside an input, a directory holding
// one, or something llmq did not make; staging never follows a planted symbolic link; an input
// error leaves no staging behind. Every writing command: quantize, calibrate, logits,
// make-checkpoint. The harness checks every byte of the case directory (planted links' targets
// included) before and after each run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "hostile_support.hpp"

namespace llmq::hostile {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> quantize(const std::string& model, const std::string& out, bool force = true) {
  std::vector<std::string> a = {"quantize", "--model", model, "--scheme", "fp8-dynamic", "-o", out};
  if (force) a.push_back("--force");
  return a;
}

std::vector<std::string> calibrate(const std::string& model, const std::string& out) {
  return {"calibrate", "--model", model, "--samples", "1", "--length", "8", "-o", out};
}

std::vector<std::string> logits(const std::string& model, const std::string& out) {
  return {"logits", "--model", model, "--ids", "1 5 9", "-o", out, "--force"};
}

// A directory of the user's own: never replaced.
void user_dir(Case& c, const std::string& rel) {
  fs::create_directories(c.path(rel));
  write_bytes(c.path(rel + "/notes.txt"), "the user's own notes\n");
}

// ---- quantize

TEST(HostileOutput, QuantizeForceOntoTheInputWeightsFile) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(quantize("m", "m/model.safetensors"), {"model.safetensors", "input"});
}

TEST(HostileOutput, QuantizeForceOntoTheInputDirectory) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(quantize("m", "m"), {"input"});
}

TEST(HostileOutput, QuantizeForceOntoTheInputDirectorySpelledWithDot) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(quantize("m", "m/."), {"input"});
}

TEST(HostileOutput, QuantizeForceOntoTheParentOfTheInput) {
  Case c;
  c.add(Base::kHf, "p/m");
  c.refused(quantize("p/m", "p"), {"input"});
}

TEST(HostileOutput, QuantizeForceOntoTheWorkingDirectory) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(quantize("m", "."), {"input"});
}

TEST(HostileOutput, QuantizeForceOntoASymlinkToTheInput) {
  Case c;
  c.add(Base::kHf, "m");
  ASSERT_EQ(::symlink("m", c.path("link").c_str()), 0);
  c.refused(quantize("m", "link"), {"input|link|symbolic"});
}

TEST(HostileOutput, QuantizeForceOntoTheLlama2cInputFile) {
  Case c;
  c.add(Base::kLlama2c, "model.bin");
  c.refused(quantize("model.bin", "model.bin"), {"model.bin", "input"});
}

TEST(HostileOutput, QuantizeForceOntoTheDirectoryHoldingTheLlama2cInput) {
  Case c;
  c.add(Base::kLlama2c, "p/model.bin");
  c.refused(quantize("p/model.bin", "p"), {"input"});
}

TEST(HostileOutput, QuantizeForceOntoTheStatsInput) {
  Case c;
  c.add(Base::kHf, "m");
  c.add(Base::kStats, "s.json");
  c.refused({"quantize", "--model", "m", "--scheme", "fp8-tensor-static", "--stats", "s.json", "-o", "s.json", "--force"},
            {"s.json"});
}

TEST(HostileOutput, QuantizeForceOntoAUserDirectory) {
  Case c;
  c.add(Base::kHf, "m");
  user_dir(c, "user");
  c.refused(quantize("m", "user"), {"user"});
}

TEST(HostileOutput, QuantizeForceOntoAUserFile) {
  Case c;
  c.add(Base::kHf, "m");
  write_bytes(c.path("out"), "not a checkpoint\n");
  c.refused(quantize("m", "out"), {"out"});
}

TEST(HostileOutput, QuantizeWithoutForceOntoAPreviousOutput) {
  Case c;
  c.add(Base::kHf, "m");
  c.add(Base::kQuantized, "quant-out");
  c.refused(quantize("m", "quant-out", false), {"quant-out"});
}

// The control: --force does replace llmq's own previous output (the refusals above are not blanket).
TEST(HostileOutput, QuantizeForceReplacesAPreviousQuantizeOutput) {
  Case c;
  c.add(Base::kHf, "m");
  c.succeeds(quantize("m", "quant-out", false));
  c.allow_change("quant-out");
  c.succeeds({"quantize", "--model", "m", "--scheme", "int8-w8a8", "-o", "quant-out", "--force"});
}

// A <out>.llmq-partial planted as a symbolic link (in a shared /tmp, say): never followed; its
// target comes through unchanged.
struct Planted {
  const char* name;
  std::vector<std::string> flags;
  bool to_file;
};
void PrintTo(const Planted& p, std::ostream* os) { *os << p.name; }
class PlantedStaging : public ::testing::TestWithParam<Planted> {};
TEST_P(PlantedStaging, SymlinkIsRefusedAndItsTargetKept) {
  Case c;
  c.add(Base::kHf, "m");
  if (GetParam().to_file) {
    write_bytes(c.path("victim.txt"), "precious\n");
    ASSERT_EQ(::symlink("victim.txt", c.path("quant-out.llmq-partial").c_str()), 0);
  } else {
    user_dir(c, "victim");
    ASSERT_EQ(::symlink("victim", c.path("quant-out.llmq-partial").c_str()), 0);
  }
  std::vector<std::string> args = quantize("m", "quant-out", false);
  args.insert(args.end(), GetParam().flags.begin(), GetParam().flags.end());
  c.refused(args, {"llmq-partial", "symbolic link|symlink"});
}
INSTANTIATE_TEST_SUITE_P(Hostile, PlantedStaging,
                         ::testing::Values(Planted{"ToDirectory", {}, false}, Planted{"ToDirectoryForce", {"--force"}, false},
                                           Planted{"ToDirectoryResume", {"--resume"}, false},
                                           Planted{"ToFileForce", {"--force"}, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// A real directory there that llmq did not make (no progress manifest): the user's, refused untouched.
TEST(HostileOutput, PlantedStagingDirectoryWithoutManifestIsKept) {
  Case c;
  c.add(Base::kHf, "m");
  user_dir(c, "quant-out.llmq-partial");
  c.refused(quantize("m", "quant-out"), {"llmq-partial"});
}

// ---- calibrate

TEST(HostileOutput, CalibrateOntoTheModelWeights) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(calibrate("m", "m/model.safetensors"), {"model.safetensors", "input"});
}

TEST(HostileOutput, CalibrateOntoTheModelConfig) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(calibrate("m", "m/config.json"), {"config.json", "input"});
}

TEST(HostileOutput, CalibrateOntoTheModelDirectory) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(calibrate("m", "m"), {"input|directory"});
}

TEST(HostileOutput, CalibrateOntoTheLlama2cInputFile) {
  Case c;
  c.add(Base::kLlama2c, "model.bin");
  c.refused(calibrate("model.bin", "model.bin"), {"model.bin", "input"});
}

TEST(HostileOutput, CalibrateOntoItsDataFile) {
  Case c;
  c.add(Base::kHf, "m");
  c.add(Base::kData, "d.txt");
  c.refused({"calibrate", "--model", "m", "--data", "d.txt", "-o", "d.txt"}, {"d.txt", "input"});
}

TEST(HostileOutput, CalibrateOntoAUserFile) {
  Case c;
  c.add(Base::kHf, "m");
  write_bytes(c.path("notes.json"), "{\"mine\": true}\n");
  c.refused(calibrate("m", "notes.json"), {"notes.json"});
}

TEST(HostileOutput, CalibrateOntoASymlinkToTheWeights) {
  Case c;
  c.add(Base::kHf, "m");
  ASSERT_EQ(::symlink("m/model.safetensors", c.path("stats.json").c_str()), 0);
  c.refused(calibrate("m", "stats.json"), {"stats.json"});
}

// The control: a previous statistics file of llmq's is replaced.
TEST(HostileOutput, CalibrateReplacesItsPreviousStatistics) {
  Case c;
  c.add(Base::kHf, "m");
  c.add(Base::kStats, "s.json");
  c.allow_change("s.json");
  c.succeeds(calibrate("m", "s.json"));
}

// ---- logits

TEST(HostileOutput, LogitsForceOntoTheModelWeights) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(logits("m", "m/model.safetensors"), {"model.safetensors", "input"});
}

TEST(HostileOutput, LogitsForceOntoTheModelConfig) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(logits("m", "m/config.json"), {"config.json", "input"});
}

TEST(HostileOutput, LogitsForceOntoTheModelDirectory) {
  Case c;
  c.add(Base::kHf, "m");
  c.refused(logits("m", "m"), {"input|directory"});
}

TEST(HostileOutput, LogitsForceOntoTheLlama2cInputFile) {
  Case c;
  c.add(Base::kLlama2c, "model.bin");
  c.refused(logits("model.bin", "model.bin"), {"model.bin", "input"});
}

TEST(HostileOutput, LogitsForceOntoTheQuantizedInputWeights) {
  Case c;
  c.add(Base::kQuantized, "q");
  c.refused({"logits", "--quantized", "q", "--ids", "1 5 9", "-o", "q/model.safetensors", "--force"},
            {"model.safetensors", "input"});
}

TEST(HostileOutput, LogitsForceOntoTheStatsInput) {
  Case c;
  c.add(Base::kHf, "m");
  c.add(Base::kStats, "s.json");
  c.refused({"logits", "--model", "m", "--scheme", "fp8-tensor-static", "--stats", "s.json", "--ids", "1 5 9", "-o",
             "s.json", "--force"},
            {"s.json", "input"});
}

TEST(HostileOutput, LogitsWithoutForceOntoAUserFile) {
  Case c;
  c.add(Base::kHf, "m");
  write_bytes(c.path("mine.bin"), "user data\n");
  c.refused({"logits", "--model", "m", "--ids", "1 5 9", "-o", "mine.bin"}, {"mine.bin"});
}

// The control: --force replaces a previous raw logits file.
TEST(HostileOutput, LogitsForceReplacesAPreviousLogitsFile) {
  Case c;
  c.add(Base::kHf, "m");
  c.succeeds(logits("m", "l.bin"));
  c.allow_change("l.bin");
  c.succeeds({"logits", "--model", "m", "--ids", "1 7 9 11", "-o", "l.bin", "--force"});
}

// ---- make-checkpoint

TEST(HostileOutput, MakeCheckpointOverAUserDirectory) {
  Case c;
  user_dir(c, "user");
  c.refused({"make-checkpoint", "--shape", "tiny", "--layers", "1", "-o", "user"}, {"user"});
}

TEST(HostileOutput, MakeCheckpointOverAUserCheckpoint) {
  Case c;
  c.add(Base::kHf, "m");
  fs::remove(c.path("m/.llmq-output"));  // as if the user's own (downloaded) checkpoint
  c.refused({"make-checkpoint", "--shape", "tiny", "--layers", "1", "-o", "m"}, {"m"});
}

TEST(HostileOutput, MakeCheckpointOverAUserFile) {
  Case c;
  write_bytes(c.path("user.txt"), "mine\n");
  c.refused({"make-checkpoint", "--shape", "tiny", "--layers", "1", "-o", "user.txt"}, {"user.txt"});
}

TEST(HostileOutput, MakeCheckpointInsideAFile) {
  Case c;
  write_bytes(c.path("user.txt"), "mine\n");
  c.refused({"make-checkpoint", "--shape", "tiny", "--layers", "1", "-o", "user.txt/ckpt"}, {"user.txt"});
}

// ---- an input error after the arguments parse leaves no staging, no partial output

TEST(HostileOutput, QuantizeNaNInTheLastLayerLeavesNoStaging) {
  Case c;
  c.add(Base::kSharded, "m");
  // Poison the last shard's first tensor, after earlier shards (1 MiB each) are written.
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(c.path("m")))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  ASSERT_GE(shards.size(), 3u);
  StFile f = read_safetensors(shards.back());
  ASSERT_FALSE(f.tensors.empty());
  StTensor& t = f.tensors.front();
  ASSERT_EQ(t.dtype, "BF16");
  set_bf16(&t, static_cast<int64_t>(t.data.size() / 2 - 3), 0x7FC0);
  write_safetensors(shards.back(), f);
  for (const char* flag : {"--force", "--resume"})
    c.refused({"quantize", "--model", "m", "--scheme", "fp8-dynamic", "-o", "quant-out", "--shard-mb", "1", flag},
              {t.name, "NaN|finite"});
}

TEST(HostileOutput, QuantizeMissingTensorInTheLastShardLeavesNoStaging) {
  Case c;
  c.add(Base::kSharded, "m");
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(c.path("m")))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  ASSERT_GE(shards.size(), 3u);
  StFile f = read_safetensors(shards.back());
  ASSERT_FALSE(f.tensors.empty());
  const std::string gone = f.tensors.back().name;
  f.tensors.pop_back();
  write_safetensors(shards.back(), f);
  c.refused({"quantize", "--model", "m", "--scheme", "fp8-dynamic", "-o", "quant-out", "--shard-mb", "1"}, {gone});
}

TEST(HostileOutput, CalibrateInputErrorWritesNothing) {
  Case c;
  c.add(Base::kHf, "m");
  edit_config(c.path("m"), [](json& j) { j["num_hidden_layers"] = 1; });
  c.add(Base::kStats, "s.json");  // a previous output: must survive a failed run
  c.refused(calibrate("m", "s.json"), {"layers.1|layer 1"});
}

}  // namespace
}  // namespace llmq::hostile
