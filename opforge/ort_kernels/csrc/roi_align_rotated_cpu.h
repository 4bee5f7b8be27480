// opforge's roi_align_rotated computation for ORT's CPU EP, shared by the kernels of
// every node form meaning mmcv's roi_align_rotated (opforge::roi_align_rotated,
// mmdeploy::MMCVRoIAlignRotated): the core (core/roi_align_rotated.h) on a
// channels-last copy of the map, parallel over output bins on ORT's intra-op pool.
// float16 / bfloat16 compute in float32 and round once (as the torch CPU kernel
// does). The checks, the rois' values among them, are RoiAlignRotatedKernel's
// (ort_common.h), before this runs.
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

// The CPU EP's part of RoiAlignRotatedKernel (ort_common.h): it computes with the rois
// the kernel checked, in the compute type (wide_rois).
struct RoiAlignRotatedCpu {
  using Io = HostIo;

  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const char* /*op*/, const core::RoiAlignRotatedParams& p, const T* input,
                  const T* /*rois*/, const compute_t<T>* wide_rois, int64_t samples, T* out) const {
    using F = compute_t<T>;
    const int64_t out_numel = p.rois * p.channels * p.pooled_h * p.pooled_w;
    // The map channels-last in F (one pass: transpose and widen).
    std::vector<F> x(static_cast<size_t>(p.batch * p.channels * p.map_size()));
    const auto* src = core_ptr(input);
    const int64_t items = core::nchw_to_nhwc_items(p.batch, p.channels);
    parallel_for(ctx, items, std::max<int64_t>(1, kRoiAlignConvertGrain / (core::kLayoutTile * p.map_size())),
                 [&](int64_t begin, int64_t end) {
                   core::nchw_to_nhwc(src, x.data(), p.channels, p.map_size(), begin, end,
                                      [](auto v) { return static_cast<F>(core::load(v)); });
                 });
    // ORT does not tell a kernel its pool's size: planned as for many threads (threads 0)
    const core::RoiAlignRotatedWork work = core::roi_align_rotated_work(p, 0);
    const int64_t grain = core::roi_align_rotated_forward_grain(p, work, samples);
    if constexpr (std::is_same_v<T, F>) {
      parallel_for(ctx, work.items, grain, [&](int64_t begin, int64_t end) {
        core::roi_align_rotated_forward(p, work, x.data(), wide_rois, out, begin, end);
      });
    } else {
      std::vector<float> y(static_cast<size_t>(out_numel));
      parallel_for(ctx, work.items, grain, [&](int64_t begin, int64_t end) {
        core::roi_align_rotated_forward(p, work, x.data(), wide_rois, y.data(), begin, end);
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
