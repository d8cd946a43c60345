// The chat-template Jinja interpreter (jinja.h): the evaluator's statements,
// expressions, comparisons and tests (its functions, methods and filters are
// in jinja_filters.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/jinja_internal.h"

namespace tessera::model::jinja {

void Evaluator::run(const Node& root, const nlohmann::ordered_json& context, std::string& out) {
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

Flow Evaluator::exec_body(const std::vector<NodeP>& body, Scope& scope, std::string& out) {
  for (const auto& st : body) {
    const Flow f = exec(*st, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

void Evaluator::append(std::string& out, const std::string& s, int line) {
  if (static_cast<int64_t>(out.size() + s.size()) > lim_.max_output_bytes) throw_render(line, "output too large");
  out += s;
}

void Evaluator::step(int line) {
  if (++steps_ > lim_.max_steps) throw_render(line, "template takes too many steps");
}

Flow Evaluator::exec(const Node& n, Scope& scope, std::string& out) {
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

std::vector<Value> Evaluator::iterate(const Value& v, int line) {
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

void Evaluator::bind_targets(const Node& n, const Value& item, Scope& s) {
  if (n.names.size() == 1) {
    s.vars[n.names[0]] = item;
    return;
  }
  const auto parts = iterate(item, n.line);
  if (parts.size() != n.names.size()) throw_render(n.line, "wrong number of values to unpack in for loop");
  for (size_t k = 0; k < parts.size(); ++k) s.vars[n.names[k]] = parts[k];
}

Flow Evaluator::exec_for(const Node& n, Scope& scope, std::string& out) {
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
    // Each iteration starts from the outer names, as in Jinja: what a
    // `{% set %}` in the body assigned does not carry to the next one.
    for (auto it = loop_scope.vars.begin(); it != loop_scope.vars.end();)
      it = it->first == "loop" ? std::next(it) : loop_scope.vars.erase(it);
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

Args Evaluator::eval_args(const Node& call, Scope& scope) {
  Args a;
  for (const auto& e : call.args) a.pos.push_back(eval(*e, scope));
  for (size_t k = 0; k < call.kwargs.size(); ++k) a.kw.emplace_back(call.names[k], eval(*call.kwargs[k], scope));
  return a;
}

// Binds parameters (then defaults, in the macro's scope) and renders the body.
Value Evaluator::call_macro(const Node& m, const Args& args, Scope& caller_scope, int line) {
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

Value Evaluator::new_list() {
  Value v = Value::make(Value::List);
  v.depth = 1;
  v.list = std::make_shared<std::vector<Value>>();
  return v;
}

void Evaluator::check_size(const std::string& s, int line) const {
  if (static_cast<int64_t>(s.size()) > lim_.max_output_bytes) throw_render(line, "string too large");
}

void Evaluator::check_depth(const Value& v, int line) const {
  if (v.depth > lim_.max_nesting) throw_render(line, "values nested too deeply");
}

void Evaluator::fix_depth(Value& v, int line) const {
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

bool Evaluator::equals(const Value& a, const Value& b, int depth) {
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
int Evaluator::compare(const Value& a, const Value& b, int line, int depth) {
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

bool Evaluator::contains(const Value& container, const Value& x, int line) {
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

Value Evaluator::attr(const Value& obj, const std::string& name) {
  if ((obj.t == Value::Dict || obj.t == Value::Ns)) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value();
}

Value Evaluator::item(const Value& obj, const Value& key, int line) {
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

Value Evaluator::slice(const Value& obj, const Node& n, Scope& scope) {
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

Value Evaluator::arith(const std::string& op, const Value& l, const Value& r, int line) {
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

Value Evaluator::eval(const Node& n, Scope& scope) {
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

bool Evaluator::apply_test(const Node& n, const Value& v, Scope& scope) {
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

bool Evaluator::test_by_name(const std::string& name, const Value& v, const Value* argv, int line) {
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
