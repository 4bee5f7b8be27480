// Glue between torch tensors and the compute cores of `opforge new-op --schema` packages (no
// op-specific code): tensors prepared the way the cores read them, the cores' alloc(k, shape) over
// the op's outputs, and ATen's intra-op pool as their parallel_for. Installed with opforge and
// included from there, like core_tensor.h; a package's kernels name it
// `namespace torch_glue = opforge::torch_glue;`.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/SymInt.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "opforge/glue/core_tensor.h"
#include "opforge/torch_shape_rule.h"  // known(dim) for c10::SymInt dims, rule_shape, flattened_shapes

namespace opforge {
namespace torch_glue {
inline namespace OPFORGE_GLUE_NAMESPACE {

// The cores compute in float32 for the 16-bit dtypes (widened once, results rounded once) and in
// float64 for float64.
inline at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// `t` as a core reads it: contiguous, converted to `as` when given; an absent optional tensor stays
// undefined. The caller keeps the result alive while the core runs.
inline at::Tensor prepared(const at::Tensor& t, std::optional<at::ScalarType> as = std::nullopt) {
  if (!t.defined()) return t;
  return (as ? t.to(*as) : t).contiguous();
}
inline at::Tensor prepared(const std::optional<at::Tensor>& t, std::optional<at::ScalarType> as = std::nullopt) {
  return t.has_value() ? prepared(*t, as) : at::Tensor();
}

// A prepared tensor as the core's Input (present == false for an undefined one).
template <typename T>
glue::Input<T> input(const at::Tensor& t) {
  glue::Input<T> in;
  in.present = t.defined();
  if (in.present) {
    in.data = t.const_data_ptr<T>();
    in.shape = t.sizes().vec();
  }
  return in;
}

// A shape argument of an op's shape rule (SymInt[], SymInt[]? for an optional tensor) as the core's
// Shape: opforge's own ops' (opforge/torch_shape_rule.h).
inline glue::Shape<c10::SymInt> shape(c10::SymIntArrayRef dims) { return rule_shape(dims); }
inline glue::Shape<c10::SymInt> shape(const std::optional<c10::SymIntArrayRef>& dims) { return rule_shape(dims); }

// The outputs' shapes as a shape rule op returns them: [rank0, dims0..., rank1, dims1...].
inline std::vector<c10::SymInt> flattened(const std::vector<std::vector<c10::SymInt>>& shapes, size_t outputs,
                                          const char* op) {
  TORCH_CHECK(shapes.size() == outputs, op, ": the shape rule gave ", shapes.size(), " shape(s) for ", outputs,
              " output(s)");
  return flattened_shapes(shapes);
}

// The core's alloc(k, shape): output k as a new contiguous tensor, kept in `outputs`.
template <typename F>
struct Allocator {
  std::vector<at::Tensor>* outputs;
  at::TensorOptions options;
  const char* op;
  const char* function;

  F* operator()(int k, const std::vector<int64_t>& shape) const {
    TORCH_CHECK(k >= 0 && k < static_cast<int>(outputs->size()), op, ": ", function, " allocates output ", k,
                ", but there are ", outputs->size());
    (*outputs)[k] = at::empty(shape, options);
    return (*outputs)[k].template mutable_data_ptr<F>();
  }
};

// Every output allocated: a core that returns "" without allocating one is a bug in the core.
inline void check_allocated(const std::vector<at::Tensor>& outputs, const char* op, const char* function) {
  for (size_t k = 0; k < outputs.size(); ++k)
    TORCH_CHECK(outputs[k].defined(), op, ": ", function, " returned without allocating output ", k);
}

// The core's parallel_for(n, grain, body): ATen's intra-op pool (torch.set_num_threads).
struct ParallelFor {
  template <typename Body>
  void operator()(int64_t n, int64_t grain, const Body& body) const {
    at::parallel_for(0, n, std::max<int64_t>(grain, 1), body);
  }
};

}  // namespace OPFORGE_GLUE_NAMESPACE
}  // namespace torch_glue
}  // namespace opforge
