// What every ORT custom-op library built on opforge does in RegisterCustomOps
// besides adding its kernels: negotiate the API version, register its domain
// at most once per SessionOptions, keep domain objects alive, and hand its
// kernels the session config entries they declare (ort_op.h: ConfigKey).
//
//   #include "opforge/ort_library.h"
//   OPFORGE_ORT_LIBRARY("libmy_ops_ort", "com.example")   // once per library
//
// defines the library's only exported symbol, RegisterCustomOps, serving every
// kernel registered with OPFORGE_ORT_KERNELS in the ONNX domain "com.example".
#pragma once

#include "opforge/ort_op.h"  // ORT's C++ API, with ORT_API_MANUAL_INIT

#include <exception>
#include <map>
#include <memory>
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

// ---- kernels with session config entries (ort_op.h: ConfigKey, config_entry) ----------

// The declared entries set in `options`, each checked; false with *error set when one is bad.
inline bool read_kernel_config(OrtSessionOptions* options, KernelConfig* config, std::string* error) {
  Ort::UnownedSessionOptions session_options(options);
  for (const ConfigKeyInfo& k : config_keys()) {
    if (!session_options.HasConfigEntry(k.key.c_str())) continue;
    std::string value = session_options.GetConfigEntry(k.key.c_str());
    if (k.check != nullptr)
      if (std::string bad = k.check(k.key, value); !bad.empty()) {
        *error = bad;
        return false;
      }
    (*config)[k.key] = std::move(value);
  }
  return true;
}

// Makes `config` the one config_entry sees on this thread while a kernel is created.
class CreatingKernelWith {
 public:
  explicit CreatingKernelWith(const KernelConfig* config) : saved_(creating_config()) { creating_config() = config; }
  ~CreatingKernelWith() { creating_config() = saved_; }
  CreatingKernelWith(const CreatingKernelWith&) = delete;
  CreatingKernelWith& operator=(const CreatingKernelWith&) = delete;

 private:
  const KernelConfig* saved_;
};

// A kernel definition as the sessions of one configuration see it: the library's own (`inner`,
// this library's or its companion's) with every callback forwarded, kernel creation run with
// the configuration visible (CreatingKernelWith). Callbacks that take no definition pointer
// (compute, destroy, in-place and alias maps) are the inner one's, copied.
struct ConfiguredKernel : OrtCustomOp {
  const OrtCustomOp* inner;
  const KernelConfig* config;  // lives as long as the process (configured_kernels)

  ConfiguredKernel(const OrtCustomOp* op, const KernelConfig* c) : OrtCustomOp(*op), inner(op), config(c) {
    GetName = [](const OrtCustomOp* o) { return in(o)->GetName(in(o)); };
    GetExecutionProviderType = [](const OrtCustomOp* o) { return in(o)->GetExecutionProviderType(in(o)); };
    GetInputType = [](const OrtCustomOp* o, size_t i) { return in(o)->GetInputType(in(o), i); };
    GetInputTypeCount = [](const OrtCustomOp* o) { return in(o)->GetInputTypeCount(in(o)); };
    GetOutputType = [](const OrtCustomOp* o, size_t i) { return in(o)->GetOutputType(in(o), i); };
    GetOutputTypeCount = [](const OrtCustomOp* o) { return in(o)->GetOutputTypeCount(in(o)); };
    if (op->GetInputCharacteristic)
      GetInputCharacteristic = [](const OrtCustomOp* o, size_t i) { return in(o)->GetInputCharacteristic(in(o), i); };
    if (op->GetOutputCharacteristic)
      GetOutputCharacteristic = [](const OrtCustomOp* o, size_t i) {
        return in(o)->GetOutputCharacteristic(in(o), i);
      };
    if (op->GetInputMemoryType)
      GetInputMemoryType = [](const OrtCustomOp* o, size_t i) { return in(o)->GetInputMemoryType(in(o), i); };
    if (op->GetVariadicInputMinArity)
      GetVariadicInputMinArity = [](const OrtCustomOp* o) { return in(o)->GetVariadicInputMinArity(in(o)); };
    if (op->GetVariadicInputHomogeneity)
      GetVariadicInputHomogeneity = [](const OrtCustomOp* o) { return in(o)->GetVariadicInputHomogeneity(in(o)); };
    if (op->GetVariadicOutputMinArity)
      GetVariadicOutputMinArity = [](const OrtCustomOp* o) { return in(o)->GetVariadicOutputMinArity(in(o)); };
    if (op->GetVariadicOutputHomogeneity)
      GetVariadicOutputHomogeneity = [](const OrtCustomOp* o) { return in(o)->GetVariadicOutputHomogeneity(in(o)); };
    if (op->InferOutputShapeFn)
      InferOutputShapeFn = [](const OrtCustomOp* o, OrtShapeInferContext* ctx) {
        return in(o)->InferOutputShapeFn(in(o), ctx);
      };
    if (op->GetStartVersion) GetStartVersion = [](const OrtCustomOp* o) { return in(o)->GetStartVersion(in(o)); };
    if (op->GetEndVersion) GetEndVersion = [](const OrtCustomOp* o) { return in(o)->GetEndVersion(in(o)); };
    if (op->CreateKernel)
      CreateKernel = [](const OrtCustomOp* o, const OrtApi* api, const OrtKernelInfo* info) -> void* {
        const CreatingKernelWith scope(static_cast<const ConfiguredKernel*>(o)->config);
        return in(o)->CreateKernel(in(o), api, info);
      };
    if (op->CreateKernelV2)
      CreateKernelV2 = [](const OrtCustomOp* o, const OrtApi* api, const OrtKernelInfo* info,
                          void** kernel) -> OrtStatusPtr {
        const CreatingKernelWith scope(static_cast<const ConfiguredKernel*>(o)->config);
        return in(o)->CreateKernelV2(in(o), api, info, kernel);
      };
  }

 private:
  static const OrtCustomOp* in(const OrtCustomOp* o) { return static_cast<const ConfiguredKernel*>(o)->inner; }
};

// `kernels` (the library's, a process-wide list) as the sessions of `config` see them: one set of
// definitions per distinct configuration, made once and never freed (ORT keeps pointers to them
// in every session of those options), so re-registering with the same values adds none.
inline const std::vector<const OrtCustomOp*>& configured_kernels(const std::vector<const OrtCustomOp*>& kernels,
                                                                 const KernelConfig& config) {
  struct Set {
    KernelConfig config;
    std::vector<std::unique_ptr<ConfiguredKernel>> owned;
    std::vector<const OrtCustomOp*> ops;
  };
  static std::mutex mutex;
  static std::map<KernelConfig, std::unique_ptr<Set>> sets;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Set>& set = sets[config];
  if (!set) {
    set = std::make_unique<Set>();
    set->config = config;
    for (const OrtCustomOp* op : kernels) {
      set->owned.push_back(std::make_unique<ConfiguredKernel>(op, &set->config));
      set->ops.push_back(set->owned.back().get());
    }
  }
  return set->ops;
}

// The definitions to register in `options`: `kernels` themselves when no declared entry is set
// there, else their configured set; null with *error set when an entry is bad.
inline const std::vector<const OrtCustomOp*>* kernels_for_options(OrtSessionOptions* options,
                                                                   const std::vector<const OrtCustomOp*>& kernels,
                                                                   std::string* error) {
  KernelConfig config;
  if (!read_kernel_config(options, &config, error)) return nullptr;
  return config.empty() ? &kernels : &configured_kernels(kernels, config);
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
// companion of another layout is refused by name. V3: it also takes the library proper's
// ConfigLookup (ort_op.h), through which its kernels read their session config entries.
#define OPFORGE_ORT_CUDA_PART_ENTRY OpforgeOrtCudaKernelsV3
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
      const OrtApiBase* api_base, const char* build_id, ::opforge::ort::ConfigLookup config_lookup,      \
      const OrtCustomOp* const** ops, size_t* count) {                                                    \
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
      if (config_lookup != nullptr) ::opforge::ort::config_lookup() = config_lookup;                      \
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
// kernels (or their stand-ins), recorded in the session config; configured with the
// session config entries its kernels declare (kernels_for_options).
inline OrtStatus* register_library(OrtSessionOptions* options, const OrtApiBase* api_base, const char* library,
                                   const std::vector<std::string>& domains, DomainFilter serves = nullptr) {
  OrtStatus* error = nullptr;
  if (!init_api(api_base, library, &error)) return error;
  try {
    std::string bad_entry;
#ifdef OPFORGE_ORT_CUDA_COMPANION
    std::string cuda_status;
    const auto* kernels = kernels_for_options(options, with_cuda_companion(library, api_base, &cuda_status), &bad_entry);
    if (kernels == nullptr) return Ort::Status(bad_entry.c_str(), ORT_INVALID_ARGUMENT).release();
    if (OrtStatus* failed = add_domains(options, library, domains, serves, *kernels)) return failed;
    Ort::UnownedSessionOptions session_options(options);
    const std::string cuda_key = cuda_kernels_config_key(library);
    if (!session_options.HasConfigEntry(cuda_key.c_str()))
      session_options.AddConfigEntry(cuda_key.c_str(), cuda_status.c_str());
    return nullptr;
#else
    static const std::vector<const OrtCustomOp*> all_kernels = [] {
      auto all = kernels_for(true), other = kernels_for(false);
      all.insert(all.end(), other.begin(), other.end());
      return all;
    }();
    const auto* kernels = kernels_for_options(options, all_kernels, &bad_entry);
    if (kernels == nullptr) return Ort::Status(bad_entry.c_str(), ORT_INVALID_ARGUMENT).release();
    return add_domains(options, library, domains, serves, *kernels);
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
