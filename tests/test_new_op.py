"""A user's own op, outside this repo, end to end: `opforge new-op` writes a package into a
temporary directory, it builds against the installed opforge (opforge.build), its generated
tests pass, a model mixing opforge.my_add and the new op goes through both exporters and
runs in ONE opforge.ort_session with no manual registration, and the new op's ORT library
runs in a process that never imports torch."""

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import needed_libraries, run_paths, scratch_venv, without_cuda
from preloaded_python import run_command, run_python

ROOT = Path(__file__).resolve().parents[1]
PKG, NAME, DOMAIN = "opf_example_ops", "swish", "com.example.ops"


def _nvcc() -> bool:
    return os.path.isfile("/usr/local/cuda/bin/nvcc") or shutil.which("nvcc") is not None


_run = run_command  # a Python forked from a torch-preloaded server (tests/preloaded_python.py)


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory):
    """(python of a scratch venv that sees this venv's packages, generated package dir), built."""
    base = tmp_path_factory.mktemp("new_op")
    assert ROOT not in base.parents
    python = scratch_venv(base)

    pkg_dir = base / PKG
    gen = _run([python, "-m", "opforge", "new-op", NAME, "--package", PKG, "--domain", DOMAIN, "--dir", str(pkg_dir)],
               cwd=base)
    assert gen.returncode == 0, gen.stderr
    assert "next:" in gen.stdout and (pkg_dir / "pyproject.toml").is_file()
    env = dict(os.environ, OPFORGE_CUDA="1" if _nvcc() else "0")  # CUDA kernels compile-checked where nvcc is
    build = _run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", str(pkg_dir)],
                 cwd=base, env=env)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    return python, pkg_dir


def test_generated_package_layout_and_build(scaffold):
    python, pkg_dir = scaffold
    files = sorted(p.relative_to(pkg_dir).as_posix() for p in pkg_dir.rglob("*") if p.is_file() and "build" not in p.parts)
    for expected in (f"src/{PKG}/csrc/{NAME}.h", f"src/{PKG}/csrc/{NAME}_torch.cpp", f"src/{PKG}/csrc/{NAME}_ort.cc",
                     f"src/{PKG}/csrc/cuda/{NAME}_cuda.cu", f"src/{PKG}/{NAME}.py", f"tests/test_{NAME}.py", "setup.py",
                     "pyproject.toml", "README.md", f"src/{PKG}/lib{PKG}_ort.so"):
        assert expected in files, files
    check = _run([python, "-c", f"import torch, {PKG}; x = torch.linspace(-2, 2, 5, dtype=torch.float64);"
                  f"print(torch.ops.{PKG}.{NAME}(x, 0.5).sub(x * torch.sigmoid(0.5 * x)).abs().max().item(),"
                  f" {PKG}.BUILT_WITH_CUDA)"], cwd=pkg_dir.parent)
    assert check.returncode == 0, check.stderr
    err, with_cuda = check.stdout.split()
    assert float(err) < 1e-15
    assert with_cuda == str(_nvcc())  # the OPFORGE_CUDA switch reached the package's build


def test_generated_tests_pass(scaffold):
    python, pkg_dir = scaffold
    run = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg_dir)], cwd=pkg_dir.parent)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


def test_mixed_model_both_exporters_one_session(scaffold):
    python, pkg_dir = scaffold
    script = textwrap.dedent(f"""
        import numpy as np, torch, opforge, {PKG}

        class Mixed(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.offset = torch.nn.Parameter(torch.linspace(-1, 1, 6))

            def forward(self, x):
                return torch.ops.{PKG}.{NAME}(opforge.my_add(x, self.offset), 1.25) * 2

        model = Mixed().eval()
        for dynamo in (True, False):
            kw = dict(dynamic_shapes=({{0: torch.export.Dim("batch")}},)) if dynamo else dict(
                dynamic_axes={{"x": {{0: "batch"}}}}, opset_version=17)
            proto = opforge.export(model, (torch.randn(2, 6),), dynamo=dynamo, input_names=["x"], **kw)
            nodes = {{(n.domain, n.op_type) for n in proto.graph.node}}
            assert ("opforge", "my_add") in nodes and ("{DOMAIN}", "{NAME}") in nodes, nodes
            x = torch.randn(7, 6)
            (got,) = opforge.ort_session(proto).run(None, {{"x": x.numpy()}})  # no manual registration
            np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
        print("ok", opforge.ort_library_path("{DOMAIN}"))
    """)
    run = _run([python, "-c", script], cwd=pkg_dir.parent)
    assert run.returncode == 0, run.stderr[-4000:]
    status, lib = run.stdout.strip().splitlines()[-1].split()  # after the exporter's progress lines
    assert status == "ok" and lib == str(pkg_dir / "src" / PKG / f"lib{PKG}_ort.so")


def test_moving_a_prototype_to_cpp_changes_neither_model_code_nor_exported_model(scaffold, tmp_path):
    """`new-op --prototype` and `new-op` of the same op: one model script, run against each package,
    exports the same nodes with both exporters, and ORT matches torch and the other package."""
    python, pkg_dir = scaffold
    proto_dir = tmp_path / PKG
    gen = _run([python, "-m", "opforge", "new-op", NAME, "--package", PKG, "--domain", DOMAIN, "--prototype", "--dir",
                str(proto_dir)], cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    script = textwrap.dedent(f"""
        import json, numpy as np, torch, opforge, {PKG}

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(6, 6)
                self.act = {PKG}.{NAME.capitalize()}(alpha=0.75)

            def forward(self, x):
                return self.act(self.linear(x)) - torch.ops.{PKG}.{NAME}(x, 2.0)

        torch.manual_seed(0)
        model = Model().eval()
        x = torch.linspace(-3, 3, 30).reshape(5, 6)
        report = {{"prototype": getattr({PKG}, "PROTOTYPE", False), "nodes": {{}}, "outputs": {{}}}}
        for dynamo in (True, False):
            kw = dict(dynamic_shapes=({{0: torch.export.Dim("batch")}},)) if dynamo else dict(
                dynamic_axes={{"x": {{0: "batch"}}}}, opset_version=17)
            proto = opforge.export(model, (torch.randn(2, 6),), dynamo=dynamo, input_names=["x"], **kw)
            (got,) = opforge.ort_session(proto).run(None, {{"x": x.numpy()}})
            np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
            name = "dynamo" if dynamo else "torchscript"
            report["nodes"][name] = sorted({{f"{{n.domain}}::{{n.op_type}}" for n in proto.graph.node if n.domain}})
            report["outputs"][name] = got.tolist()
        print("REPORT", json.dumps(report))
    """)
    reports = {}
    for label, env in (("compiled", dict(os.environ)), ("prototype", dict(os.environ, PYTHONPATH=str(proto_dir / "src")))):
        run = _run([python, "-c", script], cwd=tmp_path, env=env)
        assert run.returncode == 0, (label, run.stderr[-4000:])
        import json

        reports[label] = json.loads(run.stdout.split("REPORT ", 1)[1])
    assert reports["prototype"]["prototype"] is True and reports["compiled"]["prototype"] is False
    for exporter in ("dynamo", "torchscript"):
        assert reports["prototype"]["nodes"][exporter] == reports["compiled"]["nodes"][exporter] == [f"{DOMAIN}::{NAME}"]
        import numpy as np

        np.testing.assert_allclose(reports["prototype"]["outputs"][exporter], reports["compiled"]["outputs"][exporter],
                                   rtol=1e-5, atol=1e-6)


def test_ort_session_finds_the_library_by_entry_point_without_importing_the_package(scaffold):
    python, pkg_dir = scaffold
    script = textwrap.dedent(f"""
        import sys, numpy as np, opforge
        from onnx import helper, TensorProto
        node = helper.make_node("{NAME}", ["X"], ["Y"], domain="{DOMAIN}", alpha=2.0)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [4])],
                                  [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [4])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("{DOMAIN}", 1)])
        x = np.array([-2.0, -0.5, 0.0, 3.0])
        (y,) = opforge.ort_session(model).run(None, {{"X": x}})
        np.testing.assert_allclose(y, x / (1 + np.exp(-2.0 * x)), rtol=1e-12)
        assert "{PKG}" not in sys.modules, "the package was imported"
        print("ok")
    """)
    run = _run([python, "-c", script], cwd=pkg_dir.parent)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-4000:]


def test_new_op_library_runs_in_a_torch_free_process(scaffold):
    python, pkg_dir = scaffold
    lib = _run([python, "-m", "opforge", "ort-library-path", DOMAIN], cwd=pkg_dir.parent)
    assert lib.returncode == 0, lib.stderr
    path = lib.stdout.strip()
    script = textwrap.dedent(f"""
        import sys, numpy as np, onnxruntime as ort
        from onnx import helper, TensorProto
        node = helper.make_node("{NAME}", ["X"], ["Y"], domain="{DOMAIN}", alpha=0.75)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT16, None)],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("{DOMAIN}", 1)])
        so = ort.SessionOptions()
        so.register_custom_ops_library({path!r})
        so.register_custom_ops_library({path!r})  # twice: a no-op, not "Domain already set in registry"
        x = np.linspace(-4, 4, 9).astype(np.float16)
        (y,) = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {{"X": x}})
        xf = x.astype(np.float32)
        np.testing.assert_allclose(y.astype(np.float32), xf / (1 + np.exp(np.float32(-0.75) * xf)), rtol=2e-3, atol=1e-3)
        bad = helper.make_model(helper.make_graph([helper.make_node("{NAME}", ["X"], ["Y"], domain="{DOMAIN}")], "g",
                                                  graph.input, graph.output), opset_imports=model.opset_import)
        try:  # no alpha: the session fails naming the op and the attribute
            ort.InferenceSession(bad.SerializeToString(), so, providers=["CPUExecutionProvider"])
            raise SystemExit("a node without alpha was accepted")
        except Exception as exc:
            assert "{DOMAIN}::{NAME}: the node needs the float attribute 'alpha'" in str(exc), str(exc)
        assert "torch" not in sys.modules, "torch got imported"
        print("ok")
    """)
    run = _run([python, "-c", script], cwd="/", fresh=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-4000:]


_TORCH_FREE_SWISH = f"""
import sys, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto
lib = sys.argv[1]
node = helper.make_node("{NAME}", ["X"], ["Y"], domain="{DOMAIN}", alpha=0.5)
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, None)],
                          [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("{DOMAIN}", 1)])
so = ort.SessionOptions()
so.register_custom_ops_library(lib)
x = np.linspace(-3, 3, 7)
(y,) = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {{"X": x}})
np.testing.assert_allclose(y, x / (1 + np.exp(-0.5 * x)), rtol=1e-12)
try:  # what the library says of its CUDA part (no entry: a CPU-only build has none)
    status = so.get_session_config_entry("opforge.cuda_kernels.lib{PKG}_ort")
except Exception:
    status = "cpu-only build"
print("ok", status)
"""


def test_new_op_library_loads_and_runs_on_a_box_without_cuda(scaffold):
    """The package's ORT library from a CUDA build (where nvcc is) on a box with no CUDA
    runtime at all: it links none, runs its CPU kernel, and its CUDA part, asked for
    (OPFORGE_ORT_CUDA=always), is reported as unavailable instead of failing the load."""
    python, pkg_dir = scaffold
    lib = pkg_dir / "src" / PKG / f"lib{PKG}_ort.so"
    assert not [n for n in needed_libraries(lib) if "cuda" in n or "cublas" in n], needed_libraries(lib)
    companion = lib.with_name(f"lib{PKG}_ort_cuda.so")
    assert companion.is_file() == _nvcc()
    env = dict(os.environ, OPFORGE_ORT_CUDA="always")
    run = _run(without_cuda([sys.executable, "-I", "-c", _TORCH_FREE_SWISH, lib]), cwd="/", env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    status = run.stdout.split("ok ", 1)[1].strip()
    if _nvcc():
        assert status.startswith(f"unavailable: lib{PKG}_ort's CUDA kernels could not be loaded: libcudart.so"), status
    else:
        assert status == "cpu-only build"


@pytest.mark.slow
def test_new_op_wheel_installs_into_a_fresh_venv_and_runs(scaffold, tmp_path):
    """`pip wheel --no-build-isolation` of the generated package: the wheel's libraries have only
    $ORIGIN-relative run paths, no shipped file names the build directory or the builder's venv,
    and, installed into a fresh venv, its op runs in torch and its library in ORT."""
    import zipfile

    python, pkg_dir = scaffold
    env = dict(os.environ, OPFORGE_CUDA="1" if _nvcc() else "0")
    build = _run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path / "dist"),
                  str(pkg_dir)], cwd=tmp_path, env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob(f"{PKG}-*.whl")
    roots = {os.path.realpath(p) for p in (pkg_dir, sys.prefix, sys.base_prefix, Path(python).parents[1])}
    with zipfile.ZipFile(wheel) as z:
        libs = sorted(n for n in z.namelist() if n.endswith(".so"))
        naming = {n: [r for r in roots if (r + "/").encode() in z.read(n)] for n in z.namelist()}
        z.extractall(tmp_path / "unpacked")
    assert f"{PKG}/lib{PKG}_ort.so" in libs and (f"{PKG}/lib{PKG}_ort_cuda.so" in libs) == _nvcc(), libs
    assert {n: r for n, r in naming.items() if r} == {}
    for name in libs:
        entries = run_paths(tmp_path / "unpacked" / name)
        assert all(e.startswith("$ORIGIN/") for e in entries), (name, entries)

    fresh = scratch_venv(tmp_path / "fresh")  # sees torch/onnxruntime of this venv, not the package's editable install
    install = _run([sys.executable, "-m", "pip", "--python", fresh, "install", "--no-deps", "--no-index", str(wheel)],
                   cwd=tmp_path)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    site = Path(fresh).parents[1] / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    lib = site / PKG / f"lib{PKG}_ort.so"
    check = _run([fresh, "-c", f"import torch, {PKG}; x = torch.linspace(-2, 2, 5, dtype=torch.float64);"
                  f"print({PKG}.__file__, torch.ops.{PKG}.{NAME}(x, 0.5).sub(x * torch.sigmoid(0.5 * x)).abs().max().item())"],
                 cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    module_file, err = check.stdout.split()
    assert module_file.startswith(str(site)) and float(err) < 1e-15, check.stdout
    run = _run([fresh, "-I", "-c", _TORCH_FREE_SWISH, lib], cwd="/")
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stderr[-4000:]


def test_incremental_rebuild_compiles_only_the_touched_source(scaffold):
    """Objects persist in the package's build/ (also under pip install -e): touching one
    source recompiles that object alone."""
    python, pkg_dir = scaffold
    objects = {p.name: p for p in (pkg_dir / "build").rglob("*.o")}
    ort_obj, torch_obj = objects[f"{NAME}_ort.o"], objects[f"{NAME}_torch.o"]
    before = {ort_obj: ort_obj.stat().st_mtime_ns, torch_obj: torch_obj.stat().st_mtime_ns}
    (pkg_dir / "src" / PKG / "csrc" / f"{NAME}_ort.cc").touch()
    env = dict(os.environ, OPFORGE_CUDA="1" if _nvcc() else "0")
    build = _run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", str(pkg_dir)],
                 cwd=pkg_dir.parent, env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert ort_obj.stat().st_mtime_ns > before[ort_obj], "the touched source was not recompiled"
    assert torch_obj.stat().st_mtime_ns == before[torch_obj], "an untouched source was recompiled"


def test_info_lists_the_new_op_and_its_library(scaffold):
    """`opforge info` finds installed packages through their entry points (opforge.extensions,
    opforge.ort_libraries) and lists their ops and libraries beside the built-in ones."""
    python, pkg_dir = scaffold
    info = _run([python, "-m", "opforge", "info"], cwd=pkg_dir.parent)
    assert info.returncode == 0, info.stderr
    assert f"op             {DOMAIN}::{NAME} v1: torch.ops.{PKG}.{NAME} ({PKG}::{NAME}(Tensor x, float alpha)" in info.stdout
    assert f"ORT library    {DOMAIN}: {pkg_dir / 'src' / PKG / f'lib{PKG}_ort.so'}" in info.stdout
    assert "op             opforge::my_add" in info.stdout and "could not load" not in info.stdout


def test_new_op_cli_errors_are_clear(tmp_path):
    not_empty = tmp_path / "taken"
    not_empty.mkdir()
    (not_empty / "file.txt").write_text("x")
    for args, words in (
        (["new-op", NAME, "--package", PKG, "--dir", str(not_empty)], "exists and is not empty"),
        (["new-op", "Bad-Name", "--package", PKG, "--dir", str(tmp_path / "a")], "must be a Python identifier"),
        (["new-op", NAME, "--package", "opforge", "--dir", str(tmp_path / "b")], "clash"),
        (["new-op", NAME, "--package", PKG, "--domain", "ai.onnx", "--dir", str(tmp_path / "c")], "choose your own"),
    ):
        run = run_python(["-m", "opforge", *args], cwd=tmp_path)
        assert run.returncode == 1 and words in run.stderr, (args, run.stderr)
    assert not (tmp_path / "a").exists()
