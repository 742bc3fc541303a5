// First contact (issue 23): what a new user meets, run as the real binary. The demo's table and
// verdict, text in and out through the tokenizer, stopping at EOS, the seed a sampled run prints,
// readable eval and quantize output, --version, exit statuses, defaults in --help, one name per
// format.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>

#include "hostile_support.hpp"

namespace llmq::hostile {
namespace {

namespace fs = std::filesystem;

constexpr double kSlowTimeout = 300.0;  // the demo and eval run real (small) evaluations (the harness scales it)

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::vector<int32_t> ids_of(const std::string& text) {
  std::vector<int32_t> out;
  std::stringstream in(text);
  int32_t id;
  while (in >> id) out.push_back(id);
  return out;
}

// The rows of an accuracy table: lines after the header that start with "* " or "  " and a name,
// up to the blank line; (marked, name, mean KL).
struct TableRow {
  bool best = false;
  std::string name;
  double kl = 0;
};
std::vector<TableRow> table_rows(const std::string& out) {
  std::vector<TableRow> rows;
  bool in_table = false;
  for (const std::string& line : lines_of(out)) {
    if (line.find("mean KL") != std::string::npos && line.find("scheme") != std::string::npos) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty()) break;
    TableRow r;
    r.best = line.rfind("* ", 0) == 0;
    std::stringstream in(line.substr(2));
    in >> r.name >> r.kl;
    rows.push_back(r);
  }
  return rows;
}

void expect_sorted_with_one_best(const std::vector<TableRow>& rows, const std::string& out) {
  ASSERT_GE(rows.size(), 2u) << out;
  EXPECT_TRUE(rows[0].best) << out;
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_FALSE(rows[i].best) << out;
    EXPECT_LE(rows[i - 1].kl, rows[i].kl) << "rows are sorted by mean KL\n" << out;
  }
}

void expect_narrow(const std::string& out, size_t columns = 100) {
  for (const std::string& line : lines_of(out))
    EXPECT_LE(line.size(), columns) << "wider than " << columns << " columns: " << line;
}

// Whether this build has CUDA and sees a GPU: `llmq --version` says so.
bool have_gpu(Case& c) {
  const RunResult r = c.run({"--version"});
  return r.out.find("compute capability") != std::string::npos;
}

// A Hugging Face model directory with a byte-level BPE tokenizer beside its weights.
std::string model_with_tokenizer(Case& c) {
  const std::string dir = c.add(Base::kHf, "model");
  for (const auto& f : fs::directory_iterator(base_path(Base::kTokenizer)))
    fs::copy_file(f.path(), c.path(dir + "/" + f.path().filename().string()));
  return dir;
}

TEST(CliFirstContact, VersionExitStatusesAndDefaultsInHelp) {
  Case c;
  RunResult r = c.succeeds({"--version"});
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^llmq [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit [0-9a-f]+(-dirty)?\\)")) ||
              r.out.find("(commit unknown)") != std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("CUDA: "), std::string::npos) << r.out;
  r = c.run({"--no-such-flag"});
  EXPECT_EQ(r.code, 2) << "a wrong command line exits 2\n" << r.err;
  r = c.run({"run", "-n", "-3"});
  EXPECT_EQ(r.code, 2) << r.err;
  r = c.run({"run", "--model", "no-such-model.bin"});
  EXPECT_EQ(r.code, 2) << "a refused input exits 2\n" << r.err;
  const std::string unsupported = c.add(Base::kHf, "unsupported");
  edit_config(c.path(unsupported), [](json& j) { j["model_type"] = "gemma2"; });
  r = c.run({"run", "--model", unsupported, "-n", "4"});
  EXPECT_EQ(r.code, 1) << "a model llmq does not support exits 1\n" << r.err;
  r = c.succeeds({"run", "--help"});
  EXPECT_NE(r.out.find("=256"), std::string::npos) << "--steps' default is shown\n" << r.out;
  EXPECT_NE(r.out.find("=default"), std::string::npos) << "--model's default is shown\n" << r.out;
  r = c.succeeds({});
  EXPECT_NE(r.out.find("demo"), std::string::npos) << "llmq alone lists the commands\n" << r.out;
}

TEST(CliFirstContact, DemoPrintsOneSortedTableAVerdictAndWritesTheBestCheckpoint) {
  Case c;
  c.allow_change("out");
  // --llmq as scripts/run spells it: the suggested commands stay within 100 columns with it.
  const std::vector<std::string> args = {"demo", "-o", "out", "--samples", "2", "--device", "cpu", "--schemes",
                                         "fp8-tensor-dynamic,fp8-dynamic,int8-w8a8", "--llmq", "build/release/bin/llmq"};
  RunResult r = c.expect(Want::kSucceeds, args, {}, kSlowTimeout);
  const std::vector<TableRow> rows = table_rows(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;
  expect_sorted_with_one_best(rows, r.out);
  for (const char* column : {"mean KL", "top-1 %", "PPL ratio", "checkpoint"})
    EXPECT_NE(r.out.find(column), std::string::npos) << column << "\n" << r.out;
  EXPECT_NE(r.out.find("verdict: " + rows[0].name + ": the lowest mean KL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wrote out: the " + rows[0].name + " checkpoint"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(c.path("out/config.json"))) << r.out;
  for (const char* next : {"run --model", "eval --model", "quantize --model"})
    EXPECT_NE(r.out.find(next), std::string::npos) << "the next commands name " << next << "\n" << r.out;
  expect_narrow(r.out);
  // The checkpoint loads and runs; a second demo replaces its own output (the release build checks
  // that: under the sanitizers a second demo would take a minute to retake the same paths).
  c.succeeds({"run", "--model", "out", "--ids", "-n", "8", "-t", "0"});
  if (!kSanitized) c.expect(Want::kSucceeds, args, {}, kSlowTimeout);
}

TEST(CliFirstContact, EvalTableIsSortedNarrowExplainedAndTheSameForAnyThreadCount) {
  Case c;
  // Schemes that need no calibration (a calibration under ASan takes minutes).
  const std::vector<std::string> base = {"eval", "--scheme", "int8-w8a8,fp8-dynamic,fp8-tensor-dynamic",
                                         "--samples", "3", "--length", "24"};
  RunResult r = c.expect(Want::kSucceeds, base, {}, kSlowTimeout);
  expect_sorted_with_one_best(table_rows(r.out), r.out);
  expect_narrow(r.out);
  for (const char* note : {"mean KL ", "top-1 % ", "PPL ratio ", "one standard error"})
    EXPECT_NE(r.out.find(note), std::string::npos) << "the footer explains " << note << "\n" << r.out;
  // The thread-count comparison needs the same data on both sides, not much of it: under the
  // sanitizers (25 s an evaluation) it runs on 2 samples of 12 tokens.
  std::vector<std::string> one = base, three = base;
  if (kSanitized) {
    one = three = {"eval", "--scheme", "int8-w8a8,fp8-dynamic,fp8-tensor-dynamic", "--samples", "2", "--length", "12"};
  }
  one.insert(one.end(), {"--json", "--threads", "1"});
  three.insert(three.end(), {"--json", "--threads", "3"});
  const RunResult j1 = c.expect(Want::kSucceeds, one, {}, kSlowTimeout);
  const RunResult j3 = c.expect(Want::kSucceeds, three, {}, kSlowTimeout);
  EXPECT_EQ(j1.out, j3.out) << "threads change the speed, never the numbers";
  const json j = json::parse(j1.out);
  ASSERT_EQ(j["results"].size(), 3u);
  EXPECT_EQ(j["results"][0]["scheme"], "int8-w8a8") << "--json keeps the order given";
}

TEST(CliFirstContact, RunPromptRoundTripsTextAndStopsAtEos) {
  Case c;
  const std::string dir = model_with_tokenizer(c);
  const std::string prompt = "hello world, said the model";
  RunResult r = c.succeeds({"run", "--model", dir, "--prompt", prompt, "-t", "0", "-n", "48"});
  EXPECT_EQ(r.out.rfind(prompt, 0), 0u) << "the prompt comes back as it went in\n" << r.out;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;

  // The greedy continuation without EOS, then again with EOS set to its fourth new token.
  r = c.succeeds({"run", "--model", dir, "--prompt", prompt, "-t", "0", "-n", "48", "--ids", "--ignore-eos"});
  const std::vector<int32_t> free_run = ids_of(r.out);
  ASSERT_GE(free_run.size(), 4u) << r.out;
  const int32_t eos = free_run[3];
  edit_config(c.path(dir), [eos](json& j) { j["eos_token_id"] = eos; });
  r = c.succeeds({"run", "--model", dir, "--prompt", prompt, "-t", "0", "-n", "48", "--ids"});
  const std::vector<int32_t> stopped = ids_of(r.out);
  ASSERT_LT(stopped.size(), free_run.size()) << r.out << r.err;
  EXPECT_LE(stopped.size(), 3u) << "ends at the first EOS at the latest";
  EXPECT_TRUE(std::equal(stopped.begin(), stopped.end(), free_run.begin())) << r.out;
  EXPECT_NE(r.err.find("stopped at EOS (token " + std::to_string(free_run[stopped.size()]) + ")"), std::string::npos)
      << r.err;
}

TEST(CliFirstContact, SamplingWithoutASeedPrintsOneThatRepeatsIt) {
  Case c;
  RunResult r = c.succeeds({"run", "-t", "1", "-n", "24"});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("sampling with seed ([0-9]+)"))) << r.err;
  const std::string seed = m[1].str();
  EXPECT_GE(ids_of(r.out).size(), 1u) << r.out;
  const RunResult again = c.succeeds({"run", "-t", "1", "-n", "24", "--seed", seed});
  EXPECT_EQ(again.out, r.out);
  const RunResult other = c.succeeds({"run", "-t", "1", "-n", "24"});
  ASSERT_TRUE(std::regex_search(other.err, m, std::regex("sampling with seed ([0-9]+)"))) << other.err;
  EXPECT_NE(m[1].str(), seed) << "a new random seed each run";
}

TEST(CliFirstContact, APromptLongerThanTheStepsIsRefused) {
  Case c;
  const RunResult r = c.run({"run", "--prompt-ids", "5 6 7 8 9", "-n", "4", "-t", "0"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--steps: 4 positions do not hold the 6-token prompt"), std::string::npos) << r.err;
}

// --fp8-fast-accum is a GPU GEMM option: on the CPU it is refused by name, never ignored.
TEST(CliFirstContact, FastAccumulationOnTheCpuIsRefusedByName) {
  Case c;
  const std::vector<std::vector<std::string>> commands = {
      {"eval", "--model", "default", "--samples", "1", "--length", "8", "--fp8-fast-accum"},
      {"bench", "serve", "--model", "default", "--device", "cpu", "--requests", "1", "--fp8-fast-accum"},
      {"run", "--model", "default", "-n", "4", "--fp8-fast-accum"},
      {"serve", "--model", "default", "--port", "0", "--fp8-fast-accum"}};
  for (const auto& args : commands) {
    const RunResult r = c.run(args);
    EXPECT_EQ(r.code, 2) << args[0] << ": " << r.err;
    EXPECT_NE(r.err.find("--fp8-fast-accum: a GPU GEMM option (--device cuda)"), std::string::npos) << args[0] << ": " << r.err;
  }
}

// A Hugging Face config without bos_token_id says the model has no BOS: `llmq run --prompt-ids`
// prepends nothing (the same context as the model that has BOS 1 given "1 5 6") and generation does
// not stop on token 1.
TEST(CliFirstContact, AModelWithoutBosGetsNoTokenOnePrepended) {
  Case c;
  const std::string with = c.add(Base::kHf, "with");
  const std::string without = c.add(Base::kHf, "without");
  edit_config(c.path(with), [](json& j) { j["bos_token_id"] = 1; });
  edit_config(c.path(without), [](json& j) { j.erase("bos_token_id"); });
  const RunResult a = c.succeeds({"run", "--model", with, "--prompt-ids", "5 6", "-n", "10", "-t", "0", "--ids"});
  const RunResult b = c.succeeds({"run", "--model", without, "--prompt-ids", "1 5 6", "-n", "10", "-t", "0", "--ids"});
  const std::vector<int32_t> ia = ids_of(a.out), ib = ids_of(b.out);
  ASSERT_FALSE(ia.empty()) << a.out << a.err;
  // The same greedy tokens, up to where the model with BOS stops at token 1 (run.c's rule).
  ASSERT_LE(ia.size(), ib.size());
  EXPECT_TRUE(std::equal(ia.begin(), ia.end(), ib.begin())) << a.out << "\n" << b.out;
  // No prompt: a text starts after the model's EOS (its documents' separator); a model with neither
  // BOS nor EOS is refused, naming what to give.
  c.succeeds({"run", "--model", without, "-n", "4", "-t", "0", "--ids"});
  // eval samples its text after EOS too, and scores every sampled token.
  const RunResult ev =
      c.succeeds({"eval", "--model", without, "--scheme", "fp8-dynamic", "--samples", "2", "--length", "8", "--json"});
  EXPECT_EQ(json::parse(ev.out).at("tokens").get<int64_t>(), 16) << ev.out;
  edit_config(c.path(without), [](json& j) { j.erase("eos_token_id"); });
  const RunResult r = c.run({"run", "--model", without, "-n", "4", "-t", "0"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("give --prompt or --prompt-ids"), std::string::npos) << r.err;
  // calibrate --data: a sequence that begins with BOS is not given a second one.
  write_bytes(c.path("ids.txt"), "1 5 6 7\n5 6\n");
  c.allow_change("s.json");
  c.succeeds({"calibrate", "--model", with, "--data", c.path("ids.txt"), "-o", c.path("s.json")});
  EXPECT_EQ(json::parse(read_bytes(c.path("s.json"))).at("tokens").get<int64_t>(), 4 + 3);
}

// On a GPU machine: the demo's speed column, and EOS past the first 64-token chunk of greedy
// decoding on the device.
TEST(CliFirstContact, OnTheGpuTheDemoTimesDecodeAndRunStopsAtEos) {
  Case c;
  if (!have_gpu(c)) GTEST_SKIP() << "no CUDA GPU on this machine";
  c.allow_change("out");
  RunResult r = c.expect(Want::kSucceeds,
                         {"demo", "-o", "out", "--samples", "2", "--device", "cuda", "--schemes", "fp8-dynamic,int8-w8a8"},
                         {}, kSlowTimeout);
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("x BF16's speed"), std::string::npos) << r.out;
  expect_narrow(r.out);
  const std::string dir = model_with_tokenizer(c);
  const std::vector<std::string> base = {"run", "--device", "cuda", "--precision", "f32", "--model", dir,
                                         "--prompt", "hello", "-t", "0", "-n", "120", "--ids"};
  std::vector<std::string> free_args = base;
  free_args.push_back("--ignore-eos");
  r = c.succeeds(free_args);
  const std::vector<int32_t> free_run = ids_of(r.out);
  ASSERT_GE(free_run.size(), 80u) << r.out << r.err;
  size_t k = 70;  // the first token past the first chunk that did not come earlier
  while (k < free_run.size() && std::find(free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(k),
                                          free_run[k]) != free_run.begin() + static_cast<std::ptrdiff_t>(k))
    ++k;
  if (k == free_run.size()) GTEST_SKIP() << "every late token repeats an earlier one";
  const int32_t eos = free_run[k];
  edit_config(c.path(dir), [eos](json& j) { j["eos_token_id"] = eos; });
  r = c.succeeds(base);
  const std::vector<int32_t> stopped = ids_of(r.out);
  // The first EOS: config.json's, or the tokenizer's own "</s>" (511), whichever comes first.
  size_t end = 0;
  while (end < k && free_run[end] != 511) ++end;
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), free_run.begin() + static_cast<std::ptrdiff_t>(end)));
  EXPECT_NE(r.err.find("stopped at EOS (token " + std::to_string(free_run[end]) + ")"), std::string::npos) << r.err;
}

TEST(CliFirstContact, QuantizePrintsASummaryKeepsTheTokenizerAndNamesFormatsOneWay) {
  Case c;
  c.allow_change("q");
  const std::string dir = model_with_tokenizer(c);
  RunResult r = c.succeeds({"quantize", "--model", dir, "-o", "q"});
  EXPECT_EQ(r.out.find('{'), std::string::npos) << "a summary, not JSON\n" << r.out;
  EXPECT_NE(r.out.find("wrote q: fp8-dynamic, compressed-tensors format"), std::string::npos) << r.out;
  expect_narrow(r.out, 120);
  r = c.succeeds({"run", "--model", "q", "--prompt", "hello", "-t", "0", "-n", "12"});
  EXPECT_EQ(r.out.rfind("hello", 0), 0u) << "the quantized model keeps its tokenizer\n" << r.out;
  r = c.succeeds({"quantize", "--model", dir, "-o", "q2", "--dry-run", "--json"});
  EXPECT_EQ(json::parse(r.out)["format"], "compressed-tensors");
  // Every format `schemes` names is a value --format takes.
  r = c.succeeds({"schemes"});
  std::vector<std::string> formats;
  for (const std::string& line : lines_of(r.out)) {
    std::stringstream in(line);
    std::string scheme, format;
    in >> scheme >> format;
    if (scheme != "scheme" && format != "none" && !format.empty()) formats.push_back(format);
  }
  ASSERT_FALSE(formats.empty()) << r.out;
  for (const std::string& f : formats) {
    // Each format with a scheme `schemes` lists in it: accepted.
    std::string scheme;
    for (const std::string& line : lines_of(r.out)) {
      std::stringstream in(line);
      std::string s, g;
      in >> s >> g;
      if (g == f && scheme.empty()) scheme = s;
    }
    const RunResult q = c.run({"quantize", "--model", dir, "-o", "q3", "--dry-run", "--format", f, "--scheme", scheme});
    EXPECT_EQ(q.code, 0) << f << " with " << scheme << ": " << q.err;
  }
}

// The llama2.c tokenizer quantize converts is read as an input like any other: a FIFO or a link to
// /dev/zero in its place is refused by name (no hang, no endless read), and nothing is written.
TEST(CliFirstContact, AHostileTokenizerBesideALlama2cModelIsRefusedByName) {
  for (Special kind : {Special::kFifo, Special::kDevZero}) {
    Case c;
    const std::string model = c.add(Base::kLlama2c, "model.bin");
    make_special(c.path("tokenizer.bin"), kind);
    c.refused({"quantize", "--model", model, "-o", "q"}, {"tokenizer.bin", special_words(kind)},
              kShortTimeoutSeconds);
    EXPECT_FALSE(fs::exists(c.path("q"))) << special_name(kind);
  }
}

}  // namespace
}  // namespace llmq::hostile
