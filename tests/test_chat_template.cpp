// Chat templates (issue 26): the Jinja subset on hand-written templates, each expectation what
// Python's jinja2 prints for it (transformers' settings: trim_blocks, lstrip_blocks, loopcontrols);
// errors that name the line; hostile templates and inputs bounded. The real models' templates are
// checked byte for byte against jinja2 itself by the chat_template_oracle ctest.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "llmq/chat_template.hpp"

namespace {

using llmq::ChatTemplateOptions;

std::string render(const std::string& src, const std::string& messages = "[]", ChatTemplateOptions options = {}) {
  if (options.date.empty()) options.date = "2025-03-14";
  std::string out;
  const llmq::Status st = llmq::render_chat_template(src, messages, options, &out);
  return st.ok() ? out : "ERROR " + st.message();
}

TEST(ChatTemplate, WhitespaceControl) {
  // trim_blocks eats the newline after %} and #}; lstrip_blocks the indentation before {% and {#.
  EXPECT_EQ(render("a\n  {# c #}\n  b\n  {% if 1 %}\nX\n  {% endif %}\n{{ 1 }}\nend\n"), "a\n  b\nX\n1\nend");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}  c"), "ab  c");
  EXPECT_EQ(render("x {{- ' y ' -}} z"), "x y z");
  EXPECT_EQ(render("  {%+ if true %}k{% endif %}"), "  k");
  EXPECT_EQ(render("{% if true %}\n\nq{% endif %}\n"), "\nq");
}

TEST(ChatTemplate, LoopVariablesAndControl) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }}{% if not loop.first %}{{ loop.previtem }}{% endif %};{% endfor %}"),
            "103TrueFalse3;212FalseFalse3a;321FalseTrue3b;");
  EXPECT_EQ(render("{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}"), "13");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }} {% endfor %}"), "a=1 b=[2] ");
  EXPECT_EQ(render("{% for x in range(6) if x % 2 %}{{ x }}/{{ loop.length }} {% endfor %}"), "1/3 3/3 5/3 ");
}

TEST(ChatTemplate, ScopingAndNamespace) {
  // A set inside a loop iteration is forgotten; namespace attributes survive (the Qwen/DeepSeek idiom).
  EXPECT_EQ(render("{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = i %}{% endfor %}{{ x }}"), "0000");
  EXPECT_EQ(render("{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% macro m(a, b=2) %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{% set c = 5 %}{{ m(1) }}{{ m(1, b=3) }}"),
            "[125][135]");
  EXPECT_EQ(render("{% set t %}in {{ 1 + 1 }}{% endset %}{{ t | upper }}"), "IN 2");
}

TEST(ChatTemplate, ExpressionsFollowPython) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': (1, 2)}] }}|{{ 1e16 }}|{{ 0.1 + 0.2 }}|{{ 7 // -2 }}|{{ -7 % 3 }}|"
                   "{{ 2 ** 10 }}|{{ 3 / 2 }}|{{ 4 / 2 }}"),
            "[1, 'a', None, True, 1.5, {'k': (1, 2)}]|1e+16|0.30000000000000004|-4|2|1024|1.5|2.0");
  EXPECT_EQ(render("{{ 'abc'[::-1] }}{{ [1,2,3][:-1] }}{{ 'a\\x41\\u00e9' }}{{ 'x' 'y' }}{{ 'a' ~ 1 }}"), "cba[1, 2]aAéxya1");
  EXPECT_EQ(render("{{ 'yes' if 1 in [1, 2] else 'no' }}{{ 'b' not in 'abc' }}{{ 1 < 2 < 3 }}{{ none or 'x' }}"),
            "yesFalseTruex");
  EXPECT_EQ(render("{{ \"it's\" | string }}{{ [\"it's\"] }}"), "it's[\"it's\"]");
  EXPECT_EQ(render("{{ 'a' ~ 1 + 2 }}").rfind("ERROR", 0), 0u);  // ('a' ~ 1) + 2: str + int, as in jinja2
}

TEST(ChatTemplate, UndefinedAndTests) {
  EXPECT_EQ(render("[{{ x }}][{{ x | length }}]{{ x is defined }}{{ d.y is defined }}{{ d.y }}", R"({"messages": [], "d": {}})"),
            "[][0]FalseFalse");
  EXPECT_EQ(render("{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is number }}{{ none is none }}"
                   "{{ 'a' is sequence }}{{ 3 is odd }}{{ 'x' is equalto 'x' }}"), "TrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ d.y.z }}", R"({"messages": [], "d": {}})").rfind("ERROR chat template line 1", 0), 0u);
}

TEST(ChatTemplate, FiltersAndMethods) {
  EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|"
                   "{{ [1, 2] | join('-') }}|{{ x | default('dflt') }}|{{ 'hello world' | title }}|{{ 'abc'.startswith('ab') }}"),
            "a b|hi|['a', 'b', '', 'c']|['a', 'b']|1-2|dflt|Hello World|True");
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}"
                   "{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}{{ (messages | first).role }}",
                   R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])"),
            "['q']1user");
  EXPECT_EQ(render("{{ {'b': [1, 2.5, 'é\"'], 'a': none} | tojson }}"), "{\"b\": [1, 2.5, \"é\\\"\"], \"a\": null}");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ ['a', 'b', 'a'] | unique | list }}{{ 'ab' | replace('a', 'x') }}{{ '5' | int + 1 }}{{ d.get('k', 7) }}",
                   R"({"messages": [], "d": {}})"), "['a', 'b']xb67");
}

TEST(ChatTemplate, StrftimeNowAndContext) {
  ChatTemplateOptions o;
  o.date = "2024-02-29";
  o.bos_token = "<s>";
  EXPECT_EQ(render("{{ bos_token }}{{ strftime_now('%d %b %Y|%A %a %B %m %y %j %H:%M|%-d') }}{{ tools }}{{ add_generation_prompt }}", "[]", o),
            "<s>29 Feb 2024|Thursday Thu February 02 24 060 00:00|29NoneTrue");
  o.date = "2024-13-01";
  EXPECT_NE(render("x", "[]", o).find("is not a YYYY-MM-DD day"), std::string::npos);
}

TEST(ChatTemplate, ErrorsNameTheLineAndThing) {
  EXPECT_EQ(render("ok\n\n{{ x | bogus }}"), "ERROR chat template line 3 column 8: unknown filter 'bogus'");
  EXPECT_EQ(render("{{ raise_exception('Roles must alternate') }}"), "ERROR chat template line 1 column 4: raise_exception: Roles must alternate");
  EXPECT_NE(render("\n{% if true %}x").find("line 2"), std::string::npos);
  EXPECT_NE(render("{% frobnicate %}").find("unknown tag 'frobnicate'"), std::string::npos);
  EXPECT_NE(render("{{ 'abc'.nosuch() }}").find("no method 'nosuch'"), std::string::npos);
  EXPECT_NE(render("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(render("x", "{not json").find("not valid JSON"), std::string::npos);
}

TEST(ChatTemplate, HostileTemplatesAreBounded) {
  std::string nested;
  for (int i = 0; i < 10000; ++i) nested += "{% if true %}";
  EXPECT_NE(render(nested).find("nested deeper than"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}").find("nested deeper than"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(10000, '-') + "1 }}").find("nested deeper than"), std::string::npos);
  EXPECT_NE(render("{% for i in range(1000000000) %}{% endfor %}").find("loop iterations"), std::string::npos);
  const std::string cube = "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{% endfor %}{% endfor %}{% endfor %}";
  ChatTemplateOptions unlimited_work;  // the iteration bound on its own
  unlimited_work.max_work = INT64_MAX;
  EXPECT_NE(render(cube, "[]", unlimited_work).find("loop iterations"), std::string::npos);
  ChatTemplateOptions small;
  small.max_output_bytes = 1 << 20;
  EXPECT_NE(render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "[]", small).find("output larger than"), std::string::npos);
  EXPECT_NE(render("{{ 'x' * 1000000000000 }}").find("output larger than"), std::string::npos);
  EXPECT_NE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("macro calls nested deeper"), std::string::npos);
  EXPECT_NE(render("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  // Truncated and garbled templates are errors, never crashes.
  const std::string src = "{%- for m in messages %}{{ m['content'] | trim ~ (m.x if m.y else '') }}{% endfor %}";
  for (size_t n = 0; n < src.size(); ++n) (void)render(src.substr(0, n), R"([{"content": "a"}])");
}

TEST(ChatTemplate, InvalidUtf8ContentPassesThrough) {
  nlohmann::json messages = nlohmann::json::array();
  const std::string bad = "a\xff\xfe b\xc3";
  messages.push_back({{"role", "user"}, {"content", bad}});
  std::string out;
  ChatTemplateOptions o;
  o.date = "2025-01-01";
  ASSERT_TRUE(llmq::render_chat_template("[{{ messages[0].content }}|{{ messages[0].content[1:] | length }}]", messages, o, &out).ok());
  EXPECT_EQ(out, "[" + bad + "|5]");  // 6 characters: each invalid byte counts one
}

TEST(ChatTemplate, ReadsAModelDirectory) {
  llmq::ModelChatTemplate t;
  ASSERT_TRUE(llmq::read_model_chat_template(std::string(LLMQ_REPO_TESTDATA) + "/chat_templates/model_dir", &t).ok());
  EXPECT_EQ(t.bos_token, "<s>");
  EXPECT_EQ(t.eos_token, "</s>");
  EXPECT_NE(t.origin.find("(default)"), std::string::npos);
  EXPECT_NE(t.source.find("[AVAILABLE_TOOLS]"), std::string::npos);
  EXPECT_FALSE(llmq::read_model_chat_template(std::string(LLMQ_REPO_TESTDATA) + "/no_such_dir", &t).ok());
}

TEST(ChatTemplate, ReviewedCornersRenderAsJinja2OrAreRefusedByName) {
  const std::string messages = R"([{"role": "system", "content": "a"}, {"role": "user", "content": "\u00e9"}])";
  llmq::ChatTemplateOptions o;
  std::string out;
  // {% set ns.attr %} blocks, int of a float string and of padded digits, key order kept by tojson
  // (what jinja2 renders for the same template, checked against python3-jinja2 3.1.6).
  ASSERT_TRUE(llmq::render_chat_template("{% set ns = namespace(x='') %}{% for m in messages %}{% set ns.x %}{{ ns.x }}"
                                         "{{ m.role[:1] }}{% endset %}{% endfor %}{{ ns.x }}|{{ '3.7'|int }}|{{ ' 4 '|int }}|"
                                         "{{ messages[0]|tojson }}",
                                         messages, o, &out)
                  .ok());
  EXPECT_EQ(out, "su|3|4|{\"role\": \"system\", \"content\": \"a\"}");
  // What the subset does not map as Python does is refused by name.
  llmq::Status st = llmq::render_chat_template("{{ messages[1].content|upper }}", messages, o, &out);
  EXPECT_NE(st.message().find("filter 'upper' of non-ASCII text is not supported"), std::string::npos) << st.to_string();
  st = llmq::render_chat_template("{{ messages|tojson(true) }}", messages, o, &out);
  EXPECT_NE(st.message().find("tojson: only indent > 0"), std::string::npos) << st.to_string();
  st = llmq::render_chat_template("{{ messages|tojson(sort_keys=true) }}", messages, o, &out);
  EXPECT_NE(st.message().find("tojson: only indent > 0"), std::string::npos) << st.to_string();
}

TEST(ChatTemplate, LongChainsAndHugeCountsAreRefusedOrCheapNeverACrash) {
  const std::string messages = "[]";
  llmq::ChatTemplateOptions o;
  std::string out;
  for (const std::string& link : {std::string("+1"), std::string(".a"), std::string("|trim")}) {
    std::string t = "{{ 1";
    for (int i = 0; i < 300000; ++i) t += link;  // a left-deep tree far past the nesting limit
    t += " }}";
    const llmq::Status st = llmq::render_chat_template(t, messages, o, &out);
    EXPECT_NE(st.message().find("expression nested deeper than 256 levels"), std::string::npos) << link << ": " << st.to_string();
  }
  // Counts that would loop 2^63 times: an empty sequence repeated, a power of one.
  ASSERT_TRUE(llmq::render_chat_template("{{ '' * 9223372036854775807 }}|{{ 1 ** 9223372036854775807 }}|{{ (-3) ** 5 }}", messages,
                                         o, &out)
                  .ok());
  EXPECT_EQ(out, "|1|-243");  // as jinja2 renders it
  // Values nested one level per loop turn stop at the limit; a huge string repeated in a list is
  // held to the output bound by its bytes, not its item count.
  llmq::Status st = llmq::render_chat_template(
      "{% set ns = namespace(x=[]) %}{% for i in range(400000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|length }}", messages,
      o, &out);
  EXPECT_NE(st.message().find("a value nested deeper than 256 levels"), std::string::npos) << st.to_string();
  o.max_output_bytes = 1 << 20;
  st = llmq::render_chat_template("{% set s = 'x' * 600000 %}{{ ([s] * 40)|length }}", messages, o, &out);
  EXPECT_FALSE(st.ok());
  ASSERT_TRUE(llmq::render_chat_template("{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}"
                                         "{{ ns.x|length }}|{{ [[1, [2]], {'a': [3]}] }}",
                                         messages, o, &out)
                  .ok());
  EXPECT_EQ(out, "1|[[1, [2]], {'a': [3]}]");  // as jinja2 renders it
  // A namespace holding itself: printing it is an error, not endless recursion, comparing it is by
  // identity (as Python's), and the cycle is freed when the render ends (LeakSanitizer checks).
  st = llmq::render_chat_template("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns.x }}", messages, o, &out);
  EXPECT_NE(st.message().find("holding itself"), std::string::npos) << st.to_string();
  ASSERT_TRUE(llmq::render_chat_template("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns.x == ns.x }}|{{ ns.x|length }}",
                                         messages, o, &out)
                  .ok());
  EXPECT_EQ(out, "True|1");
}


// Found while writing fuzz_chat_template (docs/fuzzing.md): work that no limit counted.
// A list holding another list twice, 40 levels down, is 41 lists in memory but 2^40 items to
// print or compare; printing one to 64 MB took 44 s and 1.5 GB, comparing one never ended. Now the
// render's work is bounded (max_work) and so is a printed value's length (max_output_bytes), and
// the error names where the template was.
TEST(ChatTemplate, SharedListsPrintAndCompareWithinTheWorkAndTextBounds) {
  const std::string doubled = "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}\n";
  ChatTemplateOptions o;
  o.max_work = int64_t{1} << 26;  // the bound, not its size, is under test: a small one keeps the test fast
  for (const std::string& use : {"{{ ns.a }}", "{{ ns.a == ns.a }}", "{{ ns.a|tojson }}", "{{ [ns.a] in [[ns.a]] }}",
                                 "{{ ns.a|string|length }}", "{{ [ns.a, ns.a]|unique|list|length }}"}) {
    const std::string got = render(doubled + use, "[]", o);
    EXPECT_NE(got.find("ERROR chat template line 2 column "), std::string::npos) << use << ": " << got;
    EXPECT_NE(got.find("max_work = 67108864"), std::string::npos) << use << ": " << got;
  }
  o = ChatTemplateOptions{};
  o.max_output_bytes = 1 << 20;  // printed text is held to the output bound, whatever the budget
  EXPECT_NE(render(doubled + "{{ ns.a|tojson|length }}", "[]", o).find("a value printed longer than 1048576 bytes"),
            std::string::npos);
  // tojson's indent made its spaces before any bound was checked: 10^9 of them per line.
  EXPECT_NE(render("{{ [[1]]|tojson(indent=1000000000) }}").find("line 1 column 10: a value printed longer than 67108864 bytes"),
            std::string::npos);
  EXPECT_EQ(render("{{ [[1]]|tojson(indent=1) }}"), "[\n [\n  1\n ]\n]");  // as json.dumps writes it
}

TEST(ChatTemplate, CopiesAndStatementsCountAgainstTheWorkBudget) {
  ChatTemplateOptions o;
  o.max_work = int64_t{1} << 24;
  // Each iteration copies the 1 MB string; a million of them would copy a terabyte.
  EXPECT_NE(render("{% set s = 'x' * 1000000 %}\n{% for i in range(1000) %}{% if s %}{% endif %}{% endfor %}", "[]", o)
                .find("ERROR chat template line 2 column 33: the render needs more than max_work"),
            std::string::npos);
  EXPECT_NE(render("{% for i in range(100000) %}{% set a = 1 %}{% endfor %}", "[]", o).find("max_work"), std::string::npos);
  EXPECT_EQ(render("{% for i in range(1000) %}{% set a = 1 %}{% endfor %}ok", "[]", o), "ok");
  o.max_work = -1;
  EXPECT_NE(render("x", "[]", o).find("limits must be positive"), std::string::npos);
}

// The vendor templates over 512 turns of 1 KB each (a sixteenth of the most the server takes:
// 4096 messages, 8 MB) need well under a sixteenth of the default budget: the bound is far from
// what real templates do.
TEST(ChatTemplate, RealTemplatesOverALongConversationStayFarWithinTheWorkBudget) {
  nlohmann::json messages = nlohmann::json::array();
  for (int i = 0; i < 512; ++i) {
    std::string text;
    while (text.size() < 1000) text += "word" + std::to_string(i) + " ";
    messages.push_back({{"role", i % 2 == 0 ? "user" : "assistant"}, {"content", text}});
  }
  ChatTemplateOptions o;
  o.max_work = ChatTemplateOptions{}.max_work / 16;
  o.date = "2025-03-14";
  int templates = 0;
  for (const auto& f : std::filesystem::directory_iterator(std::string(LLMQ_REPO_TESTDATA) + "/chat_templates")) {
    if (f.path().extension() != ".jinja") continue;
    std::ifstream in(f.path());
    const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string out;
    const llmq::Status st = llmq::render_chat_template(source, messages, o, &out);
    EXPECT_TRUE(st.ok()) << f.path() << ": " << st.to_string();
    EXPECT_GT(out.size(), size_t{512 * 1000}) << f.path();
    ++templates;
  }
  EXPECT_EQ(templates, 11);
}

// `a if b else c if d else ...` recursed once per `else` outside the nesting count: 400,000 of
// them (a 4.8 MB template) overflowed the stack.
TEST(ChatTemplate, LongElseChainsAreRefusedNotAStackOverflow) {
  std::string t = "{{ 1";
  for (int i = 0; i < 400000; ++i) t += " if 1 else 1";
  EXPECT_NE(render(t + " }}").find("nested deeper than 256 levels"), std::string::npos);
  EXPECT_EQ(render("{{ 1 if 0 else 2 if 0 else 3 }}"), "3");
}

}  // namespace
