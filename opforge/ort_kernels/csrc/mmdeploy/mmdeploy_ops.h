// What the kernels of libopforge_mmdeploy.so share: the domains and op names of
// mmdeploy 1.3.1's node forms, and its attribute conventions. The forms were read
// from mmdeploy's exporters (mmdeploy/pytorch/symbolics, mmdeploy/mmcv/ops) and
// checked on files mmdeploy itself exported (tests/data/mmdeploy); the table is
// in docs/mmdeploy.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "opforge/ort_op.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

inline constexpr const char* kMmdeployDomain = "mmdeploy";
inline constexpr const char* kMmcvDomain = "mmcv";

inline constexpr const char* kGridSampler = "grid_sampler";
inline constexpr const char* kModulatedDeformConv = "MMCVModulatedDeformConv2d";
inline constexpr const char* kRoiAlignRotated = "MMCVRoIAlignRotated";
inline constexpr const char* kNmsRotated = "NMSRotated";
inline constexpr const char* kNmsMatch = "NMSMatch";

// ORT's attribute getters by type: an INT read as a list gives an empty list, and an
// absent attribute fails each getter. So: the scalar first, then the list.
inline bool int_attribute(const OrtKernelInfo* info, const char* name, int64_t* value) {
  OrtStatus* st = Ort::GetApi().KernelInfoGetAttribute_int64(info, name, value);
  if (st == nullptr) return true;
  Ort::GetApi().ReleaseStatus(st);
  return false;
}

// The values of an INTS attribute; empty when absent (or not a list).
inline std::vector<int64_t> ints_attribute(const OrtKernelInfo* info, const char* name) {
  size_t size = 0;
  OrtStatus* st = Ort::GetApi().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size);
  if (st != nullptr) {
    Ort::GetApi().ReleaseStatus(st);
    return {};
  }
  std::vector<int64_t> values(size);
  if (size > 0) Ort::ThrowOnError(Ort::GetApi().KernelInfoGetAttributeArray_int64(info, name, values.data(), &size));
  return values;
}

inline bool float_attribute(const OrtKernelInfo* info, const char* name, float* value) {
  OrtStatus* st = Ort::GetApi().KernelInfoGetAttribute_float(info, name, value);
  if (st == nullptr) return true;
  Ort::GetApi().ReleaseStatus(st);
  return false;
}

// An int attribute, or `fallback` (mmcv's Python default) when the node has none; one
// of another type (a list, a float) is an error naming it.
inline int64_t int_attribute_or(const OrtKernelInfo* info, const char* op, const char* name, int64_t fallback) {
  int64_t value = 0;
  if (int_attribute(info, name, &value)) return value;
  if (!ints_attribute(info, name).empty())
    node_error(std::string(op) + ": attribute '" + name + "' must be an int, got a list");
  float f = 0;
  if (float_attribute(info, name, &f)) node_error(std::string(op) + ": attribute '" + name + "' must be an int, got a float");
  return fallback;
}

// A flag attribute (0 or 1), with a default.
inline bool flag_attribute_or(const OrtKernelInfo* info, const char* op, const char* name, bool fallback) {
  const int64_t v = int_attribute_or(info, op, name, fallback ? 1 : 0);
  if (v != 0 && v != 1) node_error(std::string(op) + ": attribute " + name + " must be 0 or 1, got " + std::to_string(v));
  return v != 0;
}

// An (h, w) pair written as INTS [h, w] (mmcv's modules pass tuples), INTS [v] or
// INT v (mmcv.ops.modulated_deform_conv2d called with plain ints): mmdeploy's
// exporter writes whatever type the Python value had, so both reach the kernel.
// Absent: (fallback, fallback).
inline void pair_attribute(const OrtKernelInfo* info, const char* op, const char* name, int64_t fallback,
                           int64_t* h, int64_t* w) {
  int64_t value = 0;
  if (int_attribute(info, name, &value)) {
    *h = *w = value;
    return;
  }
  const std::vector<int64_t> values = ints_attribute(info, name);
  if (values.size() > 2)
    node_error(std::string(op) + ": attribute '" + name + "' must be an int or a list of 1 or 2 ints, got " +
               std::to_string(values.size()) + " values");
  float f = 0;
  if (values.empty() && float_attribute(info, name, &f))
    node_error(std::string(op) + ": attribute '" + name + "' must be an int or a list of ints, got a float");
  *h = values.empty() ? fallback : values[0];
  *w = values.empty() ? fallback : values.back();
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
