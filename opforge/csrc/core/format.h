// Text for error messages, shared by the cores and both front ends so torch's
// exceptions and ORT's statuses describe shapes the same way: "[2, 3]".
#pragma once

#include <cstdint>
#include <string>

namespace opforge {
namespace core {

inline std::string dims_str(const int64_t* d, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace core
}  // namespace opforge
