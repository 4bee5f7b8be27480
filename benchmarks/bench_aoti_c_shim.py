"""AOTInductor's two ways to call a custom op from a .pt2, per call, side by side in one run: the
proxy executor (a boxed call through torch's dispatcher; what opforge's packages use today) and a
C shim (`torch._inductor.config.aot_inductor.custom_ops_to_c_shims` + `custom_op_libs`: the
generated code calls a C function of the op's library directly), with eager torch for scale.

    python benchmarks/bench_aoti_c_shim.py [--calls 50] [--rounds 5]

The model is a chain of `--calls` my_add calls on a small tensor (8x16 + 16), so the per-call cost
is the call's overhead. The C shim (`aoti_torch_cpu_my_add`, the name AOTInductor derives from the
op) is built here, just in time, on opforge's stable glue and core: the same kernel. Never used to
gate CI. Why opforge does not ship this route yet: a C shim reports an error as a bare failure code
(the .pt2 raises a generic "API call failed"), so a bad input would lose opforge's message, and
AOTInductor names the shim after the op alone (`aoti_torch_cpu_<name>`), not its namespace.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import opforge
import opforge.build
from opforge.ninja_build import build_just_in_time

SHIM = r"""
#include <cstdio>
#include "core/my_add.h"
#include "my_add_args.h"
#include "opforge/torch_op.h"

namespace {
opforge::Tensor my_add(const opforge::Tensor& a, const opforge::Tensor& b) {
  opforge::MyAddPlan prep = opforge::my_add_prepare(a, b);
  if (prep.out.numel() == 0) return prep.out;
  const opforge::core::BinaryPlan& plan = prep.plan;
  opforge::dispatch_float(a.scalar_type(), "opforge::my_add", [&]<typename T>() {
    const T* pa = opforge::data<T>(a);
    const T* pb = opforge::data<T>(b);
    T* po = opforge::mutable_data<T>(prep.out);
    opforge::parallel_for(0, plan.numel, opforge::core::kMyAddGrain,
                          [&](int64_t begin, int64_t end) { opforge::core::my_add_range(plan, pa, pb, po, begin, end); });
  });
  return prep.out;
}
}  // namespace

// Inputs are borrowed handles; the output a new reference.
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_my_add(AtenTensorHandle a,
                                                                                      AtenTensorHandle b,
                                                                                      AtenTensorHandle* ret0) {
  try {
    AtenTensorHandle a_ref = nullptr, b_ref = nullptr;
    if (aoti_torch_new_tensor_handle(a, &a_ref) != AOTI_TORCH_SUCCESS) return AOTI_TORCH_FAILURE;
    const opforge::Tensor ta(a_ref);
    if (aoti_torch_new_tensor_handle(b, &b_ref) != AOTI_TORCH_SUCCESS) return AOTI_TORCH_FAILURE;
    const opforge::Tensor tb(b_ref);
    return aoti_torch_new_tensor_handle(my_add(ta, tb).get(), ret0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opforge: %s\n", e.what());
    return AOTI_TORCH_FAILURE;
  }
}
"""
DECLARATION = "AOTITorchError aoti_torch_cpu_my_add(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* ret0)"


class Chain(torch.nn.Module):
    def __init__(self, calls: int):
        super().__init__()
        self.calls = calls

    def forward(self, a, b):
        for _ in range(self.calls):
            a = opforge.my_add(a, b)
        return a


def per_call_us(fn, calls: int, repeat: int = 300) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from torch.utils import cpp_extension

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "shim.cpp").write_text(SHIM)
        torch_lib = cpp_extension.library_paths()[0]
        includes = [str(opforge.build.CSRC_DIR), str(opforge.build.CSRC_DIR.parent / "ops" / "csrc"),
                    cpp_extension.include_paths()[0]]
        build_just_in_time(tmp / "libopforge_c_shim.so", [str(tmp / "shim.cpp")],
                           ["-fPIC", *opforge.build.stable_cxx_flags(), *(f"-I{d}" for d in includes)],
                           ["-shared", "-Wl,-soname,libopforge_c_shim.so", f"-L{torch_lib}", "-ltorch_cpu",
                            f"-Wl,-rpath,{torch_lib}"], verbose=False,
                           what="bench_aoti_c_shim")
        os.environ["LIBRARY_PATH"] = str(tmp)  # where the package's link finds -lopforge_c_shim
        # loaded first, so the package's NEEDED libopforge_c_shim.so (its soname) is found already loaded
        ctypes.CDLL(str(tmp / "libopforge_c_shim.so"), mode=ctypes.RTLD_GLOBAL)
        model = Chain(args.calls)
        a, b = torch.randn(8, 16), torch.randn(16)
        program = torch.export.export(model, (a, b))
        proxy = torch._inductor.aoti_load_package(
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp / "proxy.pt2")))
        configs = {"aot_inductor.custom_ops_to_c_shims": {torch.ops.opforge.my_add.default: [DECLARATION]},
                   "aot_inductor.custom_op_libs": ["opforge_c_shim"]}
        shim = torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp / "shim.pt2"), inductor_configs=configs))
        want = model(a, b)
        torch.testing.assert_close(proxy(a, b), want)
        torch.testing.assert_close(shim(a, b), want)
        rows: dict = {"eager torch": [], "AOTI proxy executor": [], "AOTI C shim": []}
        for _ in range(args.rounds):
            rows["eager torch"].append(per_call_us(lambda: model(a, b), args.calls))
            rows["AOTI proxy executor"].append(per_call_us(lambda: proxy(a, b), args.calls))
            rows["AOTI C shim"].append(per_call_us(lambda: shim(a, b), args.calls))
    proxy_us = statistics.median(rows["AOTI proxy executor"])
    print(f"my_add (8x16 + 16) per call, 1 thread, {args.rounds} rounds: median (min / max) us; ratio to the proxy")
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:22s} {med:6.2f} us ({min(values):.2f} / {max(values):.2f})   {med / proxy_us:4.2f} x proxy")


if __name__ == "__main__":
    main()
