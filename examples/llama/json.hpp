// A minimal JSON writer for the runner's --json report (no dependency for a handful of fields).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "utf8.hpp"

namespace llama::json {

// A JSON string of s; ill-formed UTF-8 becomes U+FFFD, so the document always parses.
inline std::string quote(std::string_view raw) {
  const std::string s = unicode::to_valid_utf8(raw);
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);  // UTF-8 passes through
        }
    }
  }
  return out + "\"";
}

// A JSON array of strings.
inline std::string quote_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + quote(items[i]);
  return out + "]";
}

// The shortest text that reads back as exactly v (0.9999999 stays 0.9999999, not 1); "null" if not finite.
inline std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace llama::json
