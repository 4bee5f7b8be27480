// AOTInductor C shims for a torch op library built on opforge's stable-ABI glue (opforge/torch_op.h).
//
// An AOTInductor package (.pt2) calls a custom op in one of two ways. By default it goes through
// torch's proxy executor: a boxed call through the dispatcher, with the arguments serialised per call.
// With a C shim, the package's generated code calls a C function of the op's library directly
// (torch._inductor.config.aot_inductor.custom_ops_to_c_shims + custom_op_libs), about 4 us less per
// call (benchmarks/bench_aoti_c_shim.py). opforge.aoti_compile_and_package turns the route on for the
// ops whose libraries carry shims.
//
// AOTInductor names the shim after the device and the op's name alone, not its namespace:
// aoti_torch_<device>_<op>. Its arguments follow the op's schema: Tensor -> AtenTensorHandle
// (borrowed), int -> int64_t, float -> double, bool -> int32_t; each returned Tensor is an
// AtenTensorHandle* retN, a new reference the package owns. A library defines one with
//
//   OPFORGE_AOTI_C_SHIM(opforge, cpu, my_add, (AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* ret0)) {
//     return opforge::c_shim::give(my_add_cpu(borrow_cpu(a, "opforge::my_add", "a"), borrow_cpu(b, ...)), ret0);
//   }
//
// which also records the shim ("opforge::my_add", "cpu" and the C declaration, from the same
// parameter list) for the library's entry point opforge_aoti_c_shims_v1, so Python declares to
// AOTInductor exactly what the library defines, and maps only this namespace's op to it.
//
// Errors: a shim that returned a bare failure code would lose the op's message (the package raises
// a generic "API call failed"). So a shim lets the kernel's std::runtime_error propagate, as the
// proxy executor's call does: it unwinds through the generated C++ (its handles are RAII) to
// AOTInductor's run, which reports e.what(): the same RuntimeError text as in eager torch.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/tensor.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace opforge::c_shim {

// A Tensor of the caller's borrowed handle: a new reference, released when the Tensor goes.
inline torch::stable::Tensor borrow(AtenTensorHandle handle) {
  if (handle == nullptr) throw std::runtime_error("opforge: a C shim got a null tensor handle");
  AtenTensorHandle own = nullptr;
  if (aoti_torch_new_tensor_handle(handle, &own) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("opforge: a C shim could not take a reference to its input");
  return torch::stable::Tensor(own);
}

// borrow() for a CPU shim's input `arg` of `op`: the dispatcher would have routed a tensor on
// another device elsewhere; the shim is called whatever the device, so it checks.
inline torch::stable::Tensor borrow_cpu(AtenTensorHandle handle, const char* op, const char* arg) {
  torch::stable::Tensor t = borrow(handle);
  if (!t.is_cpu())
    throw std::runtime_error(std::string(op) + ": " + arg + " must be a CPU tensor in this package's CPU call");
  return t;
}

// Hands `out` to the package as a new reference in *ret.
inline AOTITorchError give(const torch::stable::Tensor& out, AtenTensorHandle* ret) {
  return aoti_torch_new_tensor_handle(out.get(), ret);
}

struct Entry {
  std::string op, device, declaration;
};

// The library's shims (one list per library: hidden visibility keeps it private).
inline std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

struct Registration {
  Registration(const char* op, const char* device, const char* declaration) {
    registry().push_back(Entry{op, device, declaration});
  }
};

// The list, a line per shim: "ns::op\tdevice\tdeclaration\n".
inline std::string listing() {
  std::string text;
  for (const Entry& e : registry()) text += e.op + "\t" + e.device + "\t" + e.declaration + "\n";
  return text;
}

}  // namespace opforge::c_shim

// Declares, records and starts the definition of aoti_torch_<device>_<op>; the body follows.
#define OPFORGE_AOTI_C_SHIM(ns, device, op, params)                                                       \
  extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_##device##_##op params;     \
  static const ::opforge::c_shim::Registration opforge_c_shim_##device##_##op(                           \
      #ns "::" #op, #device, "AOTITorchError aoti_torch_" #device "_" #op #params);                       \
  extern "C" AOTITorchError aoti_torch_##device##_##op params

// The library's entry point (in OPFORGE_TORCH_LIBRARY_ENTRY_POINTS): the listing into out[cap]
// (truncated, NUL-terminated); returns the listing's full length, so a caller can size its buffer.
#define OPFORGE_AOTI_C_SHIMS_ENTRY_POINT                                                                  \
  extern "C" __attribute__((visibility("default"))) size_t opforge_aoti_c_shims_v1(char* out, size_t cap) { \
    const std::string text = ::opforge::c_shim::listing();                                               \
    ::opforge::copy_message(text, out, cap);                                                             \
    return text.size();                                                                                  \
  }
