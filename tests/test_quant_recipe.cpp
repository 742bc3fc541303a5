// Mixed quantization recipes (quant_recipe.hpp): resolution against a model (which scheme each
// linear gets, in what order, and every refusal), the recipe file (round trip and refusals), the
// model quantized under a recipe (each module exactly as under its own scheme alone; kept modules
// float) and its export read back to the same logits. Models: the small seeded default models
// (dense and MoE) of model_quantize_support.hpp and, when present, stories260K.
#include "llmq/quant_recipe.hpp"
#include "llmq/atomic_io.hpp"
#include "llmq/output_dir.hpp"
#include "model_quantize_support.hpp"

namespace llmq {
namespace {

const ModelConfig& dense_config() { return small_model(0).model.config; }
const ModelConfig& moe_config() { return small_model(4).model.config; }

std::string layer(int64_t l, const std::string& rest) { return "model.layers." + std::to_string(l) + "." + rest; }

RecipeGroup group(const std::string& name, const std::string& scheme, std::vector<std::string> targets) {
  return RecipeGroup{name, scheme, std::move(targets)};
}

// The attention of every layer under int8-w8a8, the MLPs under fp8-dynamic, layer 0's down_proj kept.
QuantRecipe two_group_recipe() {
  QuantRecipe r;
  r.groups = {group("attn", "int8-w8a8", {"re:model\\.layers\\.[0-9]+\\.self_attn\\..*"}),
              group("mlp", "fp8-dynamic", {"re:model\\.layers\\.[0-9]+\\.mlp\\..*"})};
  r.ignore = {layer(0, "mlp.down_proj")};
  return r;
}

Status resolve(const QuantRecipe& r, const ModelConfig& c, ResolvedRecipe* out = nullptr) {
  ResolvedRecipe unused;
  return resolve_recipe(r, c, out != nullptr ? out : &unused);
}

// Expect a refusal whose message holds every one of `words`.
void expect_refused(const Status& st, const std::vector<std::string>& words, const std::string& what) {
  ASSERT_FALSE(st.ok()) << what << " was accepted";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
  for (const std::string& w : words) EXPECT_TRUE(contains(st.message(), w)) << what << ": '" << w << "' not in: " << st.message();
}

TEST(RecipeResolve, EachModuleGetsItsGroupsSchemeAndKeptModulesAreListedInForwardOrder) {
  const ModelConfig& c = dense_config();
  ResolvedRecipe r;
  ASSERT_TRUE(resolve(two_group_recipe(), c, &r).ok());
  std::vector<std::string> want_kept;
  for (const LinearId& id : linear_ids(c)) {
    const std::string m = id.hf_name(c);
    const bool attn = contains(m, "self_attn"), kept = m == layer(0, "mlp.down_proj") || m == "lm_head";
    if (kept) {
      want_kept.push_back(m);
      EXPECT_EQ(r.scheme_of.count(m), 0u) << m;
      continue;
    }
    ASSERT_EQ(r.scheme_of.count(m), 1u) << m;
    EXPECT_EQ(r.scheme_of.at(m).name, attn ? "int8-w8a8" : "fp8-dynamic") << m;
    EXPECT_EQ(r.group_of.at(m), attn ? "attn" : "mlp") << m;
  }
  EXPECT_EQ(r.kept, want_kept) << "kept modules in forward order, lm_head last";
  EXPECT_EQ(r.scheme_names(), (std::vector<std::string>{"fp8-dynamic", "int8-w8a8"}));
  EXPECT_TRUE(r.mixed());
}

TEST(RecipeResolve, UniformRecipeQuantizesWhatTheSchemeDoesAndKeepsLmHeadAndRouters) {
  for (int64_t experts : {0, 4}) {
    const ModelWeights& model = small_model(experts).model;
    ResolvedRecipe r;
    ASSERT_TRUE(resolve(uniform_recipe("fp8-dynamic"), model.config, &r).ok());
    for (const Linear* l : model.linears()) {
      const std::string m = l->id.hf_name(model.config);
      EXPECT_EQ(r.scheme_of.count(m), linear_is_quantized(*l, {}) ? 1u : 0u) << m;
    }
    EXPECT_FALSE(r.mixed());
  }
  // Named exactly, lm_head is quantized (the model is untied).
  QuantRecipe r = uniform_recipe("fp8-dynamic");
  r.groups.push_back(group("head", "int8-w8a8", {"lm_head"}));
  ResolvedRecipe got;
  ASSERT_TRUE(resolve(r, dense_config(), &got).ok());
  EXPECT_EQ(got.scheme_of.at("lm_head").name, "int8-w8a8");
  EXPECT_TRUE(got.kept.empty());
}

TEST(RecipeResolve, IgnoreWinsOverARegularExpressionAndOverridesApply) {
  QuantRecipe r = uniform_recipe("fp8-smoothquant");
  r.ignore = {"re:model\\.layers\\.1\\..*"};
  r.smooth_alpha = 0.8f;
  r.backoff = 0.5f;
  ResolvedRecipe got;
  ASSERT_TRUE(resolve(r, dense_config(), &got).ok());
  for (const auto& [m, s] : got.scheme_of) {
    EXPECT_TRUE(contains(m, "layers.0.")) << m;
    EXPECT_EQ(s.smooth_alpha, 0.8f);
    EXPECT_EQ(s.weight.backoff, 0.5f);
    // Static activation scales take it; dynamic ones cannot (BackoffSkipsDynamicActivationScales).
    EXPECT_EQ(s.activation.backoff, s.activation.source == ScaleSource::kStatic ? 0.5f : 1.0f);
  }
  EXPECT_EQ(got.scheme_of.size(), 7u);  // q k v o gate up down of layer 0
}

// --backoff reaches weights and static activation scales only: no checkpoint can ask an engine
// for a backoff on the scales it computes per batch, so eval and quantize would disagree.
TEST(RecipeResolve, BackoffSkipsDynamicActivationScales) {
  for (const char* name : {"fp8-dynamic", "int8-w8a8", "fp8-tensor-static"}) {
    QuantRecipe r = uniform_recipe(name);
    r.backoff = 0.8f;
    ResolvedRecipe got;
    ASSERT_TRUE(resolve(r, dense_config(), &got).ok()) << name;
    const Scheme& s = got.scheme_of.begin()->second;
    EXPECT_EQ(s.weight.backoff, 0.8f) << name;
    EXPECT_EQ(s.activation.backoff, s.activation.source == ScaleSource::kStatic ? 0.8f : 1.0f) << name;
    Scheme plain, overridden;
    ASSERT_TRUE(find_scheme(name, &plain).ok());
    ASSERT_TRUE(apply_overrides(plain, -1.0f, 0.8f, &overridden).ok());
    EXPECT_EQ(overridden.activation.backoff, s.activation.backoff) << name << ": --scheme and --recipe agree";
  }
  // A scheme given to export directly with such a backoff is refused, not written without it.
  Scheme s;
  ASSERT_TRUE(find_scheme("fp8-dynamic", &s).ok());
  s.activation.backoff = 0.8f;
  TempDir dir;
  ExportSummary sum;
  const Status st = export_quantized(*memory_weight_source(small_model(0).model), s, nullptr, dir.file("x"), {}, &sum);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "dynamic activation")) << st.message();
  EXPECT_FALSE(fs::exists(dir.file("x")));
}

// A smooth_alpha no quantized module's scheme uses would change nothing: refused, as --scheme
// refuses --smooth-alpha for a scheme that does not smooth.
TEST(RecipeResolve, SmoothAlphaWithoutASmoothingSchemeIsRefused) {
  QuantRecipe r = two_group_recipe();
  r.smooth_alpha = 0.7f;
  expect_refused(resolve(r, dense_config()), {"smooth_alpha", "smooths"}, "smooth_alpha with int8-w8a8 and fp8-dynamic");
  // A smoothing scheme whose every module ignore keeps does not count.
  QuantRecipe kept = two_group_recipe();
  kept.groups[0].scheme = "fp8-smoothquant";
  kept.ignore.push_back("re:.*self_attn.*");
  kept.smooth_alpha = 0.7f;
  expect_refused(resolve(kept, dense_config()), {"smooth_alpha"}, "smooth_alpha whose only smoothing module is kept");
  QuantRecipe smooth = two_group_recipe();
  smooth.groups[1].scheme = "fp8-smoothquant";
  smooth.smooth_alpha = 0.7f;
  EXPECT_TRUE(resolve(smooth, dense_config()).ok());
}

// Every target that matches a module is used: a redundant one is not "matching nothing", and an
// exact name that ignore contradicts is caught even after a regular expression of its group.
TEST(RecipeResolve, EveryMatchingTargetCountsAndExactNamesAfterARegexAreChecked) {
  const ModelConfig& c = dense_config();
  QuantRecipe redundant = uniform_recipe("fp8-dynamic");
  redundant.groups[0].targets = {"re:.*", "re:.*q_proj"};
  redundant.ignore = {"re:.*\\.1\\.mlp\\.down_proj", layer(1, "mlp.down_proj")};
  ResolvedRecipe got;
  const Status st = resolve(redundant, c, &got);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(got.scheme_of.count(layer(1, "mlp.down_proj")), 0u);

  QuantRecipe contradiction = uniform_recipe("fp8-dynamic");
  contradiction.groups[0].targets = {"re:.*", layer(0, "mlp.down_proj")};
  contradiction.ignore = {layer(0, "mlp.down_proj")};
  expect_refused(resolve(contradiction, c), {layer(0, "mlp.down_proj"), "not both"}, "named after a regex and ignored");

  // A bare string is an exact name, never a class name: "Linear" matches nothing, and says why.
  QuantRecipe class_name = uniform_recipe("fp8-dynamic");
  class_name.groups[0].targets = {"Linear"};
  expect_refused(resolve(class_name, c), {"'Linear'", "class name"}, "a class name as a recipe target");
}

TEST(RecipeResolve, RefusalsNameTheModuleAndTheTargets) {
  const ModelConfig& c = dense_config();
  const std::string q0 = layer(0, "self_attn.q_proj");
  QuantRecipe two_groups;
  two_groups.groups = {group("a", "fp8-dynamic", {"re:.*"}), group("b", "int8-w8a8", {q0})};
  expect_refused(resolve(two_groups, c), {q0, "'a'", "'b'", "'re:.*'"}, "a module in two groups");

  QuantRecipe contradiction = uniform_recipe("fp8-dynamic");
  contradiction.groups[0].targets = {q0, layer(0, "self_attn.k_proj"), layer(0, "self_attn.v_proj")};
  contradiction.ignore = {"re:.*q_proj"};
  expect_refused(resolve(contradiction, c), {q0, "ignore", "re:.*q_proj"}, "named by a group and ignored");

  QuantRecipe typo = uniform_recipe("fp8-dynamic");
  typo.groups[0].targets = {"model.layers.0.mlp.dwn_proj"};
  expect_refused(resolve(typo, c), {"model.layers.0.mlp.dwn_proj", "matches no linear"}, "a target matching nothing");
  QuantRecipe regex_only_head = uniform_recipe("fp8-dynamic");
  regex_only_head.groups.push_back(group("h", "fp8-dynamic", {"re:lm_h.*"}));
  expect_refused(resolve(regex_only_head, c), {"re:lm_h.*", "exact names"}, "lm_head by a regular expression");

  QuantRecipe split_qkv = uniform_recipe("fp8-dynamic");
  split_qkv.groups[0].targets = {"re:.*[qk]_proj"};
  split_qkv.groups.push_back(group("v", "int8-w8a8", {"re:.*v_proj"}));
  expect_refused(resolve(split_qkv, c), {q0, layer(0, "self_attn.v_proj"), "one GEMM"}, "q/k/v under two schemes");
  QuantRecipe kept_v = uniform_recipe("fp8-dynamic");
  kept_v.ignore = {layer(1, "self_attn.v_proj")};
  expect_refused(resolve(kept_v, c), {layer(1, "self_attn.v_proj"), "kept"}, "q/k quantized, v kept");
  QuantRecipe split_gate_up = uniform_recipe("fp8-dynamic");
  split_gate_up.ignore = {layer(0, "mlp.up_proj")};
  expect_refused(resolve(split_gate_up, c), {layer(0, "mlp.gate_proj"), layer(0, "mlp.up_proj")}, "gate/up split");

  QuantRecipe unknown = uniform_recipe("fp9");
  expect_refused(resolve(unknown, c), {"'fp9'", "group_0"}, "an unknown scheme");
  QuantRecipe empty_targets = uniform_recipe("fp8-dynamic");
  empty_targets.groups[0].targets.clear();
  expect_refused(resolve(empty_targets, c), {"group_0", "no targets"}, "a group without targets");
  QuantRecipe twice = uniform_recipe("fp8-dynamic");
  twice.groups.push_back(twice.groups[0]);
  expect_refused(resolve(twice, c), {"group_0", "twice"}, "a group name used twice");
  expect_refused(resolve(QuantRecipe{}, c), {"no groups"}, "no groups");

  QuantRecipe long_target = uniform_recipe("fp8-dynamic");
  long_target.groups[0].targets = {"re:" + std::string(5000, 'a')};
  expect_refused(resolve(long_target, c), {"5003 characters", "4096"}, "a target over 4096 characters");
  QuantRecipe bad_regex = uniform_recipe("fp8-dynamic");
  bad_regex.groups[0].targets = {"re:model(.*"};
  expect_refused(resolve(bad_regex, c), {"re:model(.*", "not a usable regular expression"}, "a regex that does not compile");
  QuantRecipe backref = uniform_recipe("fp8-dynamic");
  backref.groups[0].targets = {"re:(a)\\1"};
  expect_refused(resolve(backref, c), {"re:(a)\\1"}, "a backreference (exponential matching)");
  QuantRecipe huge_repeat = uniform_recipe("fp8-dynamic");
  huge_repeat.groups[0].targets = {"re:(a{60}){60}{60}"};
  expect_refused(resolve(huge_repeat, c), {"too large"}, "repetitions multiplying into a huge automaton");

  QuantRecipe alpha = uniform_recipe("fp8-smoothquant");
  alpha.smooth_alpha = 1.5f;
  expect_refused(resolve(alpha, c), {"smooth_alpha", "[0, 1]"}, "alpha above 1");
  QuantRecipe backoff = uniform_recipe("fp8-dynamic");
  backoff.backoff = 0.0f;
  expect_refused(resolve(backoff, c), {"backoff", "(0, 1]"}, "backoff 0");
  backoff.backoff = std::nanf("");
  expect_refused(resolve(backoff, c), {"backoff"}, "backoff NaN");
}

TEST(RecipeResolve, MoeExpertsShareOneSchemeAndSmoothQuantCoversEveryQuantizedConsumer) {
  const ModelConfig& c = moe_config();
  const std::string expert0 = LinearId{0, LinearRole::kDown, 0}.hf_name(c);
  QuantRecipe split_experts = uniform_recipe("fp8-dynamic");
  split_experts.ignore = {expert0};
  expect_refused(resolve(split_experts, c), {expert0, "one GEMM"}, "one expert kept, the others quantized");

  // The router named exactly under a plain scheme, the experts under SmoothQuant: one norm, two ways.
  const std::string router = LinearId{1, LinearRole::kRouter, -1}.hf_name(c);
  QuantRecipe smooth = uniform_recipe("fp8-smoothquant");
  smooth.groups.push_back(group("router", "fp8-dynamic", {router}));
  expect_refused(resolve(smooth, c), {router, "RMSNorm", "fp8-smoothquant"}, "part of a norm's consumers smoothed");
  // Kept, the router takes the factors in float: accepted.
  ResolvedRecipe r;
  ASSERT_TRUE(resolve(uniform_recipe("fp8-smoothquant"), c, &r).ok());
  EXPECT_EQ(r.scheme_of.count(router), 0u);

  const ModelConfig tied = [] {
    ModelConfig t = dense_config();
    t.tie_embeddings = true;
    return t;
  }();
  QuantRecipe head = uniform_recipe("fp8-dynamic");
  head.groups.push_back(group("head", "fp8-dynamic", {"lm_head"}));
  expect_refused(resolve(head, tied), {"lm_head", "tied"}, "a tied lm_head");
}

TEST(RecipeJson, RoundTripsAndNamesEveryBadField) {
  QuantRecipe r = two_group_recipe();
  r.smooth_alpha = 0.7f;
  r.backoff = 0.9f;
  QuantRecipe back;
  const std::string text = recipe_to_json(r);
  ASSERT_TRUE(parse_recipe_json(text, "r.json", &back).ok()) << text;
  EXPECT_EQ(recipe_to_json(back), text);
  ASSERT_EQ(back.groups.size(), 2u);
  EXPECT_EQ(back.groups[1].name, "mlp");
  EXPECT_EQ(back.groups[0].targets, r.groups[0].targets);
  EXPECT_EQ(back.ignore, r.ignore);
  EXPECT_EQ(back.smooth_alpha, 0.7f);
  EXPECT_EQ(back.backoff, 0.9f);
  // Unset overrides stay unset; a group without a name is named by its position.
  QuantRecipe plain;
  ASSERT_TRUE(parse_recipe_json(R"({"groups": [{"scheme": "fp8-dynamic", "targets": ["re:.*"]}]})", "p", &plain).ok());
  EXPECT_EQ(plain.groups[0].name, "group_0");
  EXPECT_LT(plain.smooth_alpha, 0.0f);
  EXPECT_LT(plain.backoff, 0.0f);

  const std::string g = R"("groups": [{"scheme": "fp8-dynamic", "targets": ["re:.*"]}])";
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad = {
      {"[]", {"expected a JSON object"}},
      {"{}", {"groups", "missing"}},
      {R"({"groups": []})", {"groups", "non-empty"}},
      {"{" + g + R"(, "colour": 1})", {"colour", "unknown key"}},
      {R"({"groups": [{"scheme": "fp8-dynamic", "targets": ["re:.*"], "bits": 4}]})", {"groups[0].bits", "unknown key"}},
      {R"({"groups": [{"scheme": 8, "targets": ["re:.*"]}]})", {"groups[0].scheme", "expected a scheme name"}},
      {R"({"groups": [{"scheme": "fp9", "targets": ["re:.*"]}]})", {"groups[0].scheme", "fp9"}},
      {R"({"groups": [{"scheme": "fp8-dynamic"}]})", {"groups[0].targets", "missing"}},
      {R"({"groups": [{"scheme": "fp8-dynamic", "targets": []}]})", {"groups[0].targets", "empty"}},
      {R"({"groups": [{"scheme": "fp8-dynamic", "targets": "re:.*"}]})", {"groups[0].targets", "expected an array"}},
      {R"({"groups": [{"scheme": "fp8-dynamic", "targets": [""]}]})", {"groups[0].targets[0]", "empty target"}},
      {R"({"groups": [{"scheme": "fp8-dynamic", "targets": [3]}]})", {"groups[0].targets[0]", "expected a string"}},
      {R"({"groups": [{"scheme": "fp8-dynamic", "targets": ["re:(("]}]})", {"groups[0].targets[0]", "regular expression"}},
      {R"({"groups": [{"name": "a", "scheme": "fp8-dynamic", "targets": ["x"]},
                      {"name": "a", "scheme": "int8-w8a8", "targets": ["y"]}]})", {"groups[1].name", "'a'"}},
      {R"({"groups": [{"name": "", "scheme": "fp8-dynamic", "targets": ["x"]}]})", {"groups[0].name", "non-empty"}},
      {"{" + g + R"(, "ignore": "lm_head"})", {"ignore", "expected an array"}},
      {"{" + g + R"(, "smooth_alpha": 2})", {"smooth_alpha", "[0, 1]"}},
      {"{" + g + R"(, "smooth_alpha": "0.5"})", {"smooth_alpha"}},
      {"{" + g + R"(, "backoff": 0})", {"backoff", "(0, 1]"}},
      {"{" + g + R"(, "backoff": true})", {"backoff"}},
      {"{" + g + R"(, "backoff": 0.5, "backoff": 0.9})", {"backoff", "twice"}},
      {R"({"groups": [{"scheme": "fp8-dynamic", "scheme": "int8-w8a8", "targets": ["x"]}]})", {"scheme", "twice"}},
      {"{" + g, {"not valid JSON"}},
      {std::string(100, '[') + std::string(100, ']'), {"nested"}},
      {"{" + g + R"(, "ignore": [")" + std::string(int64_t{1} << 20, 'x') + "\"]}", {"bytes", "at most"}},
  };
  for (const auto& [text_in, words] : bad) {
    QuantRecipe out;
    const Status st = parse_recipe_json(text_in, "bad.json", &out);
    expect_refused(st, words, text_in.substr(0, 120));
    if (!st.ok()) EXPECT_TRUE(contains(st.message(), "bad.json")) << st.message();
  }
}

TEST(RecipeJson, FileIsReadThroughTheBoundedReader) {
  TempDir dir;
  write_text(dir.file("r.json"), recipe_to_json(two_group_recipe()));
  QuantRecipe r;
  ASSERT_TRUE(load_recipe_file(dir.file("r.json"), &r).ok());
  EXPECT_EQ(r.groups.size(), 2u);
  const Status missing = load_recipe_file(dir.file("absent.json"), &r);
  EXPECT_FALSE(missing.ok());
  EXPECT_TRUE(contains(missing.message(), "absent.json")) << missing.message();
  const Status directory = load_recipe_file(dir.path(), &r);
  EXPECT_FALSE(directory.ok());
  EXPECT_TRUE(contains(directory.message(), "directory")) << directory.message();
}

// Two quantized linears hold the same codes, scales and input quantization.
void expect_same_linear(const QuantizedLinear& a, const QuantizedLinear& b, const std::string& what) {
  ASSERT_EQ(a.weight.data.nbytes(), b.weight.data.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.weight.data.data(), b.weight.data.data(), static_cast<size_t>(a.weight.data.nbytes())), 0)
      << what << ": codes differ";
  ASSERT_EQ(a.weight.scales.scales.nbytes(), b.weight.scales.scales.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.weight.scales.scales.data(), b.weight.scales.scales.data(),
                        static_cast<size_t>(a.weight.scales.scales.nbytes())),
            0)
      << what << ": scales differ";
  EXPECT_EQ(a.quantize_input, b.quantize_input) << what;
  if (a.quantize_input) {  // a weight-only linear's activation spec is unused
    EXPECT_EQ(a.input_spec.format, b.input_spec.format) << what;
    EXPECT_EQ(a.input_spec.granularity, b.input_spec.granularity) << what;
    EXPECT_EQ(a.input_spec.source, b.input_spec.source) << what;
  }
  EXPECT_EQ(a.scheme, b.scheme) << what;
}

// A module under scheme X in the mix is exactly the module of the uniform-X model (no smoothing
// involved), and a kept module is absent (the backend runs it in float).
void expect_mix_equals_uniforms(int64_t which, const QuantRecipe& recipe) {
  SmallModel& m = small_model(which);
  QuantizedModel mixed;
  const Status st = quantize_model(m.model, recipe, &m.stats, {}, &mixed);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ResolvedRecipe r;
  ASSERT_TRUE(resolve_recipe(recipe, m.model.config, &r).ok());
  EXPECT_EQ(mixed.linears.size(), r.scheme_of.size());
  for (const auto& [module, scheme] : r.scheme_of) {
    const QuantizedLinear* got = mixed.find(module);
    ASSERT_NE(got, nullptr) << module;
    const QuantizedLinear* want = quantized(which, scheme).find(module);
    ASSERT_NE(want, nullptr) << module << " under uniform " << scheme.name;
    expect_same_linear(*got, *want, module + " (" + scheme.name + ")");
  }
  for (const std::string& k : r.kept) EXPECT_EQ(mixed.find(k), nullptr) << k << " is kept, yet quantized";
  EXPECT_EQ(mixed.scheme.name, r.mixed() ? kMixedSchemeName : r.scheme_names().at(0));
}

TEST(RecipeQuantize, EachModuleHasExactlyTheCodesOfItsUniformScheme) {
  expect_mix_equals_uniforms(0, two_group_recipe());
  // MoE: experts of layer 0 under int8, of layer 1 under a static FP8 scheme, attention FP8.
  QuantRecipe moe;
  moe.groups = {group("attn", "fp8-dynamic", {"re:.*self_attn.*"}),
                group("experts0", "int8-w8a8", {"re:model\\.layers\\.0\\..*experts.*"}),
                group("experts1", "fp8-tensor-static", {"re:model\\.layers\\.1\\..*experts.*"})};
  expect_mix_equals_uniforms(4, moe);
  if (!have_stories()) GTEST_SKIP() << skip_reason();
  QuantRecipe stories;
  stories.groups = {group("attn", "fp8-channel-static", {"re:.*self_attn.*"}),
                    group("mlp", "int8-w8a8", {"re:.*mlp\\.(gate|up)_proj"})};
  stories.ignore = {};  // every down_proj kept: no group names them
  expect_mix_equals_uniforms(kStories, stories);
}

TEST(RecipeQuantize, UniformRecipeGivesTheUniformModelEvenWithSmoothQuant) {
  for (const char* name : {"fp8-dynamic", "fp8-smoothquant", "int8-smoothquant"}) {
    for (int64_t which : {0, 4}) {
      SmallModel& m = small_model(which);
      Scheme s;
      ASSERT_TRUE(find_scheme(name, &s).ok());
      QuantizedModel mixed;
      ASSERT_TRUE(quantize_model(m.model, uniform_recipe(name), &m.stats, {}, &mixed).ok());
      const QuantizedModel& uniform = quantized(which, s);
      ASSERT_EQ(mixed.linears.size(), uniform.linears.size()) << name;
      for (const auto& [module, ql] : uniform.linears) expect_same_linear(*mixed.find(module), ql, module);
      const std::vector<int32_t> tokens = sampled_tokens(m.model, 16, kEvalSeed);
      QuantizedLinearBackend a(mixed), b(uniform);
      const std::vector<float> la = logits_of(mixed.weights, &a, tokens), lb = logits_of(uniform.weights, &b, tokens);
      EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << name << " experts=" << which;
    }
  }
}

TEST(RecipeQuantize, KeptModulesRunInFloatAndStatisticsAreAskedFor) {
  SmallModel& m = small_model(0);
  // Everything kept but layer 1's MLP, weight-only: the model is the float model with those three
  // weights dequantized (up to the GEMM's summation order), so every kept linear ran in float.
  QuantRecipe r;
  r.groups = {group("mlp1", "fp8-weight-only", {"re:model\\.layers\\.1\\.mlp\\..*"})};
  QuantizedModel qm;
  ASSERT_TRUE(quantize_model(m.model, r, nullptr, {}, &qm).ok());
  EXPECT_EQ(qm.linears.size(), 3u);
  ModelWeights fake = m.model;
  for (Linear* l : fake.linears()) {
    const QuantizedLinear* ql = qm.find(l->id.hf_name(fake.config));
    if (ql == nullptr) continue;
    EXPECT_TRUE(contains(l->id.hf_name(fake.config), "layers.1.mlp")) << l->id.hf_name(fake.config);
    ASSERT_TRUE(dequantize(ql->weight, l->weight.view()).ok());
  }
  const std::vector<int32_t> tokens = sampled_tokens(m.model, 16, kEvalSeed);
  QuantizedLinearBackend backend(qm);
  FloatLinearBackend plain;
  const std::vector<float> got = logits_of(qm.weights, &backend, tokens), want = logits_of(fake, &plain, tokens),
                           f = logits_of(m.model, &plain, tokens);
  EXPECT_LT(rel_diff(got, want), kWeightOnlyFakeQuantRelTolerance);
  EXPECT_GT(rel_diff(got, f), kWeightOnlyFakeQuantRelTolerance) << "layer 1's MLP is quantized";

  QuantRecipe needs_stats;
  needs_stats.groups = {group("s", "fp8-tensor-static", {"re:.*self_attn.*"})};
  expect_refused(quantize_model(m.model, needs_stats, nullptr, {}, &qm), {"--stats", "fp8-tensor-static"},
                 "a static scheme without statistics");
  QuantizeModelOptions head;
  head.quantize_lm_head = true;
  expect_refused(quantize_model(m.model, two_group_recipe(), &m.stats, head, &qm), {"lm_head"},
                 "options asking for lm_head under a recipe");
}

// The mixed checkpoint reloads to the model quantized in memory under the same recipe: the same
// codes, scales and input quantization per module, kept modules float, and the same logits bit for
// bit (keep_dtype f32, so the kept modules are the float weights). SmoothQuant on the attention
// exercises the per-norm smoothing of both paths.
TEST(RecipeExport, MixedCheckpointLoadsBackToTheSameLogits) {
  SmallModel& m = small_model(0);
  QuantRecipe recipe;
  recipe.groups = {group("attn", "int8-smoothquant", {"re:.*self_attn\\..*"}),
                   group("gate_up", "fp8-channel-static", {"re:.*mlp\\.(gate|up)_proj"}),
                   group("down", "fp8-weight-only", {"re:.*down_proj"})};
  recipe.ignore = {layer(0, "mlp.down_proj")};
  QuantizedModel memory;
  ASSERT_TRUE(quantize_model(m.model, recipe, &m.stats, {}, &memory).ok());
  TempDir dir;
  const auto src = memory_weight_source(m.model);
  ExportOptions options;
  options.keep_dtype = DType::kF32;
  ExportSummary sum;
  const Status ex = export_quantized(*src, recipe, &m.stats, dir.file("mixed"), options, &sum);
  ASSERT_TRUE(ex.ok()) << ex.to_string();
  EXPECT_EQ(sum.quantized_linears, static_cast<int64_t>(memory.linears.size()));
  const json q = json::parse(read_text(dir.file("mixed/config.json")))["quantization_config"];
  EXPECT_EQ(q["llmq_scheme"], kMixedSchemeName);
  EXPECT_EQ(q["config_groups"].size(), 3u);
  QuantizedModel loaded;
  const Status st = load_quantized_checkpoint(dir.file("mixed"), &loaded);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(loaded.scheme.name, kMixedSchemeName);
  ASSERT_EQ(loaded.linears.size(), memory.linears.size());
  for (const auto& [module, ml] : memory.linears) {
    const QuantizedLinear* l = loaded.find(module);
    ASSERT_NE(l, nullptr) << module;
    expect_same_linear(*l, ml, module);
    if (ml.quantize_input && ml.input_spec.source == ScaleSource::kStatic)
      EXPECT_EQ(l->static_input_scale.scales.data_as<float>()[0], ml.static_input_scale.scales.data_as<float>()[0])
          << module;
  }
  EXPECT_EQ(loaded.find(layer(0, "mlp.down_proj")), nullptr) << "kept in float";
  const std::vector<int32_t> tokens = sampled_tokens(m.model, 32, kEvalSeed);
  QuantizedLinearBackend lb(loaded), mb(memory);
  const std::vector<float> got = logits_of(loaded.weights, &lb, tokens), want = logits_of(memory.weights, &mb, tokens);
  ASSERT_EQ(got.size(), want.size());
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0) << differ << " of " << got.size() << " logits differ between the checkpoint and memory";
}

// A uniform recipe writes exactly what --scheme writes, byte for byte.
TEST(RecipeExport, UniformRecipeWritesTheSchemesFilesByteForByte) {
  SmallModel& m = small_model(0);
  const auto src = memory_weight_source(m.model);
  TempDir dir;
  for (const char* name : {"fp8-dynamic", "int8-smoothquant", "fp8-tensor-static"}) {
    Scheme s;
    ASSERT_TRUE(find_scheme(name, &s).ok());
    ExportSummary a, b;
    ASSERT_TRUE(export_quantized(*src, s, &m.stats, dir.file(std::string(name) + "-scheme"), {}, &a).ok());
    ASSERT_TRUE(export_quantized(*src, uniform_recipe(name), &m.stats, dir.file(std::string(name) + "-recipe"), {}, &b).ok());
    for (const char* file : {"config.json", "model.safetensors"})
      EXPECT_EQ(read_text(dir.file(std::string(name) + "-scheme/" + file)), read_text(dir.file(std::string(name) + "-recipe/" + file)))
          << name << ": " << file;
  }
}

TEST(RecipeExport, MixedMoeExportIsRefusedAndNothingIsWritten) {
  SmallModel& m = small_model(4);
  const auto src = memory_weight_source(m.model);
  TempDir dir;
  QuantRecipe mixed;
  mixed.groups = {group("attn", "int8-w8a8", {"re:.*self_attn.*"}), group("experts", "fp8-dynamic", {"re:.*experts.*"})};
  ExportSummary sum;
  const Status st = export_quantized(*src, mixed, nullptr, dir.file("moe"), {}, &sum);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.message(), "MoE")) << st.message();
  EXPECT_FALSE(fs::exists(dir.file("moe")));
  // One scheme over every expert, attention kept: written (one group, attention ignored).
  QuantRecipe experts_only;
  experts_only.groups = {group("experts", "fp8-dynamic", {"re:.*experts.*"})};
  ASSERT_TRUE(export_quantized(*src, experts_only, nullptr, dir.file("experts"), {}, &sum).ok());
  QuantizedModel loaded;
  ASSERT_TRUE(load_quantized_checkpoint(dir.file("experts"), &loaded).ok());
  for (const auto& [module, ql] : loaded.linears) EXPECT_TRUE(contains(module, "experts")) << module;

  // The reverse, attention quantized and every expert kept, is refused: some vLLM versions take
  // FusedMoE's scheme from the "Linear" group without reading ignore.
  QuantRecipe attention_only;
  attention_only.groups = {group("attn", "fp8-dynamic", {"re:.*self_attn.*"})};
  const Status kept = export_quantized(*src, attention_only, nullptr, dir.file("attn"), {}, &sum);
  ASSERT_FALSE(kept.ok());
  EXPECT_TRUE(contains(kept.message(), "every expert kept")) << kept.message();
  EXPECT_FALSE(fs::exists(dir.file("attn")));
}

// What evaluates in memory is what is written: a backoff over a dynamic scheme changes the weights
// in both, and the activations in neither, so the checkpoint reloads to the same logits.
TEST(RecipeExport, BackoffOnADynamicSchemeIsWrittenAsEvaluated) {
  SmallModel& m = small_model(0);
  QuantRecipe recipe = uniform_recipe("fp8-dynamic");
  recipe.backoff = 0.8f;
  QuantizedModel memory;
  ASSERT_TRUE(quantize_model(m.model, recipe, nullptr, {}, &memory).ok());
  TempDir dir;
  ExportOptions options;
  options.keep_dtype = DType::kF32;
  ExportSummary sum;
  const Status ex = export_quantized(*memory_weight_source(m.model), recipe, nullptr, dir.file("q"), options, &sum);
  ASSERT_TRUE(ex.ok()) << ex.to_string();
  QuantizedModel loaded;
  ASSERT_TRUE(load_quantized_checkpoint(dir.file("q"), &loaded).ok());
  const std::vector<int32_t> tokens = sampled_tokens(m.model, 24, kEvalSeed);
  QuantizedLinearBackend lb(loaded), mb(memory);
  const std::vector<float> got = logits_of(loaded.weights, &lb, tokens), want = logits_of(memory.weights, &mb, tokens);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "the checkpoint runs another model than the one evaluated";
}

// --resume keeps shards only under the same plan, and the plan holds each module's effective
// scheme: SmoothQuant's alpha and the backoff are in no quantization_config field.
TEST(RecipeExport, ResumeDoesNotMixShardsOfAnotherAlphaOrBackoff) {
  SmallModel& m = small_model(0);
  const auto src = memory_weight_source(m.model);
  TempDir dir;
  auto recipe = [](float alpha, float backoff) {
    QuantRecipe r = uniform_recipe("int8-smoothquant");
    r.smooth_alpha = alpha;
    r.backoff = backoff;
    return r;
  };
  ExportOptions options;
  options.max_shard_bytes = 64 << 10;  // several shards
  ExportSummary base;
  ASSERT_TRUE(export_quantized(*src, recipe(0.8f, -1.0f), &m.stats, dir.file("a"), options, &base).ok());
  ASSERT_GT(base.shards, 1);
  ASSERT_FALSE(base.plan.empty());
  // An interrupted run under alpha 0.8 writing `out`: its staging directory holds the first
  // shard, finished.
  auto interrupted = [&](const std::string& out) {
    OutputRules rules;
    rules.writer = "llmq quantize";
    std::unique_ptr<OutputDir> staging;
    ASSERT_TRUE(OutputDir::begin(out, rules, base.plan, false, &staging).ok());
    for (const std::string& name : dir_entries(dir.file("a"))) {
      if (name.rfind("model-00001", 0) != 0) continue;
      fs::copy_file(dir.file("a/" + name), staging->path(name));
      int64_t size = 0;
      uint64_t sum = 0;
      ASSERT_TRUE(checksum_file(staging->path(name), &size, &sum).ok());
      ASSERT_TRUE(staging->mark_complete(name, size, sum).ok());
    }
    ASSERT_EQ(staging->completed_count(), 1);
  };
  ExportOptions resume = options;
  resume.resume = true;
  // The same options resume it (the setup does what an interrupted run leaves).
  interrupted(dir.file("same"));
  ExportSummary same;
  ASSERT_TRUE(export_quantized(*src, recipe(0.8f, -1.0f), &m.stats, dir.file("same"), resume, &same).ok());
  EXPECT_EQ(same.reused_shards, 1);
  EXPECT_EQ(same.plan, base.plan);
  int index = 0;
  for (const auto& [alpha, backoff] : std::vector<std::pair<float, float>>{{-1.0f, -1.0f}, {0.8f, 0.9f}, {0.5f, -1.0f}}) {
    const std::string out = dir.file("other" + std::to_string(index++));
    interrupted(out);
    ExportSummary sum;
    const Status st = export_quantized(*src, recipe(alpha, backoff), &m.stats, out, resume, &sum);
    EXPECT_FALSE(st.ok() && sum.reused_shards > 0)
        << "alpha " << alpha << " backoff " << backoff << " reused a shard quantized under alpha 0.8";
    if (!st.ok()) EXPECT_TRUE(contains(st.message(), "different inputs or options")) << st.message();
  }
}

}  // namespace
}  // namespace llmq
