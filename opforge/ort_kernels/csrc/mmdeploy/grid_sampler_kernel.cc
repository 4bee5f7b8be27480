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

template <typename T>
struct GridSamplerKernel : GridSamplerAttrs {
  GridSamplerKernel(const OrtApi*, const OrtKernelInfo* info) : GridSamplerAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& input, const Ort::Custom::Tensor<T>& grid,
                      Ort::Custom::Tensor<T>& output) {
    core::GridSampleParams p;
    if (Ort::Status bad = check(input.Shape(), grid.Shape(), p); !bad.IsOK()) return bad;
    int64_t dims[4];
    core::grid_sample_output_dims(p, dims);
    T* out = output.Allocate({dims[0], dims[1], dims[2], dims[3]});
    const core::GridSampleWork work = core::grid_sample_work(p);
    if (work.items == 0) return Ort::Status(nullptr);  // empty output
    auto* dst = core_ptr(out);
    using Core = std::remove_pointer_t<decltype(dst)>;
    if constexpr (std::is_same_v<Core, float> || std::is_same_v<Core, double>) {
      const Core* x = input.Data();
      const Core* g = grid.Data();
      parallel_for(ctx, work.items, 1, [&](int64_t begin, int64_t end) {
        core::grid_sample_forward<Core, Core>(p, work, x, g, dst, begin, end);
      });
    } else {
      const std::vector<float> x = widened(ctx, input.Data(), static_cast<size_t>(p.batch * p.channels * p.in_plane()));
      const std::vector<float> g = widened(ctx, grid.Data(), static_cast<size_t>(p.batch * p.out_plane() * 2));
      parallel_for(ctx, work.items, 1, [&](int64_t begin, int64_t end) {
        core::grid_sample_forward<float, Core>(p, work, x.data(), g.data(), dst, begin, end);
      });
    }
    return Ort::Status(nullptr);
  }
};

}  // namespace

static void append_grid_sampler_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<GridSamplerKernel<T>>(kGridSampler, kCpuEp));
  });
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_grid_sampler_ops);
