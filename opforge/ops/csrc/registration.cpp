// The opforge operator library: every op's schema is declared here, once, in
// the `opforge` namespace (torch.ops.opforge.*). Kernels register themselves
// per dispatch key in their own files (my_add.cpp, cuda/*.cu); the fake
// (meta) impls and autograd live next to each op's spec in opforge/ops/*.py,
// which also checks at import that these schemas match the spec's.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(opforge, m) {
  m.def("my_add(Tensor a, Tensor b) -> Tensor");
}

// `import opforge._C` loads this shared object, which runs the registrations
// above. The module itself is empty: every entry point is a torch op.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "opforge torch operator library", -1, nullptr};
  return PyModule_Create(&module_def);
}
