"""AOTInductor's two ways to call a custom op from a .pt2, per call, side by side in one run: the
proxy executor (a boxed call through torch's dispatcher, torch._inductor.aoti_compile_and_package's
default) and a C shim (opforge.aoti_compile_and_package: the generated code calls
libopforge_torch.so's `aoti_torch_cpu_my_add` directly, opforge/torch_c_shim.h), with eager torch
for scale.

    python benchmarks/bench_aoti_c_shim.py [--calls 50] [--rounds 5]

The model is a chain of `--calls` my_add calls on a small tensor (8x16 + 16), so the per-call cost
is the call's overhead: both routes run the same kernel. Never used to gate CI.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import opforge

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
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = Chain(args.calls)
        a, b = torch.randn(8, 16), torch.randn(16)
        program = torch.export.export(model, (a, b))
        proxy = torch._inductor.aoti_load_package(
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp / "proxy.pt2")))
        shim = torch._inductor.aoti_load_package(
            opforge.aoti_compile_and_package(program, package_path=str(tmp / "shim.pt2")))
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
