// The chat-template Jinja interpreter (jinja.h): the parser from
// jinja_lex.cpp's tokens to an AST, and Template::parse.
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
    Parser parser(lex(source), limits);
    auto t = std::make_shared<Template>();
    t->root_ = parser.run();
    return std::shared_ptr<const Template>(std::move(t));
  } catch (const JinjaError& e) {
    return core::Status(e.code, e.message);
  }
}

}  // namespace tessera::model::jinja
