// The opforge operator library: every op's schema is declared here, once, in
// the `opforge` namespace (torch.ops.opforge.*). Kernels register themselves
// per dispatch key in their own files (my_add.cpp, cuda/*.cu); the fake
// (meta) impls and autograd live next to each op's spec in opforge/ops/*.py,
// which also checks at import that these schemas match the spec's.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(opforge, m) {
  m.def("my_add(Tensor a, Tensor b) -> Tensor");
  m.def(
      "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, int stride_h, "
      "int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, int offset_groups, "
      "bool use_mask) -> Tensor");
  m.def(
      "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
      "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, "
      "int offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

// `import opforge._C` loads this shared object, which runs the registrations
// above. The module itself is empty: every entry point is a torch op.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "opforge torch operator library", -1, nullptr};
  return PyModule_Create(&module_def);
}
