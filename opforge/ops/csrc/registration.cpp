// The opforge operator library (torch.ops.opforge.*), libopforge_torch.so, on LibTorch's stable
// ABI. Each op's source file declares its schema (STABLE_TORCH_LIBRARY_FRAGMENT) next to its
// kernels and its shape rule (OPFORGE_SHAPE_RULE); the fake (meta) impls, autograd and export
// rules come from each op's spec in opforge/ops/*.py (opforge.register_op, which also checks the
// schemas, and that a CUDA build has a CUDA kernel for every op; opforge.check_library checks that
// every op declared here has a spec). Loading the library runs the registrations: Python loads it
// with torch.ops.load_library, a C++ program with dlopen (opforge.torch_library_path()).
#include "opforge/torch_library.h"

// The namespace itself: owning it here makes a second library that claims
// "opforge" fail loudly at load.
STABLE_TORCH_LIBRARY(opforge, m) {}

OPFORGE_TORCH_LIBRARY_ENTRY_POINTS
