// The chat-template Jinja interpreter (jinja.h): the lexer (Hugging Face's
// whitespace control) and the parser to an AST.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "model/jinja_internal.h"

namespace tessera::model::jinja {

// ============================ what the parser accepts ============================

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

namespace {

// ============================ lexer ============================

enum class Tok : uint8_t { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;
  int line;
  int64_t i = 0;
  double f = 0;
};

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

}  // namespace tessera::model::jinja
