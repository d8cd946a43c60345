// The chat-template Jinja interpreter: each construct on a small template
// with its expected output written from Jinja's semantics (as transformers
// renders: trim_blocks, lstrip_blocks), the errors (parse-time for what is not
// supported, raise_exception, limits against hostile templates), and one real
// template (Qwen3's) against outputs produced by @huggingface/jinja.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/io.h"
#include "model/jinja.h"

namespace tessera::model {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kDir = std::string(TESSERA_TEST_DATA) + "/chat";

std::string render(const std::string& src, const ojson& ctx = ojson::object()) {
  auto t = jinja::Template::parse(src);
  EXPECT_TRUE(t.ok()) << src << " -> " << t.status().to_string();
  if (!t.ok()) return "<parse error>";
  auto out = (*t)->render(ctx);
  EXPECT_TRUE(out.ok()) << src << " -> " << out.status().to_string();
  return out.ok() ? *out : "<render error>";
}

core::Status render_error(const std::string& src, const ojson& ctx = ojson::object()) {
  auto t = jinja::Template::parse(src);
  if (!t.ok()) return t.status();
  auto out = (*t)->render(ctx);
  return out.ok() ? core::ok_status() : out.status();
}

TEST(Jinja, TextExpressionsAndComments) {
  EXPECT_EQ(render("Hello {{ name }}!{# a comment #}", {{"name", "world"}}), "Hello world!");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true }}"), "a1NoneTrue");
  EXPECT_EQ(render("{{ \"x\\ny\" }}|{{ 'it\\'s' }}"), "x\ny|it's");
  EXPECT_EQ(render("{{ 'ab' 'cd' }}"), "abcd");  // adjacent literals
  EXPECT_EQ(render("one trailing newline dropped\n"), "one trailing newline dropped");
  EXPECT_EQ(render("{{ missing }}|{{ missing.attr }}|{{ missing['x'] }}"), "||");
}

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
  EXPECT_EQ(render("{% if true %}\n    yes\n    {% endif %}\nend"), "    yes\nend");
  EXPECT_EQ(render("x {% if true %}y{% endif %}"), "x y");  // not at the start of a line: kept
  EXPECT_EQ(render("{# c #}\nA"), "A");
  EXPECT_EQ(render("{{ 'v' }}\nA"), "v\nA");  // expressions keep their newline
  EXPECT_EQ(render("  {%+ if true %}k{% endif %}"), "  k");
}

TEST(Jinja, ForLoops) {
  const ojson ctx = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", ctx),
            "1a,2b,3c");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index0 }}{{ loop.first }}{{ loop.length }}{% endfor %}", ctx),
            "0True31False32False3");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.previtem }}{{ loop.revindex }}|{% endfor %}", ctx), "3|a2|b1|");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in xs if x != 'b' %}{{ x }}{{ loop.length }}{% endfor %}", ctx), "a2c2");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}),
            "z=1;a=2;");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", {{"d", {{"p", 1}, {"q", 2}}}}), "pq");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{% if x == 'c' %}{% break %}{% endif %}"
                   "{{ x }}{% endfor %}",
                   ctx),
            "a");
  EXPECT_EQ(render("{% for x in range(3) %}{{ x }}{% endfor %}{% for x in range(5, 1, -2) %}{{ x }}{% endfor %}"),
            "01253");
  // A set inside a loop does not leak out of it.
  EXPECT_EQ(render("{% set n = 0 %}{% for x in xs %}{% set n = n + 1 %}{% endfor %}{{ n }}", ctx), "0");
  // Nor from one iteration to the next (Python's Jinja2 3.1 renders these so).
  EXPECT_EQ(render("{% set c = 0 %}{% for i in range(3) %}{{ c }}{% set c = c + 1 %}{% endfor %}"), "000");
  EXPECT_EQ(render("{% for m in ms %}{% if m.role == 'system' %}{% set sys = m.content %}{% endif %}[{{ sys }}]{% endfor %}",
                   {{"ms", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}}}),
            "[S][]");
}

TEST(Jinja, ConditionalsAndSet) {
  EXPECT_EQ(render("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {{"a", false}, {"b", true}}), "B");
  EXPECT_EQ(render("{% if a %}A{% elif b %}B{% else %}C{% endif %}"), "C");
  EXPECT_EQ(render("{% set x = 2 %}{% set y, z = [3, 4] %}{{ x + y * z }}"), "14");
  EXPECT_EQ(render("{% set block %}in {{ 'side' }}{% endset %}[{{ block }}]"), "[in side]");
  EXPECT_EQ(render("{{ 'yes' if c else 'no' }}{{ 'only' if c }}", {{"c", false}}), "no");
  EXPECT_EQ(render("{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
                   "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }}/{{ ns.s }}"),
            "3/012");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}"),
            "Hi A! Hi B? Hi C.");
  EXPECT_EQ(render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                   "{% call wrap('b') %}bold{% endcall %}"),
            "<b>bold</b>");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
}

TEST(Jinja, Operators) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2.5 }}"),
            "3 -4 1 2 3.5 1024 3.5");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' == 'a' }} {{ 1 == 1.0 }} {{ 'a' != 'b' }}"),
            "True False True True True");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }}", {{"d", {{"k", 1}}}}),
            "True True True True");
  EXPECT_EQ(render("{{ not 0 }} {{ 0 or 'x' }} {{ 1 and 2 }} {{ [] or [] }}"), "True x 2 []");
  EXPECT_EQ(render("{{ [1, 2] + [3] }} {{ 'ab' * 2 }} {{ -(3) }} {{ (1, 2) }}"), "[1, 2, 3] abab -3 [1, 2]");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }} {{ 1e20 * 10 }} {{ 2.0 }}"), "0.30000000000000004 1e+21 2.0");
}

TEST(Jinja, SubscriptsAndSlices) {
  const ojson ctx = {{"xs", {1, 2, 3, 4, 5}}, {"s", "héllo"}, {"m", {{"role", "user"}}}};
  EXPECT_EQ(render("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:3] }}{{ xs[::-1] }}{{ xs[::2] }}{{ xs[:-3] }}", ctx),
            "15[2, 3][5, 4, 3, 2, 1][1, 3, 5][1, 2]");
  EXPECT_EQ(render("{{ s[1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s | length }}", ctx), "éélolléh5");
  EXPECT_EQ(render("{{ m.role }}{{ m['role'] }}{{ m.content is defined }}{{ xs.0 }}", ctx), "useruserFalse1");
}

TEST(Jinja, Filters) {
  const ojson ctx = {{"msgs", {{{"role", "user"}, {"content", "a"}}, {{"role", "tool"}, {"content", "b"}},
                               {{"role", "user"}, {"content", "c"}}}}};
  EXPECT_EQ(render("{{ '  x  ' | trim }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ 'hello world' | title }}"
                   "|{{ 'hELLO' | capitalize }}"),
            "x|ABab|Hello World|Hello");
  EXPECT_EQ(render("{{ [1, 2] | length }}{{ 'abc' | count }}{{ [3, 1] | first }}{{ [3, 1] | last }}"), "2331");
  EXPECT_EQ(render("{{ ['a', 'b'] | join(', ') }}|{{ [1, 2] | join }}|{{ 'ab' | list }}"), "a, b|12|['a', 'b']");
  EXPECT_EQ(render("{{ x | default('d') }}{{ '' | default('e', true) }}{{ 0 | default('f') }}"), "de0");
  EXPECT_EQ(render("{{ 'aXbX' | replace('X', '-') }}{{ '3' | int + 1 }}{{ 'x' | int }}{{ 2.7 | int }}{{ 5 | string }}"),
            "a-b-4025");
  EXPECT_EQ(render("{% for m in msgs | selectattr('role', 'equalto', 'user') %}{{ m.content }}{% endfor %}", ctx), "ac");
  EXPECT_EQ(render("{{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | list }}", ctx),
            "['b']");
  EXPECT_EQ(render("{{ msgs | map(attribute='role') | unique | join(',') }}", ctx), "user,tool");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort }}{{ ['b', 'A'] | sort }}{{ [1, 2] | reverse | list }}"),
            "[1, 2, 3]['A', 'b'][2, 1]");
  EXPECT_EQ(render("{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}), "a1b2");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}"), "a\n  b\n\n  c");
  EXPECT_EQ(render("{% filter upper %}shout {{ 'it' }}{% endfilter %}"), "SHOUT IT");
}

TEST(Jinja, ToJson) {
  const ojson ctx = {{"t", {{"name", "f"}, {"z", {1, 2.5, true, nullptr}}, {"u", "Zürich \"q\"\n"}}}};
  EXPECT_EQ(render("{{ t | tojson }}", ctx),
            "{\"name\": \"f\", \"z\": [1, 2.5, true, null], \"u\": \"Zürich \\\"q\\\"\\n\"}");
  EXPECT_EQ(render("{{ t | tojson(indent=2) }}", {{"t", {{"b", {1}}, {"a", ojson::object()}}}}),
            "{\n  \"b\": [\n    1\n  ],\n  \"a\": {}\n}");
  EXPECT_EQ(render("{{ t | tojson(sort_keys=true) }}", {{"t", {{"b", 1}, {"a", 2}}}}), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(render("{{ 'é' | tojson(ensure_ascii=true) }}{{ '😀' | tojson(ensure_ascii=true) }}"),
            "\"\\u00e9\"\"\\ud83d\\ude00\"");
}

TEST(Jinja, Tests) {
  const ojson ctx = {{"s", "x"}, {"n", nullptr}, {"d", {{"a", 1}}}, {"l", {1}}, {"i", 3}, {"f", 1.5}, {"b", true}};
  EXPECT_EQ(render("{{ s is string }}{{ n is none }}{{ d is mapping }}{{ l is iterable }}{{ l is sequence }}"
                   "{{ i is number }}{{ f is number }}{{ i is integer }}{{ f is float }}",
                   ctx),
            "TrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ b is true }}{{ b is false }}{{ b is boolean }}{{ u is defined }}{{ u is undefined }}"
                   "{{ s is not none }}",
                   ctx),
            "TrueFalseTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ i is equalto 3 }}{{ i is eq(4) }}{{ 1 is in l }}{{ i is odd }}{{ 4 is even }}"
                   "{{ 9 is divisibleby 3 }}",
                   ctx),
            "TrueFalseTrueTrueTrueTrue");
}

TEST(Jinja, StringAndDictMethods) {
  const ojson ctx = {{"s", "  Hello, World  "}, {"d", {{"a", 1}, {"b", 2}}}};
  EXPECT_EQ(render("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\n\na'.lstrip('\n') }}",
                   ctx),
            "Hello, World|Hello, World  |  Hello, World|a|a");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'bc')) }}{{ s.upper() }}{{ 'A'.lower() }}", ctx),
            "TrueTrue  HELLO, WORLD  a");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ 'x</t>y'.split('</t>')[-1] }}"),
            "['a', 'b', '', 'c']['a', 'b']['a', 'b c']y");
  EXPECT_EQ(render("{{ 'aaa'.replace('a', 'b', 2) }}{{ 'the end'.title() }}{{ '-'.join(['a', 'b']) }}"), "bbaThe Enda-b");
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 9) }}{{ d.keys() | list }}{{ d.values() | list }}"
                   "{{ d.items() | list }}",
                   ctx),
            "1None9['a', 'b'][1, 2][['a', 1], ['b', 2]]");
}

TEST(Jinja, StrftimeNowAndVariables) {
  auto t = jinja::Template::parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok());
  jinja::RenderOptions o;
  o.now_epoch = 1721865600;  // 2024-07-25 00:00 UTC
  EXPECT_EQ((*t)->render(ojson::object(), o).value(), "25 Jul 2024");
}

TEST(Jinja, UnsupportedConstructsFailAtParseTime) {
  struct Case {
    const char* src;
    const char* names;
  };
  for (const Case& c : {Case{"{{ x | frobnicate }}", "filter 'frobnicate'"}, Case{"{% include 'x' %}", "tag 'include'"},
                        Case{"{% extends 'base' %}", "tag 'extends'"}, Case{"{{ x is prime }}", "test 'prime'"},
                        Case{"{{ s.zfill(3) }}", "method 'zfill'"}, Case{"{{ lipsum(2) }}", "function 'lipsum'"},
                        Case{"{% for x in xs recursive %}{% endfor %}", "recursive"}}) {
    auto t = jinja::Template::parse(c.src);
    ASSERT_FALSE(t.ok()) << c.src;
    EXPECT_NE(t.status().message().find(c.names), std::string::npos) << t.status().to_string();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  }
}

TEST(Jinja, SyntaxErrors) {
  for (const char* src : {"{% if x %}never closed", "{% for x in xs %}", "{{ x ", "{% macro m() %}", "{{ 'open }}",
                          "{# open", "{% endif %}", "{{ (1 }}", "{% set %}", "{{ x[] }}", "{% else %}"}) {
    auto t = jinja::Template::parse(src);
    EXPECT_FALSE(t.ok()) << src;
  }
  auto t = jinja::Template::parse("line one\n{% if x %}\n{{ x | nope }}\n{% endif %}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 3"), std::string::npos) << t.status().message();
}

TEST(Jinja, RaiseExceptionAndRuntimeErrors) {
  auto st = render_error("{% if x %}{{ raise_exception('roles must alternate') }}{% endif %}", {{"x", true}});
  EXPECT_EQ(st.code(), core::ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("roles must alternate"), std::string::npos);
  EXPECT_FALSE(render_error("{{ 1 / 0 }}").ok());
  EXPECT_FALSE(render_error("{{ 'a' + 1 }}").ok());
  EXPECT_FALSE(render_error("{{ undefined_thing + 1 }}").ok());
  EXPECT_FALSE(render_error("{{ 9223372036854775807 + 1 }}").ok());
}

TEST(Jinja, HostileTemplatesAreBounded) {
  // Unbounded recursion, huge loops, exponential strings and deep nesting end in errors, quickly.
  EXPECT_FALSE(render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").ok());
  EXPECT_FALSE(render_error("{% for i in range(100000000) %}x{% endfor %}").ok());
  EXPECT_FALSE(render_error("{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}").ok());
  EXPECT_FALSE(render_error("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                            "{% endfor %}{{ ns.s }}")
                   .ok());
  EXPECT_FALSE(render_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
                            "{% endfor %}{{ ns.l | tojson }}")
                   .ok());
  EXPECT_FALSE(jinja::Template::parse("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").ok());
  EXPECT_FALSE(jinja::Template::parse("{{ " + std::string(5000, '[') + " }}").ok());
  // Macro recursion inside deeply nested blocks: bounded before the native stack is.
  std::string deep = "{% macro f(n) %}";
  for (int i = 0; i < 60; ++i) deep += "{% if true %}";
  deep += "{{ f(n + 1) }}";
  for (int i = 0; i < 60; ++i) deep += "{% endif %}";
  deep += "{% endmacro %}{{ f(0) }}";
  EXPECT_FALSE(render_error(deep).ok());
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_FALSE(jinja::Template::parse(nested).ok());
}

TEST(ChatTemplate, RendersMessagesAndSpecialTokens) {
  auto t = ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const nlohmann::json msgs = {{{"role", "user"}, {"content", " hi "}}};
  EXPECT_EQ(t->render(msgs, true).value(), "<s><user>hi</s><assistant>");
  EXPECT_EQ(t->render(msgs, false).value(), "<s><user>hi</s>");
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->eos_token(), "</s>");
  EXPECT_FALSE(t->render(nlohmann::json::object(), true).ok());                    // not an array
  EXPECT_FALSE(t->render(nlohmann::json::array({{{"content", "x"}}}), true).ok());  // no role
  EXPECT_FALSE(ChatTemplate::parse("{{ x | nope }}", "", "").ok());
}

TEST(ChatTemplate, LoadsFromAFolder) {
  const std::string dir = ::testing::TempDir() + "/chat_template_load";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(core::write_file(dir + "/tokenizer_config.json",
                               R"({"bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>",
                                   "chat_template": [{"name": "tool_use", "template": "T"},
                                                     {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}]})")
                  .ok());
  auto t = ChatTemplate::load(dir);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->render(nlohmann::json::array(), false).value(), "<B>D<E>");
  ASSERT_TRUE(core::write_file(dir + "/chat_template.jinja", "J{{ eos_token }}").ok());  // wins over the config
  EXPECT_EQ(ChatTemplate::load(dir)->render(nlohmann::json::array(), false).value(), "J<E>");
  EXPECT_EQ(ChatTemplate::load(kDir + "/no_such_model").status().code(), core::ErrorCode::kNotFound);
}

// The real Qwen3 template against @huggingface/jinja's outputs (qwen3_expected.json,
// generated with that renderer, see its _comment).
TEST(ChatTemplate, Qwen3MatchesTheReferenceRenderer) {
  const auto src = core::read_file(kDir + "/qwen3_chat_template.jinja");
  ASSERT_TRUE(src.ok());
  auto t = ChatTemplate::parse(src.value(), "", "<|im_end|>");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const auto expected = ojson::parse(core::read_file(kDir + "/qwen3_expected.json").value());
  ASSERT_EQ(expected["cases"].size(), 2u);
  for (const auto& c : expected["cases"]) {
    ojson extra = ojson::object();
    if (c.contains("tools")) extra["tools"] = c["tools"];
    auto out = t->render_ordered(c["messages"], c["add_generation_prompt"].get<bool>(), extra);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, c["expected"].get<std::string>()) << c["name"];
  }
}

}  // namespace
}  // namespace tessera::model
