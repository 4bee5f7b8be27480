// Glue between torch tensors and the compute cores of `opforge new-op --schema` packages (no
// op-specific code), on LibTorch's stable ABI (opforge/torch_op.h: torch::stable::Tensor, checks
// that throw std::runtime_error): tensors prepared the way the cores read them, the cores'
// alloc(k, shape) over the op's outputs, torch's intra-op pool as their parallel_for, and the
// shape rule's arguments (opforge/torch_shape_rule.h: RuleArgs, RuleDim) as the core reads them.
// Installed with opforge and included from there, like core_tensor.h; a package's kernels name it
// `namespace torch_glue = opforge::torch_glue;`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "opforge/glue/core_tensor.h"
#include "opforge/torch_op.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {
namespace torch_glue {
inline namespace OPFORGE_GLUE_NAMESPACE {

using Tensor = ::opforge::Tensor;
using ScalarType = ::opforge::ScalarType;
// An int[] argument of a kernel (TORCH_BOX hands it over as a std::vector), and a float[] one.
using IntList = torch::headeronly::HeaderOnlyArrayRef<int64_t>;
using FloatList = torch::headeronly::HeaderOnlyArrayRef<double>;

// The cores compute in float32 for the 16-bit dtypes (widened once, results rounded once) and in
// float64 for float64.
using ::opforge::compute_type;

// `t` as a core reads it: contiguous, converted to `as` when given; an absent optional tensor stays
// undefined. The caller keeps the result alive while the core runs.
inline Tensor prepared(const Tensor& t, std::optional<ScalarType> as = std::nullopt) {
  if (!t.defined()) return t;
  return as ? ::opforge::prepared(t, *as) : ::opforge::prepared(t);
}
inline Tensor prepared(const std::optional<Tensor>& t, std::optional<ScalarType> as = std::nullopt) {
  return t.has_value() ? prepared(*t, as) : Tensor();
}

// A prepared tensor as the core's Input (present == false for an undefined one).
template <typename T>
glue::Input<T> input(const Tensor& t) {
  glue::Input<T> in;
  in.present = t.defined();
  if (in.present) {
    in.data = ::opforge::data<T>(t);
    in.shape = ::opforge::sizes_of(t);
  }
  return in;
}

// ---- the shape rule (opforge/torch_shape_rule.h) ------------------------------------------------
// The torch library registers the core's rule, instantiated on RuleDim (a size that may be
// symbolic: opforge.ShapeRule answers its comparisons and arithmetic on torch's SymInts), by name
// with OPFORGE_SHAPE_RULE; its function reads the arguments from RuleArgs in the signature's order:
// args.shape(i) (a tensor's shape; present == false for an absent optional one), args.integer(i),
// args.integers(i), args.real(i), args.boolean(i), and floats(args, i) below.
using RuleDim = ::opforge::RuleDim;
using RuleArgs = ::opforge::RuleArgs;
using RuleShapes = ::opforge::RuleShapes;

// A float[] argument of the rule, each value rounded to float32 (as ONNX stores it). (A template:
// only a rule with a float[] argument needs RuleArgs::reals.)
template <typename Args>
std::vector<float> floats(const Args& args, int i) {
  const std::vector<double> values = args.reals(i);
  return std::vector<float>(values.begin(), values.end());
}

// What the rule function returns: the core's refusal (`err`) prefixed with the op's name, which
// opforge.ShapeRule raises in the fake impl and ONNX shape inference as the kernels raise it; or ""
// once the core gave one shape per output (another count is a bug in the core: an error).
inline std::string rule_result(const std::string& err, const RuleShapes& out, size_t outputs, const char* op) {
  if (!err.empty()) return glue::message(op, ": ", err);
  ::opforge::check(out.size() == outputs, op, ": the shape rule gave ", out.size(), " shape(s) for ", outputs,
                   " output(s)");
  return "";
}

// ---- the core's callbacks -----------------------------------------------------------------------

// The core's alloc(k, shape): output k as a new contiguous tensor of `dtype` on `like`'s device, kept
// in `outputs`.
template <typename F>
struct Allocator {
  std::vector<Tensor>* outputs;
  Tensor like;
  ScalarType dtype;
  const char* op;
  const char* function;

  F* operator()(int k, const std::vector<int64_t>& shape) const {
    ::opforge::check(k >= 0 && k < static_cast<int>(outputs->size()), op, ": ", function, " allocates output ", k,
                     ", but there are ", outputs->size());
    (*outputs)[k] = ::opforge::empty_tensor(shape, dtype, like);
    return ::opforge::mutable_data<F>((*outputs)[k]);
  }
};

// Every output allocated: a core that returns "" without allocating one is a bug in the core.
inline void check_allocated(const std::vector<Tensor>& outputs, const char* op, const char* function) {
  for (size_t k = 0; k < outputs.size(); ++k)
    ::opforge::check(outputs[k].defined(), op, ": ", function, " returned without allocating output ", k);
}

// The core's parallel_for(n, grain, body): torch's intra-op pool (torch.set_num_threads).
using ::opforge::ParallelFor;

}  // namespace OPFORGE_GLUE_NAMESPACE
}  // namespace torch_glue
}  // namespace opforge
