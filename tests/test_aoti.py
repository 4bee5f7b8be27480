"""AOTInductor (torch.export -> aoti_compile_and_package -> .pt2), the route to deploy without ONNX:
every opforge op compiles into a package, which runs in a fresh Python process after
`import opforge` and in a C++ program (tutorials/aoti_cpp) that dlopens
opforge.torch_library_path(), with no Python; both match eager torch, at another batch / roi
count than compiled with, and bad input inside a package run gets opforge's error, not a crash.
Both routes a package can call an op by: opforge.aoti_compile_and_package's C shims
(opforge/torch_c_shim.h) and torch's own proxy executor (torch._inductor.aoti_compile_and_package)."""

import os
import re
import subprocess
import sys
import textwrap
import zipfile
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
    bad = out / "bad"  # a roi's batch index past the batch: opforge::roi_align_rotated refuses it
    bad.mkdir()
    bad_rois = det_inputs[3].clone()
    bad_rois[0, 0] = 7
    export_model.save_tensors(bad, "inputs", (*det_inputs[:3], bad_rois))
    export_model.save_tensors(bad, "expected", det_expected)

    ops = OpsModel()
    batch, n = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("boxes", min=2, max=4096)
    shapes = ({0: batch}, None, {0: batch}, {0: batch}, None, {0: n}, {0: n})
    program = torch.export.export(ops, _ops_inputs(2), dynamic_shapes=shapes)
    opforge.aoti_compile_and_package(program, package_path=str(out / "ops.pt2"))
    torch._inductor.aoti_compile_and_package(program, package_path=str(out / "ops_proxy.pt2"))
    ops_inputs = _ops_inputs(3, boxes=30, seed=2)
    torch.save(list(ops_inputs), out / "ops_inputs.pt")
    torch.save(list(ops(*ops_inputs)), out / "ops_expected.pt")
    return out


FRESH_PROCESS = """
import sys, torch
import opforge  # registers opforge's ops: the .pt2 does not carry them
out = sys.argv[1]
for name, inputs, expected in (("detector", "inputs", "expected"), ("ops", "ops_inputs", "ops_expected"),
                               ("ops_proxy", "ops_inputs", "ops_expected")):
    runner = torch._inductor.aoti_load_package(f"{out}/{name}.pt2")
    got = runner(*torch.load(f"{out}/{inputs}.pt"))
    want = torch.load(f"{out}/{expected}.pt")
    assert len(got) == len(want), (name, len(got), len(want))
    for g, w in zip(got, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    print(name, "ok", [tuple(g.shape) for g in got])
# Bad input inside a package run, by either route: opforge's check, raised, not a crash.
x, weight, offset, mask, bias, boxes, scores = torch.load(f"{out}/ops_inputs.pt")
boxes = boxes.clone()
boxes[0, 2] = float("nan")
for name in ("ops", "ops_proxy"):
    runner = torch._inductor.aoti_load_package(f"{out}/{name}.pt2")
    try:
        runner(x, weight, offset, mask, bias, boxes, scores)
        print(name, "not refused")
    except Exception as exc:
        print(name, "refused:", str(exc).splitlines()[0][:200])
"""


def test_packages_run_in_a_fresh_python_process_after_import_opforge(packages):
    run = run_command([sys.executable, "-c", textwrap.dedent(FRESH_PROCESS), str(packages)], cwd=packages)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "detector ok [(3, 5, 8), (7, 8, 4, 4)]" in run.stdout, run.stdout
    assert "ops ok [(3, 6, 8, 8)," in run.stdout and "ops_proxy ok [(3, 6, 8, 8)," in run.stdout, run.stdout
    for name in ("ops", "ops_proxy"):
        assert f"{name} refused: opforge::nms_rotated: boxes row 0 has a non-finite w (nan)" in run.stdout, run.stdout


def _wrapper_source(package: Path) -> str:
    with zipfile.ZipFile(package) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
        return z.read(name).decode()


def test_opforge_packages_call_the_c_shims_and_torchs_call_the_proxy_executor(packages):
    """opforge.aoti_compile_and_package: every opforge op of the program is a direct call of its C
    shim (aoti_torch_cpu_<op>, declared with the library's own parameter list), no proxy-executor
    call is left, and the package links libopforge_torch.so by its soname. torch's own compile of
    the same program calls each op through the proxy executor."""
    shims = {op: decl for op, device, decl in opforge.ops._registry._C.c_shims if device == "cpu"}
    assert set(shims) == {f"opforge::{n}" for n in ("my_add", "deform_conv2d", "ms_deform_attn", "nms_rotated",
                                                     "batched_nms_rotated", "roi_align_rotated")}, shims
    for package, ops in (("ops.pt2", ("my_add", "deform_conv2d", "nms_rotated", "batched_nms_rotated")),
                         ("detector.pt2", ("deform_conv2d", "ms_deform_attn", "roi_align_rotated"))):
        source = _wrapper_source(packages / package)
        assert "proxy_executor_call_function" not in source, package
        called = set(re.findall(r"AOTI_TORCH_ERROR_CODE_CHECK\(aoti_torch_cpu_(\w+)\(", source))
        assert called >= set(ops), (package, called)
        for op in ops:
            assert f"extern {shims['opforge::' + op]};" in source, (package, op)
    proxy = _wrapper_source(packages / "ops_proxy.pt2")
    assert proxy.count("aoti_torch_proxy_executor_call_function(") >= 4
    assert "aoti_torch_cpu_my_add" not in proxy and "aoti_torch_cpu_nms_rotated" not in proxy
    with zipfile.ZipFile(packages / "ops.pt2") as z:
        (so,) = [n for n in z.namelist() if n.endswith(".wrapper.so")]
        z.extract(so, packages / "unzipped")
    dynamic = subprocess.run(["readelf", "-d", str(packages / "unzipped" / so)], capture_output=True, text=True).stdout
    assert "[libopforge_torch.so]" in dynamic, dynamic


class SmallOps(torch.nn.Module):
    def forward(self, x, y, boxes, scores):
        return opforge.my_add(x, y), opforge.nms_rotated(boxes, scores, 0.5)


def test_c_shim_package_in_this_torch(tmp_path, capfd):
    """The C-shim route in whatever torch runs the suite (the torch matrix runs this file's test in
    torch 2.10 too): values match eager at another batch, and a bad input raises. torch >= 2.14
    puts the op's text in the RuntimeError; older runners raise a generic "API call failed" and
    AOTInductor prints the op's text on stderr (their proxy executor is worse: it returns None
    outputs without raising)."""
    g = torch.Generator().manual_seed(3)
    boxes = torch.rand(9, 5, generator=g) * torch.tensor([20, 20, 6, 6, 1.0]) + torch.tensor([0, 0, 2, 2, 0])
    inputs = (torch.randn(2, 4, generator=g), torch.randn(4, generator=g), boxes, torch.rand(9, generator=g))
    n = torch.export.Dim("n", min=2, max=512)
    program = torch.export.export(SmallOps(), inputs,
                                  dynamic_shapes=({0: torch.export.Dim("batch")}, None, {0: n}, {0: n}))
    runner = torch._inductor.aoti_load_package(
        opforge.aoti_compile_and_package(program, package_path=str(tmp_path / "small.pt2")))
    assert "proxy_executor_call_function" not in _wrapper_source(tmp_path / "small.pt2")
    other = (torch.randn(5, 4), inputs[1], torch.cat([boxes, boxes[:3] + 1]), torch.rand(12))
    for got, want in zip(runner(*other), SmallOps()(*other)):
        torch.testing.assert_close(got, want)
    bad_boxes = other[2].clone()
    bad_boxes[0, 3] = float("inf")
    capfd.readouterr()
    with pytest.raises(RuntimeError) as raised:
        runner(other[0], other[1], bad_boxes, other[3])
    text = "opforge::nms_rotated: boxes row 0 has a non-finite h (inf)"
    if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14):
        assert text in str(raised.value), str(raised.value)
    else:
        assert text in str(raised.value) + capfd.readouterr().err


def test_compile_leaves_the_environment_and_configs_as_they_were(monkeypatch):
    """The C-shim route puts opforge's folder on the linker's LIBRARY_PATH for the compile only,
    and merges the caller's inductor configs without changing the caller's dict."""
    monkeypatch.setenv("LIBRARY_PATH", "/somewhere/else")
    seen = {}

    def fake_compile(program, package_path=None, inductor_configs=None):
        seen["path"], seen["configs"] = package_path, inductor_configs
        seen["LIBRARY_PATH"] = os.environ.get("LIBRARY_PATH")
        return package_path

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fake_compile)
    program = torch.export.export(OpsModel(), _ops_inputs(2))
    mine = {"aot_inductor.custom_op_libs": ["mine"], "max_autotune": False}
    assert opforge.aoti_compile_and_package(program, "x.pt2", mine) == "x.pt2"
    assert mine == {"aot_inductor.custom_op_libs": ["mine"], "max_autotune": False}
    assert os.environ["LIBRARY_PATH"] == "/somewhere/else"
    folder = str(Path(opforge.torch_library_path()).parent)
    assert seen["LIBRARY_PATH"] == folder + os.pathsep + "/somewhere/else"
    assert seen["configs"]["aot_inductor.custom_op_libs"] == ["mine", "opforge_torch"]
    assert seen["configs"]["max_autotune"] is False
    assert {op.name() for op in seen["configs"]["aot_inductor.custom_ops_to_c_shims"]} == {
        "opforge::my_add", "opforge::deform_conv2d", "opforge::nms_rotated", "opforge::batched_nms_rotated"}
    monkeypatch.delenv("LIBRARY_PATH")
    opforge.aoti_compile_and_package(program, "x.pt2", c_shims=False)
    assert seen["LIBRARY_PATH"] is None and "LIBRARY_PATH" not in os.environ
    assert "aot_inductor.custom_ops_to_c_shims" not in seen["configs"]


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


def test_cpp_program_gets_opforges_error_for_bad_input_through_the_c_shim(packages, cpp_demo):
    """A roi whose batch index is past the batch, in the C++ program: roi_align_rotated's C shim
    raises opforge's check, which the program catches and prints; no crash."""
    bad = _run_demo(cpp_demo, packages / "detector.pt2", opforge.torch_library_path(), packages / "bad")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "opforge::roi_align_rotated: rois row 0 has batch index 7" in bad.stderr, bad.stderr
