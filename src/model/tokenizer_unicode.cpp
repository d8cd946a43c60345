// Unicode for the tokenizers: UTF-8 coding (ours: strict, with offsets in the
// errors), character classes, case mapping and the normalization forms from
// utf8proc (libutf8proc-dev), and the PCRE2 (libpcre2-dev, 32-bit code units,
// UTF + UCP, JIT) regexes of Split / Replace.
#define PCRE2_CODE_UNIT_WIDTH 32
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "model/tokenizer_impl.h"

namespace tessera::model::tok {
namespace {

utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

}  // namespace

// ---- UTF-8 ----

Utf8Step next_utf8(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {b0, 1, true};
  size_t need = 0;
  char32_t cp = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // valid range of the next byte (excludes overlongs and surrogates)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0xFFFD, 1, false};
  }
  for (size_t i = 1; i <= need; ++i) {
    if (pos + i >= s.size()) return {0xFFFD, i, false};
    const auto b = static_cast<uint8_t>(s[pos + i]);
    if (b < lo || b > hi) return {0xFFFD, i, false};
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, true};
}

core::Result<std::u32string> utf8_to_u32(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Step step = next_utf8(text, pos);
    if (!step.valid) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned>(static_cast<uint8_t>(text[pos])));
      return core::invalid_argument("text is not valid UTF-8 (byte " + std::string(byte) + " at offset " +
                                    std::to_string(pos) + ")");
    }
    out.push_back(step.cp);
    pos += step.len;
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string u32_to_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) append_utf8(c, out);
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const Utf8Step step = next_utf8(bytes, pos);
    if (step.valid) {
      out.append(bytes.substr(pos, step.len));
    } else {
      append_utf8(0xFFFD, out);
    }
    pos += step.len;
  }
  return out;
}

// ---- Unicode classes (utf8proc's tables) ----

// White_Space: the C0 spaces, NEL and the Z categories (Zs, Zl, Zp), as Unicode defines it.
bool is_whitespace(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || c == 0x20;
  if (c == 0x85) return true;
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_letter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  const auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool is_number(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  const auto cat = category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;  // BERT counts these as whitespace
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CO;
}

bool is_nonspacing_mark(char32_t c) { return c >= 0x300 && category(c) == UTF8PROC_CATEGORY_MN; }

bool is_mark(char32_t c) {
  const auto cat = category(c);
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

// The ranges BERT's tokenizer pads with spaces (its own list, not a Unicode property).
bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_lowercase(char32_t c, std::u32string& out) {
  if (c == 0x130) {  // the one unconditional full mapping: i + combining dot above (SpecialCasing.txt)
    out.append(U"i\u0307");
    return;
  }
  out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

void append_without_accents(char32_t c, std::u32string& out) {
  if (c < 0xC0) {  // nothing below U+00C0 decomposes into a mark
    out.push_back(c);
    return;
  }
  utf8proc_int32_t buf[32];
  int boundclass = 0;
  const utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
  if (n <= 0 || n > 32) {
    if (!is_nonspacing_mark(c)) out.push_back(c);
    return;
  }
  for (utf8proc_ssize_t i = 0; i < n; ++i) {
    const auto d = static_cast<char32_t>(buf[i]);
    if (!is_nonspacing_mark(d)) out.push_back(d);
  }
}

std::u32string normalize_form(std::u32string_view text, NormalForm form) {
  char32_t stable_below = form == NormalForm::kNFC ? 0x300 : 0x80;  // text below is its own normal form
  bool stable = true;
  for (char32_t c : text) {
    if (c >= stable_below) {
      stable = false;
      break;
    }
  }
  if (stable) return std::u32string(text);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  const std::string utf8 = u32_to_utf8(text);
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                                          static_cast<utf8proc_ssize_t>(utf8.size()), &mapped,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::u32string(text);  // only on allocation failure: our input is valid
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  auto decoded = utf8_to_u32(std::string_view(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n)));
  return decoded.ok() ? std::move(decoded).value() : std::u32string(text);
}

// ---- Regex (PCRE2) ----

namespace {

// Per thread: one match block (one ovector pair is all we read) and a JIT
// stack that grows to 8 MB for long runs without whitespace.
struct MatchState {
  pcre2_match_data_32* data = pcre2_match_data_create_32(1, nullptr);
  pcre2_match_context_32* context = pcre2_match_context_create_32(nullptr);
  pcre2_jit_stack_32* stack = pcre2_jit_stack_create_32(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() {
    if (stack != nullptr) pcre2_jit_stack_assign_32(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_match_data_free_32(data);
    pcre2_match_context_free_32(context);
    pcre2_jit_stack_free_32(stack);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR32 buf[256];
  const int n = pcre2_get_error_message_32(code, buf, 256);
  std::string out;
  for (int i = 0; i < n; ++i) append_utf8(static_cast<char32_t>(buf[i]), out);
  return out;
}

}  // namespace

Regex::~Regex() { pcre2_code_free_32(static_cast<pcre2_code_32*>(code_)); }

core::Result<std::shared_ptr<const Regex>> Regex::compile(const std::string& pattern) {
  TESSERA_ASSIGN_OR_RETURN(const std::u32string chars, utf8_to_u32(pattern));
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code_32* code = pcre2_compile_32(reinterpret_cast<PCRE2_SPTR32>(chars.data()), chars.size(),
                                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    return core::parse_error("regex '" + pattern + "' does not compile at offset " + std::to_string(offset) + ": " +
                             pcre2_message(error));
  }
  auto regex = std::shared_ptr<Regex>(new Regex());
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile_32(code, PCRE2_JIT_COMPLETE) == 0;  // interpreted where JIT is unavailable
  return std::shared_ptr<const Regex>(std::move(regex));
}

core::Status Regex::find_all(std::u32string_view subject, std::vector<Span>& out) const {
  MatchState& state = match_state();
  auto* code = static_cast<pcre2_code_32*>(code_);
  const auto* text = reinterpret_cast<PCRE2_SPTR32>(subject.data());
  for (size_t pos = 0; pos <= subject.size();) {
    // Our text is checked UTF-8 turned into code points: no surrogates, nothing past U+10FFFF.
    const int rc = pcre2_match_32(code, text, subject.size(), pos, PCRE2_NO_UTF_CHECK, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return core::resource_exhausted("regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer_32(state.data);
    out.push_back({ov[0], ov[1]});
    pos = ov[1] > ov[0] ? ov[1] : ov[1] + 1;  // an empty match moves on one char
  }
  return core::ok_status();
}

}  // namespace tessera::model::tok
