// Well-formed UTF-8 out of arbitrary bytes (a model's decoded answer, a user's prompt) for the report.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace llama::unicode {

// s with every ill-formed UTF-8 sequence replaced by U+FFFD, one per maximal subpart (Unicode's recommended
// practice, what Python's bytes.decode("utf-8", errors="replace") and so transformers' decode() produce). A
// byte-level BPE model may emit a token sequence that stops inside a character, or bytes that form none.
inline std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out += char(b0);
      ++i;
      continue;
    }
    // Expected length and the allowed range of the second byte (which excludes overlongs and surrogates).
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) n = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) n = 3, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4) n = 4, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;  // bytes of the well-formed prefix
    while (n > 0 && k < n && i + k < s.size()) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) break;
      ++k;
    }
    if (n > 0 && k == n) out.append(s.substr(i, n));
    else out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

}  // namespace llama::unicode
