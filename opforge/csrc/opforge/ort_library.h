// What every ORT custom-op library built on opforge does in RegisterCustomOps
// besides adding its kernels: negotiate the API version, register its domain
// at most once per SessionOptions, and keep domain objects alive.
//
//   #include "opforge/ort_library.h"
//   OPFORGE_ORT_LIBRARY("libmy_ops_ort", "com.example")   // once per library
//
// defines the library's only exported symbol, RegisterCustomOps, serving every
// kernel registered with OPFORGE_ORT_KERNELS in the ONNX domain "com.example".
#pragma once

#include "opforge/ort_op.h"  // ORT's C++ API, with ORT_API_MANUAL_INIT

#include <exception>
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

// The session-config key marking "domain D is registered in these options, by
// library L". ORT refuses a custom domain added twice to one SessionOptions
// ("Domain already set in registry", at session creation, too late to undo),
// so registering a library again is made a no-op, and a second library for
// the same domain a clear error. opforge.ort_session reads the same key.
inline std::string domain_config_key(const std::string& domain) { return "opforge.custom_domain." + domain; }

// Whether `domain` may be added to `options` by `library`: *already is true when this
// library added it before (registering a library again is a no-op); an error status
// when another library did (see domain_config_key).
inline OrtStatus* check_domain_free(OrtSessionOptions* options, const char* library, const char* domain,
                                    bool* already) {
  Ort::UnownedSessionOptions session_options(options);
  const std::string key = domain_config_key(domain);
  *already = false;
  if (!session_options.HasConfigEntry(key.c_str())) return nullptr;
  const std::string owner = session_options.GetConfigEntry(key.c_str());
  if (owner == library) {
    *already = true;
    return nullptr;
  }
  const std::string msg = std::string("opforge: ") + library + " serves the ONNX domain '" + domain +
                          "', which these SessionOptions already have from " + owner +
                          "; ONNX Runtime allows one custom-op library per domain";
  return Ort::Status(msg.c_str(), ORT_INVALID_ARGUMENT).release();
}

// Adds `ops` to `options` as the custom domain `domain` (see domain_config_key).
template <typename OpRange>
OrtStatus* add_domain(OrtSessionOptions* options, const char* library, const char* domain, const OpRange& ops) {
  try {
    bool already = false;
    if (OrtStatus* taken = check_domain_free(options, library, domain, &already)) return taken;
    if (already) return nullptr;
    Ort::UnownedSessionOptions session_options(options);
    Ort::CustomOpDomain custom_domain{domain};
    for (const auto& op : ops) custom_domain.Add(&*op);  // OrtCustomOp pointers or owning pointers
    session_options.Add(custom_domain);
    session_options.AddConfigEntry(domain_config_key(domain).c_str(), library);
    keep_domain_alive(std::move(custom_domain));
  } catch (const Ort::Exception& e) {
    return Ort::Status(e).release();
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
  return nullptr;
}

// Which kernels a library serves in which of its ONNX domains: serves(domain, op_name).
// A library with one domain serves every kernel there (nullptr).
using DomainFilter = bool (*)(const std::string& domain, const char* op_name);

// Adds `ops` to `options` in each of `domains` (only the ops `serves` picks for a domain).
// Every domain is checked before any is added, so a refusal leaves the options as they were.
inline OrtStatus* add_domains(OrtSessionOptions* options, const char* library, const std::vector<std::string>& domains,
                              DomainFilter serves, const std::vector<const OrtCustomOp*>& ops) {
  try {
    for (const std::string& domain : domains) {
      bool already = false;
      if (OrtStatus* taken = check_domain_free(options, library, domain.c_str(), &already)) return taken;
    }
    for (const std::string& domain : domains) {
      std::vector<const OrtCustomOp*> picked;
      for (const OrtCustomOp* op : ops)
        if (serves == nullptr || serves(domain, op->GetName(op))) picked.push_back(op);
      if (OrtStatus* failed = add_domain(options, library, domain.c_str(), picked)) return failed;
    }
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
  return nullptr;
}

inline bool is_cpu_kernel(const OrtCustomOp* op) {
  const char* ep = op->GetExecutionProviderType(op);
  return ep == nullptr || std::string(ep) == kCpuEp;
}

// The kernels registered in this library (OPFORGE_ORT_KERNELS) as ORT sees them;
// `cpu` selects the CPU kernels or all the others.
inline std::vector<const OrtCustomOp*> kernels_for(bool cpu) {
  std::vector<const OrtCustomOp*> out;
  for (const auto& op : registered_kernels())
    if (is_cpu_kernel(&*op) == cpu) out.push_back(&*op);
  return out;
}

}  // namespace ort
}  // namespace opforge

// The companion's exported entry (see ort_cuda_companion.h); versioned, so a stale
// companion of another layout is refused by name.
#define OPFORGE_ORT_CUDA_PART_ENTRY OpforgeOrtCudaKernelsV2
#if defined(OPFORGE_ORT_CUDA_COMPANION) || defined(OPFORGE_ORT_CUDA_PART)
// OPFORGE_ORT_BUILD_ID: one value for a library and the companion of the same build
// (opforge.build.OrtLibrary writes this header for both), so a companion left from
// another build is refused instead of run with this library's kernels.
#include "opforge_ort_build_id.h"
#endif
#ifdef OPFORGE_ORT_CUDA_COMPANION
#include "opforge/ort_cuda_companion.h"
#endif

// Defines the library's entry point for kernels registered with OPFORGE_ORT_KERNELS,
// all of them in the ONNX domain `domain`. The build (opforge.build.OrtLibrary)
// compiles a CUDA build's library twice, so one file serves every box:
//  * the library proper (OPFORGE_ORT_CUDA_COMPANION): CPU kernels only, no CUDA
//    dependency; RegisterCustomOps adds the companion's CUDA EP kernels when it loads
//    (see ort_cuda_companion.h);
//  * the companion lib<name>_cuda.so (OPFORGE_ORT_CUDA_PART): every source with
//    OPFORGE_WITH_CUDA, exporting only its CUDA EP kernels (OPFORGE_ORT_CUDA_PART_ENTRY);
//  * neither (a CPU-only build): RegisterCustomOps with every kernel.
#if defined(OPFORGE_ORT_CUDA_PART)
#define OPFORGE_ORT_LIBRARY(library, domain)                                                              \
  extern "C" __attribute__((visibility("default"))) OrtStatus* OPFORGE_ORT_CUDA_PART_ENTRY(               \
      const OrtApiBase* api_base, const char* build_id, const OrtCustomOp* const** ops, size_t* count) {  \
    OrtStatus* opforge_error = nullptr;                                                                   \
    if (!::opforge::ort::init_api(api_base, library "_cuda", &opforge_error)) return opforge_error;      \
    try {                                                                                                 \
      if (std::string(build_id) != OPFORGE_ORT_BUILD_ID)                                                  \
        return Ort::Status((std::string("the companion is from another build (build id ") +              \
                            OPFORGE_ORT_BUILD_ID + ", the library's " + build_id +                        \
                            "): copy the library and its _cuda companion from one build, or rebuild")     \
                               .c_str(),                                                                  \
                           ORT_FAIL)                                                                      \
            .release();                                                                                   \
      static const std::vector<const OrtCustomOp*> cuda_kernels = ::opforge::ort::kernels_for(false);     \
      *ops = cuda_kernels.data();                                                                         \
      *count = cuda_kernels.size();                                                                       \
      return nullptr;                                                                                     \
    } catch (const std::exception& e) {                                                                   \
      return Ort::Status(e).release();                                                                    \
    }                                                                                                     \
  }
// The companion hands over all its CUDA EP kernels; the library proper sorts them into domains.
#define OPFORGE_ORT_LIBRARY_DOMAINS(library, serves, ...) OPFORGE_ORT_LIBRARY(library, "")
#else
namespace opforge {
namespace ort {
// RegisterCustomOps' body: every kernel of this library in each of `domains` that
// `serves` gives it (see DomainFilter), and in a CUDA build the companion's CUDA EP
// kernels (or their stand-ins), recorded in the session config.
inline OrtStatus* register_library(OrtSessionOptions* options, const OrtApiBase* api_base, const char* library,
                                   const std::vector<std::string>& domains, DomainFilter serves = nullptr) {
  OrtStatus* error = nullptr;
  if (!init_api(api_base, library, &error)) return error;
  try {
#ifdef OPFORGE_ORT_CUDA_COMPANION
    std::string cuda_status;
    const auto& kernels = with_cuda_companion(library, api_base, &cuda_status);
    if (OrtStatus* failed = add_domains(options, library, domains, serves, kernels)) return failed;
    Ort::UnownedSessionOptions session_options(options);
    const std::string cuda_key = cuda_kernels_config_key(library);
    if (!session_options.HasConfigEntry(cuda_key.c_str()))
      session_options.AddConfigEntry(cuda_key.c_str(), cuda_status.c_str());
    return nullptr;
#else
    static const std::vector<const OrtCustomOp*> kernels = [] {
      auto all = kernels_for(true), other = kernels_for(false);
      all.insert(all.end(), other.begin(), other.end());
      return all;
    }();
    return add_domains(options, library, domains, serves, kernels);
#endif
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
}
}  // namespace ort
}  // namespace opforge

#define OPFORGE_ORT_LIBRARY(library, domain)                                                      \
  extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps( \
      OrtSessionOptions* options, const OrtApiBase* api_base) {                               \
    return ::opforge::ort::register_library(options, api_base, library, {domain});            \
  }

// The entry point of a library serving several ONNX domains: `domains` is a braced list
// of names, `serves` a DomainFilter choosing each domain's kernels.
#define OPFORGE_ORT_LIBRARY_DOMAINS(library, serves, ...)                                         \
  extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps( \
      OrtSessionOptions* options, const OrtApiBase* api_base) {                               \
    return ::opforge::ort::register_library(options, api_base, library, __VA_ARGS__, serves); \
  }
#endif
