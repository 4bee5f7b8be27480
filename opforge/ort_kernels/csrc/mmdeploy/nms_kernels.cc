// The CPU EP kernels of mmdeploy::NMSRotated and mmdeploy::NMSMatch (node forms and
// kernels: nms.h): their tensors are host memory.
#include <vector>

#include "nms.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

static void append_nms_ops(std::vector<LiteOpPtr>& ops) { append_nms_kernels<HostIo>(ops, kCpuEp); }

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_KERNELS(opforge::ort::mmdeploy::append_nms_ops);
