// mmdeploy::grid_sampler, the node mmdeploy's symbolic for aten::grid_sampler writes
// (torch.nn.functional.grid_sample):
//   inputs  (input [N,C,H,W], grid [N,Ho,Wo,2] with (x, y) in [-1, 1])
//   attrs   interpolation_mode (0 bilinear, 1 nearest, 2 bicubic), padding_mode (0 zeros,
//           1 border, 2 reflection), align_corners (0/1): INT, torch's defaults 0, 0, 0
//           when absent
//   output  [N,C,Ho,Wo], the input's type
// torch's semantics for every mode combination (core/grid_sample.h, which also defines
// what NaN / inf grid values give), every float type (16-bit ones computed in float32
// and rounded once), parallel over (image, pixel block, channel block) on ORT's
// intra-op pool.
#include <string>
#include <type_traits>
#include <vector>

#include "grid_sampler.h"
#include "ort_common.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

// The CPU EP's part: the core over (image, pixel block, channel block) items on ORT's
// intra-op pool.
struct GridSamplerCpu {
  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const core::GridSampleParams& p, const T* input, const T* grid,
                  T* out) const {
    const core::GridSampleWork work = core::grid_sample_work(p);
    auto* dst = core_ptr(out);
    using Core = std::remove_pointer_t<decltype(dst)>;
    if constexpr (std::is_same_v<Core, float> || std::is_same_v<Core, double>) {
      parallel_for(ctx, work.items, 1, [&](int64_t begin, int64_t end) {
        core::grid_sample_forward<Core, Core>(p, work, input, grid, dst, begin, end);
      });
    } else {
      const std::vector<float> x = widened(ctx, input, static_cast<size_t>(p.batch * p.channels * p.in_plane()));
      const std::vector<float> g = widened(ctx, grid, static_cast<size_t>(p.batch * p.out_plane() * 2));
      parallel_for(ctx, work.items, 1, [&](int64_t begin, int64_t end) {
        core::grid_sample_forward<float, Core>(p, work, x.data(), g.data(), dst, begin, end);
      });
    }
    return Ort::Status(nullptr);
  }
};

}  // namespace

const FloatKernels<GridSamplerKernel, GridSamplerCpu> grid_sampler_kernels(kGridSampler, kCpuEp);

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge
