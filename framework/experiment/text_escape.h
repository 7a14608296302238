// JSON and CSV spelling of strings and numbers, shared by `kvlab report` (report.cpp) and the
// summary rows / kvpress export (summary_rows.cpp).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace kvlab {

// A JSON string literal: quotes, backslashes and control characters escaped.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else out += ch;
  }
  return out + "\"";
}

// A JSON number that round-trips a double (%.17g); null for NaN and infinities.
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

// RFC 4180: quoted when it holds a comma, quote or line break; quotes doubled.
inline std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace kvlab
