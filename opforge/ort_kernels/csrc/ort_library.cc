// Entry point of libopforge_ort.so, loaded by
//   SessionOptions.register_custom_ops_library(opforge.ort_library_path())
// It exports exactly one symbol, RegisterCustomOps (see exports.map), and
// links neither libonnxruntime nor libtorch: the running ORT hands us its API.
#include "ort_common.h"
#include "ort_registration.h"

namespace {

using opforge::ort::LiteOpPtr;

// Kernel definitions, created once and never freed: ORT keeps raw pointers to
// them in every session that registered this library.
const std::vector<LiteOpPtr>& all_ops() {
  static const std::vector<LiteOpPtr> ops = [] {
    std::vector<LiteOpPtr> v;
    opforge::ort::append_my_add_ops(v);  // one line per op
    opforge::ort::append_deform_conv2d_ops(v);
#ifdef OPFORGE_WITH_CUDA
    // Same names and domain, CUDA execution provider: ORT places each node on
    // the EP it assigned and picks the matching kernel.
    opforge::ort::append_my_add_cuda_ops(v);
    opforge::ort::append_deform_conv2d_cuda_ops(v);
#endif
    return v;
  }();
  return ops;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  OrtStatus* error = nullptr;
  if (!opforge::ort::init_api(api_base, "libopforge_ort", &error)) return error;
  try {
    Ort::CustomOpDomain domain{opforge::ort::kDomain};
    for (const LiteOpPtr& op : all_ops()) domain.Add(op.get());
    Ort::UnownedSessionOptions(options).Add(domain);
    opforge::ort::keep_domain_alive(std::move(domain));
  } catch (const Ort::Exception& e) {
    return Ort::Status(e).release();
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
  return nullptr;
}
