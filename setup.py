"""Builds opforge's four native libraries, with the same helpers (opforge/build.py) a
package uses for its own ops:

* ``opforge/libopforge_torch.so``: the torch ops (``torch.ops.opforge.*``, CPU kernels) on
  LibTorch's stable ABI: one build for every torch >= 2.10, loadable without Python; its CUDA
  kernels in ``libopforge_torch_cuda.so`` when ``OPFORGE_CUDA`` allows and a CUDA toolchain +
  CUDA torch exist.
* ``opforge/ort_kernels/libopforge_ort.so``: the ONNX Runtime custom-op library
  (ORT C/C++ headers only; links neither libonnxruntime nor libtorch).
* ``opforge/ort_kernels/libopforge_mmdeploy.so``: mmdeploy's node forms on opforge's cores,
  a drop-in for mmdeploy's libmmdeploy_onnxruntime_ops.so (same build rules as above).
* ``opforge/ort_kernels/libopforge_aten.so``: ORT kernel for ``org.pytorch.aten::ATen``
  (ATen-fallback nodes), which runs the op through libtorch (links it, found through
  ``$ORIGIN``-relative run paths into the installed torch wheel).

It also copies ORT's headers into the package (``opforge/include/onnxruntime``), so an
installed opforge builds other packages' ORT libraries without fetching anything.

Use ``pip install --no-build-isolation -e .`` or ``python setup.py develop`` (never an
isolated build: it would download torch again); a wheel: ``python -m build --wheel
--no-isolation``. Environment switches: see opforge/build.py (OPFORGE_CUDA=auto|1|0,
CUDA_HOME, TORCH_CUDA_ARCH_LIST, OPFORGE_ORT_INCLUDE_DIR, OPFORGE_DEBUG=1).
"""
import glob
import importlib.util
import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

ROOT = os.path.dirname(os.path.abspath(__file__))


def _load_build_helpers():
    # By path: importing the opforge package would need the extension this builds.
    spec = importlib.util.spec_from_file_location("_opforge_build", os.path.join(ROOT, "opforge", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


B = _load_build_helpers()
B.resolve_cuda_home()  # before anything imports torch.utils.cpp_extension

# The repo's own header copy (scripts/bootstrap.sh: python opforge/build.py fetch-ort-headers --dest deps/onnxruntime).
REPO_ORT_INCLUDE = os.path.join(ROOT, "deps", "onnxruntime", "include", "onnxruntime")


def rel(*parts):
    return os.path.relpath(os.path.join(ROOT, *parts), ROOT)


def ort_include():
    try:
        return B.ort_include_dir(extra_candidates=[REPO_ORT_INCLUDE])
    except (FileNotFoundError, RuntimeError) as exc:
        sys.exit(str(exc))


def bundle_ort_headers():
    """Copies the ORT headers used for this build into the package (shipped as package data)."""
    src = ort_include()
    dest = os.path.join(ROOT, "opforge", "include", "onnxruntime")
    if os.path.realpath(src) == os.path.realpath(dest):
        return
    os.makedirs(dest, exist_ok=True)
    for header in glob.glob(os.path.join(src, "*.h")):
        target = os.path.join(dest, os.path.basename(header))
        if not os.path.isfile(target) or open(header, "rb").read() != open(target, "rb").read():
            shutil.copy2(header, target)


def torch_library():
    """libopforge_torch.so: the torch ops on LibTorch's stable ABI (loads in every torch >= 2.10, and
    without Python); its CUDA kernels in libopforge_torch_cuda.so beside it, in CUDA builds."""
    csrc = rel("opforge", "ops", "csrc")
    return B.TorchLibrary(
        "opforge.libopforge_torch",
        [os.path.join(csrc, "*.cpp")],
        cuda_sources=[os.path.join(csrc, "cuda", "*.cpp"), os.path.join(csrc, "cuda", "*.cu")],
        include_dirs=[os.path.join(ROOT, csrc)],
    )


def ort_library(name: str, sources: str, cuda_sources: list):
    """An ONNX Runtime custom-op library of opforge/ort_kernels (built on the ORT headers, linking
    neither torch nor onnxruntime): libopforge_ort (opforge's domain) or libopforge_mmdeploy
    (mmdeploy's node forms, a drop-in for libmmdeploy_onnxruntime_ops.so)."""
    csrc = rel("opforge", "ort_kernels", "csrc")
    return B.OrtLibrary(
        f"opforge.ort_kernels.{name}",
        [os.path.join(csrc, sources)],
        cuda_sources=[os.path.join(csrc, c) for c in cuda_sources],
        include_dirs=[os.path.join(ROOT, csrc)],  # absolute: ninja runs elsewhere
        ort_include_candidates=[REPO_ORT_INCLUDE],
    )


def aten_library():
    """libopforge_aten.so: org.pytorch.aten::ATen for ORT, through libtorch (which it links)."""
    from setuptools import Extension
    from torch.utils import cpp_extension

    name = "opforge.ort_kernels.libopforge_aten"
    lib_dirs = cpp_extension.library_paths()
    cuda_libs, cuda_flags, cuda_link, include_dirs = [], [], [], []
    if B.cuda_enabled():
        # CUDA EP variant: c10_cuda for streams; torch_cuda so ATen's CUDA kernels are
        # registered in the dispatcher (nothing references it directly, hence no-as-needed).
        cuda_libs, cuda_flags, include_dirs = ["c10_cuda"], ["-DOPFORGE_WITH_CUDA"], B.cuda_include_dirs()
        cuda_link = ["-Wl,--no-as-needed", "-ltorch_cuda", "-Wl,--as-needed"]
    ext = Extension(
        name,
        sources=sorted(glob.glob(os.path.join(rel("opforge", "aten", "csrc"), "*.cc"))),
        # the allow-list and the argument guards it includes: a change to either rebuilds it
        depends=sorted(glob.glob(os.path.join(rel("opforge", "aten", "csrc"), "*.inc")) +
                       glob.glob(os.path.join(rel("opforge", "aten", "csrc"), "*.h"))),
        include_dirs=[str(B.CSRC_DIR), ort_include(), *cpp_extension.include_paths(), *include_dirs],
        library_dirs=lib_dirs,
        libraries=["c10", "torch_cpu"] + cuda_libs,  # not torch_python: any ORT process, no Python needed
        language="c++",
        extra_compile_args=B.ort_cxx_flags("c++20") + cuda_flags,
        # -z nodelete: never unloaded (ORT dlcloses a library with the last session options that
        # registered it), because libtorch keeps pointers into it: the budgeted CPU allocator it
        # installs (csrc/aten_guards.h) and the storages that allocator made.
        extra_link_args=[f"-Wl,--version-script={B.ORT_EXPORTS_MAP}", "-Wl,-z,nodelete", *B.rpath_flags(lib_dirs, name),
                         *cuda_link, *B.sanitizer_flags()],
        py_limited_api=False,
    )
    ext.opforge_plain_library = True
    # The torch it is built against, beside it: opforge refuses it under any other torch
    # (opforge/ort_kernels/libraries.py, _aten_library).
    import torch

    stamp = os.path.join(ROOT, "opforge", "ort_kernels", "libopforge_aten.so.torch")
    if not os.path.isfile(stamp) or open(stamp).read().strip() != torch.__version__:
        with open(stamp, "w") as f:
            f.write(torch.__version__ + "\n")
    return ext


class BuildPyWithOrtHeaders(build_py):
    def run(self):
        bundle_ort_headers()
        super().run()


class DevelopNoIsolation(develop):
    """`setup.py develop` = editable pip install WITHOUT build isolation.

    Recent setuptools turned `develop` into `pip install -e .`, which builds in an
    isolated env and would download torch again; reuse the installed one.
    """

    def run(self):
        import subprocess

        cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "-e", ROOT]
        if self.no_deps:
            cmd.append("--no-deps")
        subprocess.check_call(cmd)


bundle_ort_headers()
setup(
    ext_modules=[
        torch_library(),
        ort_library("libopforge_ort", "*.cc", ["cuda/*.cc", "cuda/*.cu"]),
        # its CUDA EP kernels, and the shared cores' CUDA kernels (the same nvcc unit as libopforge_ort's)
        ort_library("libopforge_mmdeploy", "mmdeploy/*.cc", ["mmdeploy/cuda/*.cc", "cuda/kernels.cu"]),
        aten_library(),
    ],
    cmdclass={"build_ext": B.build_ext(), "build_py": BuildPyWithOrtHeaders, "develop": DevelopNoIsolation},
)
