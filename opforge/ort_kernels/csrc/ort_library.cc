// Entry point of libopforge_ort.so, loaded by
//   SessionOptions.register_custom_ops_library(opforge.ort_library_path())
// It exports exactly one symbol, RegisterCustomOps (see exports.map), and
// links neither libonnxruntime nor libtorch: the running ORT hands us its API.
#include <mutex>

#include "ort_common.h"

namespace {

using opforge::ort::LiteOpPtr;

// Kernel definitions, created once and never freed: ORT keeps raw pointers to
// them in every session that registered this library.
const std::vector<LiteOpPtr>& all_ops() {
  static const std::vector<LiteOpPtr> ops = [] {
    std::vector<LiteOpPtr> v;
    opforge::ort::append_my_add_ops(v);  // one line per op
    opforge::ort::append_deform_conv2d_ops(v);
    return v;
  }();
  return ops;
}

// Each registration makes a domain object that must outlive the sessions using
// it; keep them all until the library is unloaded.
void keep_domain_alive(Ort::CustomOpDomain&& domain) {
  static std::vector<Ort::CustomOpDomain> domains;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  domains.push_back(std::move(domain));
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  // Ask for the API version we were compiled against. The C API is
  // append-only, so any newer runtime serves it; an older one returns null.
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    const OrtApi* v1 = api_base->GetApi(1);  // every runtime has version 1, enough to report the error
    const std::string msg = std::string("opforge: libopforge_ort needs ONNX Runtime API version ") +
                            std::to_string(ORT_API_VERSION) + " (onnxruntime >= 1." +
                            std::to_string(ORT_API_VERSION) + "), but this runtime is onnxruntime " +
                            api_base->GetVersionString() + "; upgrade onnxruntime";
    return v1 ? v1->CreateStatus(ORT_NOT_IMPLEMENTED, msg.c_str()) : nullptr;
  }
  Ort::InitApi(api);
  try {
    Ort::CustomOpDomain domain{opforge::ort::kDomain};
    for (const LiteOpPtr& op : all_ops()) domain.Add(op.get());
    Ort::UnownedSessionOptions(options).Add(domain);
    keep_domain_alive(std::move(domain));
  } catch (const Ort::Exception& e) {
    return Ort::Status(e).release();
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
  return nullptr;
}
