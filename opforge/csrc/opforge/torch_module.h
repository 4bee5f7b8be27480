// The Python module of a torch extension built on opforge, in one line:
//   OPFORGE_TORCH_EXTENSION_MODULE(_C)   // in exactly one source of the extension
#pragma once

#include <Python.h>

// Defines the Python module `name` of a torch extension (`import pkg.name` loads the
// shared object, which runs its TORCH_LIBRARY registrations). The module is empty
// except for WITH_CUDA, which opforge.register_op(spec, extension=module) reads: in
// a CUDA build (OPFORGE_WITH_CUDA, set by opforge.build) every op needs a CUDA kernel.
#ifdef OPFORGE_WITH_CUDA
#define OPFORGE_EXTENSION_WITH_CUDA 1
#else
#define OPFORGE_EXTENSION_WITH_CUDA 0
#endif
#define OPFORGE_TORCH_EXTENSION_MODULE(name)                                                           \
  PyMODINIT_FUNC PyInit_##name(void) {                                                                 \
    static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, #name, "torch operator library", -1, \
                                            nullptr};                                                  \
    PyObject* module = PyModule_Create(&module_def);                                                   \
    if (module != nullptr && PyModule_AddIntConstant(module, "WITH_CUDA", OPFORGE_EXTENSION_WITH_CUDA) != 0) \
      return nullptr;                                                                                  \
    return module;                                                                                     \
  }
