"""One build of opforge for every torch from 2.10 on: this checkout's build (made with this venv's
torch, 2.14.1), unchanged (its libraries' hashes are compared before and after), runs in throwaway
venvs with other torch versions: every op's values and float64 gradients against its reference,
opcheck, both exporters -> ONNX Runtime (opforge.testing's op checks, the same tests as here), the
stable-ABI library's own tests, and a package `opforge new-op` generated and built here, with its
own tests.

CI runs torch 2.10.0 (the oldest the stable ABI targets) in the slow tier. All three:

    OPFORGE_TORCH_MATRIX=2.10.0,2.12.1,2.15.0 bash scripts/run_tests.sh tests/test_torch_matrix.py

(torch wheels are CUDA builds, 5-7 GB a venv; uv links them from its cache: ~70 s cold, ~1 s warm.)"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opforge
from helpers import cached_venv

ROOT = Path(__file__).resolve().parents[1]
VENV_ROOT = ROOT / "build" / "torch-venvs"

#: torch -> the torchvision built for it (None: none on the index yet; the checks that need
#: torchvision as a reference then do not run there).
TORCHVISION = {"2.10.0": "0.25.0", "2.11.0": "0.26.0", "2.12.1": "0.27.1", "2.13.0": "0.28.0", "2.15.0": None}
VERSIONS = [v.strip() for v in os.environ.get("OPFORGE_TORCH_MATRIX", "2.10.0").split(",") if v.strip()]
# The pinned rest of the stack (requirements.txt's own pins), so a difference is torch's alone.
STACK = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
         if line.split("==")[0].strip() in ("numpy", "onnx", "onnxruntime", "onnxscript", "onnx_ir", "pytest")]

#: The checks run there: every op's opforge.testing checks (opcheck, gradcheck in float64, values
#: against the reference, both exporters -> ORT, bad inputs), the stable library's tests,
#: torch.compile(fullgraph=True), an AOTInductor package on the C-shim route, and the hostile-model
#: and guard tests of the ATen fallback, whose libopforge_aten.so is built there for that torch
#: first (`opforge build-aten`: it links libtorch's C++ API, the one library that has no stable ABI).
COMPAT_TESTS = [
    "tests/test_check_op.py::test_my_add", "tests/test_check_op.py::test_deform_conv2d",
    "tests/test_ms_deform_attn.py::test_check_op", "tests/test_roi_align_rotated.py::test_check_op",
    "tests/test_nms_rotated.py::test_check_op_nms_rotated", "tests/test_nms_rotated.py::test_check_op_batched_nms_rotated",
    "tests/test_torch_library.py", "tests/test_torch_compile.py", "tests/test_aten_hostile.py", "tests/test_aten_guards.py",
    "tests/test_aoti.py::test_c_shim_package_in_this_torch",
]
NEEDS_TORCHVISION = {"tests/test_roi_align_rotated.py::test_check_op", "tests/test_nms_rotated.py::test_check_op_nms_rotated",
                     "tests/test_nms_rotated.py::test_check_op_batched_nms_rotated"}


def _built_libraries(*dirs) -> dict:
    libs = [p for d in (ROOT / "opforge", ROOT / "opforge" / "ort_kernels", *dirs) for p in sorted(d.glob("*.so"))]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in libs}


@pytest.fixture(scope="module")
def new_op_package(tmp_path_factory):
    """A package `opforge new-op` generates, built here (torch 2.14.1), in place: its src/ dir."""
    base = tmp_path_factory.mktemp("matrix_new_op")
    pkg = base / "matrix_ops"
    gen = subprocess.run([sys.executable, "-m", "opforge", "new-op", "swishy", "--package", "matrix_ops", "--domain",
                          "com.example.matrix", "--dir", str(pkg)], cwd=base, capture_output=True, text=True)
    assert gen.returncode == 0, gen.stderr[-3000:]
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=pkg,
                           env={**os.environ, "OPFORGE_CUDA": "0"}, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert (pkg / "src" / "matrix_ops" / "libmatrix_ops_torch.so").is_file()
    return pkg


@pytest.mark.slow
@pytest.mark.xdist_group("torch-matrix")
@pytest.mark.parametrize("version", VERSIONS)
def test_this_build_works_in_another_torch(version, new_op_package):
    if version == torch.__version__.split("+")[0]:
        pytest.skip(f"torch {version} is this venv's: the whole suite is its check")
    if not Path(opforge.__file__).resolve().is_relative_to(ROOT):
        pytest.skip("opforge is not this checkout's build")
    vision = TORCHVISION.get(version)
    requirements = [f"torch=={version}", *STACK] + ([f"torchvision=={vision}"] if vision else [])
    python = cached_venv(VENV_ROOT / f"torch-{version}", requirements, what=f"torch {version}")
    package_libs = new_op_package / "src" / "matrix_ops"
    before = _built_libraries(package_libs)
    assert {"libopforge_torch.so", "libmatrix_ops_torch.so"} <= set(before)
    tests = [t for t in COMPAT_TESTS if vision or t not in NEEDS_TORCHVISION]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{new_op_package / 'src'}", "OPFORGE_TORCH_MATRIX_RUN": version,
           "XDG_CACHE_HOME": str(VENV_ROOT / f"torch-{version}" / "cache")}  # build-aten's build, per venv
    env.pop("PYTEST_XDIST_WORKER", None)
    aten = subprocess.run([python, "-m", "opforge", "build-aten"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert aten.returncode == 0, aten.stdout[-3000:] + aten.stderr[-3000:]
    assert f"/aten/{version}" in aten.stdout, aten.stdout
    run = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", *tests], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=3000)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    print(f"torch {version}: {summary}")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in summary and "failed" not in summary, summary
    # the new-op package's own generated tests (its op end to end), built on torch 2.14.1
    package = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"], cwd=new_op_package,
                             env=env, capture_output=True, text=True, timeout=1800)
    assert package.returncode == 0, package.stdout[-6000:] + package.stderr[-3000:]
    print(f"torch {version}, new-op package: {package.stdout.strip().splitlines()[-1]}")
    assert _built_libraries(package_libs) == before, "the libraries were rebuilt or changed: the matrix must run this build"
