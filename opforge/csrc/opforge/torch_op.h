// opforge's torch glue for an op's torch kernels, on LibTorch's stable ABI only (installed with
// opforge; add opforge.build.include_paths() to the include path). A library built on it targets
// torch 2.10 (TORCH_TARGET_VERSION, set by opforge.build) and loads in every torch from 2.10 on:
// it reaches torch only through the stable C shims (aoti_torch_*, torch_*), never through
// at::/c10:: C++ symbols, and links no libpython (opforge.torch_library_path() loads in a C++
// program). What it gives a kernel:
//   - tensors: torch::stable::Tensor, the storage types mapped onto the compute cores' types,
//     allocation, views and conversions through stable ops;
//   - checks that throw std::runtime_error with a message naming the op and the argument (torch
//     raises it as a RuntimeError; opforge's op wrappers re-raise it as opforge.OpInputError);
//   - call_aten(...): any ATen op by name through the dispatcher (the GEMMs: MKL/BLAS, cuBLAS);
//   - parallel_for over torch's intra-op pool (torch.set_num_threads).
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/format.h"
#include "core/half.h"
#include "core/shape.h"

namespace opforge {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using IntList = torch::headeronly::IntHeaderOnlyArrayRef;

// ---- errors --------------------------------------------------------------------------------

// Throws std::runtime_error(message) when !cond: torch raises it as a RuntimeError with the
// message, in eager calls and in an AOTInductor package's run alike.
template <typename... Parts>
inline void check(bool cond, const Parts&... parts) {
  if (!cond) throw std::runtime_error(core::message(parts...));
}
// A rule's message ("" when valid) as the error.
inline void check_rule(const std::string& err) {
  if (!err.empty()) throw std::runtime_error(err);
}

// ---- dtypes --------------------------------------------------------------------------------

// The name messages give a dtype (torch's C++ name: Float, Double, Half, BFloat16, Long, ...).
inline const char* dtype_name(ScalarType t) { return torch::headeronly::toString(t); }

inline bool is_supported_float(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half || t == ScalarType::BFloat16;
}
inline bool is_16bit(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16; }
// The cores compute in float64 for float64 and in float32 for the other floats.
inline ScalarType compute_type(ScalarType t) { return t == ScalarType::Double ? ScalarType::Double : ScalarType::Float; }

// Calls body.template operator()<T>() with T the core's scalar type of `t`'s dtype: float, double,
// core::float16_t, core::bfloat16_t (the same bit layouts as torch's Half and BFloat16). `op` names
// the op in the error for any other dtype.
template <typename Body>
inline void dispatch_float(ScalarType t, const char* op, const Body& body) {
  switch (t) {
    case ScalarType::Float:
      return body.template operator()<float>();
    case ScalarType::Double:
      return body.template operator()<double>();
    case ScalarType::Half:
      return body.template operator()<core::float16_t>();
    case ScalarType::BFloat16:
      return body.template operator()<core::bfloat16_t>();
    default:
      throw std::runtime_error(core::message(op, ": no kernel for dtype ", dtype_name(t)));
  }
}
// The same for the compute dtypes alone (float32, float64).
template <typename Body>
inline void dispatch_compute(ScalarType t, const char* op, const Body& body) {
  if (t == ScalarType::Float) return body.template operator()<float>();
  if (t == ScalarType::Double) return body.template operator()<double>();
  throw std::runtime_error(core::message(op, ": no kernel for dtype ", dtype_name(t)));
}

template <typename T>
inline const T* data(const Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}
template <typename T>
inline T* mutable_data(const Tensor& t) {
  return static_cast<T*>(t.mutable_data_ptr());
}

// ---- shapes --------------------------------------------------------------------------------

inline std::vector<int64_t> sizes_of(const Tensor& t) {
  const IntList s = t.sizes();
  return std::vector<int64_t>(s.begin(), s.end());
}
inline core::Shape<int64_t> shape_of(const Tensor& t) { return core::Shape<int64_t>{sizes_of(t)}; }
inline std::string shape_str(IntList s) { return core::dims_str(s.data(), s.size()); }
inline std::string shape_str(const std::vector<int64_t>& s) { return core::dims_str(s.data(), s.size()); }

// Element strides of `t` viewed as broadcast to `out_shape` (0 on broadcast dims).
inline std::vector<int64_t> broadcast_strides(const Tensor& t, const std::vector<int64_t>& out_shape) {
  const int64_t n = static_cast<int64_t>(out_shape.size());
  const int64_t offset = n - t.dim();
  std::vector<int64_t> strides(n, 0);
  for (int64_t i = offset; i < n; ++i) {
    const int64_t j = i - offset;
    strides[i] = (t.size(j) == 1 && out_shape[i] != 1) ? 0 : t.stride(j);
  }
  return strides;
}

// A backward op's grad_output must have its forward's output shape (`want`, from the core's rule).
inline void check_grad_output_shape(const char* op, const Tensor& grad_output, const std::vector<int64_t>& want) {
  check(sizes_of(grad_output) == want, op, " backward: grad_output has shape ", shape_str(grad_output.sizes()),
        ", expected the output's ", shape_str(want));
}

// ---- devices -------------------------------------------------------------------------------

inline std::string device_str(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  return "device " + std::to_string(static_cast<int>(t.device().type()));
}

// All tensors on the first one's device, else an error naming both (the dispatcher picks the CUDA
// kernel if ANY argument is on CUDA). Null and undefined tensors are skipped.
inline void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> tensors) {
  const std::pair<const char*, const Tensor*>* first = nullptr;
  for (const auto& named : tensors) {
    if (named.second == nullptr || !named.second->defined()) continue;
    if (first == nullptr) {
      first = &named;
      continue;
    }
    const Tensor &a = *named.second, &b = *first->second;
    const bool same = a.device().type() == b.device().type() && (a.is_cpu() || a.get_device_index() == b.get_device_index());
    check(same, op, ": ", named.first, " is on ", device_str(a), " but ", first->first, " is on ", device_str(b),
          "; all tensors must be on one device");
  }
}

// ---- tensors -------------------------------------------------------------------------------
// (Named apart from torch::stable's ops, which argument-dependent lookup also finds: call those
// unqualified, e.g. contiguous(t), transpose(t, 0, 1).)

inline Tensor empty_tensor(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like_device) {
  return torch::stable::empty(IntList(shape), dtype, std::nullopt, like_device.device());
}
inline Tensor zeros_tensor(const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& like_device) {
  return torch::stable::new_zeros(like_device, IntList(shape), dtype);
}
// A new tensor of t's shape and device, in `dtype` (default: t's).
inline Tensor empty_as(const Tensor& t, std::optional<ScalarType> dtype = std::nullopt) {
  return torch::stable::new_empty(t, t.sizes(), dtype.value_or(t.scalar_type()));
}
inline Tensor zeros_as(const Tensor& t, std::optional<ScalarType> dtype = std::nullopt) {
  return torch::stable::new_zeros(t, t.sizes(), dtype.value_or(t.scalar_type()));
}
// `t` in dtype `as` (itself when it already is).
inline Tensor to_dtype(const Tensor& t, ScalarType as) {
  return t.scalar_type() == as ? t : torch::stable::to(t, as);
}
// Contiguous (itself when it already is: no dispatcher call, ~1 us) and, with `as`, in that dtype:
// what a core reads.
inline Tensor prepared(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }
inline Tensor prepared(const Tensor& t, ScalarType as) { return prepared(to_dtype(t, as)); }
inline Tensor permuted(const Tensor& t, std::initializer_list<int64_t> dims) {
  return torch::stable::permute(t, IntList(dims));
}
inline Tensor reshaped(const Tensor& t, const std::vector<int64_t>& shape) {
  return torch::stable::view(t, IntList(shape));
}
inline Tensor narrowed(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Tensor self = t;
  return torch::stable::narrow(self, dim, start, length);
}
inline Tensor to_cpu(const Tensor& t) {
  return t.is_cpu() ? t : torch::stable::to(t, torch::stable::Device(torch::headeronly::DeviceType::CPU));
}

// Any ATen op by name through the dispatcher ("aten::addmm_", overload ""), with its arguments in
// schema order; returns the first output (a Tensor). Stable: the op is looked up at run time.
template <typename... Args>
inline Tensor call_aten(const char* name, const char* overload, const Args&... args) {
  std::array<StableIValue, sizeof...(Args) == 0 ? 1 : sizeof...(Args)> stack{torch::stable::detail::from(args)...};
  STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// The core's parallel_for(n, grain, body): torch's intra-op pool.
template <typename Body>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const Body& body) {
  torch::stable::parallel_for(begin, end, grain < 1 ? 1 : grain, body);
}
struct ParallelFor {
  template <typename Body>
  void operator()(int64_t n, int64_t grain, const Body& body) const {
    parallel_for(0, n, grain, body);
  }
};

}  // namespace opforge
