// The CUDA EP kernels of mmdeploy::NMSRotated and mmdeploy::NMSMatch (node forms:
// nms.h). Boxes, scores and thresholds are copied to the host (B boxes per image:
// small synchronous copies), the rows are computed there by the CPU kernels' code,
// and written to the device output. Detection heads keep their tensors on the
// GPU this way, with no placement change in the graph around the node.
#include <string>
#include <vector>

#include "mmdeploy/nms.h"
#include "opforge/ort_cuda.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

namespace {

// The rows (width columns) as the node's int64 output on the device.
Ort::Status write_rows(const std::vector<int64_t>& rows, int64_t width, Ort::Custom::Tensor<int64_t>& output,
                       cudaStream_t stream, const char* op) {
  int64_t* out = output.Allocate({static_cast<int64_t>(rows.size()) / width, width});
  if (rows.empty()) return Ort::Status(nullptr);
  cudaError_t ce = cudaMemcpyAsync(out, rows.data(), rows.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream);
  if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);  // `rows` is freed on return
  return cuda_status(ce, op, "copying the rows to the device");
}

template <typename T>
struct NmsRotatedCudaKernel : NmsRotatedAttrs {
  NmsRotatedCudaKernel(const OrtApi*, const OrtKernelInfo* info) : NmsRotatedAttrs(info) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      Ort::Custom::Tensor<int64_t>& output) {
    core::NmsMulticlassParams p;
    if (Ort::Status bad = check(boxes.Shape(), scores.Shape(), p); !bad.IsOK()) return bad;
    const InputDeviceGuard device(ctx);
    const cudaStream_t stream = compute_stream(ctx);
    std::vector<T> host_boxes, host_scores;
    if (Ort::Status s = to_host(boxes.Data(), static_cast<size_t>(p.batch * p.boxes * 5), host_boxes, stream,
                                kNmsRotatedOp, "copying boxes to the host");
        !s.IsOK())
      return s;
    if (Ort::Status s = to_host(scores.Data(), static_cast<size_t>(p.pairs() * p.boxes), host_scores, stream,
                                kNmsRotatedOp, "copying scores to the host");
        !s.IsOK())
      return s;
    if (Ort::Status s = cuda_status(cudaStreamSynchronize(stream), kNmsRotatedOp, "synchronising the copies"); !s.IsOK())
      return s;
    std::vector<int64_t> rows;
    if (Ort::Status bad = nms_rotated_rows(ctx, p, host_boxes.data(), host_scores.data(), rows); !bad.IsOK())
      return bad;
    return write_rows(rows, 3, output, stream, kNmsRotatedOp);
  }
};

template <typename T, typename U>
struct NmsMatchCudaKernel {
  NmsMatchCudaKernel(const OrtApi*, const OrtKernelInfo* info) { check_nms_match_node(info); }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& boxes, const Ort::Custom::Tensor<T>& scores,
                      const Ort::Custom::Tensor<U>& iou_threshold, const Ort::Custom::Tensor<U>& score_threshold,
                      Ort::Custom::Tensor<int64_t>& output) {
    if (Ort::Status bad = check_nms_match_thresholds(iou_threshold, score_threshold); !bad.IsOK()) return bad;
    const InputDeviceGuard device(ctx);
    const cudaStream_t stream = compute_stream(ctx);
    std::vector<U> thresholds[2];
    if (Ort::Status s = to_host(iou_threshold.Data(), 1, thresholds[0], stream, kNmsMatchOp, "copying iou_threshold");
        !s.IsOK())
      return s;
    if (Ort::Status s = to_host(score_threshold.Data(), 1, thresholds[1], stream, kNmsMatchOp,
                                "copying score_threshold");
        !s.IsOK())
      return s;
    if (Ort::Status s = cuda_status(cudaStreamSynchronize(stream), kNmsMatchOp, "synchronising the copies"); !s.IsOK())
      return s;
    const double iou = core::load(*core_ptr(thresholds[0].data()));
    const double score = core::load(*core_ptr(thresholds[1].data()));
    core::NmsMulticlassParams p;
    if (Ort::Status bad = check_nms_match(boxes.Shape(), scores.Shape(), iou, score, p); !bad.IsOK()) return bad;
    std::vector<T> host_boxes, host_scores;
    if (Ort::Status s = to_host(boxes.Data(), static_cast<size_t>(p.batch * p.boxes * 4), host_boxes, stream,
                                kNmsMatchOp, "copying boxes to the host");
        !s.IsOK())
      return s;
    if (Ort::Status s = to_host(scores.Data(), static_cast<size_t>(p.pairs() * p.boxes), host_scores, stream,
                                kNmsMatchOp, "copying scores to the host");
        !s.IsOK())
      return s;
    if (Ort::Status s = cuda_status(cudaStreamSynchronize(stream), kNmsMatchOp, "synchronising the copies"); !s.IsOK())
      return s;
    std::vector<int64_t> rows;
    if (Ort::Status bad = nms_match_rows(ctx, p, host_boxes.data(), host_scores.data(), rows); !bad.IsOK()) return bad;
    return write_rows(rows, 4, output, stream, kNmsMatchOp);
  }
};

}  // namespace

static void append_nms_cuda_ops(std::vector<LiteOpPtr>& ops) {
  for_each_float_type([&](auto tag) {
    using T = decltype(tag);
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<NmsRotatedCudaKernel<T>>(kNmsRotated, kCudaEp));
  });
  append_nms_match_kernels<NmsMatchCudaKernel>(ops, kCudaEp);
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_nms_cuda_ops);
