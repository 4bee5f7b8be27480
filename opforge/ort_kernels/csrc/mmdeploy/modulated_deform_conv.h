// mmdeploy::MMCVModulatedDeformConv2d (also mmcv::MMCVModulatedDeformConv2d), the
// node mmdeploy's symbolic for mmcv's ModulatedDeformConv2dFunction writes:
//   inputs  (input [N,C,H,W], offset [N,2*dg*kh*kw,oh,ow], mask [N,dg*kh*kw,oh,ow],
//            weight [O,C/groups,kh,kw], bias [O] optional: absent without bias)
//   attrs   stride, padding, dilation: INTS [h, w] or INT (both are written),
//           groups, deform_groups: INT
//   output  [N,O,oh,ow], the input's type
// The offset/mask layout is torchvision's, and the result is torchvision's
// deform_conv2d, computed by the same code as opforge::deform_conv2d's ORT kernels
// (deform_conv2d_cpu.h, cuda/deform_conv2d_cuda.h). mmdeploy's own kernel is wrong
// for groups > 1 with deform_groups > 1 and when (C/groups)*kh*kw is not a multiple
// of 8, and crashes on INT attributes; these are not.
//
// The node's attributes, shape check and kernel, shared by the CPU and CUDA EP kernels.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/deform_conv2d.h"
#include "mmdeploy_ops.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

// opforge's messages name opforge::deform_conv2d and its offset_groups; say what this node calls them.
inline std::string in_mmdeploy_words(std::string msg) {
  const auto replace_all = [&msg](const std::string& from, const std::string& to) {
    for (size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at + to.size()))
      msg.replace(at, from.size(), to);
  };
  replace_all("opforge::deform_conv2d", kModulatedDeformConvOp);
  replace_all("offset_groups", "deform_groups");
  return msg;
}

struct ModulatedDeformConvAttrs {
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, deform_groups;
  bool with_bias;

  explicit ModulatedDeformConvAttrs(const OrtKernelInfo* info) {
    const Ort::ConstKernelInfo ki(info);
    const size_t inputs = ki.GetInputCount();
    if (inputs != 4 && inputs != 5)
      node_error(std::string(kModulatedDeformConvOp) + ": the node has " + std::to_string(inputs) +
                 " input(s); expected 4 or 5 (input, offset, mask, weight[, bias])");
    const char* names[] = {"input", "offset", "mask", "weight"};
    for (size_t i = 0; i < 4; ++i)
      if (ki.GetInputName(i).empty())
        node_error(std::string(kModulatedDeformConvOp) + ": input " + std::to_string(i) + " (" + names[i] +
                   ") is omitted (\"\"), but it is required");
    // An omitted ("") bias would reach ORT's lite-op glue as a null value, which it
    // dereferences before the kernel runs; mmdeploy writes 4 inputs for "no bias".
    if (inputs == 5 && ki.GetInputName(4).empty())
      node_error(std::string(kModulatedDeformConvOp) +
                 ": input 4 (bias) is omitted (\"\"); a node without bias has 4 inputs, as mmdeploy writes it");
    with_bias = inputs == 5;
    if (ki.GetOutputCount() != 1)
      node_error(std::string(kModulatedDeformConvOp) + ": the node has " + std::to_string(ki.GetOutputCount()) + " outputs; expected 1");
    pair_attribute(info, kModulatedDeformConvOp, "stride", 1, &stride_h, &stride_w);
    pair_attribute(info, kModulatedDeformConvOp, "padding", 0, &pad_h, &pad_w);
    pair_attribute(info, kModulatedDeformConvOp, "dilation", 1, &dil_h, &dil_w);
    groups = int_attribute_or(info, kModulatedDeformConvOp, "groups", 1);
    deform_groups = int_attribute_or(info, kModulatedDeformConvOp, "deform_groups", 1);
    if (std::string err =
            core::deform_conv2d_check_attrs(stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, deform_groups);
        !err.empty())
      node_error(in_mmdeploy_words(err));
  }
};

// The node's tensors checked (core::deform_conv2d_check with the node's attributes) into p;
// *bias_data: the bias, or null for a node without one (torchvision's zeros of [O] then).
template <typename T>
Ort::Status check_modulated_deform_conv_inputs(const ModulatedDeformConvAttrs& a, const Ort::Custom::Tensor<T>& input,
                                               const Ort::Custom::Tensor<T>& offset, const Ort::Custom::Tensor<T>& mask,
                                               const Ort::Custom::Tensor<T>& weight,
                                               std::optional<const Ort::Custom::Tensor<T>*> bias,
                                               core::DeformConv2dParams& p, const T** bias_data) {
  const bool has_bias = a.with_bias && bias.has_value() && *bias != nullptr;
  const std::vector<int64_t> xs = input.Shape(), os = offset.Shape(), ms = mask.Shape(), ws = weight.Shape();
  const std::vector<int64_t> bs = has_bias ? (*bias)->Shape() : std::vector<int64_t>{ws.empty() ? 0 : ws[0]};
  *bias_data = has_bias ? (*bias)->Data() : nullptr;
  const std::string err = core::deform_conv2d_check(
      xs.data(), static_cast<int>(xs.size()), ws.data(), static_cast<int>(ws.size()), os.data(),
      static_cast<int>(os.size()), ms.data(), static_cast<int>(ms.size()), bs.data(), static_cast<int>(bs.size()),
      a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups, a.deform_groups, /*use_mask=*/true, p);
  return err.empty() ? Ort::Status(nullptr) : invalid_argument(in_mmdeploy_words(err));
}

// The node's kernel: ep.run(ctx, op, p, input, weight, offset, mask, bias or null, out) is
// opforge::deform_conv2d's computation for the EP (DeformConv2dCpu in deform_conv2d_cpu.h,
// DeformConv2dCuda in cuda/deform_conv2d_cuda.h); a node without bias adds zeros.
template <typename T, typename Ep>
struct ModulatedDeformConvKernel : ModulatedDeformConvAttrs {
  Ep ep;

  ModulatedDeformConvKernel(const OrtApi*, const OrtKernelInfo* info) : ModulatedDeformConvAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& offset,
                      const Ort::Custom::Tensor<T>& mask, const Ort::Custom::Tensor<T>& weight,
                      std::optional<const Ort::Custom::Tensor<T>*> bias, Ort::Custom::Tensor<T>& output) {
    core::DeformConv2dParams p;
    const T* bias_data = nullptr;
    if (Ort::Status bad = check_modulated_deform_conv_inputs(*this, input, offset, mask, weight, bias, p, &bias_data);
        !bad.IsOK())
      return bad;
    T* out = output.Allocate({p.batch, p.out_channels, p.out_h, p.out_w});
    return ep.run(ctx, kModulatedDeformConvOp, p, input.Data(), weight.Data(), offset.Data(), mask.Data(), bias_data,
                  out);
  }
};

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
