"""The tutorial detector (tutorials/aoti_cpp: deform_conv2d, ms_deform_attn, roi_align_rotated) on
each deployment route, side by side in one run at the same thread count: eager torch, its
AOTInductor package from Python (after `import opforge`) and from the C++ runner (no Python), each
with the package calling opforge's ops through their C shims (opforge.aoti_compile_and_package) and
through torch's proxy executor (torch._inductor.aoti_compile_and_package), and its ONNX export in
ONNX Runtime with libopforge_ort. One line per route: median ms per call, and the ratio to eager torch.

    python benchmarks/bench_aoti.py [--threads 2] [--repeat 200] [--cpp-rounds 5]

Builds the C++ runner with CMake into build/aoti_cpp (skipped, with a note, when cmake is missing).
Never used to gate CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import opforge

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "tutorials" / "aoti_cpp"
sys.path.insert(0, str(TUTORIAL))
import export_model  # noqa: E402


def median_ms(fn, repeat: int) -> float:
    fn(), fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def cpp_runner_ms(package: Path, data: Path, threads: int) -> str:
    if shutil.which("cmake") is None:
        return "n/a (no cmake)"
    build = ROOT / "build" / "aoti_cpp"
    torch_dir = Path(torch.__file__).resolve().parent
    for cmd in (["cmake", "-S", str(TUTORIAL), "-B", str(build), f"-DTORCH_DIR={torch_dir}"],
                ["cmake", "--build", str(build)]):
        subprocess.run(cmd, check=True, capture_output=True)
    env = {"LD_LIBRARY_PATH": str(torch_dir / "lib"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": str(threads)}
    run = subprocess.run([str(build / "opforge_aoti_demo"), str(package), opforge.torch_library_path(), str(data),
                          str(threads)], capture_output=True, text=True, env=env)
    found = re.search(r"([\d.]+) ms per run", run.stdout)
    if run.returncode != 0 or not found:
        raise SystemExit(f"the C++ runner failed:\n{run.stdout}\n{run.stderr}")
    return found.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--cpp-rounds", type=int, default=5, help="runs of the C++ runner per package (median)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = export_model.Detector().eval()
    inputs = export_model.example_inputs(batch=2, rois=16, seed=1)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        tmp = Path(tmp)
        rows["eager torch"] = median_ms(lambda: model(*inputs), args.repeat)
        export_model.compile_package(model, export_model.example_inputs(), tmp / "detector.pt2")  # C shims
        batch, rois = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("rois", min=1, max=1024)
        program = torch.export.export(model, export_model.example_inputs(),
                                      dynamic_shapes=({0: batch}, {0: batch}, {0: batch}, {0: rois}))
        torch._inductor.aoti_compile_and_package(program, package_path=str(tmp / "detector_proxy.pt2"))
        runners = {route: torch._inductor.aoti_load_package(str(tmp / f"detector{suffix}.pt2"))
                   for route, suffix in (("C shims", ""), ("proxy executor", "_proxy"))}
        for route, runner in runners.items():
            rows[f"AOTInductor, Python, {route}"] = median_ms(lambda: runner(*inputs), args.repeat)
        expected = model(*inputs)
        export_model.save_tensors(tmp, "inputs", inputs)
        export_model.save_tensors(tmp, "expected", expected)
        cpp_runs: dict = {}
        for _ in range(args.cpp_rounds):  # the two packages alternately: a slow spell hits both
            for route, suffix in (("C shims", ""), ("proxy executor", "_proxy")):
                cpp_runs.setdefault(route, []).append(float(cpp_runner_ms(tmp / f"detector{suffix}.pt2", tmp,
                                                                           args.threads)))
        for route, values in cpp_runs.items():
            rows[f"AOTInductor, C++ (no Python), {route}"] = statistics.median(values)
        names = ["image", "query", "reference_points", "rois"]
        proto = opforge.export(model, inputs, input_names=names, output_names=["attended", "pooled"])
        session = opforge.ort_session(proto, intra_op_num_threads=args.threads)
        feeds = {n: t.numpy() for n, t in zip(names, inputs)}
        rows["ONNX Runtime (opforge.export, libopforge_ort)"] = median_ms(lambda: session.run(None, feeds), args.repeat)
    eager = rows["eager torch"]
    print(f"tutorial detector (batch 2, 16 rois), {args.threads} threads, median of {args.repeat} calls, torch "
          f"{torch.__version__}")
    for name, ms in rows.items():
        print(f"{name:50s} {ms:8.3f} ms   {ms / eager:5.2f} x eager")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
