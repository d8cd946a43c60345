// Internals of the chat-template Jinja interpreter (jinja.h), shared by its
// parts: jinja_text.cpp (errors, values, text and JSON helpers),
// jinja_lex.cpp (tokens), jinja_parse.cpp (the parser), jinja_eval.cpp (statements and
// expressions) and jinja_filters.cpp (functions, methods, filters, repr).
// Not a public header: only those files include it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "model/jinja.h"

namespace tessera::model::jinja {

// ============================ errors ============================

struct JinjaError {
  core::ErrorCode code;
  std::string message;
};

[[noreturn]] void throw_parse(int line, const std::string& what);
[[noreturn]] void throw_unsupported(int line, const std::string& what);
[[noreturn]] void throw_render(int line, const std::string& what);

// ============================ text helpers (jinja_text.cpp) ============================

// Byte offsets of each code point start (plus the end) of s; invalid bytes
// count as one code point each.
std::vector<size_t> cp_offsets(const std::string& s);
// The code point at s[i] and its length in bytes (invalid: the byte, 1).
char32_t decode_at(const std::string& s, size_t i, size_t* len);
// Python's str.isspace() set.
bool is_py_space(char32_t c);
// Python's str.strip([chars]) family: which: 1 left, 2 right, 3 both.
std::string py_strip(const std::string& s, const std::string* chars, int which);
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string py_title(std::string s);
std::string py_capitalize(const std::string& s);
// Python's float repr.
std::string py_float(double d);
inline bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// ============================ values ============================

struct Object;
struct Func;

struct Value {
  enum T : uint8_t { Undef, None, Bool, Int, Float, Str, List, Dict, Ns, Fn } t = Undef;
  bool b = false;
  uint16_t depth = 0;  // container nesting
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<std::vector<Value>> list;
  std::shared_ptr<Object> dict;  // Dict and Ns
  std::shared_ptr<const Func> fn;

  static Value none() { return make(None); }
  static Value boolean(bool v) {
    Value x = make(Bool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = make(Int);
    x.i = v;
    return x;
  }
  static Value real(double v) {
    Value x = make(Float);
    x.f = v;
    return x;
  }
  static Value str(std::string v) {
    Value x = make(Str);
    x.s = std::move(v);
    return x;
  }
  static Value make(T t) {
    Value x;
    x.t = t;
    return x;
  }
  bool numeric() const { return t == Int || t == Float || t == Bool; }
  double num() const { return t == Float ? f : t == Int ? static_cast<double>(i) : (b ? 1.0 : 0.0); }
  int64_t inum() const { return t == Int ? i : t == Bool ? (b ? 1 : 0) : static_cast<int64_t>(f); }
};

struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& k) const {
    for (const auto& [key, v] : items)
      if (key == k) return &v;
    return nullptr;
  }
  void set(const std::string& k, Value v) {
    for (auto& [key, old] : items)
      if (key == k) {
        old = std::move(v);
        return;
      }
    items.emplace_back(k, std::move(v));
  }
};

const char* type_name(const Value& v);
bool truthy(const Value& v);

// ============================ AST ============================

enum class K : uint8_t {
  // expressions
  Literal, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Binary, Compare, Cond, ListLit,
  DictLit,
  // statements
  Text, Emit, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Body,
};

struct Node {
  K kind;
  int line = 0;
  std::string name;                          // Name/Attr/Filter/Test/Macro name, operator, Text
  std::vector<std::string> names;            // For/Set targets, Macro params, keyword names
  std::vector<std::unique_ptr<Node>> args;   // operands, positional arguments, elements
  std::vector<std::unique_ptr<Node>> kwargs; // keyword values (names[i]); macro defaults (may be null)
  std::vector<std::string> ops;              // Compare operators
  std::vector<std::unique_ptr<Node>> body, orelse;
  std::unique_ptr<Node> x, y, z;
  Value lit;
  bool flag = false;  // Test: negated; Set: namespace attribute; Slice parts present
};

using NodeP = std::unique_ptr<Node>;
NodeP mk(K kind, int line);

// ============================ tokens (jinja_lex.cpp) ============================

enum class Tok : uint8_t { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;
  int line;
  int64_t i = 0;
  double f = 0;
};

// The template's tokens, with Hugging Face's whitespace control (trim_blocks
// and lstrip_blocks on, one trailing newline dropped); the last is Eof.
std::vector<Token> lex(std::string_view source);

// What the parser accepts (jinja_parse.cpp): anything else is a parse-time error.
const std::unordered_set<std::string>& known_filters();
const std::unordered_set<std::string>& known_tests();
const std::unordered_set<std::string>& known_methods();
const std::unordered_set<std::string>& known_globals();

// ============================ evaluator ============================

struct Func {
  enum Kind { Builtin, Macro, Caller } kind;
  std::string name;
  const Node* node = nullptr;  // Macro: the macro; Caller: the call block
  struct Scope* scope = nullptr;  // Caller: the scope of the call block
};

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> vars;
  const Value* lookup(const std::string& k) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(k);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* get(size_t i, const char* name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

Value from_json(const nlohmann::ordered_json& j, int depth);
void json_string(std::string& out, const std::string& s, bool ascii);

struct JsonOpts {
  std::string indent;  // empty: compact
  bool has_indent = false;
  bool ascii = false;
  bool sort_keys = false;
  std::string item_sep = ", ", key_sep = ": ";
};

// Renders a parsed template (jinja_eval.cpp; its functions, methods and
// filters in jinja_filters.cpp).
class Evaluator {
 public:
  Evaluator(const RenderOptions& opts) : opts_(opts), lim_(opts.limits) {
    char here = 0;
    stack_top_ = reinterpret_cast<uintptr_t>(&here);
  }

  void run(const Node& root, const nlohmann::ordered_json& context, std::string& out);

 private:
  // ---------------- statements ----------------
  Flow exec_body(const std::vector<NodeP>& body, Scope& scope, std::string& out);
  void append(std::string& out, const std::string& s, int line);
  void step(int line);

  // Statement and expression recursion together (macro calls inside nested
  // blocks inside nested expressions): bounded so the native stack is, by
  // depth and by the bytes of stack used since the evaluator was made (frames
  // are several times larger in sanitizer builds; a server thread's stack
  // may be smaller than the main thread's).
  struct Recursion {
    Recursion(Evaluator* e, int line) : e_(e) {
      char here = 0;
      const uintptr_t at = reinterpret_cast<uintptr_t>(&here);
      const uintptr_t used = e_->stack_top_ > at ? e_->stack_top_ - at : 0;
      if (++e_->recursion_ > kMaxRecursion || used > kMaxStackBytes) throw_render(line, "template recursion too deep");
    }
    ~Recursion() { --e_->recursion_; }
    Evaluator* e_;
  };
  static constexpr int kMaxRecursion = 1500;
  static constexpr uintptr_t kMaxStackBytes = 1u << 20;

  Flow exec(const Node& n, Scope& scope, std::string& out);
  std::vector<Value> iterate(const Value& v, int line);
  void bind_targets(const Node& n, const Value& item, Scope& s);
  Flow exec_for(const Node& n, Scope& scope, std::string& out);

  // ---------------- calls ----------------
  Args eval_args(const Node& call, Scope& scope);

  struct CallDepth {
    CallDepth(Evaluator* e, int line) : e_(e) {
      if (++e_->call_depth_ > e_->lim_.max_call_depth) throw_render(line, "macro calls nested too deeply");
    }
    ~CallDepth() { --e_->call_depth_; }
    Evaluator* e_;
  };

  // Binds parameters (then defaults, in the macro's scope) and renders the body.
  Value call_macro(const Node& m, const Args& args, Scope& caller_scope, int line);
  Value call_function(const Value& fv, const Args& args, Scope& scope, int line);

  // ---------------- methods ----------------
  Value call_method(const Value& obj, const std::string& m, const Args& a, int line);
  Value split(const std::string& s, const std::string* sep, int64_t maxsplit, int line);
  std::string replace(const std::string& s, const std::string& o, const std::string& n, int64_t count, int line);

  // ---------------- helpers ----------------
  Value new_list();
  void check_size(const std::string& s, int line) const;
  void check_depth(const Value& v, int line) const;
  void fix_depth(Value& v, int line) const;

  // str(v) as Python prints it (Undefined: empty).
  std::string to_str(const Value& v, int line);
  static void py_quote(std::string& out, const std::string& s);
  void repr(std::string& out, const Value& v, int line, int depth, bool top);
  void to_json(std::string& out, const Value& v, const JsonOpts& o, int depth, int line);
  bool equals(const Value& a, const Value& b, int depth = 0);

  // <0, 0, >0; lists lexicographically.
  int compare(const Value& a, const Value& b, int line, int depth = 0);
  bool contains(const Value& container, const Value& x, int line);

  // ---------------- expressions ----------------
  Value attr(const Value& obj, const std::string& name);
  Value item(const Value& obj, const Value& key, int line);
  Value slice(const Value& obj, const Node& n, Scope& scope);
  Value arith(const std::string& op, const Value& l, const Value& r, int line);
  Value eval(const Node& n, Scope& scope);

  // ---------------- tests ----------------
  bool apply_test(const Node& n, const Value& v, Scope& scope);
  bool test_by_name(const std::string& name, const Value& v, const Value* argv, int line);

  // ---------------- filters ----------------
  Value apply_filter_chain(const Node& chain, Value body, Scope& scope);
  Value apply_filter(const Node& n, Value v, Scope& scope);
  Value filter(const std::string& f, const Value& v, const Args& a, int line);

  // `attribute` of x, with dotted paths and integer parts ("a.b", "0").
  Value get_path(const Value& x, const Value& path);

  template <typename KeyFn>
  void sort_values(std::vector<Value>& items, bool case_sensitive, bool reverse, int line, KeyFn key) {
    auto norm = [&](const Value& x) {
      Value k = key(x);
      if (!case_sensitive && k.t == Value::Str) k.s = ascii_lower(k.s);
      return k;
    };
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& x : items) keyed.emplace_back(norm(x), std::move(x));
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) {
      step(line);
      const int c = compare(p.first, q.first, line);
      return reverse ? c > 0 : c < 0;
    });
    items.clear();
    for (auto& [_, x] : keyed) items.push_back(std::move(x));
  }

  const RenderOptions& opts_;
  const Limits& lim_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int recursion_ = 0;
  uintptr_t stack_top_ = 0;
};

}  // namespace tessera::model::jinja
