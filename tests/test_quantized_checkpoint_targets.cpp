// How load_quantized_checkpoint (and QuantizedLinearReader, which the GPU loader streams through)
// reads a compressed-tensors quantization_config's targets and ignore list from a third-party or
// hand-edited config.json: what no engine reads alike is refused naming the module or the field
// instead of being read one way here and another way in vLLM; a hostile config.json is refused
// before it can make loading take hours; a null field is not an exception.
#include "model_quantize_support.hpp"

namespace llmq {
namespace {

// The small dense model exported under fp8-dynamic: one group targeting "Linear", lm_head in
// ignore. Written once; each test copies it and edits the copy's quantization_config.
const std::string& exported() {
  static TempDir dir;
  static const std::string path = [] {
    const std::string out = dir.file("fp8");
    Scheme s;
    EXPECT_TRUE(find_scheme("fp8-dynamic", &s).ok());
    ExportSummary sum;
    const Status st = export_quantized(*memory_weight_source(small_model(0).model), s, nullptr, out, {}, &sum);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }();
  return path;
}

// A copy of the export with its quantization_config edited by `edit`, loaded.
Status load_edited(const TempDir& dir, const std::function<void(json&)>& edit, QuantizedModel* out = nullptr) {
  const std::string copy = dir.file("edited");
  fs::remove_all(copy);
  fs::copy(exported(), copy, fs::copy_options::recursive);
  json config = json::parse(read_text(copy + "/config.json"));
  edit(config["quantization_config"]);
  write_text(copy + "/config.json", config.dump(2));
  QuantizedModel unused;
  return load_quantized_checkpoint(copy, out != nullptr ? out : &unused);
}

void expect_refused(const Status& st, const std::vector<std::string>& words, const std::string& what) {
  ASSERT_FALSE(st.ok()) << what << " was accepted";
  for (const std::string& w : words) EXPECT_TRUE(contains(st.message(), w)) << what << ": '" << w << "' not in: " << st.message();
}

std::string layer(int64_t l, const std::string& rest) { return "model.layers." + std::to_string(l) + "." + rest; }

TEST(QuantizedCheckpointTargets, TheExportAndPrefixPatternsLoad) {
  TempDir dir;
  QuantizedModel qm;
  ASSERT_TRUE(load_edited(dir, [](json&) {}, &qm).ok());
  const size_t all = qm.linears.size();
  EXPECT_GT(all, 0u);
  // re.match reads a pattern from the start of the name only: no trailing .* needed.
  const Status st = load_edited(dir, [](json& q) {
    q["config_groups"]["group_0"]["targets"] = {"re:model\\.layers\\.\\d+\\.(self_attn|mlp)"};
  }, &qm);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(qm.linears.size(), all);
}

// Item: the loader read neither ignore nor a lone group's targets, so a module stored 8-bit that
// ignore keeps, or that the one group does not target, ran quantized under that group's spec.
TEST(QuantizedCheckpointTargets, AStoredModuleThatIgnoreKeepsOrNoGroupTargetsIsRefused) {
  TempDir dir;
  const std::string down = layer(0, "mlp.down_proj");
  expect_refused(load_edited(dir, [&](json& q) { q["ignore"].push_back(down); }), {down, "ignore"},
                 "a stored module listed in ignore");
  expect_refused(load_edited(dir, [](json& q) { q["ignore"].push_back("re:.*down_proj"); }), {"re:.*down_proj", "ignore"},
                 "a stored module ignored by a pattern");
  expect_refused(load_edited(dir, [](json& q) { q["config_groups"]["group_0"]["targets"] = {"re:.*self_attn.*"}; }),
                 {"mlp", "no config group targets it"}, "a lone group that does not target the MLP");
}

// vLLM reads a bare target other than an exact name as a class name, by substring; llmq cannot
// tell which modules such a name covers.
TEST(QuantizedCheckpointTargets, ABareTargetThatIsNoModuleIsRefused) {
  TempDir dir;
  expect_refused(load_edited(dir, [](json& q) { q["config_groups"]["group_0"]["targets"] = {"LlamaMLP", "Linear"}; }),
                 {"'LlamaMLP'", "class name"}, "a class name target");
  // Exact names of the checkpoint's linears are fine.
  QuantizedModel qm;
  const Status st = load_edited(dir, [](json& q) {
    json names = json::array();
    for (const LinearId& id : linear_ids(small_model(0).model.config))
      if (id.role != LinearRole::kLmHead) names.push_back(id.hf_name(small_model(0).model.config));
    q["config_groups"]["group_0"]["targets"] = names;
  }, &qm);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// Python's \Z is the letter Z in ECMAScript: q/k/v would fall to another group silently.
// "a)|(?:b" would close the "(?:" ... ")" wrapper that re.match's prefix semantics needs.
TEST(QuantizedCheckpointTargets, PatternsPythonReadsDifferentlyAreRefused) {
  TempDir dir;
  for (const std::string bad : {"re:.*self_attn\\.[qkv]_proj\\Z", "re:a)|(?:.*"}) {
    expect_refused(load_edited(dir, [&](json& q) {
      json g = q["config_groups"]["group_0"];
      g["targets"] = {bad};
      q["config_groups"]["group_1"] = g;
      q["config_groups"]["group_0"]["targets"] = {"re:.*mlp.*"};
    }), {"config_groups.group_1.targets[0]", bad}, bad);
  }
}

// Each pattern used to be compiled again for every module; 300 slow ones are now refused when the
// config is opened, before any is matched.
TEST(QuantizedCheckpointTargets, AHostileConfigIsRefusedBeforeMatching) {
  std::string slow = "re:(?:";
  for (int i = 0; i < 250; ++i) slow += "(.?)";
  slow += "){64}";
  TempDir dir;
  expect_refused(load_edited(dir, [&](json& q) {
    json targets = json::array();
    for (int i = 0; i < 300; ++i) targets.push_back(slow + std::to_string(i));
    json g = q["config_groups"]["group_0"];
    g["targets"] = targets;
    q["config_groups"]["group_1"] = g;
  }), {"config_groups.group_1.targets[", "states"}, "300 slow patterns");
  expect_refused(load_edited(dir, [&](json& q) {
    for (int i = 0; i < 300; ++i) q["ignore"].push_back(slow + std::to_string(i));
  }), {"ignore[", "states"}, "300 slow ignore patterns");
}

// nlohmann's value() throws on null: the exception escaped load_quantized_checkpoint.
TEST(QuantizedCheckpointTargets, NullOrWrongTypedFieldsAreNoException) {
  TempDir dir;
  QuantizedModel qm;
  Status st;
  EXPECT_NO_THROW(st = load_edited(dir, [](json& q) { q["llmq_scheme"] = nullptr; }, &qm));
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(qm.scheme.name, "checkpoint");
  std::unique_ptr<Checkpoint> ckpt;
  ASSERT_TRUE(Checkpoint::open(dir.file("edited"), &ckpt).ok());
  EXPECT_NO_THROW(EXPECT_EQ(quantized_checkpoint_scheme(*ckpt), "checkpoint"));
  ckpt.reset();
  EXPECT_NO_THROW(st = load_edited(dir, [](json& q) { q["llmq_scheme"] = 5; }));
  expect_refused(st, {"llmq_scheme", "expected a string"}, "a numeric llmq_scheme");
  EXPECT_NO_THROW(st = load_edited(dir, [](json& q) { q["quant_method"] = nullptr; }));
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace llmq
