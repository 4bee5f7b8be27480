"""The native libraries: what the ORT library exports and links, API-version
negotiation; and (slow) the documented builds from a clean copy: `setup.py develop`, and
a wheel whose libraries load, from a real site-packages layout, in a process without torch."""

import ctypes
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime
import pytest
import torch

import opforge
import opforge.build
from helpers import needed_libraries, run_paths
from preloaded_python import run_command

ROOT = Path(__file__).resolve().parents[1]


def _dynamic_symbols(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_ort_library_exports_only_register_custom_ops():
    assert _dynamic_symbols(opforge.ort_library_path()) == {"RegisterCustomOps"}


def test_ort_library_links_neither_onnxruntime_nor_torch():
    needed = needed_libraries(opforge.ort_library_path())
    assert needed, "readelf found no NEEDED entries at all"
    forbidden = [n for n in needed if any(k in n for k in ("onnxruntime", "torch", "c10", "python"))]
    assert forbidden == [], needed


def _cuda_companion(path) -> Path:
    path = Path(path)
    return path.with_name(path.stem + "_cuda.so")


def test_cuda_build_as_requested_and_linked_as_designed():
    """OPFORGE_CUDA=1 (what CI sets where nvcc exists) must give CUDA kernels, so a CUDA
    build break cannot land; with them, the torch extension links torch's CUDA libraries,
    and the ORT library's CUDA EP kernels sit in a companion beside it that links the CUDA
    runtime and cuBLAS, while the library users register links no CUDA library in any
    build, so it loads on a box without CUDA (neither links torch nor onnxruntime)."""
    if os.environ.get("OPFORGE_CUDA") == "1":
        assert opforge.BUILT_WITH_CUDA
    ext_needed = needed_libraries(opforge.torch_library_path())
    torch_companion = _cuda_companion(opforge.torch_library_path())
    ort_needed = needed_libraries(opforge.ort_library_path())
    companion = _cuda_companion(opforge.ort_library_path())
    assert not any("cuda" in n or "cublas" in n for n in ort_needed), ort_needed
    assert not any("cuda" in n or "cublas" in n for n in ext_needed), ext_needed
    if opforge.BUILT_WITH_CUDA:
        assert "libcudart.so.13" in needed_libraries(torch_companion)
        companion_needed = needed_libraries(companion)
        assert {"libcudart.so.13", "libcublas.so.13"} <= set(companion_needed), companion_needed
        assert _dynamic_symbols(companion) == {"OpforgeOrtCudaKernelsV3"}
        for op in ("my_add", "deform_conv2d", "_deform_conv2d_backward"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opforge::{op}", "CUDA"), op
    else:
        assert not companion.exists()


def test_a_companion_of_another_build_is_refused(tmp_path):
    """Library and CUDA companion carry their build's id (opforge_ort_build_id.h, a hash of their
    sources and flags); the library refuses a companion of another build and says so, instead of
    running another build's kernels. A real companion of another build: libopforge_mmdeploy's,
    under libopforge_ort's companion name."""
    if not opforge.BUILT_WITH_CUDA:
        pytest.skip("a CPU-only build has no CUDA companion (CI builds with CUDA where nvcc is)")
    shutil.copy2(opforge.ort_library_path(), tmp_path / "libopforge_ort.so")
    shutil.copy2(_cuda_companion(opforge.ort_library_path()), tmp_path / "libopforge_ort_cuda.so")
    child = ("import sys, onnxruntime as ort\nso = ort.SessionOptions()\nso.register_custom_ops_library(sys.argv[1])\n"
             "print(so.get_session_config_entry('opforge.cuda_kernels.libopforge_ort'))")

    def status():
        proc = subprocess.run([sys.executable, "-c", child, str(tmp_path / "libopforge_ort.so")], capture_output=True,
                              text=True, env=dict(os.environ, OPFORGE_ORT_CUDA="always"), cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip()

    assert status().startswith("loaded: "), status()  # the pair of one build
    shutil.copy2(_cuda_companion(opforge.mmdeploy_library_path()), tmp_path / "libopforge_ort_cuda.so")
    refused = status()
    assert refused.startswith("unavailable: libopforge_ort's CUDA kernels could not be loaded: the companion is from "
                              "another build (build id "), refused


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


# ---- slow: the documented builds, each from a clean copy of the repository -----------


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


def _ort_include() -> str:
    repo = ROOT / "deps" / "onnxruntime" / "include" / "onnxruntime"  # scripts/bootstrap.sh
    return str(repo) if repo.is_dir() else opforge.build.ort_include_dir(fetch=False)


def _build_env(cuda: str) -> dict:
    """OPFORGE_CUDA is set by each test, never inherited from the caller's environment."""
    return dict(os.environ, OPFORGE_CUDA=cuda, OPFORGE_ORT_INCLUDE_DIR=_ort_include())


def _nvcc_exists() -> bool:
    return os.path.isfile("/usr/local/cuda/bin/nvcc") or shutil.which("nvcc") is not None


def _ldd(path, env=None) -> dict[str, str]:
    """soname -> where the dynamic loader finds it (or "not found"), for the library and its dependencies."""
    out = subprocess.run(["ldd", str(path)], check=True, capture_output=True, text=True, env=env).stdout
    found = {}
    for line in out.splitlines():
        if "=>" in line:
            name, where = (part.strip() for part in line.split("=>", 1))
            found[name] = where.rsplit(" (", 1)[0].strip()
    return found


def _env_without_library_path() -> dict:
    """Libraries must be found through their run paths, not through LD_LIBRARY_PATH."""
    return {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


@pytest.mark.slow
def test_setup_py_develop_builds_everything(tmp_path):
    src, venv = _clean_copy(tmp_path), _scratch_venv(tmp_path)
    python = str(venv / "bin" / "python")
    ort_kernels = src / "opforge" / "ort_kernels"
    # What an earlier CUDA build left: a build without CUDA must not leave it beside its library.
    stale = ort_kernels / "libopforge_ort_cuda.so"
    stale.write_bytes(b"an earlier build's companion")
    start = time.monotonic()
    build = subprocess.run([python, "setup.py", "develop"], cwd=src, env=_build_env("0"), capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(f"setup.py develop (OPFORGE_CUDA=0): {time.monotonic() - start:.0f} s")
    assert not stale.exists(), "the stale CUDA companion is still beside the CPU-only library"
    assert (ort_kernels / "libopforge_ort.so").is_file() and (ort_kernels / "libopforge_aten.so").is_file()
    assert (src / "opforge" / "libopforge_torch.so").is_file()
    # In place, beside the sources: libtorch is found through the absolute run path.
    missing = {n: w for n, w in _ldd(ort_kernels / "libopforge_aten.so", _env_without_library_path()).items()
               if w == "not found"}
    assert not missing, missing
    check = subprocess.run(
        [python, "-c", "import opforge, torch, numpy as np; from onnx import TensorProto;"
         "print(opforge.__file__, opforge.ort_library_path(), opforge.BUILT_WITH_CUDA, "
         "opforge.my_add(torch.ones(2), torch.ones(2)).tolist())"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    module_file, lib_path, with_cuda, value = check.stdout.split(" ", 3)
    assert module_file.startswith(str(src)) and lib_path.startswith(str(src))
    assert with_cuda == "False"
    assert value.strip() == "[3.0, 3.0]"


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory):
    """A wheel built from this checkout (a CUDA build where nvcc and a CUDA torch exist, so the
    CUDA link is checked wherever it can be), installed into a scratch site-packages laid out
    like a real one: opforge from the wheel, everything else (torch, nvidia, onnxruntime,
    numpy, onnx ...) symlinked from this venv's site-packages.

    Built here rather than in a clean copy: the objects of this checkout's own build (same
    configuration in CI, which starts from a clean clone) are reused, about 12 s instead of
    about 3 minutes; a from-scratch build of a clean copy is test_setup_py_develop_builds_everything."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = ROOT
    cuda = "1" if _nvcc_exists() and torch.version.cuda else "0"
    start = time.monotonic()
    build = run_command([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                         str(tmp / "dist"), "."], cwd=src, env=_build_env(cuda))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(f"wheel build (OPFORGE_CUDA={cuda}): {time.monotonic() - start:.0f} s")
    (wheel,) = (tmp / "dist").glob("opforge-*.whl")
    site = tmp / "site-packages"
    install = run_command([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--no-compile", "--target", str(site), str(wheel)])
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    main_site = Path(torch.__file__).resolve().parents[1]
    for entry in main_site.iterdir():
        if entry.name.startswith(("opforge", "__editable__", "__pycache__")) or entry.suffix == ".pth":
            continue
        if not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    ort_kernels = site / "opforge" / "ort_kernels"
    ext = site / "opforge" / "libopforge_torch.so"
    return SimpleNamespace(src=src, wheel=wheel, site=site, cuda=cuda == "1", ext=ext,
                           ort=ort_kernels / "libopforge_ort.so", ort_cuda=ort_kernels / "libopforge_ort_cuda.so",
                           aten=ort_kernels / "libopforge_aten.so")


@pytest.mark.slow
def test_wheel_ships_libraries_and_headers(wheel_install):
    names = set(zipfile.ZipFile(wheel_install.wheel).namelist())
    src = wheel_install.src
    expected = {
        "opforge/ort_kernels/libopforge_ort.so", "opforge/ort_kernels/libopforge_aten.so",
        "opforge/ort_kernels/libopforge_mmdeploy.so",
        "opforge/csrc/opforge/ort_op.h", "opforge/csrc/opforge/torch_op.h", "opforge/csrc/core/half.h",
        "opforge/csrc/core/cuda/kernels.cuh", "opforge/csrc/opforge/ort_exports.map",
        "opforge/include/onnxruntime/onnxruntime_cxx_api.h", "opforge/include/onnxruntime/onnxruntime_lite_custom_op.h",
    }
    expected |= {f.relative_to(src).as_posix() for f in (src / "opforge" / "csrc").rglob("*")
                 if f.suffix in (".h", ".cuh", ".map")}
    expected |= {f"opforge/include/onnxruntime/{h.name}" for h in Path(_ort_include()).glob("*.h")}
    expected |= {f.relative_to(src).as_posix() for f in (src / "opforge" / "templates").rglob("*") if f.is_file()}
    assert sorted(expected - names) == []
    assert "opforge/libopforge_torch.so" in names, sorted(names)
    assert ("opforge/ort_kernels/libopforge_ort_cuda.so" in names) == wheel_install.cuda
    assert ("opforge/ort_kernels/libopforge_mmdeploy_cuda.so" in names) == wheel_install.cuda
    assert not [n for n in names if n.endswith((".o", ".ninja"))]


def _build_machine_paths(*roots) -> list[bytes]:
    """The directories of the build machine a shipped file must not name: the build copy,
    this venv (its site-packages holds torch's headers) and the Python it was made from."""
    paths = {os.path.realpath(r) for r in roots} | {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
                                                    os.path.realpath(sysconfig.get_paths()["purelib"])}
    return sorted(p.encode() + b"/" for p in paths if p not in ("/", "/usr", "/usr/local"))


def _files_naming(wheel: Path, paths: list[bytes]) -> dict[str, list[str]]:
    hits = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            data = z.read(name)
            found = [p.decode() for p in paths if p in data]
            if found:
                hits[name] = found
    return hits


@pytest.mark.slow
def test_wheel_files_name_no_build_machine_path(wheel_install):
    """No shipped file (libraries: __FILE__ of torch's and our checks, debug info; headers,
    Python, metadata) names the build copy, the builder's venv or its Python:
    opforge.build maps those prefixes away (-ffile-prefix-map)."""
    paths = _build_machine_paths(wheel_install.src)
    assert _files_naming(wheel_install.wheel, paths) == {}


@pytest.mark.slow
def test_wheel_libraries_have_no_build_time_run_paths(wheel_install):
    """No run path into the build copy, a temporary directory, a pip build env or the builder's
    venv (absolute run paths are for in-place/editable builds only); the ORT
    libraries find what they link outside the package relative to themselves ($ORIGIN),
    first, as torch's wheels lay it out (site-packages/torch/lib, site-packages/nvidia/cu13/lib)."""
    w = wheel_install
    temp_roots = {os.path.realpath(tempfile.gettempdir()), tempfile.gettempdir(), str(w.src), os.path.realpath(w.src)}
    for lib in (w.ext, w.ort, w.aten) + ((w.ort_cuda,) if w.cuda else ()):
        entries = run_paths(lib)
        bad = [e for e in entries if "pip-build-env" in e or any(e == r or e.startswith(r + os.sep) for r in temp_roots)]
        assert bad == [], (lib.name, entries)
        # only $ORIGIN-relative entries: a wheel never reaches into the builder's environment
        assert all(e.startswith("$ORIGIN/") for e in entries), (lib.name, entries)
    aten_paths = run_paths(w.aten)
    assert aten_paths and aten_paths[0] == "$ORIGIN/../../torch/lib", aten_paths
    ort_needed, ort_paths = needed_libraries(w.ort), run_paths(w.ort)
    assert not [n for n in ort_needed if any(k in n for k in ("onnxruntime", "torch", "c10", "python"))], ort_needed
    assert not [n for n in ort_needed if "cuda" in n or "cublas" in n], ort_needed
    assert ort_paths == [], ort_paths  # needs nothing outside the system's libraries, in every build
    if w.cuda:
        cuda_needed, cuda_paths = needed_libraries(w.ort_cuda), run_paths(w.ort_cuda)
        assert {"libcudart.so.13", "libcublas.so.13"} <= set(cuda_needed), cuda_needed
        assert cuda_paths and cuda_paths[0] == "$ORIGIN/../../nvidia/cu13/lib", cuda_paths


@pytest.mark.slow
def test_wheel_libraries_resolve_from_the_site_packages_layout(wheel_install):
    """ldd, without LD_LIBRARY_PATH: nothing missing, and libtorch (libopforge_aten) and the
    CUDA runtime + cuBLAS (libopforge_ort, CUDA build) are found next to the install, i.e.
    through the $ORIGIN-relative run path."""
    w = wheel_install
    env = _env_without_library_path()
    libs = [(w.aten, ["libc10.so", "libtorch_cpu.so"]), (w.ort, [])]
    if w.cuda:
        libs.append((w.ort_cuda, ["libcudart.so.13", "libcublas.so.13"]))
    for lib, outside in libs:
        found = _ldd(lib, env)
        assert not [n for n, where in found.items() if where == "not found"], (lib.name, found)
        for name in outside:
            assert found.get(name, "").startswith(str(w.site) + os.sep), (lib.name, name, found.get(name))


@pytest.mark.slow
def test_wheel_ort_libraries_run_in_a_process_without_torch(wheel_install):
    """Only the scratch site-packages on sys.path (python -I -S), never `import torch`:
    libopforge_ort runs my_add (a CUDA build too: CPU kernels in a CPU-only ORT; its CUDA
    companion, loaded on request, finds the CUDA runtime through $ORIGIN), libopforge_aten
    runs aten::cummax through libtorch."""
    w = wheel_install
    script = textwrap.dedent(
        f"""
        import site, sys
        site.addsitedir({str(w.site)!r})
        import numpy as np, onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
        assert ort.__file__.startswith({str(w.site)!r}), ort.__file__

        def session(model, lib):
            so = ort.SessionOptions()
            so.register_custom_ops_library(lib)
            return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

        node = helper.make_node("my_add", ["A", "B"], ["C"], domain="opforge")
        graph = helper.make_graph([node], "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "AB"],
            [helper.make_tensor_value_info("C", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("opforge", 1)])
        a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)
        (c,) = session(model, {str(w.ort)!r}).run(None, {{"A": a, "B": b}})
        assert (c == 2 * a + b).all(), c

        nodes = [helper.make_node("Constant", [], ["dim"], value=numpy_helper.from_array(np.array(1, np.int64))),
                 helper.make_node("ATen", ["x", "dim"], ["v", "i"], domain="org.pytorch.aten", operator="cummax",
                                  overload_name="")]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
             helper.make_tensor_value_info("i", TensorProto.INT64, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("org.pytorch.aten", 1)])
        v, i = session(model, {str(w.aten)!r}).run(None, {{"x": np.array([[1, 3, 2], [0, -1, 5]], np.float32)}})
        assert v.tolist() == [[1, 3, 3], [0, 0, 5]] and i.tolist() == [[0, 1, 1], [0, 0, 2]], (v, i)

        if {w.cuda!r}:  # OPFORGE_ORT_CUDA=always: the companion loads, its CUDA runtime found through $ORIGIN
            so = ort.SessionOptions()
            so.register_custom_ops_library({str(w.ort)!r})
            status = so.get_session_config_entry("opforge.cuda_kernels.libopforge_ort")
            assert status.startswith("loaded: ") and status.endswith({str(w.ort_cuda)!r}), status

        assert "torch" not in sys.modules, "torch got imported"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True,
                         env=dict(_env_without_library_path(), OPFORGE_ORT_CUDA="always"), cwd=w.site.parent)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout[-2000:] + out.stderr[-3000:]


@pytest.mark.slow
def test_wheel_install_is_the_opforge_python_imports(wheel_install):
    w = wheel_install
    script = textwrap.dedent(
        f"""
        import site
        site.addsitedir({str(w.site)!r})
        import numpy as np, torch, opforge
        from onnx import TensorProto, helper
        print(opforge.__file__, opforge.ort_library_path(), opforge.aten_library_path(), opforge.BUILT_WITH_CUDA,
              opforge.my_add(torch.ones(2), torch.ones(2)).tolist())
        """
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True,
                         env=_env_without_library_path(), cwd=w.site.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    module_file, ort_path, aten_path, with_cuda, value = out.stdout.split(" ", 4)
    assert module_file.startswith(str(w.site)), module_file
    assert ort_path == str(w.ort) and aten_path == str(w.aten)
    assert with_cuda == str(w.cuda)
    assert value.strip() == "[3.0, 3.0]"
