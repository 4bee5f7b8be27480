// ORT kernel of opforge::ms_deform_attn (domain "opforge", version 1): inputs
// (value, spatial_shapes, level_start_index, sampling_locations,
// attention_weights), int attribute im2col_step, output "output" — the torch
// schema one to one. Same core as the torch extension (core/ms_deform_attn.h),
// parallel over queries on ORT's intra-op pool. float16 / bfloat16 compute in
// float32 and round once (as the torch CPU kernel does).
//
// The index tensors are run-time data from the model or its caller: their
// shapes and values are checked (core::ms_deform_attn_check_levels) before
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

namespace {

template <typename T>
struct MsDeformAttnKernel {
  int64_t im2col_step;

  MsDeformAttnKernel(const OrtApi*, const OrtKernelInfo* info) : im2col_step(check_ms_deform_attn_node(info)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& value,
                      const Ort::Custom::Tensor<int64_t>& spatial_shapes,
                      const Ort::Custom::Tensor<int64_t>& level_start_index,
                      const Ort::Custom::Tensor<T>& sampling_locations, const Ort::Custom::Tensor<T>& attention_weights,
                      Ort::Custom::Tensor<T>& output) {
    core::MsDeformAttnParams p;
    if (Ort::Status bad = ms_deform_attn_shapes(value.Shape(), spatial_shapes.Shape(), level_start_index.Shape(),
                                                sampling_locations.Shape(), attention_weights.Shape(), im2col_step, p);
        !bad.IsOK())
      return bad;
    // Shapes are known good: spatial_shapes holds 2*L and level_start_index L values (L >= 1).
    const int64_t* shapes = spatial_shapes.Data();
    const int64_t* starts = level_start_index.Data();
    if (std::string err = core::ms_deform_attn_check_levels(p, shapes, starts); !err.empty())
      return invalid_argument(err);
    int64_t out_dims[3];
    core::ms_deform_attn_output_dims(p, out_dims);
    T* out = output.Allocate({out_dims[0], out_dims[1], out_dims[2]});
    const int64_t items = p.batch * p.queries;
    if (items * out_dims[2] == 0) return Ort::Status(nullptr);
    const int64_t grain = core::ms_deform_attn_forward_grain(p);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T *v = value.Data(), *loc = sampling_locations.Data(), *attn = attention_weights.Data();
      parallel_for(ctx, items, grain, [&](int64_t begin, int64_t end) {
        core::ms_deform_attn_forward(p, v, shapes, starts, loc, attn, out, begin, end);
      });
    } else {
      const auto f = [&](const Ort::Custom::Tensor<T>& t) { return widened(ctx, t.Data(), t.NumberOfElement()); };
      const std::vector<float> v = f(value), loc = f(sampling_locations), attn = f(attention_weights);
      std::vector<float> y(static_cast<size_t>(items * out_dims[2]));
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

static void append_ms_deform_attn_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<MsDeformAttnKernel<T>>("ms_deform_attn", kCpuEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_ms_deform_attn_ops);
