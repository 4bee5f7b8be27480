// ORT kernel of opforge::ms_deform_attn (domain "opforge", version 1): inputs
// (value, spatial_shapes, level_start_index, sampling_locations,
// attention_weights), int attribute im2col_step, output "output" — the torch
// schema one to one. Same core as the torch extension (core/ms_deform_attn.h),
// parallel over queries on ORT's intra-op pool. float16 / bfloat16 compute in
// float32 and round once (as the torch CPU kernel does).
//
// The index tensors are run-time data from the model or its caller: their
// shapes and values are checked (MsDeformAttnKernel in ort_common.h) before
// anything is read with them; a bad one is an INVALID_ARGUMENT status.
#include <type_traits>
#include <vector>

#include "core/ms_deform_attn.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

int64_t check_ms_deform_attn_node(const OrtKernelInfo* info) {
  constexpr const char* op = "opforge::ms_deform_attn";
  check_node_arity(info, op,
                   {"value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"});
  const int64_t im2col_step = node_attribute<int64_t>(info, op, "im2col_step");
  if (std::string err = core::ms_deform_attn_check_im2col_step(im2col_step); !err.empty()) node_error(err);
  return im2col_step;
}

Ort::Status ms_deform_attn_shapes(const std::vector<int64_t>& value, const std::vector<int64_t>& spatial_shapes,
                                  const std::vector<int64_t>& level_start_index,
                                  const std::vector<int64_t>& sampling_locations,
                                  const std::vector<int64_t>& attention_weights, int64_t im2col_step,
                                  core::MsDeformAttnParams& p) {
  const auto rank = [](const std::vector<int64_t>& dims) { return static_cast<int>(dims.size()); };
  const std::string err = core::ms_deform_attn_check(
      value.data(), rank(value), spatial_shapes.data(), rank(spatial_shapes), level_start_index.data(),
      rank(level_start_index), sampling_locations.data(), rank(sampling_locations), attention_weights.data(),
      rank(attention_weights), im2col_step, p);
  return err.empty() ? Ort::Status(nullptr) : invalid_argument(err);
}

Ort::Status ms_deform_attn_output_shape(const core::MsDeformAttnParams& p, const int64_t* spatial_shapes,
                                        const int64_t* level_start_index, std::vector<int64_t>& shape) {
  if (std::string err = core::ms_deform_attn_check_levels(p, spatial_shapes, level_start_index); !err.empty())
    return invalid_argument(err);
  int64_t out_dims[3];
  core::ms_deform_attn_output_dims(p, out_dims);
  shape.assign(out_dims, out_dims + 3);
  return Ort::Status(nullptr);
}

namespace {

// The CPU EP's part: the core over the queries on ORT's intra-op pool; the index
// tensors are host memory, read in place.
struct MsDeformAttnCpu {
  using Io = HostIo;

  template <typename T>
  Ort::Status run(OrtKernelContext* ctx, const core::MsDeformAttnParams& p, const T* value, const int64_t* shapes,
                  const int64_t* starts, const T* locations, const T* weights, T* out) const {
    const int64_t items = p.batch * p.queries;
    const int64_t grain = core::ms_deform_attn_forward_grain(p);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      parallel_for(ctx, items, grain, [&](int64_t begin, int64_t end) {
        core::ms_deform_attn_forward(p, value, shapes, starts, locations, weights, out, begin, end);
      });
    } else {
      // value [N, S, M, D], sampling_locations [N, Lq, M, L, P, 2], attention_weights [N, Lq, M, L, P].
      const int64_t samples = items * p.heads * p.points_per_head();
      const std::vector<float> v = widened(ctx, value, static_cast<size_t>(p.batch * p.value_len * p.value_row()));
      const std::vector<float> loc = widened(ctx, locations, static_cast<size_t>(2 * samples));
      const std::vector<float> attn = widened(ctx, weights, static_cast<size_t>(samples));
      std::vector<float> y(static_cast<size_t>(items * p.value_row()));
      parallel_for(ctx, items, grain, [&](int64_t begin, int64_t end) {
        core::ms_deform_attn_forward(p, v.data(), shapes, starts, loc.data(), attn.data(), y.data(), begin, end);
      });
      auto* dst = core_ptr(out);
      using Core = std::remove_pointer_t<decltype(dst)>;
      parallel_for(ctx, static_cast<int64_t>(y.size()), kWidenGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) dst[i] = core::store<Core>(y[i]);
      });
    }
    return Ort::Status(nullptr);
  }
};

}  // namespace

const FloatKernels<MsDeformAttnKernel, MsDeformAttnCpu> ms_deform_attn_kernels("ms_deform_attn", kCpuEp);

}  // namespace ort
}  // namespace opforge
