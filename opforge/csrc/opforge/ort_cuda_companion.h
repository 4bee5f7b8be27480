// The CUDA part of an opforge-built ORT library, loaded on demand.
//
// A CUDA build makes two files (opforge.build.OrtLibrary): lib<name>.so with the CPU
// kernels, which needs nothing but libc/libstdc++ and so loads on any box, and the
// companion lib<name>_cuda.so beside it with the CUDA EP kernels, which needs the CUDA
// runtime and cuBLAS. ONNX Runtime itself ships its CUDA kernels the same way (a
// provider library loaded only when a session asks for the CUDA EP).
//
// RegisterCustomOps (ort_library.h) loads the companion when the running ORT has
// a CUDA execution provider, i.e. only where its kernels could ever run, so a CPU
// onnxruntime never maps the CUDA libraries. OPFORGE_ORT_CUDA=always|never
// overrides that decision (tests, or a GPU box that should stay on the CPU).
// When the companion cannot be loaded, each CUDA EP kernel is replaced by a stub
// whose creation fails with the loader's reason, so a session placed on the CUDA
// EP fails at creation saying what is missing, instead of running on the CPU
// unnoticed. What happened is written to the session config entry
// "opforge.cuda_kernels.<library>" (opforge.ort_session and `opforge info` read it).
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef ORT_API_MANUAL_INIT
#define ORT_API_MANUAL_INIT
#endif
#include <onnxruntime_cxx_api.h>

#define OPFORGE_ORT_STRINGIFY_INNER(x) #x
#define OPFORGE_ORT_STRINGIFY(x) OPFORGE_ORT_STRINGIFY_INNER(x)

namespace opforge {
namespace ort {

// The companion's only exported symbol: hands over its CUDA EP kernels (definitions
// that live as long as the process, like the library's own).
// The library passes its build id (OPFORGE_ORT_BUILD_ID); a companion of another build refuses.
// It also passes its own ConfigLookup (ort_op.h): the library proper creates every kernel, the
// companion's too, with the session config entries of their registration set on its side.
using CudaPartEntry = OrtStatus*(const OrtApiBase*, const char*, ConfigLookup, const OrtCustomOp* const**, size_t*);

inline std::string cuda_kernels_config_key(const std::string& library) { return "opforge.cuda_kernels." + library; }

// A CUDA EP stand-in for a CPU kernel whose CUDA twin could not be loaded: the same
// name, domain and types (every schema callback forwards to the CPU kernel), but
// creating it fails with `reason`. Only ORT's CUDA EP ever creates it.
struct UnavailableCudaKernel : OrtCustomOp {
  const OrtCustomOp* cpu;
  std::string reason;

  UnavailableCudaKernel(const OrtCustomOp* cpu_kernel, std::string why) : OrtCustomOp(*cpu_kernel), cpu(cpu_kernel), reason(std::move(why)) {
    GetName = [](const OrtCustomOp* op) { return inner(op)->GetName(inner(op)); };
    GetExecutionProviderType = [](const OrtCustomOp*) { return "CUDAExecutionProvider"; };
    GetInputType = [](const OrtCustomOp* op, size_t i) { return inner(op)->GetInputType(inner(op), i); };
    GetInputTypeCount = [](const OrtCustomOp* op) { return inner(op)->GetInputTypeCount(inner(op)); };
    GetOutputType = [](const OrtCustomOp* op, size_t i) { return inner(op)->GetOutputType(inner(op), i); };
    GetOutputTypeCount = [](const OrtCustomOp* op) { return inner(op)->GetOutputTypeCount(inner(op)); };
    GetInputCharacteristic = [](const OrtCustomOp* op, size_t i) { return inner(op)->GetInputCharacteristic(inner(op), i); };
    GetOutputCharacteristic = [](const OrtCustomOp* op, size_t i) {
      return inner(op)->GetOutputCharacteristic(inner(op), i);
    };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    GetVariadicInputMinArity = [](const OrtCustomOp* op) { return inner(op)->GetVariadicInputMinArity(inner(op)); };
    GetVariadicInputHomogeneity = [](const OrtCustomOp* op) { return inner(op)->GetVariadicInputHomogeneity(inner(op)); };
    GetVariadicOutputMinArity = [](const OrtCustomOp* op) { return inner(op)->GetVariadicOutputMinArity(inner(op)); };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp* op) {
      return inner(op)->GetVariadicOutputHomogeneity(inner(op));
    };
    GetStartVersion = [](const OrtCustomOp* op) { return inner(op)->GetStartVersion(inner(op)); };
    GetEndVersion = [](const OrtCustomOp* op) { return inner(op)->GetEndVersion(inner(op)); };
    InferOutputShapeFn = nullptr;  // shapes come from the model; the kernel never runs
    CreateKernel = [](const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*) -> void* { return nullptr; };
    CreateKernelV2 = [](const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo*, void** kernel) -> OrtStatusPtr {
      *kernel = nullptr;
      return Ort::Status(static_cast<const UnavailableCudaKernel*>(op)->reason.c_str(), ORT_EP_FAIL).release();
    };
    KernelCompute = [](void*, OrtKernelContext*) {};
    KernelComputeV2 = [](void*, OrtKernelContext*) -> OrtStatusPtr {
      return Ort::Status("opforge: unavailable CUDA kernel", ORT_EP_FAIL).release();
    };
    KernelDestroy = [](void*) {};
  }

 private:
  static const OrtCustomOp* inner(const OrtCustomOp* op) { return static_cast<const UnavailableCudaKernel*>(op)->cpu; }
};

// What loading the companion gave: its kernels, or why there are none.
struct CudaCompanion {
  std::vector<const OrtCustomOp*> kernels;
  std::string status;  // the session config value: "loaded: ...", "not loaded: ...", "unavailable: ..."
  bool failed = false;
};

inline bool runtime_has_cuda_ep() {
  char** names = nullptr;
  int count = 0;
  if (OrtStatus* st = Ort::GetApi().GetAvailableProviders(&names, &count)) {
    Ort::GetApi().ReleaseStatus(st);
    return false;
  }
  bool found = false;
  for (int i = 0; i < count; ++i) found = found || std::strcmp(names[i], "CUDAExecutionProvider") == 0;
  Ort::GetApi().ReleaseAvailableProviders(names, count);
  return found;
}

// lib<name>.so -> lib<name>_cuda.so, in the directory this library was loaded from.
inline std::string companion_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&companion_path), &info) == 0 || info.dli_fname == nullptr) return {};
  std::string path = info.dli_fname;
  const size_t so = path.rfind(".so");
  return so == std::string::npos ? path + "_cuda.so" : path.substr(0, so) + "_cuda" + path.substr(so);
}

inline CudaCompanion load_cuda_companion(const char* library, const OrtApiBase* api_base) {
  CudaCompanion out;
  const char* env = std::getenv("OPFORGE_ORT_CUDA");
  const std::string mode = env ? env : "auto";
  if (mode == "never" || mode == "0") {
    out.status = "not loaded: OPFORGE_ORT_CUDA=" + mode;
    return out;
  }
  if (mode != "always" && mode != "1" && !runtime_has_cuda_ep()) {
    out.status = std::string("not loaded: this onnxruntime ") + api_base->GetVersionString() +
                 " has no CUDAExecutionProvider";
    return out;
  }
  const std::string path = companion_path();
  std::string error;
  // RTLD_LOCAL: the companion's copies of the ORT C++ wrappers stay its own.
  void* handle = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    error = path.empty() ? "cannot find this library's own path" : (why ? why : ("cannot load " + path));
  } else if (auto* entry = reinterpret_cast<CudaPartEntry*>(
                 dlsym(handle, OPFORGE_ORT_STRINGIFY(OPFORGE_ORT_CUDA_PART_ENTRY)))) {
    const OrtCustomOp* const* ops = nullptr;
    size_t count = 0;
    if (OrtStatus* st = entry(api_base, OPFORGE_ORT_BUILD_ID, own_config_lookup, &ops, &count)) {
      error = Ort::Status(st).GetErrorMessage();
    } else {
      out.kernels.assign(ops, ops + count);
      out.status = "loaded: " + std::to_string(count) + " CUDA EP kernels from " + path;
    }
  } else {
    error = path + " has no " OPFORGE_ORT_STRINGIFY(OPFORGE_ORT_CUDA_PART_ENTRY) " (a companion of another opforge version?)";
  }
  // The handle is never closed: ORT keeps pointers to the kernels for the process's life.
  if (!error.empty()) {
    out.failed = true;
    out.status = std::string("unavailable: ") + library + "'s CUDA kernels could not be loaded: " + error;
  }
  return out;
}

// This library's CPU kernels plus the CUDA EP kernels of its companion (loaded once
// per process, on the first registration), or stand-ins naming why they are missing.
inline const std::vector<const OrtCustomOp*>& with_cuda_companion(const char* library, const OrtApiBase* api_base,
                                                                  std::string* status) {
  static const CudaCompanion companion = load_cuda_companion(library, api_base);
  static const std::vector<const OrtCustomOp*> kernels = [&] {
    std::vector<const OrtCustomOp*> all = kernels_for(true);
    if (!companion.failed) {
      all.insert(all.end(), companion.kernels.begin(), companion.kernels.end());
      return all;
    }
    const std::string reason = "opforge: " + companion.status.substr(std::strlen("unavailable: ")) +
                               ". This session places the node on CUDAExecutionProvider; install the CUDA runtime "
                               "and cuBLAS the library was built with, or run the model on CPUExecutionProvider";
    static std::vector<UnavailableCudaKernel> stand_ins;  // never freed: ORT keeps the pointers
    const size_t cpu_count = all.size();
    stand_ins.reserve(cpu_count);
    for (size_t i = 0; i < cpu_count; ++i) {
      stand_ins.emplace_back(all[i], reason);
      all.push_back(&stand_ins.back());
    }
    return all;
  }();
  *status = companion.status;
  return kernels;
}

}  // namespace ort
}  // namespace opforge
