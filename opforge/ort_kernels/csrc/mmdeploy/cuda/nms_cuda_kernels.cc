// The CUDA EP kernels of mmdeploy::NMSRotated and mmdeploy::NMSMatch (node forms and
// kernels: nms.h). Boxes, scores and thresholds are copied to the host (B boxes per
// image: small synchronous copies), the rows are computed there by the CPU kernels'
// code, and written to the device output (CudaHostIo). Detection heads keep their
// tensors on the GPU this way, with no placement change in the graph around the node.
#include <vector>

#include "cuda/cuda_host_io.h"
#include "mmdeploy/nms.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

static void append_nms_cuda_ops(std::vector<LiteOpPtr>& ops) { append_nms_kernels<CudaHostIo>(ops, kCudaEp); }

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_nms_cuda_ops);
