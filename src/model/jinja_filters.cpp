// The chat-template Jinja interpreter (jinja.h): the evaluator's global
// functions, string and dict methods, filters, and Python's str()/repr()
// and json.dumps() of its values.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>

#include "model/jinja_internal.h"

namespace tessera::model::jinja {

Value Evaluator::call_function(const Value& fv, const Args& args, Scope& scope, int line) {
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

Value Evaluator::call_method(const Value& obj, const std::string& m, const Args& a, int line) {
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

Value Evaluator::split(const std::string& s, const std::string* sep, int64_t maxsplit, int line) {
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

std::string Evaluator::replace(const std::string& s, const std::string& o, const std::string& n, int64_t count, int line) {
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

// str(v) as Python prints it (Undefined: empty).
std::string Evaluator::to_str(const Value& v, int line) {
  if (v.t == Value::Str) return v.s;
  if (v.t == Value::Undef) return "";
  std::string out;
  repr(out, v, line, 0, true);
  return out;
}

void Evaluator::py_quote(std::string& out, const std::string& s) {
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

void Evaluator::repr(std::string& out, const Value& v, int line, int depth, bool top) {
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

void Evaluator::to_json(std::string& out, const Value& v, const JsonOpts& o, int depth, int line) {
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

Value Evaluator::apply_filter_chain(const Node& chain, Value body, Scope& scope) {
  // `chain` is Filter(Filter(Literal)) with the Literal standing for the body.
  if (chain.kind != K::Filter) return body;
  Value inner = apply_filter_chain(*chain.x, std::move(body), scope);
  return apply_filter(chain, std::move(inner), scope);
}

Value Evaluator::apply_filter(const Node& n, Value v, Scope& scope) {
  const Args a = eval_args(n, scope);
  return filter(n.name, v, a, n.line);
}

Value Evaluator::filter(const std::string& f, const Value& v, const Args& a, int line) {
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
Value Evaluator::get_path(const Value& x, const Value& path) {
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

}  // namespace tessera::model::jinja
