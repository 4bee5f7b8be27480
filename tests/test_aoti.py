"""AOTInductor (torch.export -> aoti_compile_and_package -> .pt2), the route to deploy without ONNX:
every opforge op compiles into a package, which runs in a fresh Python process after
`import opforge` and in a C++ program (tutorials/aoti_cpp) that dlopens
opforge.torch_library_path(), with no Python; both match eager torch, at another batch / roi
count than compiled with, and bad input inside a package run gets opforge's error, not a crash."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opforge
from preloaded_python import run_command

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "tutorials" / "aoti_cpp"
TORCH_DIR = Path(torch.__file__).resolve().parent

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("aoti")]


class OpsModel(torch.nn.Module):
    """my_add, deform_conv2d, nms_rotated and batched_nms_rotated (roi_align_rotated and
    ms_deform_attn: the tutorial's detector, below): every op of opforge in one package or the other."""

    def forward(self, x, weight, offset, mask, bias, boxes, scores):
        y = opforge.my_add(x, x)
        y = opforge.deform_conv2d(y, offset, weight, bias, padding=(1, 1), mask=mask)
        keep = opforge.nms_rotated(boxes, scores, 0.5)
        classes = (scores * 3).long()  # three classes, from the scores: no extra input
        keep_per_class = opforge.batched_nms_rotated(boxes, scores, classes, 0.3)
        return y, keep, keep_per_class


def _ops_inputs(batch, boxes=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, 8, 8, generator=g)
    weight = torch.randn(6, 4, 3, 3, generator=g)
    offset = torch.randn(batch, 18, 8, 8, generator=g)
    mask = torch.rand(batch, 9, 8, 8, generator=g)
    bias = torch.randn(6, generator=g)
    b = torch.rand(boxes, 5, generator=g) * torch.tensor([20, 20, 6, 6, 1.0]) + torch.tensor([0, 0, 2, 2, 0])
    return x, weight, offset, mask, bias, b, torch.rand(boxes, generator=g)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    sys.path.insert(0, str(TUTORIAL))
    try:
        import export_model
    finally:
        sys.path.remove(str(TUTORIAL))
    out = tmp_path_factory.mktemp("aoti")
    torch.manual_seed(0)
    detector = export_model.Detector().eval()
    export_model.compile_package(detector, export_model.example_inputs(), out / "detector.pt2")
    det_inputs = export_model.example_inputs(batch=3, rois=7, seed=1)
    with torch.no_grad():
        det_expected = detector(*det_inputs)
    torch.save(list(det_inputs), out / "inputs.pt")
    torch.save(list(det_expected), out / "expected.pt")
    export_model.save_tensors(out, "inputs", det_inputs)  # for the C++ program
    export_model.save_tensors(out, "expected", det_expected)

    ops = OpsModel()
    batch, n = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("boxes", min=2, max=4096)
    shapes = ({0: batch}, None, {0: batch}, {0: batch}, None, {0: n}, {0: n})
    program = torch.export.export(ops, _ops_inputs(2), dynamic_shapes=shapes)
    torch._inductor.aoti_compile_and_package(program, package_path=str(out / "ops.pt2"))
    ops_inputs = _ops_inputs(3, boxes=30, seed=2)
    torch.save(list(ops_inputs), out / "ops_inputs.pt")
    torch.save(list(ops(*ops_inputs)), out / "ops_expected.pt")
    return out


FRESH_PROCESS = """
import sys, torch
import opforge  # registers opforge's ops: the .pt2 does not carry them
out = sys.argv[1]
for name, inputs, expected in (("detector", "inputs", "expected"), ("ops", "ops_inputs", "ops_expected")):
    runner = torch._inductor.aoti_load_package(f"{out}/{name}.pt2")
    got = runner(*torch.load(f"{out}/{inputs}.pt"))
    want = torch.load(f"{out}/{expected}.pt")
    assert len(got) == len(want), (name, len(got), len(want))
    for g, w in zip(got, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    print(name, "ok", [tuple(g.shape) for g in got])
# Bad input inside a package run: opforge's check, raised, not a crash.
runner = torch._inductor.aoti_load_package(f"{out}/ops.pt2")
x, weight, offset, mask, bias, boxes, scores = torch.load(f"{out}/ops_inputs.pt")
boxes = boxes.clone()
boxes[0, 2] = float("nan")
try:
    runner(x, weight, offset, mask, bias, boxes, scores)
except Exception as exc:
    print("refused:", str(exc).splitlines()[0][:200])
"""


def test_packages_run_in_a_fresh_python_process_after_import_opforge(packages):
    run = run_command([sys.executable, "-c", textwrap.dedent(FRESH_PROCESS), str(packages)], cwd=packages)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "detector ok [(3, 5, 8), (7, 8, 4, 4)]" in run.stdout, run.stdout
    assert "ops ok [(3, 6, 8, 8)," in run.stdout, run.stdout
    assert "refused:" in run.stdout and "opforge::nms_rotated" in run.stdout, run.stdout


@pytest.fixture(scope="module")
def cpp_demo(tmp_path_factory):
    build = tmp_path_factory.mktemp("aoti_cpp_build")
    configured = run_command(["cmake", "-S", str(TUTORIAL), "-B", str(build), f"-DTORCH_DIR={TORCH_DIR}"])
    assert configured.returncode == 0, configured.stdout[-3000:] + configured.stderr[-3000:]
    built = run_command(["cmake", "--build", str(build)])
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return build / "opforge_aoti_demo"


def _run_demo(demo, *args):
    env = {"LD_LIBRARY_PATH": str(TORCH_DIR / "lib"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"}
    return subprocess.run([str(demo), *map(str, args)], capture_output=True, text=True, timeout=600, env=env)


def test_cpp_program_runs_the_package_with_opforge_torch_library(packages, cpp_demo):
    """tutorials/aoti_cpp: dlopen(opforge.torch_library_path()), then the .pt2; no libpython in
    the process (the program links none, and the library needs none)."""
    ok = _run_demo(cpp_demo, packages / "detector.pt2", opforge.torch_library_path(), packages, 2)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "output 0: shape [3, 5, 8]" in ok.stdout and "output 1: shape [7, 8, 4, 4]" in ok.stdout, ok.stdout
    assert "all 2 outputs match torch's" in ok.stdout
    linked = subprocess.run(["ldd", str(cpp_demo)], capture_output=True, text=True,
                            env={"LD_LIBRARY_PATH": str(TORCH_DIR / "lib")}).stdout
    assert "libpython" not in linked, linked

    # Without opforge's library the package cannot run its ops: a reported error, not a crash.
    missing = _run_demo(cpp_demo, packages / "detector.pt2", packages / "no_such_library.so", packages)
    assert missing.returncode == 2 and "cannot load" in missing.stderr, missing.stdout + missing.stderr
