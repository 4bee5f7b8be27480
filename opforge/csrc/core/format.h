// Text for error messages, shared by the cores and both front ends so torch's
// exceptions and ORT's statuses describe shapes and values the same way: "[2, 3]".
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace opforge {
namespace core {

inline std::string dims_str(const int64_t* d, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// A number for a message in the fewest significant digits that read back as the same value of
// its type: "0.5", "1e+19", "inf", "nan" (a float32 1e19 is "1e+19", not its double digits).
inline std::string number_str(double v) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v || v != v) break;
  }
  return buf;
}
inline std::string number_str(float v) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v || v != v) break;
  }
  return buf;
}

}  // namespace core
}  // namespace opforge
