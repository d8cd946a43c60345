// The chat-template Jinja interpreter (see jinja.h): lexer, parser, evaluator.
#include "model/jinja.h"

#include <algorithm>
#include <cstdint>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tessera::model::jinja {

namespace {

// ============================ errors ============================

struct JinjaError {
  core::ErrorCode code;
  std::string message;
};

[[noreturn]] void throw_parse(int line, const std::string& what) {
  throw JinjaError{core::ErrorCode::kParseError, "template line " + std::to_string(line) + ": " + what};
}
[[noreturn]] void throw_unsupported(int line, const std::string& what) {
  throw JinjaError{core::ErrorCode::kUnimplemented,
                   "template line " + std::to_string(line) + ": unsupported " + what};
}
[[noreturn]] void throw_render(int line, const std::string& what) {
  throw JinjaError{core::ErrorCode::kInvalidArgument,
                   "template line " + std::to_string(line) + ": " + what};
}

// ============================ UTF-8 helpers ============================

// Byte offsets of each code point start (plus the end) of s; invalid bytes
// count as one code point each.
std::vector<size_t> cp_offsets(const std::string& s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    out.push_back(i);
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    i += n;
  }
  out.push_back(s.size());
  return out;
}

// The code point at s[i] and its length in bytes (invalid: the byte, 1).
char32_t decode_at(const std::string& s, size_t i, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
  *len = n;
  if (n == 1) return c;
  char32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

// Python's str.isspace() set.
bool is_py_space(char32_t c) {
  return (c >= 9 && c <= 13) || c == ' ' || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.strip([chars]) family: which: 1 left, 2 right, 3 both.
std::string py_strip(const std::string& s, const std::string* chars, int which) {
  std::vector<char32_t> set;
  if (chars) {
    for (size_t i = 0, n = 0; i < chars->size(); i += n) set.push_back(decode_at(*chars, i, &n));
  }
  auto strip_it = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_py_space(c);
  };
  const auto offs = cp_offsets(s);
  size_t a = 0, b = offs.size() - 1;  // code point index range [a, b)
  size_t n = 0;
  if (which & 1)
    while (a < b && strip_it(decode_at(s, offs[a], &n))) ++a;
  if (which & 2)
    while (b > a && strip_it(decode_at(s, offs[b - 1], &n))) --b;
  return s.substr(offs[a], offs[b] - offs[a]);
}

std::string ascii_upper(std::string s) {
  for (auto& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  return s;
}
std::string ascii_lower(std::string s) {
  for (auto& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return s;
}
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
std::string py_title(std::string s) {
  bool prev_letter = false;
  for (auto& c : s) {
    if (is_alpha(c)) {
      c = prev_letter ? (c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c)
                      : (c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c);
      prev_letter = true;
    } else {
      prev_letter = static_cast<unsigned char>(c) >= 0x80;  // a non-ASCII letter keeps the word going
    }
  }
  return s;
}
std::string py_capitalize(const std::string& s) {
  std::string r = ascii_lower(s);
  if (!r.empty() && r[0] >= 'a' && r[0] <= 'z') r[0] = static_cast<char>(r[0] - 32);
  return r;
}

// Python's float repr.
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  const int decpt = exp + 1;
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    const std::string xs = std::to_string(std::abs(x));
    out += (xs.size() < 2 ? "0" : "") + xs;
  }
  return sign + out;
}

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

const char* type_name(const Value& v) {
  switch (v.t) {
    case Value::Undef: return "undefined";
    case Value::None: return "none";
    case Value::Bool: return "bool";
    case Value::Int: return "int";
    case Value::Float: return "float";
    case Value::Str: return "string";
    case Value::List: return "list";
    case Value::Dict: return "dict";
    case Value::Ns: return "namespace";
    case Value::Fn: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.t) {
    case Value::Undef:
    case Value::None: return false;
    case Value::Bool: return v.b;
    case Value::Int: return v.i != 0;
    case Value::Float: return v.f != 0;
    case Value::Str: return !v.s.empty();
    case Value::List: return !v.list->empty();
    case Value::Dict: return !v.dict->items.empty();
    case Value::Ns:
    case Value::Fn: return true;
  }
  return false;
}

// ============================ AST ============================

enum class K : uint8_t {
  // expressions
  Literal, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Binary, Compare, Cond, ListLit,
  DictLit,
  // statements
  Text, Emit, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue, Body,
};

}  // namespace

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

namespace {

using NodeP = std::unique_ptr<Node>;

NodeP mk(K kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

// ============================ lexer ============================

enum class Tok : uint8_t { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;
  int line;
  int64_t i = 0;
  double f = 0;
};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Strips trailing whitespace (Python's rstrip) off a text token.
void rstrip_text(std::string& t) { t = py_strip(t, nullptr, 2); }

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(source) {
    // Jinja drops a single trailing newline (keep_trailing_newline=False).
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t open = find_open(pos);
      std::string text(src_.substr(pos, open - pos));
      if (open == src_.size()) {
        emit_text(std::move(text), pos);
        break;
      }
      const char kind = src_[open + 1];
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (mod == '-') {
        rstrip_text(text);
      } else if (mod != '+' && (kind == '%' || kind == '#')) {
        // lstrip_blocks: spaces and tabs from the start of the line to a block or comment tag.
        const size_t k = text.find_last_not_of(" \t");
        if (k == std::string::npos) {
          if (pos == 0 || src_[pos - 1] == '\n') text.clear();
        } else if (text[k] == '\n') {
          text.resize(k + 1);
        }
      }
      emit_text(std::move(text), pos);
      line_at(open);
      size_t p = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        const size_t close = src_.find("#}", p);
        if (close == std::string_view::npos) throw_parse(line_, "unterminated comment");
        const bool strip = close > p && src_[close - 1] == '-';
        pos = close + 2;
        pos = after_close(pos, strip, true);
        continue;
      }
      tokens_.push_back({kind == '%' ? Tok::BlockBegin : Tok::VarBegin, "", line_});
      pos = lex_tag(p, kind == '%');
    }
    tokens_.push_back({Tok::Eof, "", line_});
    return std::move(tokens_);
  }

 private:
  size_t find_open(size_t pos) const {
    while (true) {
      const size_t k = src_.find('{', pos);
      if (k == std::string_view::npos || k + 1 >= src_.size()) return src_.size();
      const char c = src_[k + 1];
      if (c == '{' || c == '%' || c == '#') return k;
      pos = k + 1;
    }
  }
  void line_at(size_t pos) {
    for (; counted_ < pos && counted_ < src_.size(); ++counted_)
      if (src_[counted_] == '\n') ++line_;
  }
  void emit_text(std::string text, size_t pos) {
    line_at(pos);
    if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), line_});
  }
  // After a closing tag: `-` skips whitespace; trim_blocks drops one newline after a block or comment.
  size_t after_close(size_t pos, bool strip, bool block) const {
    if (strip) {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    } else if (block && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t lex_tag(size_t p, bool block) {
    int braces = 0;
    while (true) {
      while (p < src_.size() && is_ws(src_[p])) {
        if (src_[p] == '\n') ++line_;
        ++p;
      }
      counted_ = std::max(counted_, p);
      if (p >= src_.size()) throw_parse(line_, block ? "unterminated '{%' tag" : "unterminated '{{' expression");
      const std::string_view rest = src_.substr(p);
      const bool dash = rest[0] == '-';
      const std::string_view close = block ? "%}" : "}}";
      if ((dash && rest.substr(1, 2) == close) || (!dash && rest.substr(0, 2) == close && (block || braces == 0))) {
        tokens_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", line_});
        return after_close(p + (dash ? 3 : 2), dash, block);
      }
      if (rest.substr(0, 1) == "+" && block && rest.substr(1, 2) == "%}") {
        tokens_.push_back({Tok::BlockEnd, "", line_});
        return p + 3;
      }
      const char c = rest[0];
      if (is_alpha(c) || c == '_') {
        size_t n = 1;
        while (n < rest.size() && (is_alpha(rest[n]) || rest[n] == '_' || (rest[n] >= '0' && rest[n] <= '9'))) ++n;
        tokens_.push_back({Tok::Name, std::string(rest.substr(0, n)), line_});
        p += n;
      } else if (c >= '0' && c <= '9') {
        size_t n = 0;
        while (n < rest.size() && (rest[n] >= '0' && rest[n] <= '9')) ++n;
        bool is_float = false;
        const bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::Op && tokens_.back().text == ".";
        if (!after_dot && n + 1 < rest.size() && rest[n] == '.' && rest[n + 1] >= '0' && rest[n + 1] <= '9') {
          is_float = true;
          ++n;
          while (n < rest.size() && (rest[n] >= '0' && rest[n] <= '9')) ++n;
        }
        if (!after_dot && n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
          size_t m = n + 1;
          if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
          if (m < rest.size() && rest[m] >= '0' && rest[m] <= '9') {
            while (m < rest.size() && (rest[m] >= '0' && rest[m] <= '9')) ++m;
            n = m;
            is_float = true;
          }
        }
        Token t{is_float ? Tok::Float : Tok::Int, std::string(rest.substr(0, n)), line_};
        if (is_float) {
          t.f = std::strtod(t.text.c_str(), nullptr);
        } else {
          auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), t.i);
          if (r.ec != std::errc()) throw_parse(line_, "integer literal out of range");
        }
        tokens_.push_back(std::move(t));
        p += n;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, c);
      } else {
        static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "|",
                                           ".",  ",",  ":",  "(",  ")",  "[",  "]", "{", "}", "<", ">", "="};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::strlen(op);
          if (rest.substr(0, n) == op) {
            tokens_.push_back({Tok::Op, op, line_});
            if (*op == '{') ++braces;
            if (*op == '}') --braces;
            p += n;
            found = true;
            break;
          }
        }
        if (!found) throw_parse(line_, std::string("unexpected character '") + c + "'");
      }
    }
  }

  size_t lex_string(size_t p, char quote) {
    std::string out;
    size_t i = p + 1;
    const int start_line = line_;
    while (true) {
      if (i >= src_.size()) throw_parse(start_line, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c == '\\' && i + 1 < src_.size()) {
        const char e = src_[i + 1];
        i += 2;
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'v': out += '\v'; break;
          case '0': out += '\0'; break;
          case '\\': out += '\\'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          case '\n': ++line_; break;
          case 'x':
          case 'u':
          case 'U': {
            const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (i + n > src_.size()) throw_parse(line_, "bad \\" + std::string(1, e) + " escape");
            uint32_t cp = 0;
            for (size_t k = 0; k < n; ++k) {
              const char h = src_[i + k];
              const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
              if (d < 0) throw_parse(line_, "bad \\" + std::string(1, e) + " escape");
              cp = cp * 16 + static_cast<uint32_t>(d);
            }
            if (cp > 0x10FFFF) throw_parse(line_, "bad \\U escape");
            i += n;
            append_utf8(out, cp);
            break;
          }
          default:  // Python keeps unknown escapes as written
            out += '\\';
            out += e;
        }
        continue;
      }
      out += c;
      ++i;
    }
    tokens_.push_back({Tok::String, std::move(out), start_line});
    return i + 1;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string_view src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t counted_ = 0;
};

// ============================ parser ============================

const std::unordered_set<std::string>& known_filters() {
  static const std::unordered_set<std::string> k = {
      "trim", "tojson", "length", "count", "list", "join", "items", "default", "d", "upper", "lower", "replace",
      "selectattr", "rejectattr", "select", "reject", "map", "first", "last", "string", "int", "float", "capitalize",
      "title", "abs", "safe", "indent", "unique", "reverse", "sort", "dictsort", "bool"};
  return k;
}
const std::unordered_set<std::string>& known_tests() {
  static const std::unordered_set<std::string> k = {
      "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string", "mapping",
      "iterable", "sequence", "callable", "sameas", "equalto", "eq", "==", "ne", "!=", "lt", "<", "le", "<=", "gt",
      ">", "ge", ">=", "in", "odd", "even", "divisibleby", "lower", "upper"};
  return k;
}
const std::unordered_set<std::string>& known_methods() {
  static const std::unordered_set<std::string> k = {
      "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "upper", "lower", "title", "capitalize",
      "replace", "find", "count", "join", "get", "items", "keys", "values", "isdigit", "isalpha", "isspace"};
  return k;
}
const std::unordered_set<std::string>& known_globals() {
  static const std::unordered_set<std::string> k = {"range", "namespace", "raise_exception", "strftime_now", "dict"};
  return k;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits) : t_(std::move(tokens)), limits_(limits) {}

  NodeP run() {
    auto root = mk(K::Body, 1);
    std::string end;
    root->body = parse_body({}, &end);
    // Calls of names that nothing defines are unsupported functions (load-time error).
    for (const auto& [name, line] : called_)
      if (!known_globals().count(name) && !assigned_.count(name) && name != "caller" && name != "loop")
        throw_unsupported(line, "function '" + name + "'");
    return root;
  }

 private:
  struct Depth {
    Depth(Parser* p) : p_(p) {
      if (++p_->depth_ > p_->limits_.max_nesting) throw_parse(p_->cur().line, "nesting too deep");
    }
    ~Depth() { --p_->depth_; }
    Parser* p_;
  };

  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) throw_parse(cur().line, std::string("expected '") + op + "', got " + describe(cur()));
    ++pos_;
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) throw_parse(cur().line, "expected a name, got " + describe(cur()));
    return t_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) throw_parse(cur().line, "expected '%}', got " + describe(cur()));
    ++pos_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "text";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "'%}'";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "'}}'";
      case Tok::Eof: return "the end of the template";
      case Tok::String: return "a string";
      case Tok::Int:
      case Tok::Float: return "a number";
      default: return "'" + t.text + "'";
    }
  }

  // Statements until one of `ends` (a `{% name` with name in ends); *end is
  // set to it (the `{%` and name are consumed), or "" at the end of input.
  std::vector<NodeP> parse_body(const std::vector<std::string>& ends, std::string* end) {
    Depth d(this);
    std::vector<NodeP> out;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (!ends.empty()) throw_parse(tk.line, "unterminated block: expected {% " + ends.back() + " %}");
        *end = "";
        return out;
      }
      if (tk.type == Tok::Text) {
        auto n = mk(K::Text, tk.line);
        n->name = tk.text;
        out.push_back(std::move(n));
        ++pos_;
      } else if (tk.type == Tok::VarBegin) {
        ++pos_;
        auto n = mk(K::Emit, tk.line);
        n->x = parse_tuple_expr();
        if (cur().type != Tok::VarEnd) throw_parse(cur().line, "expected '}}', got " + describe(cur()));
        ++pos_;
        out.push_back(std::move(n));
      } else if (tk.type == Tok::BlockBegin) {
        const Token& nt = peek();
        if (nt.type != Tok::Name) throw_parse(nt.line, "expected a tag name after '{%'");
        if (std::find(ends.begin(), ends.end(), nt.text) != ends.end()) {
          pos_ += 2;
          *end = nt.text;
          return out;
        }
        pos_ += 2;
        out.push_back(parse_statement(nt.text, nt.line));
      } else {
        throw_parse(tk.line, "unexpected " + describe(tk));
      }
    }
  }

  NodeP parse_statement(const std::string& tag, int line) {
    std::string end;
    if (tag == "if" || tag == "elif") {
      auto n = mk(K::If, line);
      n->x = parse_expr();
      expect_block_end();
      n->body = parse_body({"elif", "else", "endif"}, &end);
      if (end == "elif") {
        n->orelse.push_back(parse_statement("elif", cur().line));
        return n;  // the nested if consumed endif
      }
      if (end == "else") {
        expect_block_end();
        n->orelse = parse_body({"endif"}, &end);
      }
      expect_block_end();
      return n;
    }
    if (tag == "for") {
      auto n = mk(K::For, line);
      const bool paren = is_op("(");
      if (paren) ++pos_;
      n->names.push_back(expect_name());
      while (is_op(",")) {
        ++pos_;
        if (cur().type != Tok::Name) break;
        n->names.push_back(expect_name());
      }
      if (paren) expect_op(")");
      for (const auto& v : n->names) assigned_.insert(v);
      if (!is_name("in")) throw_parse(cur().line, "expected 'in' in for loop");
      ++pos_;
      n->x = parse_or();
      if (is_name("if")) {
        ++pos_;
        n->y = parse_expr(false);
      }
      if (is_name("recursive")) throw_unsupported(cur().line, "recursive for loop");
      expect_block_end();
      ++loops_;
      n->body = parse_body({"else", "endfor"}, &end);
      --loops_;
      if (end == "else") {
        expect_block_end();
        n->orelse = parse_body({"endfor"}, &end);
      }
      expect_block_end();
      return n;
    }
    if (tag == "set") {
      std::vector<std::string> targets{expect_name()};
      bool attr = false;
      if (is_op(".")) {
        ++pos_;
        targets.push_back(expect_name());
        attr = true;
      } else {
        while (is_op(",")) {
          ++pos_;
          targets.push_back(expect_name());
        }
      }
      if (!attr)
        for (const auto& v : targets) assigned_.insert(v);
      if (is_op("=")) {
        ++pos_;
        auto n = mk(K::Set, line);
        n->names = std::move(targets);
        n->flag = attr;
        n->x = parse_tuple_expr();
        expect_block_end();
        return n;
      }
      if (attr || targets.size() != 1) throw_parse(cur().line, "expected '=' in set");
      if (is_op("|")) throw_unsupported(cur().line, "filter on a block set");
      expect_block_end();
      auto n = mk(K::SetBlock, line);
      n->names = std::move(targets);
      n->body = parse_body({"endset"}, &end);
      expect_block_end();
      return n;
    }
    if (tag == "macro") {
      auto n = mk(K::Macro, line);
      n->name = expect_name();
      assigned_.insert(n->name);
      parse_params(n.get());
      expect_block_end();
      n->body = parse_body({"endmacro"}, &end);
      if (cur().type == Tok::Name) ++pos_;
      expect_block_end();
      return n;
    }
    if (tag == "call") {
      auto n = mk(K::CallBlock, line);
      if (is_op("(")) parse_params(n.get());
      n->x = parse_expr();
      if (n->x->kind != K::Call) throw_parse(line, "expected a macro call in {% call %}");
      expect_block_end();
      n->body = parse_body({"endcall"}, &end);
      expect_block_end();
      return n;
    }
    if (tag == "filter") {
      auto n = mk(K::FilterBlock, line);
      auto first = mk(K::Filter, cur().line);
      first->name = expect_name();
      if (!known_filters().count(first->name)) throw_unsupported(first->line, "filter '" + first->name + "'");
      if (is_op("(")) parse_args(first.get());
      first->x = mk(K::Literal, line);  // stands for the rendered body
      n->x = parse_filters(std::move(first), true);
      expect_block_end();
      n->body = parse_body({"endfilter"}, &end);
      expect_block_end();
      return n;
    }
    if (tag == "break" || tag == "continue") {
      if (loops_ == 0) throw_parse(line, "'" + tag + "' outside a loop");
      expect_block_end();
      return mk(tag == "break" ? K::Break : K::Continue, line);
    }
    if (tag == "generation") {  // transformers' assistant-mask tag: renders its body
      expect_block_end();
      auto n = mk(K::Body, line);
      n->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
      return n;
    }
    throw_unsupported(line, "tag '" + tag + "'");
  }

  void parse_params(Node* n) {
    expect_op("(");
    while (!is_op(")")) {
      const std::string p = expect_name();
      n->names.push_back(p);
      assigned_.insert(p);
      if (is_op("=")) {
        ++pos_;
        n->kwargs.push_back(parse_expr());
      } else {
        n->kwargs.push_back(nullptr);
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }

  // expr [, expr ...] as a tuple (a list value).
  NodeP parse_tuple_expr() {
    auto first = parse_expr();
    if (!is_op(",")) return first;
    auto n = mk(K::ListLit, first->line);
    n->args.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd) break;
      n->args.push_back(parse_expr());
    }
    return n;
  }

  NodeP parse_expr(bool with_cond = true) {
    Depth d(this);
    auto a = parse_or();
    if (with_cond && is_name("if")) {
      const int line = cur().line;
      ++pos_;
      auto n = mk(K::Cond, line);
      n->y = parse_or();
      n->x = std::move(a);
      if (is_name("else")) {
        ++pos_;
        n->z = parse_expr();
      }
      return n;
    }
    return a;
  }
  NodeP parse_or() {
    auto l = parse_and();
    while (is_name("or")) {
      auto n = mk(K::Or, cur().line);
      ++pos_;
      n->x = std::move(l);
      n->y = parse_and();
      l = std::move(n);
    }
    return l;
  }
  NodeP parse_and() {
    auto l = parse_not();
    while (is_name("and")) {
      auto n = mk(K::And, cur().line);
      ++pos_;
      n->x = std::move(l);
      n->y = parse_not();
      l = std::move(n);
    }
    return l;
  }
  NodeP parse_not() {
    if (is_name("not")) {
      Depth d(this);
      auto n = mk(K::Not, cur().line);
      ++pos_;
      n->x = parse_not();
      return n;
    }
    return parse_compare();
  }
  NodeP parse_compare() {
    auto first = parse_math1();
    NodeP n;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "not in";
        pos_ += 2;
      } else {
        break;
      }
      if (!n) {
        n = mk(K::Compare, first->line);
        n->args.push_back(std::move(first));
      }
      n->ops.push_back(op);
      n->args.push_back(parse_math1());
    }
    return n ? std::move(n) : std::move(first);
  }
  NodeP binary(NodeP l, const std::string& op, NodeP r) {
    auto n = mk(K::Binary, l->line);
    n->name = op;
    n->x = std::move(l);
    n->y = std::move(r);
    return n;
  }
  NodeP parse_math1() {
    auto l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[pos_++].text;
      l = binary(std::move(l), op, parse_concat());
    }
    return l;
  }
  NodeP parse_concat() {
    auto l = parse_math2();
    while (is_op("~")) {
      ++pos_;
      l = binary(std::move(l), "~", parse_math2());
    }
    return l;
  }
  NodeP parse_math2() {
    auto l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[pos_++].text;
      l = binary(std::move(l), op, parse_pow());
    }
    return l;
  }
  NodeP parse_pow() {
    auto l = parse_unary(true);
    while (is_op("**")) {
      ++pos_;
      l = binary(std::move(l), "**", parse_unary(true));
    }
    return l;
  }
  NodeP parse_unary(bool with_filter) {
    Depth d(this);
    NodeP node;
    if (is_op("-") || is_op("+")) {
      node = mk(is_op("-") ? K::Neg : K::Pos, cur().line);
      ++pos_;
      node->x = parse_unary(false);
    } else {
      node = parse_postfix(parse_primary());
    }
    if (with_filter) node = parse_filters(std::move(node), false);
    return node;
  }

  NodeP parse_primary() {
    Depth d(this);
    const Token& tk = cur();
    const int line = tk.line;
    if (tk.type == Tok::Name) {
      ++pos_;
      auto n = mk(K::Literal, line);
      if (tk.text == "true" || tk.text == "True") {
        n->lit = Value::boolean(true);
      } else if (tk.text == "false" || tk.text == "False") {
        n->lit = Value::boolean(false);
      } else if (tk.text == "none" || tk.text == "None") {
        n->lit = Value::none();
      } else {
        n = mk(K::Name, line);
        n->name = tk.text;
      }
      return n;
    }
    if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += t_[pos_++].text;
      auto n = mk(K::Literal, line);
      n->lit = Value::str(std::move(s));
      return n;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      ++pos_;
      auto n = mk(K::Literal, line);
      n->lit = tk.type == Tok::Int ? Value::integer(tk.i) : Value::real(tk.f);
      return n;
    }
    if (is_op("(")) {
      ++pos_;
      if (is_op(")")) {
        ++pos_;
        return mk(K::ListLit, line);
      }
      auto e = parse_expr();
      if (is_op(",")) {
        auto n = mk(K::ListLit, line);
        n->args.push_back(std::move(e));
        while (is_op(",")) {
          ++pos_;
          if (is_op(")")) break;
          n->args.push_back(parse_expr());
        }
        e = std::move(n);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++pos_;
      auto n = mk(K::ListLit, line);
      while (!is_op("]")) {
        n->args.push_back(parse_expr());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("]");
      return n;
    }
    if (is_op("{")) {
      ++pos_;
      auto n = mk(K::DictLit, line);
      while (!is_op("}")) {
        n->args.push_back(parse_expr());
        expect_op(":");
        n->kwargs.push_back(parse_expr());
        if (!is_op(",")) break;
        ++pos_;
      }
      expect_op("}");
      return n;
    }
    throw_parse(line, "unexpected " + describe(tk));
  }

  NodeP parse_postfix(NodeP node) {
    while (true) {
      if (is_op(".")) {
        ++pos_;
        if (cur().type == Tok::Int) {
          auto n = mk(K::Item, cur().line);
          auto key = mk(K::Literal, cur().line);
          key->lit = Value::integer(cur().i);
          ++pos_;
          n->x = std::move(node);
          n->y = std::move(key);
          node = std::move(n);
          continue;
        }
        auto n = mk(K::Attr, cur().line);
        n->name = expect_name();
        n->x = std::move(node);
        node = std::move(n);
      } else if (is_op("[")) {
        const int line = cur().line;
        ++pos_;
        NodeP parts[3];
        int idx = 0;
        bool slice = false;
        while (!is_op("]")) {
          if (is_op(":")) {
            ++pos_;
            slice = true;
            if (++idx > 2) throw_parse(line, "too many ':' in a slice");
            continue;
          }
          if (parts[idx]) throw_parse(line, "expected ']'");
          parts[idx] = parse_expr();
        }
        expect_op("]");
        if (slice) {
          auto n = mk(K::Slice, line);
          n->x = std::move(node);
          n->y = std::move(parts[0]);
          n->z = std::move(parts[1]);
          n->args.push_back(std::move(parts[2]));
          node = std::move(n);
        } else {
          if (!parts[0]) throw_parse(line, "empty subscript");
          auto n = mk(K::Item, line);
          n->x = std::move(node);
          n->y = std::move(parts[0]);
          node = std::move(n);
        }
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  void parse_args(Node* n) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) throw_unsupported(cur().line, "argument unpacking");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        n->names.push_back(t_[pos_].text);
        pos_ += 2;
        n->kwargs.push_back(parse_expr());
      } else {
        if (!n->kwargs.empty()) throw_parse(cur().line, "positional argument after a keyword argument");
        n->args.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }

  NodeP parse_call(NodeP callee) {
    auto n = mk(K::Call, callee->line);
    if (callee->kind == K::Name) {
      called_.emplace_back(callee->name, callee->line);
    } else if (callee->kind == K::Attr) {
      if (!known_methods().count(callee->name)) throw_unsupported(callee->line, "method '" + callee->name + "'");
    } else {
      throw_unsupported(callee->line, "call of an expression");
    }
    n->x = std::move(callee);
    parse_args(n.get());
    return n;
  }

  // `| filter(args)` and `is [not] test args` after an operand.
  NodeP parse_filters(NodeP node, bool filters_only) {
    while (true) {
      if (is_op("|")) {
        ++pos_;
        auto n = mk(K::Filter, cur().line);
        n->name = expect_name();
        if (!known_filters().count(n->name)) throw_unsupported(n->line, "filter '" + n->name + "'");
        if (is_op("(")) parse_args(n.get());
        n->x = std::move(node);
        node = std::move(n);
      } else if (!filters_only && is_name("is")) {
        ++pos_;
        auto n = mk(K::Test, cur().line);
        if (is_name("not")) {
          n->flag = true;
          ++pos_;
        }
        if (cur().type == Tok::Name) {
          n->name = t_[pos_++].text;
        } else if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                             cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
          n->name = t_[pos_++].text;
        } else {
          throw_parse(cur().line, "expected a test name after 'is'");
        }
        if (!known_tests().count(n->name)) throw_unsupported(n->line, "test '" + n->name + "'");
        if (is_op("(")) {
          parse_args(n.get());
        } else if ((cur().type == Tok::Name && cur().text != "else" && cur().text != "or" && cur().text != "and" &&
                    cur().text != "if" && cur().text != "is" && cur().text != "not" && cur().text != "in") ||
                   cur().type == Tok::String || cur().type == Tok::Int || cur().type == Tok::Float || is_op("[") ||
                   is_op("{")) {
          n->args.push_back(parse_postfix(parse_primary()));
        }
        n->x = std::move(node);
        node = std::move(n);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  const Limits& limits_;
  int depth_ = 0;
  int loops_ = 0;
  std::unordered_set<std::string> assigned_;
  std::vector<std::pair<std::string, int>> called_;
};

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

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 512) throw JinjaError{core::ErrorCode::kInvalidArgument, "template variables nested too deeply"};
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Value::real(static_cast<double>(u))
                                                  : Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value v = Value::make(Value::List);
      v.list = std::make_shared<std::vector<Value>>();
      v.list->reserve(j.size());
      for (const auto& e : j) {
        v.list->push_back(from_json(e, depth + 1));
        v.depth = std::max<uint16_t>(v.depth, static_cast<uint16_t>(v.list->back().depth + 1));
      }
      if (v.depth == 0) v.depth = 1;
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::make(Value::Dict);
      v.dict = std::make_shared<Object>();
      for (const auto& [k, e] : j.items()) {
        Value c = from_json(e, depth + 1);
        v.depth = std::max<uint16_t>(v.depth, static_cast<uint16_t>(c.depth + 1));
        v.dict->items.emplace_back(k, std::move(c));
      }
      if (v.depth == 0) v.depth = 1;
      return v;
    }
    default: return Value::none();
  }
}

void json_string(std::string& out, const std::string& s, bool ascii) {
  out += '"';
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\b') {
      out += "\\b";
    } else if (c == '\f') {
      out += "\\f";
    } else if (c < 0x20 || (ascii && c >= 0x7F)) {
      size_t n = 1;
      char32_t cp = c < 0x80 ? c : decode_at(s, i, &n);
      auto u16 = [&](uint32_t u) {
        out += "\\u";
        for (int k = 12; k >= 0; k -= 4) out += hex[(u >> k) & 0xF];
      };
      if (cp >= 0x10000) {
        cp -= 0x10000;
        u16(0xD800 + (cp >> 10));
        u16(0xDC00 + (cp & 0x3FF));
      } else {
        u16(cp);
      }
      i += n;
      continue;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  out += '"';
}

struct JsonOpts {
  std::string indent;  // empty: compact
  bool has_indent = false;
  bool ascii = false;
  bool sort_keys = false;
  std::string item_sep = ", ", key_sep = ": ";
};

class Evaluator {
 public:
  Evaluator(const RenderOptions& opts) : opts_(opts), lim_(opts.limits) {
    char here = 0;
    stack_top_ = reinterpret_cast<uintptr_t>(&here);
  }

  void run(const Node& root, const nlohmann::ordered_json& context, std::string& out) {
    Scope globals;
    for (const char* g : {"range", "namespace", "raise_exception", "strftime_now", "dict"}) {
      Value f = Value::make(Value::Fn);
      f.fn = std::make_shared<Func>(Func{Func::Builtin, g});
      globals.vars[g] = std::move(f);
    }
    if (context.is_object())
      for (const auto& [k, v] : context.items()) globals.vars[k] = from_json(v, 0);
    Scope top;
    top.parent = &globals;
    exec_body(root.body, top, out);
  }

 private:
  // ---------------- statements ----------------
  Flow exec_body(const std::vector<NodeP>& body, Scope& scope, std::string& out) {
    for (const auto& st : body) {
      const Flow f = exec(*st, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  void append(std::string& out, const std::string& s, int line) {
    if (static_cast<int64_t>(out.size() + s.size()) > lim_.max_output_bytes) throw_render(line, "output too large");
    out += s;
  }

  void step(int line) {
    if (++steps_ > lim_.max_steps) throw_render(line, "template takes too many steps");
  }

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

  Flow exec(const Node& n, Scope& scope, std::string& out) {
    step(n.line);
    Recursion r(this, n.line);
    switch (n.kind) {
      case K::Text: append(out, n.name, n.line); return Flow::Normal;
      case K::Emit: {
        const Value v = eval(*n.x, scope);
        if (v.t == Value::Fn) throw_render(n.line, "cannot render a function");
        append(out, to_str(v, n.line), n.line);
        return Flow::Normal;
      }
      case K::Body: return exec_body(n.body, scope, out);
      case K::If:
        return exec_body(truthy(eval(*n.x, scope)) ? n.body : n.orelse, scope, out);
      case K::For: return exec_for(n, scope, out);
      case K::Set: {
        Value v = eval(*n.x, scope);
        if (n.flag) {
          const Value* ns = scope.lookup(n.names[0]);
          if (!ns || ns->t != Value::Ns) throw_render(n.line, "cannot assign an attribute of a non-namespace '" + n.names[0] + "'");
          if (v.depth + 1 > lim_.max_nesting) throw_render(n.line, "values nested too deeply");
          ns->dict->set(n.names[1], std::move(v));
        } else if (n.names.size() == 1) {
          scope.vars[n.names[0]] = std::move(v);
        } else {
          const auto items = iterate(v, n.line);
          if (items.size() != n.names.size()) throw_render(n.line, "wrong number of values to unpack in set");
          for (size_t k = 0; k < items.size(); ++k) scope.vars[n.names[k]] = items[k];
        }
        return Flow::Normal;
      }
      case K::SetBlock: {
        std::string s;
        exec_body(n.body, scope, s);
        scope.vars[n.names[0]] = Value::str(std::move(s));
        return Flow::Normal;
      }
      case K::Macro: {
        Value f = Value::make(Value::Fn);
        f.fn = std::make_shared<Func>(Func{Func::Macro, n.name, &n});
        scope.vars[n.name] = std::move(f);
        return Flow::Normal;
      }
      case K::CallBlock: {
        const Node& call = *n.x;
        Value callee = eval(*call.x, scope);
        if (callee.t != Value::Fn || callee.fn->kind != Func::Macro)
          throw_render(n.line, "{% call %} needs a macro");
        Args args = eval_args(call, scope);
        Value caller = Value::make(Value::Fn);
        caller.fn = std::make_shared<Func>(Func{Func::Caller, "caller", &n, &scope});
        Scope outer;
        outer.parent = &scope;
        outer.vars["caller"] = std::move(caller);
        append(out, call_macro(*callee.fn->node, args, outer, n.line).s, n.line);
        return Flow::Normal;
      }
      case K::FilterBlock: {
        std::string s;
        exec_body(n.body, scope, s);
        Value v = apply_filter_chain(*n.x, Value::str(std::move(s)), scope);
        append(out, to_str(v, n.line), n.line);
        return Flow::Normal;
      }
      case K::Break: return Flow::Break;
      case K::Continue: return Flow::Continue;
      default: throw_render(n.line, "internal: not a statement");
    }
  }

  std::vector<Value> iterate(const Value& v, int line) {
    switch (v.t) {
      case Value::List: return *v.list;
      case Value::Dict: {
        std::vector<Value> keys;
        for (const auto& [k, _] : v.dict->items) keys.push_back(Value::str(k));
        return keys;
      }
      case Value::Str: {
        std::vector<Value> chars;
        const auto offs = cp_offsets(v.s);
        for (size_t k = 0; k + 1 < offs.size(); ++k) chars.push_back(Value::str(v.s.substr(offs[k], offs[k + 1] - offs[k])));
        return chars;
      }
      case Value::Undef: return {};
      default: throw_render(line, std::string("'") + type_name(v) + "' is not iterable");
    }
  }

  void bind_targets(const Node& n, const Value& item, Scope& s) {
    if (n.names.size() == 1) {
      s.vars[n.names[0]] = item;
      return;
    }
    const auto parts = iterate(item, n.line);
    if (parts.size() != n.names.size()) throw_render(n.line, "wrong number of values to unpack in for loop");
    for (size_t k = 0; k < parts.size(); ++k) s.vars[n.names[k]] = parts[k];
  }

  Flow exec_for(const Node& n, Scope& scope, std::string& out) {
    Scope loop_scope;
    loop_scope.parent = &scope;
    std::vector<Value> items = iterate(eval(*n.x, scope), n.line);
    if (n.y) {
      std::vector<Value> kept;
      for (auto& it : items) {
        step(n.line);
        Scope s;
        s.parent = &scope;
        bind_targets(n, it, s);
        if (truthy(eval(*n.y, s))) kept.push_back(std::move(it));
      }
      items = std::move(kept);
    }
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step(n.line);
      // The loop object: updated in place unless the template kept a reference to it.
      Value& loop = loop_scope.vars["loop"];
      if (loop.t != Value::Dict || loop.dict.use_count() != 1) {
        loop = Value::make(Value::Dict);
        loop.dict = std::make_shared<Object>();
        for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth",
                                "depth0", "previtem", "nextitem"})
          loop.dict->items.emplace_back(key, Value());
      }
      auto& li = loop.dict->items;
      li[0].second = Value::integer(k + 1);
      li[1].second = Value::integer(k);
      li[2].second = Value::integer(len - k);
      li[3].second = Value::integer(len - k - 1);
      li[4].second = Value::boolean(k == 0);
      li[5].second = Value::boolean(k == len - 1);
      li[6].second = Value::integer(len);
      li[7].second = Value::integer(1);
      li[8].second = Value::integer(0);
      li[9].second = k > 0 ? items[static_cast<size_t>(k - 1)] : Value();
      li[10].second = k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value();
      uint16_t d = 1;
      if (k > 0) d = std::max<uint16_t>(d, static_cast<uint16_t>(li[9].second.depth + 1));
      if (k + 1 < len) d = std::max<uint16_t>(d, static_cast<uint16_t>(li[10].second.depth + 1));
      loop.depth = d;
      bind_targets(n, items[static_cast<size_t>(k)], loop_scope);
      if (exec_body(n.body, loop_scope, out) == Flow::Break) break;
    }
    if (len == 0) exec_body(n.orelse, loop_scope, out);
    return Flow::Normal;
  }

  // ---------------- calls ----------------
  Args eval_args(const Node& call, Scope& scope) {
    Args a;
    for (const auto& e : call.args) a.pos.push_back(eval(*e, scope));
    for (size_t k = 0; k < call.kwargs.size(); ++k) a.kw.emplace_back(call.names[k], eval(*call.kwargs[k], scope));
    return a;
  }

  struct CallDepth {
    CallDepth(Evaluator* e, int line) : e_(e) {
      if (++e_->call_depth_ > e_->lim_.max_call_depth) throw_render(line, "macro calls nested too deeply");
    }
    ~CallDepth() { --e_->call_depth_; }
    Evaluator* e_;
  };

  // Binds parameters (then defaults, in the macro's scope) and renders the body.
  Value call_macro(const Node& m, const Args& args, Scope& caller_scope, int line) {
    CallDepth d(this, line);
    Scope s;
    s.parent = &caller_scope;
    std::vector<std::pair<std::string, Value>> extra_kw;
    std::vector<bool> bound(m.names.size(), false);
    for (size_t k = 0; k < m.names.size() && k < args.pos.size(); ++k) {
      s.vars[m.names[k]] = args.pos[k];
      bound[k] = true;
    }
    for (const auto& [key, v] : args.kw) {
      auto it = std::find(m.names.begin(), m.names.end(), key);
      if (it == m.names.end()) {
        extra_kw.emplace_back(key, v);
        continue;
      }
      const auto k = static_cast<size_t>(it - m.names.begin());
      if (bound[k]) throw_render(line, "macro '" + m.name + "' got multiple values for '" + key + "'");
      s.vars[key] = v;
      bound[k] = true;
    }
    for (size_t k = 0; k < m.names.size(); ++k)
      if (!bound[k]) s.vars[m.names[k]] = Value();
    for (size_t k = 0; k < m.names.size(); ++k)
      if (!bound[k] && m.kwargs[k]) s.vars[m.names[k]] = eval(*m.kwargs[k], s);
    Value varargs = Value::make(Value::List);
    varargs.depth = 1;
    varargs.list = std::make_shared<std::vector<Value>>();
    for (size_t k = m.names.size(); k < args.pos.size(); ++k) varargs.list->push_back(args.pos[k]);
    s.vars["varargs"] = std::move(varargs);
    Value kwargs = Value::make(Value::Dict);
    kwargs.depth = 1;
    kwargs.dict = std::make_shared<Object>();
    kwargs.dict->items = std::move(extra_kw);
    s.vars["kwargs"] = std::move(kwargs);
    std::string out;
    exec_body(m.body, s, out);
    return Value::str(std::move(out));
  }

  Value call_function(const Value& fv, const Args& args, Scope& scope, int line) {
    if (fv.t != Value::Fn) throw_render(line, std::string("'") + type_name(fv) + "' is not callable");
    const Func& f = *fv.fn;
    if (f.kind == Func::Macro) return call_macro(*f.node, args, scope, line);
    if (f.kind == Func::Caller) {
      // The call block's body, with its parameters, in the call block's scope.
      Node m;
      m.kind = K::Macro;
      m.name = "caller";
      CallDepth d(this, line);
      Scope s;
      s.parent = f.scope;
      for (size_t k = 0; k < f.node->names.size(); ++k) {
        const Value* a = args.get(k, f.node->names[k].c_str());
        if (a) {
          s.vars[f.node->names[k]] = *a;
        } else if (f.node->kwargs[k]) {
          s.vars[f.node->names[k]] = eval(*f.node->kwargs[k], s);
        } else {
          s.vars[f.node->names[k]] = Value();
        }
      }
      std::string out;
      exec_body(f.node->body, s, out);
      return Value::str(std::move(out));
    }
    const std::string& name = f.name;
    if (name == "raise_exception") {
      const Value* m = args.get(0, "message");
      throw JinjaError{core::ErrorCode::kInvalidArgument,
                       "template raised an exception: " + (m ? to_str(*m, line) : std::string())};
    }
    if (name == "range") {
      int64_t start = 0, stop = 0, stepv = 1;
      auto num = [&](const Value& v) {
        if (v.t != Value::Int && v.t != Value::Bool) throw_render(line, "range() needs integers");
        return v.inum();
      };
      if (args.pos.size() == 1) {
        stop = num(args.pos[0]);
      } else if (args.pos.size() == 2 || args.pos.size() == 3) {
        start = num(args.pos[0]);
        stop = num(args.pos[1]);
        if (args.pos.size() == 3) stepv = num(args.pos[2]);
      } else {
        throw_render(line, "range() takes 1 to 3 arguments");
      }
      if (stepv == 0) throw_render(line, "range() step must not be zero");
      const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(stepv));
      if (count > static_cast<double>(lim_.max_items)) throw_render(line, "range() too large");
      Value v = new_list();
      for (int64_t x = start; stepv > 0 ? x < stop : x > stop; x += stepv) v.list->push_back(Value::integer(x));
      return v;
    }
    if (name == "namespace" || name == "dict") {
      Value v = Value::make(name == "namespace" ? Value::Ns : Value::Dict);
      v.dict = std::make_shared<Object>();
      v.depth = 1;
      auto add = [&](const std::string& k, const Value& x) {
        v.dict->set(k, x);
        v.depth = std::max<uint16_t>(v.depth, static_cast<uint16_t>(x.depth + 1));
      };
      for (const auto& p : args.pos) {
        if (p.t != Value::Dict) throw_render(line, name + "() takes a mapping or keyword arguments");
        for (const auto& [k, x] : p.dict->items) add(k, x);
      }
      for (const auto& [k, x] : args.kw) add(k, x);
      check_depth(v, line);
      return v;
    }
    if (name == "strftime_now") {
      const Value* fmt = args.get(0, "format");
      if (!fmt || fmt->t != Value::Str) throw_render(line, "strftime_now() needs a format string");
      if (fmt->s.size() > 256) throw_render(line, "strftime_now() format too long");
      std::time_t t = opts_.now_epoch ? static_cast<std::time_t>(*opts_.now_epoch) : std::time(nullptr);
      std::tm tm{};
      if (opts_.now_epoch) {
        gmtime_r(&t, &tm);
      } else {
        localtime_r(&t, &tm);
      }
      char buf[2048];
      const size_t n = std::strftime(buf, sizeof buf, fmt->s.c_str(), &tm);
      return Value::str(std::string(buf, n));
    }
    throw_render(line, "unknown function '" + name + "'");
  }

  // ---------------- methods ----------------
  Value call_method(const Value& obj, const std::string& m, const Args& a, int line) {
    auto str_arg = [&](size_t i, const char* name) -> const std::string* {
      const Value* v = a.get(i, name);
      if (!v || v->t == Value::None) return nullptr;
      if (v->t != Value::Str) throw_render(line, m + "() argument must be a string");
      return &v->s;
    };
    if (obj.t == Value::Str) {
      const std::string& s = obj.s;
      if (m == "startswith" || m == "endswith") {
        const Value* p = a.get(0, "prefix");
        if (!p) throw_render(line, m + "() needs an argument");
        auto test = [&](const std::string& x) {
          return m == "startswith" ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                                   : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
        };
        if (p->t == Value::Str) return Value::boolean(test(p->s));
        if (p->t == Value::List) {
          for (const auto& x : *p->list) {
            if (x.t != Value::Str) throw_render(line, m + "() tuple items must be strings");
            if (test(x.s)) return Value::boolean(true);
          }
          return Value::boolean(false);
        }
        throw_render(line, m + "() argument must be a string or a tuple");
      }
      if (m == "strip") return Value::str(py_strip(s, str_arg(0, "chars"), 3));
      if (m == "lstrip") return Value::str(py_strip(s, str_arg(0, "chars"), 1));
      if (m == "rstrip") return Value::str(py_strip(s, str_arg(0, "chars"), 2));
      if (m == "upper") return Value::str(ascii_upper(s));
      if (m == "lower") return Value::str(ascii_lower(s));
      if (m == "title") return Value::str(py_title(s));
      if (m == "capitalize") return Value::str(py_capitalize(s));
      if (m == "isdigit" || m == "isalpha" || m == "isspace") {
        if (s.empty()) return Value::boolean(false);
        for (char c : s) {
          const bool ok = m == "isdigit" ? (c >= '0' && c <= '9') : m == "isalpha" ? is_alpha(c) : is_ws(c);
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(true);
      }
      if (m == "split") {
        const std::string* sep = str_arg(0, "sep");
        const Value* mx = a.get(1, "maxsplit");
        const int64_t maxsplit = mx && mx->t == Value::Int ? mx->i : -1;
        return split(s, sep, maxsplit, line);
      }
      if (m == "replace") {
        const std::string* o = str_arg(0, "old");
        const std::string* nw = str_arg(1, "new");
        if (!o || !nw) throw_render(line, "replace() needs two strings");
        const Value* c = a.get(2, "count");
        return Value::str(replace(s, *o, *nw, c && c->t == Value::Int ? c->i : -1, line));
      }
      if (m == "find" || m == "count") {
        const std::string* sub = str_arg(0, "sub");
        if (!sub) throw_render(line, m + "() needs a string");
        if (m == "find") {
          const size_t k = s.find(*sub);
          if (k == std::string::npos) return Value::integer(-1);
          return Value::integer(static_cast<int64_t>(cp_offsets(s.substr(0, k)).size() - 1));
        }
        if (sub->empty()) return Value::integer(static_cast<int64_t>(cp_offsets(s).size()));
        int64_t c = 0;
        for (size_t k = s.find(*sub); k != std::string::npos; k = s.find(*sub, k + sub->size())) ++c;
        return Value::integer(c);
      }
      if (m == "join") {
        const Value* it = a.get(0, "iterable");
        if (!it) throw_render(line, "join() needs an argument");
        std::string out;
        bool first = true;
        for (const auto& x : iterate(*it, line)) {
          if (x.t != Value::Str) throw_render(line, "join() items must be strings");
          if (!first) out += s;
          out += x.s;
          first = false;
          check_size(out, line);
        }
        return Value::str(std::move(out));
      }
    } else if (obj.t == Value::Dict) {
      if (m == "get") {
        const Value* k = a.get(0, "key");
        if (!k) throw_render(line, "get() needs a key");
        if (k->t == Value::Str)
          if (const Value* v = obj.dict->find(k->s)) return *v;
        const Value* d = a.get(1, "default");
        return d ? *d : Value::none();
      }
      if (m == "items" || m == "keys" || m == "values") {
        Value out = new_list();
        for (const auto& [k, v] : obj.dict->items) {
          if (m == "keys") {
            out.list->push_back(Value::str(k));
          } else if (m == "values") {
            out.list->push_back(v);
          } else {
            Value pair = new_list();
            pair.list->push_back(Value::str(k));
            pair.list->push_back(v);
            pair.depth = static_cast<uint16_t>(v.depth + 1);
            out.list->push_back(std::move(pair));
          }
        }
        fix_depth(out, line);
        return out;
      }
    }
    throw_render(line, std::string("'") + type_name(obj) + "' has no method '" + m + "'");
  }

  Value split(const std::string& s, const std::string* sep, int64_t maxsplit, int line) {
    Value out = new_list();
    if (!sep) {
      size_t i = 0;
      int64_t splits = 0;
      while (true) {
        size_t n = 0;
        while (i < s.size() && is_py_space(decode_at(s, i, &n))) i += n;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && splits >= maxsplit) {
          out.list->push_back(Value::str(py_strip(s.substr(i), nullptr, 2)));
          break;
        }
        size_t j = i;
        while (j < s.size() && !is_py_space(decode_at(s, j, &n))) j += n;
        out.list->push_back(Value::str(s.substr(i, j - i)));
        ++splits;
        i = j;
      }
    } else {
      if (sep->empty()) throw_render(line, "split(): empty separator");
      size_t i = 0;
      int64_t splits = 0;
      while (true) {
        const size_t k = (maxsplit >= 0 && splits >= maxsplit) ? std::string::npos : s.find(*sep, i);
        if (k == std::string::npos) {
          out.list->push_back(Value::str(s.substr(i)));
          break;
        }
        out.list->push_back(Value::str(s.substr(i, k - i)));
        i = k + sep->size();
        ++splits;
      }
    }
    return out;
  }

  std::string replace(const std::string& s, const std::string& o, const std::string& n, int64_t count, int line) {
    std::string out;
    if (o.empty()) {
      const auto offs = cp_offsets(s);
      int64_t done = 0;
      for (size_t k = 0; k < offs.size(); ++k) {
        if (count < 0 || done < count) {
          out += n;
          ++done;
        }
        if (k + 1 < offs.size()) out.append(s, offs[k], offs[k + 1] - offs[k]);
        check_size(out, line);
      }
      return out;
    }
    size_t i = 0;
    int64_t done = 0;
    while (true) {
      const size_t k = (count >= 0 && done >= count) ? std::string::npos : s.find(o, i);
      if (k == std::string::npos) {
        out.append(s, i, std::string::npos);
        break;
      }
      out.append(s, i, k - i);
      out += n;
      check_size(out, line);
      i = k + o.size();
      ++done;
    }
    check_size(out, line);
    return out;
  }

  // ---------------- helpers ----------------
  Value new_list() {
    Value v = Value::make(Value::List);
    v.depth = 1;
    v.list = std::make_shared<std::vector<Value>>();
    return v;
  }
  void check_size(const std::string& s, int line) const {
    if (static_cast<int64_t>(s.size()) > lim_.max_output_bytes) throw_render(line, "string too large");
  }
  void check_depth(const Value& v, int line) const {
    if (v.depth > lim_.max_nesting) throw_render(line, "values nested too deeply");
  }
  void fix_depth(Value& v, int line) const {
    uint16_t d = 1;
    if (v.t == Value::List) {
      if (static_cast<int64_t>(v.list->size()) > lim_.max_items) throw_render(line, "list too long");
      for (const auto& x : *v.list) d = std::max<uint16_t>(d, static_cast<uint16_t>(x.depth + 1));
    } else if (v.t == Value::Dict || v.t == Value::Ns) {
      for (const auto& [_, x] : v.dict->items) d = std::max<uint16_t>(d, static_cast<uint16_t>(x.depth + 1));
    }
    v.depth = d;
    check_depth(v, line);
  }

  // str(v) as Python prints it (Undefined: empty).
  std::string to_str(const Value& v, int line) {
    if (v.t == Value::Str) return v.s;
    if (v.t == Value::Undef) return "";
    std::string out;
    repr(out, v, line, 0, true);
    return out;
  }

  static void py_quote(std::string& out, const std::string& s) {
    const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
    out += q;
    for (char c : s) {
      if (c == q || c == '\\') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else {
        out += c;
      }
    }
    out += q;
  }

  void repr(std::string& out, const Value& v, int line, int depth, bool top) {
    if (depth > 2 * lim_.max_nesting) throw_render(line, "values nested too deeply");
    check_size(out, line);
    switch (v.t) {
      case Value::Undef: break;
      case Value::None: out += "None"; break;
      case Value::Bool: out += v.b ? "True" : "False"; break;
      case Value::Int: out += std::to_string(v.i); break;
      case Value::Float: out += py_float(v.f); break;
      case Value::Str:
        if (top) {
          out += v.s;
        } else {
          py_quote(out, v.s);
        }
        break;
      case Value::List: {
        out += '[';
        bool first = true;
        for (const auto& x : *v.list) {
          if (!first) out += ", ";
          first = false;
          repr(out, x, line, depth + 1, false);
        }
        out += ']';
        break;
      }
      case Value::Dict: {
        out += '{';
        bool first = true;
        for (const auto& [k, x] : v.dict->items) {
          if (!first) out += ", ";
          first = false;
          py_quote(out, k);
          out += ": ";
          repr(out, x, line, depth + 1, false);
        }
        out += '}';
        break;
      }
      case Value::Ns: out += "<Namespace>"; break;
      case Value::Fn: out += "<function " + v.fn->name + ">"; break;
    }
  }

  void to_json(std::string& out, const Value& v, const JsonOpts& o, int depth, int line) {
    if (depth > 2 * lim_.max_nesting) throw_render(line, "values nested too deeply");
    check_size(out, line);
    auto newline = [&](int d) {
      out += '\n';
      for (int k = 0; k < d; ++k) out += o.indent;
    };
    switch (v.t) {
      case Value::None: out += "null"; return;
      case Value::Bool: out += v.b ? "true" : "false"; return;
      case Value::Int: out += std::to_string(v.i); return;
      case Value::Float:
        out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : py_float(v.f);
        return;
      case Value::Str: json_string(out, v.s, o.ascii); return;
      case Value::List: {
        if (v.list->empty()) {
          out += "[]";
          return;
        }
        out += '[';
        bool first = true;
        for (const auto& x : *v.list) {
          if (!first) out += o.item_sep;
          first = false;
          if (o.has_indent) newline(depth + 1);
          to_json(out, x, o, depth + 1, line);
        }
        if (o.has_indent) newline(depth);
        out += ']';
        return;
      }
      case Value::Dict: {
        if (v.dict->items.empty()) {
          out += "{}";
          return;
        }
        std::vector<const std::pair<std::string, Value>*> items;
        for (const auto& p : v.dict->items) items.push_back(&p);
        if (o.sort_keys)
          std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
        out += '{';
        bool first = true;
        for (const auto* p : items) {
          if (!first) out += o.item_sep;
          first = false;
          if (o.has_indent) newline(depth + 1);
          json_string(out, p->first, o.ascii);
          out += o.key_sep;
          to_json(out, p->second, o, depth + 1, line);
        }
        if (o.has_indent) newline(depth);
        out += '}';
        return;
      }
      default: throw_render(line, std::string("cannot convert '") + type_name(v) + "' to JSON");
    }
  }

  bool equals(const Value& a, const Value& b, int depth = 0) {
    if (depth > 2 * lim_.max_nesting) throw JinjaError{core::ErrorCode::kInvalidArgument, "values nested too deeply"};
    if (a.numeric() && b.numeric()) {
      if (a.t != Value::Float && b.t != Value::Float) return a.inum() == b.inum();
      return a.num() == b.num();
    }
    if (a.t != b.t) return false;
    switch (a.t) {
      case Value::Undef:
      case Value::None: return true;
      case Value::Str: return a.s == b.s;
      case Value::List: {
        if (a.list->size() != b.list->size()) return false;
        for (size_t k = 0; k < a.list->size(); ++k)
          if (!equals((*a.list)[k], (*b.list)[k], depth + 1)) return false;
        return true;
      }
      case Value::Dict: {
        if (a.dict->items.size() != b.dict->items.size()) return false;
        for (const auto& [k, x] : a.dict->items) {
          const Value* y = b.dict->find(k);
          if (!y || !equals(x, *y, depth + 1)) return false;
        }
        return true;
      }
      case Value::Ns: return a.dict == b.dict;
      case Value::Fn: return a.fn == b.fn;
      default: return false;
    }
  }

  // <0, 0, >0; lists lexicographically.
  int compare(const Value& a, const Value& b, int line, int depth = 0) {
    if (depth > 2 * lim_.max_nesting) throw_render(line, "values nested too deeply");
    if (a.numeric() && b.numeric()) {
      if (a.t != Value::Float && b.t != Value::Float) return a.inum() < b.inum() ? -1 : a.inum() > b.inum() ? 1 : 0;
      return a.num() < b.num() ? -1 : a.num() > b.num() ? 1 : 0;
    }
    if (a.t == Value::Str && b.t == Value::Str) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
    if (a.t == Value::List && b.t == Value::List) {
      for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
        const int c = compare((*a.list)[k], (*b.list)[k], line, depth + 1);
        if (c) return c;
      }
      return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
    }
    throw_render(line, std::string("cannot compare '") + type_name(a) + "' and '" + type_name(b) + "'");
  }

  bool contains(const Value& container, const Value& x, int line) {
    switch (container.t) {
      case Value::Str:
        if (x.t != Value::Str) throw_render(line, "'in <string>' needs a string on the left");
        return container.s.find(x.s) != std::string::npos;
      case Value::List:
        for (const auto& e : *container.list)
          if (equals(e, x)) return true;
        return false;
      case Value::Dict:
        return x.t == Value::Str && container.dict->find(x.s) != nullptr;
      case Value::Undef: return false;
      default: throw_render(line, std::string("'in' on '") + type_name(container) + "'");
    }
  }

  // ---------------- expressions ----------------
  Value attr(const Value& obj, const std::string& name) {
    if ((obj.t == Value::Dict || obj.t == Value::Ns)) {
      if (const Value* v = obj.dict->find(name)) return *v;
    }
    return Value();
  }

  Value item(const Value& obj, const Value& key, int line) {
    switch (obj.t) {
      case Value::Dict:
      case Value::Ns:
        if (key.t == Value::Str) {
          if (const Value* v = obj.dict->find(key.s)) return *v;
        }
        return Value();
      case Value::List: {
        if (key.t != Value::Int && key.t != Value::Bool) {
          if (key.t == Value::Undef) return Value();
          throw_render(line, "list indices must be integers");
        }
        int64_t k = key.inum();
        const auto n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value();
        return (*obj.list)[static_cast<size_t>(k)];
      }
      case Value::Str: {
        if (key.t != Value::Int) return Value();
        const auto offs = cp_offsets(obj.s);
        const auto n = static_cast<int64_t>(offs.size() - 1);
        int64_t k = key.i;
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value();
        const auto u = static_cast<size_t>(k);
        return Value::str(obj.s.substr(offs[u], offs[u + 1] - offs[u]));
      }
      default: return Value();
    }
  }

  Value slice(const Value& obj, const Node& n, Scope& scope) {
    auto bound = [&](const Node* e, bool* present) -> int64_t {
      *present = false;
      if (!e) return 0;
      const Value v = eval(*e, scope);
      if (v.t == Value::None || v.t == Value::Undef) return 0;
      if (v.t != Value::Int && v.t != Value::Bool) throw_render(n.line, "slice indices must be integers");
      *present = true;
      return v.inum();
    };
    bool has_a, has_b, has_c;
    int64_t a = bound(n.y.get(), &has_a), b = bound(n.z.get(), &has_b), c = bound(n.args[0].get(), &has_c);
    if (!has_c) c = 1;
    if (c == 0) throw_render(n.line, "slice step cannot be zero");
    std::vector<size_t> offs;
    int64_t len;
    if (obj.t == Value::List) {
      len = static_cast<int64_t>(obj.list->size());
    } else if (obj.t == Value::Str) {
      offs = cp_offsets(obj.s);
      len = static_cast<int64_t>(offs.size() - 1);
    } else if (obj.t == Value::Undef) {
      return Value();
    } else {
      throw_render(n.line, std::string("cannot slice '") + type_name(obj) + "'");
    }
    // Python's slice.indices()
    auto adjust = [&](int64_t v, bool present, int64_t dflt) {
      if (!present) return dflt;
      if (v < 0) {
        v += len;
        if (v < 0) v = c < 0 ? -1 : 0;
      } else if (v >= len) {
        v = c < 0 ? len - 1 : len;
      }
      return v;
    };
    a = adjust(a, has_a, c < 0 ? len - 1 : 0);
    b = adjust(b, has_b, c < 0 ? -1 : len);
    std::vector<int64_t> idx;
    for (int64_t k = a; c > 0 ? k < b : k > b; k += c) idx.push_back(k);
    if (obj.t == Value::List) {
      Value out = new_list();
      for (auto k : idx) out.list->push_back((*obj.list)[static_cast<size_t>(k)]);
      out.depth = obj.depth;
      return out;
    }
    std::string s;
    for (auto k : idx) s.append(obj.s, offs[static_cast<size_t>(k)], offs[static_cast<size_t>(k) + 1] - offs[static_cast<size_t>(k)]);
    return Value::str(std::move(s));
  }

  Value arith(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "~") {
      std::string s = to_str(l, line) + to_str(r, line);
      check_size(s, line);
      return Value::str(std::move(s));
    }
    if (l.t == Value::Undef || r.t == Value::Undef)
      throw_render(line, "'" + op + "' on an undefined value");
    const bool ints = (l.t == Value::Int || l.t == Value::Bool) && (r.t == Value::Int || r.t == Value::Bool);
    if (l.numeric() && r.numeric()) {
      if (op == "/") {
        if (r.num() == 0) throw_render(line, "division by zero");
        return Value::real(l.num() / r.num());
      }
      if (ints) {
        const int64_t a = l.inum(), b = r.inum();
        int64_t res = 0;
        if (op == "+" || op == "-" || op == "*") {
          const bool ovf = op == "+" ? __builtin_add_overflow(a, b, &res)
                           : op == "-" ? __builtin_sub_overflow(a, b, &res)
                                       : __builtin_mul_overflow(a, b, &res);
          if (ovf) throw_render(line, "integer overflow");
          return Value::integer(res);
        }
        if (op == "//" || op == "%") {
          if (b == 0) throw_render(line, "division by zero");
          if (a == INT64_MIN && b == -1) throw_render(line, "integer overflow");
          int64_t q = a / b, m = a % b;
          if (m != 0 && ((m < 0) != (b < 0))) {
            --q;
            m += b;
          }
          return Value::integer(op == "//" ? q : m);
        }
        if (op == "**") {
          if (b < 0) return Value::real(std::pow(static_cast<double>(a), static_cast<double>(b)));
          int64_t acc = 1;
          for (int64_t k = 0; k < b; ++k) {
            if (__builtin_mul_overflow(acc, a, &acc)) throw_render(line, "integer overflow");
            if (acc == 0 || acc == 1) break;
            step(line);
          }
          return Value::integer(acc);
        }
      } else {
        const double a = l.num(), b = r.num();
        if (op == "+") return Value::real(a + b);
        if (op == "-") return Value::real(a - b);
        if (op == "*") return Value::real(a * b);
        if (op == "**") return Value::real(std::pow(a, b));
        if (b == 0) throw_render(line, "division by zero");
        const double m = std::fmod(a, b);
        const double mm = (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
        if (op == "%") return Value::real(mm);
        return Value::real(std::floor(a / b));
      }
    }
    if (op == "+" && l.t == Value::Str && r.t == Value::Str) {
      if (static_cast<int64_t>(l.s.size() + r.s.size()) > lim_.max_output_bytes) throw_render(line, "string too large");
      return Value::str(l.s + r.s);
    }
    if (op == "+" && l.t == Value::List && r.t == Value::List) {
      if (static_cast<int64_t>(l.list->size() + r.list->size()) > lim_.max_items) throw_render(line, "list too long");
      Value out = new_list();
      out.list->reserve(l.list->size() + r.list->size());
      out.list->insert(out.list->end(), l.list->begin(), l.list->end());
      out.list->insert(out.list->end(), r.list->begin(), r.list->end());
      out.depth = std::max(l.depth, r.depth);
      return out;
    }
    if (op == "*" && ((l.t == Value::Str || l.t == Value::List) && (r.t == Value::Int || r.t == Value::Bool))) {
      const int64_t times = std::max<int64_t>(0, r.inum());
      if (l.t == Value::Str) {
        if (times > 0 && static_cast<double>(l.s.size()) * static_cast<double>(times) > static_cast<double>(lim_.max_output_bytes))
          throw_render(line, "string too large");
        std::string s;
        for (int64_t k = 0; k < times; ++k) s += l.s;
        return Value::str(std::move(s));
      }
      if (times > 0 && static_cast<double>(l.list->size()) * static_cast<double>(times) > static_cast<double>(lim_.max_items))
        throw_render(line, "list too long");
      Value out = new_list();
      for (int64_t k = 0; k < times; ++k) out.list->insert(out.list->end(), l.list->begin(), l.list->end());
      out.depth = l.depth;
      return out;
    }
    if (op == "*" && (r.t == Value::Str || r.t == Value::List) && (l.t == Value::Int || l.t == Value::Bool))
      return arith(op, r, l, line);
    throw_render(line, std::string("unsupported operand types for ") + op + ": '" + type_name(l) + "' and '" +
                           type_name(r) + "'");
  }

  Value eval(const Node& n, Scope& scope) {
    step(n.line);
    Recursion r(this, n.line);
    switch (n.kind) {
      case K::Literal: return n.lit;
      case K::Name: {
        const Value* v = scope.lookup(n.name);
        return v ? *v : Value();
      }
      case K::Attr: return attr(eval(*n.x, scope), n.name);
      case K::Item: {
        Value obj = eval(*n.x, scope);
        return item(obj, eval(*n.y, scope), n.line);
      }
      case K::Slice: return slice(eval(*n.x, scope), n, scope);
      case K::Call: {
        const Node& callee = *n.x;
        if (callee.kind == K::Attr) {
          Value obj = eval(*callee.x, scope);
          if (obj.t == Value::Ns || obj.t == Value::Dict) {
            const Value* member = obj.dict->find(callee.name);
            if (member && member->t == Value::Fn) return call_function(*member, eval_args(n, scope), scope, n.line);
          }
          return call_method(obj, callee.name, eval_args(n, scope), n.line);
        }
        Value f = eval(callee, scope);
        if (f.t == Value::Undef) throw_render(n.line, "'" + callee.name + "' is undefined");
        return call_function(f, eval_args(n, scope), scope, n.line);
      }
      case K::Filter: return apply_filter(n, eval(*n.x, scope), scope);
      case K::Test: {
        const Value v = eval(*n.x, scope);
        const bool r = apply_test(n, v, scope);
        return Value::boolean(n.flag ? !r : r);
      }
      case K::Neg:
      case K::Pos: {
        const Value v = eval(*n.x, scope);
        if (!v.numeric()) throw_render(n.line, std::string("bad operand type for unary ") + (n.kind == K::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
        if (n.kind == K::Pos) return v.t == Value::Bool ? Value::integer(v.inum()) : v;
        if (v.t == Value::Float) return Value::real(-v.f);
        if (v.inum() == INT64_MIN) throw_render(n.line, "integer overflow");
        return Value::integer(-v.inum());
      }
      case K::Not: return Value::boolean(!truthy(eval(*n.x, scope)));
      case K::And: {
        Value l = eval(*n.x, scope);
        return truthy(l) ? eval(*n.y, scope) : l;
      }
      case K::Or: {
        Value l = eval(*n.x, scope);
        return truthy(l) ? l : eval(*n.y, scope);
      }
      case K::Binary: {
        const Value l = eval(*n.x, scope);
        const Value r = eval(*n.y, scope);
        return arith(n.name, l, r, n.line);
      }
      case K::Compare: {
        Value l = eval(*n.args[0], scope);
        for (size_t k = 0; k < n.ops.size(); ++k) {
          Value r = eval(*n.args[k + 1], scope);
          const std::string& op = n.ops[k];
          bool ok;
          if (op == "==") {
            ok = equals(l, r);
          } else if (op == "!=") {
            ok = !equals(l, r);
          } else if (op == "in") {
            ok = contains(r, l, n.line);
          } else if (op == "not in") {
            ok = !contains(r, l, n.line);
          } else {
            const int c = compare(l, r, n.line);
            ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!ok) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case K::Cond:
        if (truthy(eval(*n.y, scope))) return eval(*n.x, scope);
        return n.z ? eval(*n.z, scope) : Value();
      case K::ListLit: {
        Value out = new_list();
        for (const auto& e : n.args) out.list->push_back(eval(*e, scope));
        fix_depth(out, n.line);
        return out;
      }
      case K::DictLit: {
        Value out = Value::make(Value::Dict);
        out.dict = std::make_shared<Object>();
        for (size_t k = 0; k < n.args.size(); ++k) {
          const Value key = eval(*n.args[k], scope);
          if (key.t != Value::Str) throw_render(n.line, "dict keys must be strings");
          out.dict->set(key.s, eval(*n.kwargs[k], scope));
        }
        fix_depth(out, n.line);
        return out;
      }
      default: throw_render(n.line, "internal: not an expression");
    }
  }

  // ---------------- tests ----------------
  bool apply_test(const Node& n, const Value& v, Scope& scope) {
    const std::string& t = n.name;
    auto arg = [&]() -> Value {
      if (n.args.empty()) throw_render(n.line, "test '" + t + "' needs an argument");
      return eval(*n.args[0], scope);
    };
    if (t == "defined") return v.t != Value::Undef;
    if (t == "undefined") return v.t == Value::Undef;
    if (t == "none") return v.t == Value::None;
    if (t == "boolean") return v.t == Value::Bool;
    if (t == "true") return v.t == Value::Bool && v.b;
    if (t == "false") return v.t == Value::Bool && !v.b;
    if (t == "integer") return v.t == Value::Int;
    if (t == "float") return v.t == Value::Float;
    if (t == "number") return v.numeric();
    if (t == "string") return v.t == Value::Str;
    if (t == "mapping") return v.t == Value::Dict;
    if (t == "iterable") return v.t == Value::Str || v.t == Value::List || v.t == Value::Dict || v.t == Value::Undef;
    if (t == "sequence") return v.t == Value::Str || v.t == Value::List || v.t == Value::Dict;
    if (t == "callable") return v.t == Value::Fn;
    if (t == "lower") return v.t == Value::Str && ascii_lower(v.s) == v.s;
    if (t == "upper") return v.t == Value::Str && ascii_upper(v.s) == v.s;
    if (t == "odd" || t == "even") {
      if (v.t != Value::Int && v.t != Value::Bool) throw_render(n.line, "test '" + t + "' needs an integer");
      const bool odd = (v.inum() % 2) != 0;
      return t == "odd" ? odd : !odd;
    }
    if (t == "divisibleby") {
      const Value d = arg();
      if (!v.numeric() || !d.numeric() || d.num() == 0) throw_render(n.line, "divisibleby needs non-zero numbers");
      return std::fmod(v.num(), d.num()) == 0;
    }
    if (t == "sameas") {
      const Value o = arg();
      if (v.t != o.t) return false;
      if (v.t == Value::List) return v.list == o.list;
      if (v.t == Value::Dict || v.t == Value::Ns) return v.dict == o.dict;
      return equals(v, o);
    }
    if (t == "equalto" || t == "eq" || t == "==") return equals(v, arg());
    if (t == "ne" || t == "!=") return !equals(v, arg());
    if (t == "in") return contains(arg(), v, n.line);
    const int c = compare(v, arg(), n.line);
    if (t == "lt" || t == "<") return c < 0;
    if (t == "le" || t == "<=") return c <= 0;
    if (t == "gt" || t == ">") return c > 0;
    return c >= 0;  // ge, >=
  }

  bool test_by_name(const std::string& name, const Value& v, const Value* argv, int line) {
    Node n;
    n.kind = K::Test;
    n.line = line;
    n.name = name;
    if (!known_tests().count(name)) throw_render(line, "unsupported test '" + name + "'");
    if (argv) {
      auto lit = mk(K::Literal, line);
      lit->lit = *argv;
      n.args.push_back(std::move(lit));
    }
    Scope empty;
    return apply_test(n, v, empty);
  }

  // ---------------- filters ----------------
  Value apply_filter_chain(const Node& chain, Value body, Scope& scope) {
    // `chain` is Filter(Filter(Literal)) with the Literal standing for the body.
    if (chain.kind != K::Filter) return body;
    Value inner = apply_filter_chain(*chain.x, std::move(body), scope);
    return apply_filter(chain, std::move(inner), scope);
  }

  Value apply_filter(const Node& n, Value v, Scope& scope) {
    const Args a = eval_args(n, scope);
    return filter(n.name, v, a, n.line);
  }

  Value filter(const std::string& f, const Value& v, const Args& a, int line) {
    auto bool_arg = [&](size_t i, const char* name, bool dflt) {
      const Value* x = a.get(i, name);
      return x ? truthy(*x) : dflt;
    };
    if (f == "safe") return v;
    if (f == "default" || f == "d") {
      const Value* d = a.get(0, "default_value");
      const bool boolean = bool_arg(1, "boolean", false);
      if (v.t == Value::Undef || (boolean && !truthy(v))) return d ? *d : Value::str("");
      return v;
    }
    if (f == "tojson") {
      JsonOpts o;
      if (const Value* ind = a.get(0, "indent"); ind && ind->t != Value::None) {
        o.has_indent = true;
        if (ind->t == Value::Int) {
          if (ind->i < 0 || ind->i > 64) throw_render(line, "tojson indent out of range");
          o.indent = std::string(static_cast<size_t>(ind->i), ' ');
        } else if (ind->t == Value::Str) {
          o.indent = ind->s;
        } else {
          throw_render(line, "tojson indent must be an integer");
        }
        o.item_sep = ",";
      }
      if (const Value* x = a.get(99, "ensure_ascii")) o.ascii = truthy(*x);
      if (const Value* x = a.get(99, "sort_keys")) o.sort_keys = truthy(*x);
      if (const Value* x = a.get(99, "separators"); x && x->t != Value::None) {
        if (x->t != Value::List || x->list->size() != 2 || (*x->list)[0].t != Value::Str || (*x->list)[1].t != Value::Str)
          throw_render(line, "tojson separators must be two strings");
        o.item_sep = (*x->list)[0].s;
        o.key_sep = (*x->list)[1].s;
      }
      if (v.t == Value::Undef) throw_render(line, "tojson of an undefined value");
      std::string out;
      to_json(out, v, o, 0, line);
      return Value::str(std::move(out));
    }
    if (f == "length" || f == "count") {
      switch (v.t) {
        case Value::Str: return Value::integer(static_cast<int64_t>(cp_offsets(v.s).size() - 1));
        case Value::List: return Value::integer(static_cast<int64_t>(v.list->size()));
        case Value::Dict: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
        case Value::Undef: return Value::integer(0);
        default: throw_render(line, std::string("object of type '") + type_name(v) + "' has no length");
      }
    }
    if (f == "string") return Value::str(to_str(v, line));
    if (f == "list") {
      Value out = new_list();
      *out.list = iterate(v, line);
      fix_depth(out, line);
      return out;
    }
    if (f == "items") {
      if (v.t == Value::Undef) return new_list();
      if (v.t != Value::Dict) throw_render(line, std::string("items of '") + type_name(v) + "'");
      return call_method(v, "items", Args{}, line);
    }
    if (f == "dictsort") {
      if (v.t != Value::Dict) throw_render(line, "dictsort needs a mapping");
      const bool cs = bool_arg(0, "case_sensitive", false);
      const Value* by = a.get(1, "by");
      const bool by_value = by && by->t == Value::Str && by->s == "value";
      const bool rev = bool_arg(2, "reverse", false);
      Value out = call_method(v, "items", Args{}, line);
      sort_values(*out.list, cs, rev, line, [&](const Value& x) { return (*x.list)[by_value ? 1 : 0]; });
      return out;
    }
    if (f == "join") {
      const Value* sepv = a.get(0, "d");
      const std::string sep = sepv ? to_str(*sepv, line) : "";
      const Value* attrv = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& x : iterate(v, line)) {
        if (!first) out += sep;
        first = false;
        out += to_str(attrv ? get_path(x, *attrv) : x, line);
        check_size(out, line);
      }
      return Value::str(std::move(out));
    }
    if (f == "first" || f == "last") {
      const auto items = iterate(v, line);
      if (items.empty()) return Value();
      return f == "first" ? items.front() : items.back();
    }
    if (f == "reverse") {
      if (v.t == Value::Str) {
        const auto offs = cp_offsets(v.s);
        std::string s;
        for (size_t k = offs.size() - 1; k > 0; --k) s.append(v.s, offs[k - 1], offs[k] - offs[k - 1]);
        return Value::str(std::move(s));
      }
      Value out = new_list();
      *out.list = iterate(v, line);
      std::reverse(out.list->begin(), out.list->end());
      fix_depth(out, line);
      return out;
    }
    if (f == "unique") {
      Value out = new_list();
      for (const auto& x : iterate(v, line)) {
        bool seen = false;
        for (const auto& y : *out.list) {
          step(line);
          if (equals(x, y)) {
            seen = true;
            break;
          }
        }
        if (!seen) out.list->push_back(x);
      }
      fix_depth(out, line);
      return out;
    }
    if (f == "sort") {
      const bool rev = bool_arg(0, "reverse", false);
      const bool cs = bool_arg(1, "case_sensitive", false);
      const Value* attrv = a.get(2, "attribute");
      Value out = new_list();
      *out.list = iterate(v, line);
      sort_values(*out.list, cs, rev, line, [&](const Value& x) { return attrv ? get_path(x, *attrv) : x; });
      fix_depth(out, line);
      return out;
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool select = f == "selectattr" || f == "select";
      size_t k = 0;
      Value attrv;
      if (by_attr) {
        if (a.pos.empty()) throw_render(line, f + " needs an attribute name");
        attrv = a.pos[k++];
      }
      std::string test;
      if (k < a.pos.size()) {
        if (a.pos[k].t != Value::Str) throw_render(line, f + ": the test name must be a string");
        test = a.pos[k++].s;
      }
      const Value* targ = k < a.pos.size() ? &a.pos[k] : nullptr;
      Value out = new_list();
      for (const auto& x : iterate(v, line)) {
        step(line);
        const Value subject = by_attr ? get_path(x, attrv) : x;
        const bool r = test.empty() ? truthy(subject) : test_by_name(test, subject, targ, line);
        if (r == select) out.list->push_back(x);
      }
      fix_depth(out, line);
      return out;
    }
    if (f == "map") {
      Value out = new_list();
      const Value* attrv = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == "attribute") attrv = &x;
      if (attrv) {
        const Value* dflt = nullptr;
        for (const auto& [k, x] : a.kw)
          if (k == "default") dflt = &x;
        for (const auto& x : iterate(v, line)) {
          Value r = get_path(x, *attrv);
          out.list->push_back(r.t == Value::Undef && dflt ? *dflt : r);
        }
      } else {
        if (a.pos.empty() || a.pos[0].t != Value::Str) throw_render(line, "map needs attribute= or a filter name");
        const std::string name = a.pos[0].s;
        if (!known_filters().count(name) || name == "map") throw_render(line, "unsupported filter '" + name + "' in map");
        Args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        for (const auto& x : iterate(v, line)) {
          step(line);
          out.list->push_back(filter(name, x, rest, line));
        }
      }
      fix_depth(out, line);
      return out;
    }
    if (f == "int") {
      const Value* d = a.get(0, "default");
      const Value dflt = d ? *d : Value::integer(0);
      switch (v.t) {
        case Value::Int: return v;
        case Value::Bool: return Value::integer(v.inum());
        case Value::Float:
          if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) return dflt;
          return Value::integer(static_cast<int64_t>(v.f));
        case Value::Str: {
          const std::string s = py_strip(v.s, nullptr, 3);
          int64_t x = 0;
          const char* b = s.data();
          const char* e = s.data() + s.size();
          if (b != e && *b == '+') ++b;
          auto r = std::from_chars(b, e, x);
          if (r.ec == std::errc() && r.ptr == e && b != e) return Value::integer(x);
          char* end = nullptr;
          const double dv = std::strtod(s.c_str(), &end);
          if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(dv) && std::fabs(dv) < 9.2e18)
            return Value::integer(static_cast<int64_t>(dv));
          return dflt;
        }
        default: return dflt;
      }
    }
    if (f == "float") {
      const Value* d = a.get(0, "default");
      const Value dflt = d ? *d : Value::real(0);
      if (v.numeric()) return Value::real(v.num());
      if (v.t == Value::Str) {
        const std::string s = py_strip(v.s, nullptr, 3);
        char* end = nullptr;
        const double dv = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value::real(dv);
      }
      return dflt;
    }
    if (f == "bool") return Value::boolean(truthy(v));
    if (f == "abs") {
      if (v.t == Value::Float) return Value::real(std::fabs(v.f));
      if (v.t == Value::Int || v.t == Value::Bool) {
        if (v.inum() == INT64_MIN) throw_render(line, "integer overflow");
        return Value::integer(std::llabs(v.inum()));
      }
      throw_render(line, std::string("abs of '") + type_name(v) + "'");
    }
    // String filters: the value as a string.
    const std::string s = to_str(v, line);
    if (f == "trim") {
      const Value* chars = a.get(0, "chars");
      return Value::str(py_strip(s, chars && chars->t == Value::Str ? &chars->s : nullptr, 3));
    }
    if (f == "upper") return Value::str(ascii_upper(s));
    if (f == "lower") return Value::str(ascii_lower(s));
    if (f == "capitalize") return Value::str(py_capitalize(s));
    if (f == "title") return Value::str(py_title(s));
    if (f == "replace") {
      const Value* o = a.get(0, "old");
      const Value* nw = a.get(1, "new");
      if (!o || !nw) throw_render(line, "replace needs two arguments");
      const Value* c = a.get(2, "count");
      return Value::str(replace(s, to_str(*o, line), to_str(*nw, line), c && c->t == Value::Int ? c->i : -1, line));
    }
    if (f == "indent") {
      const Value* w = a.get(0, "width");
      std::string ind = "    ";
      if (w && w->t == Value::Str) {
        ind = w->s;
      } else if (w && (w->t == Value::Int)) {
        if (w->i < 0 || w->i > 1024) throw_render(line, "indent width out of range");
        ind = std::string(static_cast<size_t>(w->i), ' ');
      }
      const bool first = bool_arg(1, "first", false);
      const bool blank = bool_arg(2, "blank", false);
      std::vector<std::string> lines;
      size_t i = 0;
      while (true) {
        const size_t k = s.find('\n', i);
        lines.push_back(s.substr(i, k == std::string::npos ? std::string::npos : k - i));
        if (k == std::string::npos) break;
        i = k + 1;
      }
      // Jinja: blank lines stay unindented unless blank=true; the first line unless first=true.
      std::string out = first ? ind : "";
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k) out += '\n';
        if (k > 0 && (blank || !lines[k].empty())) out += ind;
        out += lines[k];
        check_size(out, line);
      }
      return Value::str(std::move(out));
    }
    throw_render(line, "unsupported filter '" + f + "'");
  }

  // `attribute` of x, with dotted paths and integer parts ("a.b", "0").
  Value get_path(const Value& x, const Value& path) {
    if (path.t == Value::Int) return item(x, path, 0);
    if (path.t != Value::Str) return Value();
    Value cur = x;
    size_t i = 0;
    while (true) {
      const size_t k = path.s.find('.', i);
      const std::string part = path.s.substr(i, k == std::string::npos ? std::string::npos : k - i);
      int64_t idx = 0;
      auto r = std::from_chars(part.data(), part.data() + part.size(), idx);
      if (cur.t == Value::List && r.ec == std::errc() && r.ptr == part.data() + part.size()) {
        cur = item(cur, Value::integer(idx), 0);
      } else {
        cur = attr(cur, part);
      }
      if (k == std::string::npos) return cur;
      i = k + 1;
    }
  }

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

}  // namespace

Template::Template() = default;
Template::~Template() = default;

core::Result<std::shared_ptr<const Template>> Template::parse(std::string_view source, const Limits& limits) {
  try {
    Lexer lexer(source);
    Parser parser(lexer.run(), limits);
    auto t = std::make_shared<Template>();
    t->root_ = parser.run();
    return std::shared_ptr<const Template>(std::move(t));
  } catch (const JinjaError& e) {
    return core::Status(e.code, e.message);
  }
}

core::Result<std::string> Template::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  if (!root_) return core::internal_error("template not parsed");
  std::string out;
  try {
    Evaluator ev(options);
    ev.run(*root_, context, out);
  } catch (const JinjaError& e) {
    return core::Status(e.code, e.message);
  } catch (const std::bad_alloc&) {
    return core::resource_exhausted("template rendering ran out of memory");
  }
  return out;
}

}  // namespace tessera::model::jinja
