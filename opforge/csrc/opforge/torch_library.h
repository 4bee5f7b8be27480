// The entry points of a torch op library built on opforge's stable-ABI glue (opforge/torch_op.h).
// One source of the library writes OPFORGE_TORCH_LIBRARY_ENTRY_POINTS at namespace scope. It defines:
//   - opforge_shape_rule_v1: the library's shape rules (opforge/torch_shape_rule.h), which
//     opforge.ShapeRule runs for the fake impls;
//   - opforge_aoti_c_shims_v1: the AOTInductor C shims it defines (opforge/torch_c_shim.h);
//   - opforge_torch_library_info_v1: what the library is (its CUDA part: built, loaded or why not);
//   - opforge_budget_v1: its budgets (opforge/torch_budget.h), which opforge.set_budget changes;
//   - the loading of the CUDA part. A CUDA build puts the CUDA kernels in a companion beside the
//     library, lib<name>_cuda.so (opforge.build.TorchLibrary), which links the CUDA runtime. The
//     library loads it when it is itself loaded, and goes on without it where it cannot load (no
//     CUDA runtime of its major on a CPU-only machine): the CPU kernels never depend on CUDA.
// A plain shared library, no Python: torch.ops.load_library loads it in Python, dlopen in a C++
// program (an AOTInductor runner), with the same registrations.
#pragma once

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstring>
#include <string>

#include <torch/csrc/stable/library.h>

#include "opforge/torch_budget.h"
#include "opforge/torch_c_shim.h"
#include "opforge/torch_shape_rule.h"

namespace opforge {

struct CudaPartState {
  int state = 0;  // 0 not built (no companion file), 1 loaded, 2 could not load (reason)
  std::string reason;
};

inline CudaPartState& cuda_part_state() {
  static CudaPartState s;
  return s;
}

// Loads lib<name>_cuda.so from beside the library holding `anchor` (a symbol of the library).
inline void load_cuda_part(const void* anchor) {
  Dl_info info{};
  if (dladdr(anchor, &info) == 0 || info.dli_fname == nullptr) return;
  std::string path = info.dli_fname;
  const size_t dot = path.rfind(".so");
  if (dot == std::string::npos) return;
  path = path.substr(0, dot) + "_cuda.so";
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return;
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) != nullptr) {
    cuda_part_state().state = 1;
  } else {
    const char* err = dlerror();
    cuda_part_state().state = 2;
    cuda_part_state().reason = err ? err : "dlopen failed";
  }
}

}  // namespace opforge

#define OPFORGE_TORCH_LIBRARY_ENTRY_POINTS                                                                  \
  OPFORGE_SHAPE_RULE_ENTRY_POINT                                                                            \
  OPFORGE_AOTI_C_SHIMS_ENTRY_POINT                                                                          \
  OPFORGE_BUDGET_ENTRY_POINT                                                                                \
  extern "C" __attribute__((visibility("default"))) int opforge_torch_library_info_v1(char* reason,        \
                                                                                      size_t cap) {         \
    ::opforge::copy_message(::opforge::cuda_part_state().reason, reason, cap);                              \
    return ::opforge::cuda_part_state().state;                                                              \
  }                                                                                                         \
  namespace {                                                                                               \
  const int opforge_cuda_part_loaded = (::opforge::load_cuda_part(                                          \
                                            reinterpret_cast<const void*>(&opforge_torch_library_info_v1)), \
                                        0);                                                                 \
  }
