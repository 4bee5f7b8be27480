"""The native libraries: what the ORT library exports and links, API-version
negotiation, and that both documented build commands build everything from a clean copy."""

import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import opforge

ROOT = Path(__file__).resolve().parents[1]


def _dynamic_symbols(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def _needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def test_ort_library_exports_only_register_custom_ops():
    assert _dynamic_symbols(opforge.ort_library_path()) == {"RegisterCustomOps"}


def test_ort_library_links_neither_onnxruntime_nor_torch():
    needed = _needed(opforge.ort_library_path())
    assert needed, "readelf found no NEEDED entries at all"
    forbidden = [n for n in needed if any(k in n for k in ("onnxruntime", "torch", "c10", "python"))]
    assert forbidden == [], needed


def test_cuda_build_as_requested_and_linked_as_designed():
    """OPFORGE_CUDA=1 (what CI sets where nvcc exists) must give CUDA kernels, so a CUDA
    build break cannot land; with them, the torch extension links torch's CUDA libraries
    and the ORT library the CUDA runtime and cuBLAS (still no torch, no onnxruntime)."""
    if os.environ.get("OPFORGE_CUDA") == "1":
        assert opforge.BUILT_WITH_CUDA
    ext_needed = _needed(opforge._C.__file__)
    ort_needed = _needed(opforge.ort_library_path())
    if opforge.BUILT_WITH_CUDA:
        assert any("c10_cuda" in n for n in ext_needed), ext_needed
        assert any(n.startswith("libcudart.so") for n in ort_needed), ort_needed
        assert any(n.startswith("libcublas.so") for n in ort_needed), ort_needed
        for op in ("my_add", "deform_conv2d", "_deform_conv2d_backward"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", "CUDA"), op
    else:
        assert not any("cuda" in n or "cublas" in n for n in ext_needed + ort_needed), (ext_needed, ort_needed)


def test_ort_library_with_cuda_kernels_serves_cpu_sessions():
    """The CUDA EP kernels sit in the same domain as the CPU ones; a CPU-only runtime
    (this onnxruntime wheel) must still load the library and run the CPU kernels."""
    from onnx import TensorProto

    from helpers import single_node_model

    sess = opforge.ort_session(single_node_model("my_add", [TensorProto.FLOAT, TensorProto.FLOAT]))
    out = sess.run(None, {"I0": np.ones((2, 3), np.float32), "I1": np.arange(3, dtype=np.float32)})[0]
    np.testing.assert_array_equal(out, np.array([[2, 3, 4], [2, 3, 4]], np.float32))


def test_ort_library_works_without_torch_in_the_process():
    script = textwrap.dedent(
        f"""
        import sys, numpy as np, onnxruntime as ort
        from onnx import helper, TensorProto
        node = helper.make_node("my_add", ["A", "B"], ["C"], domain="opforge")
        graph = helper.make_graph([node], "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "AB"],
            [helper.make_tensor_value_info("C", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("opforge", 1)])
        so = ort.SessionOptions()
        so.register_custom_ops_library({opforge.ort_library_path()!r})
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)
        assert (sess.run(None, {{"A": a, "B": b}})[0] == 2 * a + b).all()
        assert "torch" not in sys.modules, "torch got imported"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


class _OrtApiBase(ctypes.Structure):
    _fields_ = [("GetApi", ctypes.c_void_p), ("GetVersionString", ctypes.c_void_p)]


_GET_API = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
_GET_VERSION = ctypes.CFUNCTYPE(ctypes.c_char_p)


def test_too_old_runtime_gets_a_clear_error_status():
    """Simulate an ORT that only serves API <= 20 (onnxruntime 1.20): RegisterCustomOps must
    return an error status naming the needed version, not crash or register anything."""
    capi = Path(onnxruntime.__file__).parent / "capi"
    real_lib = ctypes.CDLL(str(next(capi.glob("libonnxruntime.so*"))))
    real_lib.OrtGetApiBase.restype = ctypes.POINTER(_OrtApiBase)
    real_base = real_lib.OrtGetApiBase().contents
    real_get_api = _GET_API(real_base.GetApi)

    get_api = _GET_API(lambda version: real_get_api(version) if version <= 20 else None)
    get_version = _GET_VERSION(lambda: b"1.20.0")
    old_base = _OrtApiBase(ctypes.cast(get_api, ctypes.c_void_p), ctypes.cast(get_version, ctypes.c_void_p))

    ours = ctypes.CDLL(opforge.ort_library_path())
    ours.RegisterCustomOps.restype = ctypes.c_void_p
    ours.RegisterCustomOps.argtypes = [ctypes.c_void_p, ctypes.POINTER(_OrtApiBase)]
    status = ours.RegisterCustomOps(None, ctypes.byref(old_base))
    assert status, "expected an error status"

    api = ctypes.cast(real_get_api(1), ctypes.POINTER(ctypes.c_void_p))  # OrtApi: CreateStatus, GetErrorCode, GetErrorMessage, ...
    get_error_code = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(api[1])
    get_error_message = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(api[2])
    release_status = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(api[93])  # OrtApi::ReleaseStatus
    message = get_error_message(status).decode()
    assert get_error_code(status) == 9  # ORT_NOT_IMPLEMENTED
    assert "API version 21" in message and "1.20.0" in message and "upgrade onnxruntime" in message
    release_status(status)


def _scratch_venv(tmp_path: Path) -> Path:
    """A new venv that sees this venv's packages (torch, onnx, ...) through a .pth file,
    so a build there installs opforge into it without touching the main venv."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "opforge_parent_env.pth").write_text(f"{purelib}\n")
    return venv


def _clean_copy(tmp_path: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, check=True,
        capture_output=True, text=True,
    ).stdout.split()
    dest = tmp_path / "src"
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    return dest


# setup.py develop builds like the main build (CUDA where CI has nvcc); the pip build is
# forced CPU-only, which must keep working (OPFORGE_CUDA=0: no nvcc, no CUDA libraries).
BUILD_COMMANDS = [("setup.py develop", None), ("pip install --no-build-isolation -e .", "0")]


@pytest.mark.slow
@pytest.mark.parametrize("command,cuda", BUILD_COMMANDS, ids=[c for c, _ in BUILD_COMMANDS])
def test_documented_build_commands_build_everything(tmp_path, command, cuda):
    src, venv = _clean_copy(tmp_path), _scratch_venv(tmp_path)
    python = str(venv / "bin" / "python")
    env = dict(os.environ, OPFORGE_ORT_INCLUDE_DIR=str(Path(opforge.__file__).parents[1] / "deps/onnxruntime/include/onnxruntime"))
    if cuda is not None:
        env["OPFORGE_CUDA"] = cuda
    args = ["setup.py", "develop"] if command.startswith("setup.py") else ["-m", "pip", "install", "--no-build-isolation", "-e", "."]
    build = subprocess.run([python, *args], cwd=src, env=env, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert (src / "opforge" / "ort_kernels" / "libopforge_ort.so").is_file()
    assert list((src / "opforge").glob("_C*.so"))
    check = subprocess.run(
        [python, "-c", "import opforge, torch, numpy as np; from onnx import TensorProto;"
         "print(opforge.__file__, opforge.ort_library_path(), opforge.BUILT_WITH_CUDA, "
         "opforge.my_add(torch.ones(2), torch.ones(2)).tolist())"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    module_file, lib_path, with_cuda, value = check.stdout.split(" ", 3)
    assert module_file.startswith(str(src)) and lib_path.startswith(str(src))
    assert with_cuda == str(opforge.BUILT_WITH_CUDA if cuda is None else cuda == "1")
    assert value.strip() == "[3.0, 3.0]"
