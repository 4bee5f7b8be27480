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

#ifndef OPFORGE_WITH_CUDA
// A CPU-only build still claims the CUDA key, so that a CUDA tensor gets an
// error that says why and what to do, instead of the dispatcher's generic
// "could not run ... with arguments from the 'CUDA' backend".
namespace {
void cuda_not_built(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(),
                              ": got CUDA tensors, but this opforge build has no CUDA kernels (built with "
                              "OPFORGE_CUDA=0, or without nvcc / a CUDA torch). Rebuild with CUDA_HOME set and "
                              "OPFORGE_CUDA=1: pip install --no-build-isolation -e .");
}
}  // namespace

TORCH_LIBRARY_IMPL(opforge, CUDA, m) {
  m.impl("my_add", torch::CppFunction::makeFromBoxedFunction<&cuda_not_built>());
  m.impl("deform_conv2d", torch::CppFunction::makeFromBoxedFunction<&cuda_not_built>());
  m.impl("_deform_conv2d_backward", torch::CppFunction::makeFromBoxedFunction<&cuda_not_built>());
}
#endif

// `import opforge._C` loads this shared object, which runs the registrations
// above. The module itself is empty: every entry point is a torch op.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "opforge torch operator library", -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
  // opforge.BUILT_WITH_CUDA: whether this build has the CUDA kernels (torch and ORT CUDA EP).
#ifdef OPFORGE_WITH_CUDA
  if (module != nullptr && PyModule_AddIntConstant(module, "WITH_CUDA", 1) != 0) return nullptr;
#else
  if (module != nullptr && PyModule_AddIntConstant(module, "WITH_CUDA", 0) != 0) return nullptr;
#endif
  return module;
}
