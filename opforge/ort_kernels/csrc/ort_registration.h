// What every opforge ORT library's RegisterCustomOps does besides adding its
// kernels: negotiate the API version, and keep domain objects alive.
#pragma once

#ifndef ORT_API_MANUAL_INIT
#define ORT_API_MANUAL_INIT
#endif
#include <onnxruntime_cxx_api.h>

#include <mutex>
#include <string>
#include <vector>

namespace opforge {
namespace ort {

// Initialises the C++ API with the version these headers were built for. The C
// API is append-only, so any newer runtime serves it; an older one returns null,
// and then *error is set to a status naming the needed version (built with API
// version 1, which every runtime has).
inline bool init_api(const OrtApiBase* api_base, const char* library, OrtStatus** error) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string msg = std::string("opforge: ") + library + " needs ONNX Runtime API version " +
                            std::to_string(ORT_API_VERSION) + " (onnxruntime >= 1." + std::to_string(ORT_API_VERSION) +
                            "), but this runtime is onnxruntime " + api_base->GetVersionString() + "; upgrade onnxruntime";
    *error = v1 ? v1->CreateStatus(ORT_NOT_IMPLEMENTED, msg.c_str()) : nullptr;
    return false;
  }
  Ort::InitApi(api);
  return true;
}

// Each registration makes a domain object that must outlive the sessions using
// it; keep them all until the library is unloaded.
inline void keep_domain_alive(Ort::CustomOpDomain&& domain) {
  static std::vector<Ort::CustomOpDomain> domains;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  domains.push_back(std::move(domain));
}

}  // namespace ort
}  // namespace opforge
