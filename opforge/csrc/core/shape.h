// What an op's shape rule reads and writes, for every Dim: the kernels run the rule with int64_t
// dims before they allocate; the torch library registers it on opforge::RuleDim (a size that may be
// symbolic under torch.export / the dynamo exporter), which the fake impl and ONNX shape inference
// run through opforge.ShapeRule (opforge/shape_rule.py). One rule, so every runtime accepts, refuses
// and sizes alike. No torch types here: the torch glue (opforge/torch_shape_rule.h) says what a
// RuleDim's number is.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace opforge {
namespace core {

// A tensor's shape as a shape rule reads it.
template <typename Dim>
struct Shape {
  std::vector<Dim> dims;
  bool present = true;  // false: an optional tensor that was not given

  int rank() const { return static_cast<int>(dims.size()); }
  const Dim& operator[](int i) const { return dims[static_cast<size_t>(i)]; }
};

// DimTraits<Dim>::known(d): d's value when it is a number. Always, for the kernels' int64_t; the
// torch glue specialises it for opforge::RuleDim, where a symbolic size has none. Checks that need
// numbers (int64 overflow of element counts, the kernels' 32-bit limits) run where every dim they
// read is known: always in the kernels, and in the fake impl whenever the sizes are concrete.
//
// DimTraits<Dim>::is_one(d): whether d is 1, for broadcasting. A symbolic size is taken to be
// another size than 1 unless it is known to be 1 (torch's size-oblivious rule), so a rule's
// broadcasting never specialises a dynamic dim to its example's 1.
template <typename Dim>
struct DimTraits {
  static std::optional<int64_t> known(const Dim& d) { return static_cast<int64_t>(d); }
  static bool is_one(const Dim& d) { return d == 1; }
};

template <typename Dim>
std::optional<int64_t> known(const Dim& d) {
  return DimTraits<Dim>::known(d);
}

template <typename Dim>
bool is_one(const Dim& d) {
  return DimTraits<Dim>::is_one(d);
}

// The numbers of `dims`, or nothing when one of them is symbolic.
template <typename Dim>
std::optional<std::vector<int64_t>> known_all(const std::vector<Dim>& dims) {
  std::vector<int64_t> out;
  out.reserve(dims.size());
  for (const Dim& d : dims) {
    const std::optional<int64_t> v = known(d);
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  return out;
}

// a * b into *out when it fits int64.
inline bool mul_fits(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool add_fits(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

// The product of `dims` when it fits int64 (and, times `bytes_per_element`, still does).
inline bool numel_fits(const std::vector<int64_t>& dims, int64_t bytes_per_element = 1) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (!mul_fits(n, d, &n)) return false;
  return mul_fits(n, bytes_per_element, &n);
}

// A shape as messages print it, "[2, 3]" (a symbolic dim prints as its expression, e.g. s0).
template <typename Dim>
std::ostream& operator<<(std::ostream& os, const Shape<Dim>& shape) {
  if (!shape.present) return os << "(not given)";
  os << "[";
  for (size_t i = 0; i < shape.dims.size(); ++i) os << (i ? ", " : "") << shape.dims[i];
  return os << "]";
}

// An error message from its parts: strings, numbers, dims and shapes.
template <typename... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

// The rule's view of a kernel's shape, from (pointer, rank).
inline Shape<int64_t> shape_of(const int64_t* dims, int rank) {
  return Shape<int64_t>{std::vector<int64_t>(dims, dims + rank)};
}

}  // namespace core
}  // namespace opforge
