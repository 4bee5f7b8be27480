// Shared plumbing for opforge's ONNX Runtime kernels (lite custom-op API).
#pragma once

// The library is loaded by an already running ORT: no static API lookup, we
// take the OrtApi from RegisterCustomOps' argument (see ort_library.cc).
#ifndef ORT_API_MANUAL_INIT
#define ORT_API_MANUAL_INIT
#endif
#include <onnxruntime_cxx_api.h>
#include <onnxruntime_lite_custom_op.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/broadcast.h"
#include "core/deform_conv2d_tap.h"
#include "core/format.h"
#include "core/half.h"

namespace opforge {
namespace ort {

// The custom ONNX domain of every opforge op; must match opforge/spec.py.
inline constexpr const char* kDomain = "opforge";
inline constexpr const char* kCpuEp = "CPUExecutionProvider";
inline constexpr const char* kCudaEp = "CUDAExecutionProvider";

using LiteOpPtr = std::unique_ptr<Ort::Custom::OrtLiteCustomOp>;

// ORT storage type -> compute-core scalar type (identical bit layout).
template <typename T>
struct core_scalar {
  using type = T;
};
template <>
struct core_scalar<Ort::Float16_t> {
  using type = core::float16_t;
};
template <>
struct core_scalar<Ort::BFloat16_t> {
  using type = core::bfloat16_t;
};
static_assert(sizeof(Ort::Float16_t) == 2 && sizeof(Ort::BFloat16_t) == 2, "16-bit layouts");

template <typename T>
const typename core_scalar<T>::type* core_ptr(const T* p) {
  return reinterpret_cast<const typename core_scalar<T>::type*>(p);
}
template <typename T>
typename core_scalar<T>::type* core_ptr(T* p) {
  return reinterpret_cast<typename core_scalar<T>::type*>(p);
}

inline std::string shape_str(const std::vector<int64_t>& s) { return core::dims_str(s.data(), s.size()); }

inline Ort::Status invalid_argument(const std::string& msg) {
  return Ort::Status(msg.c_str(), ORT_INVALID_ARGUMENT);
}

// Splits [0, total) into grain-sized slices and runs body(begin, end) on ORT's
// intra-op thread pool (so the session's intra_op_num_threads is honoured).
template <typename Body>
void parallel_for(OrtKernelContext* ctx, int64_t total, int64_t grain, const Body& body) {
  const int64_t tasks = (total + grain - 1) / grain;
  if (tasks <= 1) {
    body(int64_t(0), total);
    return;
  }
  struct Job {
    const Body* body;
    int64_t total, grain;
  } job{&body, total, grain};
  Ort::KernelContext(ctx).ParallelFor(
      [](void* p, size_t i) {
        const Job& j = *static_cast<const Job*>(p);
        const int64_t begin = static_cast<int64_t>(i) * j.grain;
        const int64_t end = begin + j.grain < j.total ? begin + j.grain : j.total;
        (*j.body)(begin, end);
      },
      static_cast<size_t>(tasks), 0, &job);
}

// Calls fn(T{}) for each element type the kernels support (float, double,
// float16, bfloat16): registration registers one kernel per type under one name.
template <typename Fn>
void for_each_float_type(Fn&& fn) {
  fn(float{});
  fn(double{});
  fn(Ort::Float16_t{});
  fn(Ort::BFloat16_t{});
}

// my_add's shape checks and broadcasting plan (CPU and CUDA kernels).
Ort::Status my_add_plan(const std::vector<int64_t>& shape_a, const std::vector<int64_t>& shape_b,
                        std::vector<int64_t>& out_shape, core::BinaryPlan& plan);

// deform_conv2d's node attributes (the torch schema's int arguments) and
// their check against the input shapes (core::deform_conv2d_check).
struct DeformConv2dAttrs {
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, offset_groups;
  bool use_mask;
  explicit DeformConv2dAttrs(const OrtKernelInfo* info);
  std::string check(const std::vector<int64_t>& input, const std::vector<int64_t>& weight,
                    const std::vector<int64_t>& offset, const std::vector<int64_t>& mask,
                    const std::vector<int64_t>& bias, core::DeformConv2dParams& p) const;
};

// Each op file defines one of these, returning its kernels (one per dtype).
void append_my_add_ops(std::vector<LiteOpPtr>& ops);
void append_deform_conv2d_ops(std::vector<LiteOpPtr>& ops);
#ifdef OPFORGE_WITH_CUDA
void append_my_add_cuda_ops(std::vector<LiteOpPtr>& ops);
void append_deform_conv2d_cuda_ops(std::vector<LiteOpPtr>& ops);
#endif

}  // namespace ort
}  // namespace opforge
