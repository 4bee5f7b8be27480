// ORT CUDA-EP kernels of opforge::nms_rotated and opforge::batched_nms_rotated:
// the CPU kernels' node and shape checks (NmsRotatedKernel in ort_common.h); the
// inputs are copied to the host (CudaHostIo), checked, ordered and turned into
// float64 geometry there (N boxes: small synchronous copies), the O(N^2) IoUs run
// on the GPU as the suppression mask (the same CUDA kernel as torch's CUDA path)
// in row chunks of bounded memory, and each chunk is reduced greedily on the host.
// The kept indices are written to the device output.
#include <algorithm>
#include <vector>

#include "core/nms_rotated.h"
#include "cuda/cuda_host_io.h"
#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {
namespace {

// The CUDA EP's part: the suppression mask's IoUs on the GPU in row chunks of bounded
// memory, each chunk reduced greedily on the host.
struct NmsRotatedCuda {
  using Io = CudaHostIo;

  Ort::Status suppress(OrtKernelContext* ctx, const core::NmsRotatedParams& p, const core::NmsRotatedPlan& plan,
                       std::vector<int64_t>& keep) const {
    if (p.boxes == 0) return Ort::Status(nullptr);
    const std::string op_name = core::nms_rotated_op_name(p.batched);
    const char* op = op_name.c_str();
    const cudaStream_t stream = compute_stream(ctx);
    const size_t n = static_cast<size_t>(p.boxes);
    const int64_t words = core::nms_rotated_words(p.boxes), chunk = core::nms_rotated_chunk_rows(p.boxes);
    StreamScratch geometry(n * sizeof(core::RotatedBoxGeometry), stream);
    StreamScratch device_labels(p.batched ? n * sizeof(int64_t) : 1, stream);
    StreamScratch mask(static_cast<size_t>(chunk * words) * sizeof(uint64_t), stream);
    for (const StreamScratch* s : {&geometry, &device_labels, &mask})
      if (Ort::Status st = cuda_status(s->status(), op, "scratch allocation (cudaMallocAsync)"); !st.IsOK()) return st;
    cudaError_t ce = cudaMemcpyAsync(geometry.get(), plan.geometry.data(), n * sizeof(core::RotatedBoxGeometry),
                                     cudaMemcpyHostToDevice, stream);
    if (ce == cudaSuccess && p.batched)
      ce = cudaMemcpyAsync(device_labels.get(), plan.labels.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice,
                           stream);
    if (Ort::Status s = cuda_status(ce, op, "copying the boxes' geometry to the device"); !s.IsOK()) return s;
    std::vector<uint64_t> removed(static_cast<size_t>(words), 0), host_mask;
    for (int64_t row = 0; row < p.boxes; row += chunk) {
      const int64_t rows = std::min(chunk, p.boxes - row);
      ce = core::cuda::nms_rotated_mask(p.boxes, row, rows,
                                        static_cast<const core::RotatedBoxGeometry*>(geometry.get()), plan.extreme,
                                        p.batched ? static_cast<const int64_t*>(device_labels.get()) : nullptr,
                                        static_cast<double>(p.iou_threshold), static_cast<uint64_t*>(mask.get()),
                                        stream);
      if (ce == cudaSuccess) {
        host_mask.resize(static_cast<size_t>(rows * words));
        ce = cudaMemcpyAsync(host_mask.data(), mask.get(), host_mask.size() * sizeof(uint64_t),
                             cudaMemcpyDeviceToHost, stream);
      }
      if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
      if (Ort::Status s = cuda_status(ce, op, "suppression mask"); !s.IsOK()) return s;
      core::nms_rotated_reduce_mask(host_mask.data(), row, row + rows, words, plan.order, removed, keep);
    }
    return Ort::Status(nullptr);
  }
};

}  // namespace

static void append_nms_rotated_cuda_ops(std::vector<LiteOpPtr>& ops) {
  append_nms_rotated_kernels<NmsRotatedCuda>(ops, kCudaEp);
}

}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::append_nms_rotated_cuda_ops);
