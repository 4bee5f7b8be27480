// The torch side of the built-in ops' shape rules (core/shape.h): a rule registered as a
// tensor-free op whose tensor arguments are shapes with c10::SymInt dims, so the fake impl gets
// symbolic output sizes under dynamic shapes from the same C++ the kernels run
// (opforge.ShapeRule calls it from Python).
#pragma once

#include <c10/core/SymInt.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <vector>

#include "core/shape.h"

namespace opforge {
namespace core {

// A SymInt's number, when it is not symbolic; whether it is 1, size-obliviously (core/shape.h).
template <>
struct DimTraits<c10::SymInt> {
  static std::optional<int64_t> known(const c10::SymInt& d) { return d.maybe_as_int(); }
  static bool is_one(const c10::SymInt& d) { return d.sym_eq(1).guard_size_oblivious(__FILE__, __LINE__); }
};

}  // namespace core

// A tensor argument of a rule op (SymInt[], SymInt[]? for an optional tensor), as the rule reads it.
inline core::Shape<c10::SymInt> rule_shape(c10::SymIntArrayRef dims) { return {dims.vec(), true}; }
inline core::Shape<c10::SymInt> rule_shape(const std::optional<c10::SymIntArrayRef>& dims) {
  return dims.has_value() ? rule_shape(*dims) : core::Shape<c10::SymInt>{{}, false};
}

// The outputs' shapes as a rule op returns them: [rank0, dims0..., rank1, dims1...].
inline std::vector<c10::SymInt> flattened_shapes(const std::vector<std::vector<c10::SymInt>>& shapes) {
  std::vector<c10::SymInt> flat;
  for (const auto& shape : shapes) {
    flat.emplace_back(static_cast<int64_t>(shape.size()));
    flat.insert(flat.end(), shape.begin(), shape.end());
  }
  return flat;
}

// Runs `rule` (a core's <op>_output_shapes) on `in`: its message as a ValueError, else the
// outputs' shapes flattened.
template <typename Shapes, typename Rule>
std::vector<c10::SymInt> run_shape_rule(const Shapes& in, Rule rule) {
  std::vector<std::vector<c10::SymInt>> out;
  const std::string err = rule(in, out);
  TORCH_CHECK_VALUE(err.empty(), err);
  return flattened_shapes(out);
}

}  // namespace opforge
