// The chat-template Jinja interpreter (jinja.h): the lexer, with the
// whitespace control Hugging Face renders with.
#include <charconv>
#include <cstring>

#include "model/jinja_internal.h"

namespace tessera::model::jinja {

namespace {

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

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace tessera::model::jinja
