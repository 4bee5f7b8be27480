// ORT kernel of opforge::deform_conv2d (domain "opforge", version 1): inputs
// (input, weight, offset, mask, bias), int attributes stride_h, stride_w, pad_h,
// pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask — the torch
// schema one to one. Same core as the torch extension (core/deform_conv2d.h:
// gather-free channels-last sampling + the core's packed GEMM), parallel over
// (image, pixel tile) on ORT's intra-op pool. float16 / bfloat16 compute in
// float32 and round once (as the torch CPU kernel does).
#include <vector>

#include "deform_conv2d_cpu.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

DeformConv2dAttrs::DeformConv2dAttrs(const OrtKernelInfo* info) {
  constexpr const char* op = "opforge::deform_conv2d";
  // All five inputs, always (the torch schema's; an unused mask is an empty tensor, as torchvision passes it).
  check_node_arity(info, op, {"input", "weight", "offset", "mask", "bias"});
  const auto attr = [&](const char* name) { return node_attribute<int64_t>(info, op, name); };
  stride_h = attr("stride_h");
  stride_w = attr("stride_w");
  pad_h = attr("pad_h");
  pad_w = attr("pad_w");
  dil_h = attr("dilation_h");
  dil_w = attr("dilation_w");
  groups = attr("groups");
  offset_groups = attr("offset_groups");
  const int64_t mask_flag = attr("use_mask");
  if (mask_flag != 0 && mask_flag != 1)
    node_error(std::string(op) + ": attribute use_mask must be 0 or 1, got " + std::to_string(mask_flag));
  use_mask = mask_flag != 0;
  if (std::string err = core::deform_conv2d_check_attrs(stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups,
                                                        offset_groups);
      !err.empty())
    node_error(err);
}

std::string DeformConv2dAttrs::check(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws,
                                     const std::vector<int64_t>& os, const std::vector<int64_t>& ms,
                                     const std::vector<int64_t>& bs, core::DeformConv2dParams& p) const {
  return core::deform_conv2d_check(xs.data(), static_cast<int>(xs.size()), ws.data(), static_cast<int>(ws.size()),
                                   os.data(), static_cast<int>(os.size()), ms.data(), static_cast<int>(ms.size()),
                                   bs.data(), static_cast<int>(bs.size()), stride_h, stride_w, pad_h, pad_w, dil_h,
                                   dil_w, groups, offset_groups, use_mask, p);
}

const FloatKernels<DeformConv2dKernel, DeformConv2dCpu> deform_conv2d_kernels("deform_conv2d", kCpuEp);

}  // namespace ort
}  // namespace opforge
