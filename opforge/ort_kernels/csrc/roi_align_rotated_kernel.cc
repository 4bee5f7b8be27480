// ORT kernel of opforge::roi_align_rotated (domain "opforge", version 1):
// inputs (input, rois), attributes output_height, output_width (int),
// spatial_scale (float), sampling_ratio (int), aligned, clockwise (int 0/1),
// output "output" — the torch schema one to one. Same core as the torch
// extension (core/roi_align_rotated.h), parallel over rois on ORT's intra-op
// pool. float16 / bfloat16 compute in float32 and round once (as the torch CPU
// kernel does).
//
// The rois are run-time data from the model or its caller: their values are
// checked (core::roi_align_rotated_check_rois) before anything is read with
// them; a bad one is an INVALID_ARGUMENT status.
#include <type_traits>
#include <vector>

#include "core/roi_align_rotated.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

namespace {
constexpr const char* kOp = "opforge::roi_align_rotated";

bool flag_attribute(const OrtKernelInfo* info, const char* name) {
  const int64_t v = node_attribute<int64_t>(info, kOp, name);
  if (v != 0 && v != 1)
    node_error(std::string(kOp) + ": attribute " + name + " must be 0 or 1, got " + std::to_string(v));
  return v != 0;
}
}  // namespace

RoiAlignRotatedAttrs::RoiAlignRotatedAttrs(const OrtKernelInfo* info) {
  check_node_arity(info, kOp, {"input", "rois"});
  output_height = node_attribute<int64_t>(info, kOp, "output_height");
  output_width = node_attribute<int64_t>(info, kOp, "output_width");
  spatial_scale = node_attribute<float>(info, kOp, "spatial_scale");
  sampling_ratio = node_attribute<int64_t>(info, kOp, "sampling_ratio");
  aligned = flag_attribute(info, "aligned");
  clockwise = flag_attribute(info, "clockwise");
  if (std::string err =
          core::roi_align_rotated_check_attrs(output_height, output_width, spatial_scale, sampling_ratio);
      !err.empty())
    node_error(err);
}

Ort::Status RoiAlignRotatedAttrs::check(const std::vector<int64_t>& input, const std::vector<int64_t>& rois,
                                        core::RoiAlignRotatedParams& p) const {
  const std::string err = core::roi_align_rotated_check(
      input.data(), static_cast<int>(input.size()), rois.data(), static_cast<int>(rois.size()), output_height,
      output_width, spatial_scale, sampling_ratio, aligned, clockwise, p);
  return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
}

namespace {

// Elements per task of the layout / type conversions.
constexpr int64_t kConvertGrain = int64_t(1) << 16;

template <typename T>
struct RoiAlignRotatedKernel {
  RoiAlignRotatedAttrs attrs;

  RoiAlignRotatedKernel(const OrtApi*, const OrtKernelInfo* info) : attrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input,
                      const Ort::Custom::Tensor<T>& rois, Ort::Custom::Tensor<T>& output) {
    core::RoiAlignRotatedParams p;
    if (Ort::Status bad = attrs.check(input.Shape(), rois.Shape(), p); !bad.IsOK()) return bad;
    using F = compute_t<T>;
    const std::vector<F> wide_rois = widened(rois.Data(), static_cast<size_t>(6 * p.rois));
    const F* r = wide_rois.data();
    if (std::string err = core::roi_align_rotated_check_rois<F>(p, r); !err.empty()) return invalid_argument(err);
    int64_t dims[4];
    core::roi_align_rotated_output_dims(p, dims);
    T* out = output.Allocate({dims[0], dims[1], dims[2], dims[3]});
    const int64_t out_numel = dims[0] * dims[1] * dims[2] * dims[3];
    if (out_numel == 0) return Ort::Status(nullptr);

    // The map channels-last in F (one pass: transpose and widen).
    std::vector<F> x(static_cast<size_t>(p.batch * p.channels * p.map_size()));
    const auto* src = core_ptr(input.Data());
    const int64_t items = core::nchw_to_nhwc_items(p.batch, p.channels);
    parallel_for(ctx, items, std::max<int64_t>(1, kConvertGrain / (core::kLayoutTile * p.map_size())),
                 [&](int64_t begin, int64_t end) {
                   core::nchw_to_nhwc(src, x.data(), p.channels, p.map_size(), begin, end,
                                      [](auto v) { return static_cast<F>(core::load(v)); });
                 });
    const int64_t grain = core::roi_align_rotated_forward_grain(p);
    if constexpr (std::is_same_v<T, F>) {
      parallel_for(ctx, p.rois, grain, [&](int64_t begin, int64_t end) {
        core::roi_align_rotated_forward(p, x.data(), r, out, begin, end);
      });
    } else {
      std::vector<float> y(static_cast<size_t>(out_numel));
      parallel_for(ctx, p.rois, grain, [&](int64_t begin, int64_t end) {
        core::roi_align_rotated_forward(p, x.data(), r, y.data(), begin, end);
      });
      auto* dst = core_ptr(out);
      using Core = std::remove_pointer_t<decltype(dst)>;
      parallel_for(ctx, out_numel, kConvertGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = core::store<Core>(y[i]);
      });
    }
    return Ort::Status(nullptr);
  }
};

}  // namespace

static void append_roi_align_rotated_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<RoiAlignRotatedKernel<T>>("roi_align_rotated", kCpuEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_roi_align_rotated_ops);
