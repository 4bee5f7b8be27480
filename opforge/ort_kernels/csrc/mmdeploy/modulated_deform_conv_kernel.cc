// mmdeploy::MMCVModulatedDeformConv2d (also mmcv::MMCVModulatedDeformConv2d), the
// node mmdeploy's symbolic for mmcv's ModulatedDeformConv2dFunction writes:
//   inputs  (input [N,C,H,W], offset [N,2*dg*kh*kw,oh,ow], mask [N,dg*kh*kw,oh,ow],
//            weight [O,C/groups,kh,kw], bias [O] optional: absent without bias)
//   attrs   stride, padding, dilation: INTS [h, w] or INT (both are written),
//           groups, deform_groups: INT
//   output  [N,O,oh,ow], the input's type
// The offset/mask layout is torchvision's, and the result is torchvision's
// deform_conv2d, computed by the same code as opforge::deform_conv2d's ORT kernel
// (deform_conv2d_cpu.h). mmdeploy's own kernel is wrong for groups > 1 with
// deform_groups > 1 and when (C/groups)*kh*kw is not a multiple of 8, and crashes
// on INT attributes; this one is not.
#include <string>
#include <vector>

#include "deform_conv2d_cpu.h"
#include "mmdeploy_ops.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

constexpr const char* kOp = "mmdeploy::MMCVModulatedDeformConv2d";

// opforge's messages name opforge::deform_conv2d and its offset_groups; say what this node calls them.
std::string in_mmdeploy_words(std::string msg) {
  const auto replace_all = [&msg](const std::string& from, const std::string& to) {
    for (size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at + to.size()))
      msg.replace(at, from.size(), to);
  };
  replace_all("opforge::deform_conv2d", kOp);
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
      node_error(std::string(kOp) + ": the node has " + std::to_string(inputs) +
                 " input(s); expected 4 or 5 (input, offset, mask, weight[, bias])");
    const char* names[] = {"input", "offset", "mask", "weight"};
    for (size_t i = 0; i < 4; ++i)
      if (ki.GetInputName(i).empty())
        node_error(std::string(kOp) + ": input " + std::to_string(i) + " (" + names[i] +
                   ") is omitted (\"\"), but it is required");
    with_bias = inputs == 5 && !ki.GetInputName(4).empty();
    if (ki.GetOutputCount() != 1)
      node_error(std::string(kOp) + ": the node has " + std::to_string(ki.GetOutputCount()) + " outputs; expected 1");
    pair_attribute(info, kOp, "stride", 1, &stride_h, &stride_w);
    pair_attribute(info, kOp, "padding", 0, &pad_h, &pad_w);
    pair_attribute(info, kOp, "dilation", 1, &dil_h, &dil_w);
    groups = int_attribute_or(info, kOp, "groups", 1);
    deform_groups = int_attribute_or(info, kOp, "deform_groups", 1);
    if (std::string err =
            core::deform_conv2d_check_attrs(stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, deform_groups);
        !err.empty())
      node_error(in_mmdeploy_words(err));
  }
};

template <typename T>
struct ModulatedDeformConvKernel : ModulatedDeformConvAttrs {
  ModulatedDeformConvKernel(const OrtApi*, const OrtKernelInfo* info) : ModulatedDeformConvAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& offset,
                      const Ort::Custom::Tensor<T>& mask, const Ort::Custom::Tensor<T>& weight,
                      std::optional<const Ort::Custom::Tensor<T>*> bias, Ort::Custom::Tensor<T>& output) {
    const std::vector<int64_t> xs = input.Shape(), ws = weight.Shape(), os = offset.Shape(), ms = mask.Shape();
    // Without bias, zeros of [O] (torchvision's "no bias"); O is checked against them below.
    const int64_t out_channels = ws.empty() ? 0 : ws[0];
    const bool has_bias = with_bias && bias.has_value() && *bias != nullptr;
    const std::vector<int64_t> bs = has_bias ? (*bias)->Shape() : std::vector<int64_t>{out_channels};
    core::DeformConv2dParams p;
    const std::string err = core::deform_conv2d_check(
        xs.data(), static_cast<int>(xs.size()), ws.data(), static_cast<int>(ws.size()), os.data(),
        static_cast<int>(os.size()), ms.data(), static_cast<int>(ms.size()), bs.data(), static_cast<int>(bs.size()),
        stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, deform_groups, /*use_mask=*/true, p);
    if (!err.empty()) return invalid_argument(in_mmdeploy_words(err));
    T* out = output.Allocate({p.batch, p.out_channels, p.out_h, p.out_w});
    std::vector<T> zeros;
    if (!has_bias) zeros.assign(static_cast<size_t>(p.out_channels), T{});
    deform_conv2d_run<T>(ctx, p, input.Data(), weight.Data(), offset.Data(), mask.Data(),
                         has_bias ? (*bias)->Data() : zeros.data(), out);
    return Ort::Status(nullptr);
  }
};

}  // namespace

static void append_modulated_deform_conv_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<ModulatedDeformConvKernel<T>>(kModulatedDeformConv, kCpuEp));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_modulated_deform_conv_ops);
