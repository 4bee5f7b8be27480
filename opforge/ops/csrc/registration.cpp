// The opforge operator library (torch.ops.opforge.*). Each op's source file
// declares its schema (TORCH_LIBRARY_FRAGMENT) next to its kernels; the fake
// (meta) impls, autograd and export rules come from each op's spec in
// opforge/ops/*.py (opforge.register_op, which also checks the schemas, and that
// a CUDA build has a CUDA kernel for every op; opforge.check_library checks that
// every op declared here has a spec).
#include <torch/library.h>

#include "opforge/torch_module.h"

// The namespace itself: owning it here makes a second library that claims
// "opforge" fail loudly at load.
TORCH_LIBRARY(opforge, m) {}

// `import opforge._C` loads this shared object, which runs the registrations.
// opforge.BUILT_WITH_CUDA reads its WITH_CUDA flag.
OPFORGE_TORCH_EXTENSION_MODULE(_C)
