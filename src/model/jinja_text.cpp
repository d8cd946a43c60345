// The chat-template Jinja interpreter (jinja.h): errors, values, and the
// text and JSON helpers the parser and the evaluator share.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "model/jinja_internal.h"

namespace tessera::model::jinja {

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

NodeP mk(K kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

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

}  // namespace tessera::model::jinja
