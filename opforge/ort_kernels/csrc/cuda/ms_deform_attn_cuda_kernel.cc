// ORT CUDA-EP kernel of opforge::ms_deform_attn: the CPU kernel's node and
// shape checks, then the same CUDA kernel as torch's CUDA path on ORT's
// compute stream. The index tensors live on the device here; they are copied
// to the host and checked (core::ms_deform_attn_check_levels) before the
// kernel indexes value with them: one small synchronous copy per run,
// correctness over speed.
#include <vector>

#include "core/ms_deform_attn.h"
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {
namespace {

constexpr const char* kOp = "opforge::ms_deform_attn";

template <typename T>
struct MsDeformAttnCudaKernel {
  int64_t im2col_step;

  MsDeformAttnCudaKernel(const OrtApi*, const OrtKernelInfo* info) : im2col_step(check_ms_deform_attn_node(info)) {}

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

    const InputDeviceGuard device(ctx);
    const cudaStream_t stream = compute_stream(ctx);
    // Host copies of the level geometry (the CUDA EP hands every input of a
    // default-memory custom op in device memory), ordered after whatever
    // produced it on the stream.
    std::vector<int64_t> shapes_host(static_cast<size_t>(2 * p.levels)), starts_host(static_cast<size_t>(p.levels));
    cudaError_t ce = cudaMemcpyAsync(shapes_host.data(), spatial_shapes.Data(), shapes_host.size() * sizeof(int64_t),
                                     cudaMemcpyDeviceToHost, stream);
    if (ce == cudaSuccess)
      ce = cudaMemcpyAsync(starts_host.data(), level_start_index.Data(), starts_host.size() * sizeof(int64_t),
                           cudaMemcpyDeviceToHost, stream);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
    if (Ort::Status s = cuda_status(ce, kOp, "copying spatial_shapes / level_start_index to the host"); !s.IsOK())
      return s;
    if (std::string err = core::ms_deform_attn_check_levels(p, shapes_host.data(), starts_host.data()); !err.empty())
      return invalid_argument(err);

    int64_t out_dims[3];
    core::ms_deform_attn_output_dims(p, out_dims);
    T* out = output.Allocate({out_dims[0], out_dims[1], out_dims[2]});
    if (p.batch * p.queries * out_dims[2] == 0) return Ort::Status(nullptr);
    return cuda_status(core::cuda::ms_deform_attn_forward(gpu_dtype<T>(), p, value.Data(), spatial_shapes.Data(),
                                                          level_start_index.Data(), sampling_locations.Data(),
                                                          attention_weights.Data(), out, stream),
                       kOp, "CUDA kernel launch");
  }
};

}  // namespace

static void append_ms_deform_attn_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<MsDeformAttnCudaKernel<T>>("ms_deform_attn", kCudaEp));
  });
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_ms_deform_attn_cuda_ops);
