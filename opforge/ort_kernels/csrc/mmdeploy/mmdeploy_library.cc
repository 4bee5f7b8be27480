// Entry point of libopforge_mmdeploy.so, a drop-in for mmdeploy 1.3.1's
// libmmdeploy_onnxruntime_ops.so: the ONNX files mmdeploy exported run in a plain
// onnxruntime >= 1.21 with
//   SessionOptions.register_custom_ops_library(opforge.mmdeploy_library_path())
// and nothing else: no second ONNX Runtime in the process (mmdeploy's library
// loads its bundled libonnxruntime 1.15), no torch. Its kernels have mmdeploy's
// node forms (mmdeploy_ops.h) and run opforge's compute cores.
//
// mmdeploy serves two domains: "mmdeploy" (every op) and "mmcv", where only
// MMCVModulatedDeformConv2d lives (the form mmcv's own exporter wrote). One
// kernel object serves both domains.
#include <cstring>
#include <string>

#include "mmdeploy_ops.h"
#include "opforge/ort_library.h"

namespace opforge {
namespace ort {
namespace mmdeploy {

// Unused in the CUDA companion's build: its entry point hands every kernel to the
// library proper, which sorts them into domains with this.
[[maybe_unused]] static bool serves(const std::string& domain, const char* op_name) {
  if (domain == kMmdeployDomain) return true;
  return domain == kMmcvDomain && std::strcmp(op_name, kModulatedDeformConv) == 0;
}

}  // namespace mmdeploy
}  // namespace ort
}  // namespace opforge

OPFORGE_ORT_LIBRARY_DOMAINS("libopforge_mmdeploy", opforge::ort::mmdeploy::serves,
                            {opforge::ort::mmdeploy::kMmdeployDomain, opforge::ort::mmdeploy::kMmcvDomain})
