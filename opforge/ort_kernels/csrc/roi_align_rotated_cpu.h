// opforge's roi_align_rotated computation for ORT's CPU EP, shared by the kernels of
// every node form meaning mmcv's roi_align_rotated (opforge::roi_align_rotated,
// mmdeploy::MMCVRoIAlignRotated): the core (core/roi_align_rotated.h) on a
// channels-last copy of the map, parallel over rois on ORT's intra-op pool.
// float16 / bfloat16 compute in float32 and round once (as the torch CPU kernel
// does). The rois are run-time data: their values are checked
// (core::roi_align_rotated_check_rois) before anything is read with them.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/roi_align_rotated.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

// Elements per task of the layout / type conversions.
inline constexpr int64_t kRoiAlignConvertGrain = int64_t(1) << 16;

// The kernel for storage type T; OpName::value is the node form's name in errors.
template <typename T, typename OpName>
struct RoiAlignRotatedCpuKernel {
  RoiAlignRotatedAttrs attrs;

  RoiAlignRotatedCpuKernel(const OrtApi*, const OrtKernelInfo* info) : attrs(info, OpName::value) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input,
                      const Ort::Custom::Tensor<T>& rois, Ort::Custom::Tensor<T>& output) {
    core::RoiAlignRotatedParams p;
    if (Ort::Status bad = attrs.check(input.Shape(), rois.Shape(), p); !bad.IsOK()) return bad;
    using F = compute_t<T>;
    const std::vector<F> wide_rois = widened(rois.Data(), static_cast<size_t>(6 * p.rois));
    const F* r = wide_rois.data();
    if (std::string err = core::roi_align_rotated_check_rois<F>(p, r); !err.empty())
      return invalid_argument(attrs.in_op_words(err));
    int64_t dims[4];
    core::roi_align_rotated_output_dims(p, dims);
    T* out = output.Allocate({dims[0], dims[1], dims[2], dims[3]});
    const int64_t out_numel = dims[0] * dims[1] * dims[2] * dims[3];
    if (out_numel == 0) return Ort::Status(nullptr);

    // The map channels-last in F (one pass: transpose and widen).
    std::vector<F> x(static_cast<size_t>(p.batch * p.channels * p.map_size()));
    const auto* src = core_ptr(input.Data());
    const int64_t items = core::nchw_to_nhwc_items(p.batch, p.channels);
    parallel_for(ctx, items, std::max<int64_t>(1, kRoiAlignConvertGrain / (core::kLayoutTile * p.map_size())),
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
      parallel_for(ctx, out_numel, kRoiAlignConvertGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = core::store<Core>(y[i]);
      });
    }
    return Ort::Status(nullptr);
  }
};

}  // namespace ort
}  // namespace opforge
