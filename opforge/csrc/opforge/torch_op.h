// opforge's torch glue for an op's torch kernels (installed with opforge; add
// opforge.build.include_paths() to the include path): the mapping of torch
// storage types onto the compute cores' types, and argument checks that raise
// clear Python exceptions (TypeError / ValueError naming op and argument).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/broadcast.h"
#include "core/format.h"
#include "core/half.h"

namespace opforge {

// torch scalar type -> compute-core scalar type (identical bit layout).
template <typename T>
struct core_scalar {
  using type = T;
};
template <>
struct core_scalar<c10::Half> {
  using type = core::float16_t;
};
template <>
struct core_scalar<c10::BFloat16> {
  using type = core::bfloat16_t;
};
static_assert(sizeof(c10::Half) == sizeof(core::float16_t), "Half layout");
static_assert(sizeof(c10::BFloat16) == sizeof(core::bfloat16_t), "BFloat16 layout");

template <typename T>
inline const typename core_scalar<T>::type* core_ptr(const at::Tensor& t) {
  return reinterpret_cast<const typename core_scalar<T>::type*>(t.const_data_ptr<T>());
}
template <typename T>
inline typename core_scalar<T>::type* core_mutable_ptr(at::Tensor& t) {
  return reinterpret_cast<typename core_scalar<T>::type*>(t.mutable_data_ptr<T>());
}

inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

// Element strides of `t` viewed as broadcast to `out_shape` (0 on broadcast dims).
inline std::vector<int64_t> broadcast_strides(const at::Tensor& t, at::IntArrayRef out_shape) {
  const int64_t n = static_cast<int64_t>(out_shape.size());
  const int64_t offset = n - t.dim();
  std::vector<int64_t> strides(n, 0);
  for (int64_t i = offset; i < n; ++i) {
    const int64_t j = i - offset;
    strides[i] = (t.size(j) == 1 && out_shape[i] != 1) ? 0 : t.stride(j);
  }
  return strides;
}

// All tensors on the first one's device, else a ValueError naming both (the
// dispatcher picks the CUDA kernel if ANY argument is on CUDA). Undefined
// tensors are skipped.
inline void check_same_device(const char* op,
                              std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  const std::pair<const char*, const at::Tensor*>* first = nullptr;
  for (const auto& named : tensors) {
    if (!named.second->defined()) continue;
    if (first == nullptr) {
      first = &named;
      continue;
    }
    TORCH_CHECK_VALUE(named.second->device() == first->second->device(), op, ": ", named.first, " is on ",
                      named.second->device(), " but ", first->first, " is on ", first->second->device(),
                      "; all tensors must be on one device");
  }
}

inline std::string shape_str(at::IntArrayRef s) { return core::dims_str(s.data(), s.size()); }

// A backward op's grad_output must have its forward's output shape (`want`, from the core's rule):
// RuntimeError naming the op otherwise.
inline void check_grad_output_shape(const char* op, const at::Tensor& grad_output, at::IntArrayRef want) {
  TORCH_CHECK(grad_output.sizes() == want, op, " backward: grad_output has shape ", shape_str(grad_output.sizes()),
              ", expected the output's ", shape_str(want));
}

}  // namespace opforge

