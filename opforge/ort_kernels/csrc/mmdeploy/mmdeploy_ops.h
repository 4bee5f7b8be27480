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
#include "ort_common.h"  // opforge's kernel helpers and the node forms mmdeploy shares with opforge

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

// The names errors give the node forms (domain::op; grid_sampler's is core::kGridSampleOp).
inline constexpr const char* kModulatedDeformConvOp = "mmdeploy::MMCVModulatedDeformConv2d";
inline constexpr const char* kNmsRotatedOp = "mmdeploy::NMSRotated";
inline constexpr const char* kNmsMatchOp = "mmdeploy::NMSMatch";
// MMCVRoIAlignRotated's, as opforge's RoiAlignRotatedKernel takes it (OpName::value).
struct MmcvRoiAlignRotatedOp {
  static constexpr const char* value = "mmdeploy::MMCVRoIAlignRotated";
};

// ORT's attribute getters: the scalar ones check the attribute's type (and fail when
// it is absent), but the list one does not: for a present attribute of any type it
// returns its INTS values, so an INT, FLOAT, FLOATS, STRING or empty INTS attribute
// all read as an empty list, and only an absent one fails. Hence: the scalar first,
// then the list; a present attribute with no INTS values is the wrong type.
inline bool int_attribute(const OrtKernelInfo* info, const char* name, int64_t* value) {
  OrtStatus* st = Ort::GetApi().KernelInfoGetAttribute_int64(info, name, value);
  if (st == nullptr) return true;
  Ort::GetApi().ReleaseStatus(st);
  return false;
}

// The INTS values of attribute `name`; *present tells whether the node has it at all.
inline std::vector<int64_t> ints_attribute(const OrtKernelInfo* info, const char* name, bool* present) {
  size_t size = 0;
  OrtStatus* st = Ort::GetApi().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size);
  *present = st == nullptr;
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

// "a float", or what else a present attribute with no INTS values can be.
inline std::string other_attribute_type(const OrtKernelInfo* info, const char* name) {
  float f = 0;
  return float_attribute(info, name, &f) ? "a float" : "another type (a string, floats or an empty list)";
}

// An int attribute, or `fallback` (mmcv's Python default) when the node has none; one
// of another type (a list, a float, a string...) is an error naming it.
inline int64_t int_attribute_or(const OrtKernelInfo* info, const char* op, const char* name, int64_t fallback) {
  int64_t value = 0;
  if (int_attribute(info, name, &value)) return value;
  bool present = false;
  const std::vector<int64_t> values = ints_attribute(info, name, &present);
  if (!present) return fallback;
  node_error(std::string(op) + ": attribute '" + name + "' must be an int, got " +
             (values.empty() ? other_attribute_type(info, name) : "a list"));
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
  bool present = false;
  const std::vector<int64_t> values = ints_attribute(info, name, &present);
  if (!present) {
    *h = *w = fallback;
    return;
  }
  if (values.empty() || values.size() > 2)
    node_error(std::string(op) + ": attribute '" + name + "' must be an int or a list of 1 or 2 ints, got " +
               (values.empty() ? other_attribute_type(info, name) : std::to_string(values.size()) + " values"));
  *h = values[0];
  *w = values.back();
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
