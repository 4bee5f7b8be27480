"""Builds opforge's two native libraries.

* ``opforge._C``: the torch extension (TORCH_LIBRARY "opforge" ops, CPU kernels;
  CUDA kernels when ``OPFORGE_CUDA`` allows and a CUDA toolchain + CUDA torch exist).
* ``opforge/ort_kernels/libopforge_ort.so``: the ONNX Runtime custom-op library
  (ORT C/C++ headers only; links neither libonnxruntime nor libtorch).
* ``opforge/ort_kernels/libopforge_aten.so``: ORT kernel for ``org.pytorch.aten::ATen``
  (ATen-fallback nodes), which runs the op through libtorch (links it, rpath to torch/lib).

Both share the header-only compute cores in ``opforge/csrc/core``.

Use ``pip install --no-build-isolation -e .`` or ``python setup.py develop``
(never an isolated build: it would download torch again).

Environment switches:
  OPFORGE_CUDA=0|1|auto   compile CUDA sources (default 0: CPU-only, fast builds)
  OPFORGE_ORT_INCLUDE_DIR directory holding onnxruntime_cxx_api.h
  OPFORGE_DEBUG=1         -O0 -g instead of -O3 -g0
"""
import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.develop import develop

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_INCLUDE = os.path.join(ROOT, "opforge", "csrc")
ORT_LIB_NAME = "opforge.ort_kernels.libopforge_ort"
ATEN_LIB_NAME = "opforge.ort_kernels.libopforge_aten"
PLAIN_LIBS = (ORT_LIB_NAME, ATEN_LIB_NAME)  # dlopen()ed by ORT, not Python modules
ORT_HEADER = "onnxruntime_cxx_api.h"


def rel(*parts):
    return os.path.relpath(os.path.join(ROOT, *parts), ROOT)


def find_ort_include():
    """The ORT header dir: explicit env var, project deps (scripts/fetch_ort_headers.sh), system installs."""
    explicit = os.environ.get("OPFORGE_ORT_INCLUDE_DIR")
    if explicit:
        if not os.path.isfile(os.path.join(explicit, ORT_HEADER)):
            sys.exit(f"opforge: OPFORGE_ORT_INCLUDE_DIR={explicit} has no {ORT_HEADER}")
        return explicit
    candidates = [
        os.path.join(ROOT, "deps", "onnxruntime", "include", "onnxruntime"),
        "/usr/include/onnxruntime",
        "/usr/local/include/onnxruntime",
        "/usr/local/include",
    ]
    for c in candidates:
        if os.path.isfile(os.path.join(c, ORT_HEADER)) and os.path.isfile(
            os.path.join(c, "onnxruntime_lite_custom_op.h")
        ):
            return c
    sys.exit(
        "opforge: ONNX Runtime C/C++ headers (onnxruntime_cxx_api.h, onnxruntime_lite_custom_op.h, "
        "ORT >= 1.21) not found in " + ", ".join(candidates) + ".\n"
        "  Fetch them with:  bash scripts/fetch_ort_headers.sh   (puts them in deps/onnxruntime)\n"
        "  or point OPFORGE_ORT_INCLUDE_DIR at a directory containing onnxruntime_cxx_api.h."
    )


def cuda_wanted():
    mode = os.environ.get("OPFORGE_CUDA", "0").lower()
    if mode in ("0", "off", "false", ""):
        return False
    import torch
    from torch.utils import cpp_extension

    have = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if mode == "auto":
        return have
    if not have:
        sys.exit(
            f"opforge: OPFORGE_CUDA={mode} but torch.version.cuda={torch.version.cuda!r}, "
            f"CUDA_HOME={cpp_extension.CUDA_HOME!r}; set CUDA_HOME (e.g. /usr/local/cuda) or OPFORGE_CUDA=0"
        )
    return True


def opt_flags():
    return ["-O0", "-g"] if os.environ.get("OPFORGE_DEBUG") == "1" else ["-O3", "-g0"]


def torch_extension():
    from torch.utils import cpp_extension

    sources = sorted(glob.glob(rel("opforge", "ops", "csrc", "*.cpp")))
    cxx = opt_flags() + ["-fopenmp", "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas"]
    # at::parallel_for is an inline OpenMP region: without -fopenmp it runs serially.
    # The runtime libgomp is the one torch already loaded (same SONAME).
    kwargs = dict(
        include_dirs=[CORE_INCLUDE, os.path.join(ROOT, "opforge", "ops", "csrc")],
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )
    if cuda_wanted():
        sources += sorted(glob.glob(rel("opforge", "ops", "csrc", "cuda", "*.cu")))
        import torch

        nvidia_inc = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu13", "include")
        if os.path.isdir(nvidia_inc):
            kwargs["include_dirs"].append(nvidia_inc)
        return cpp_extension.CUDAExtension(
            "opforge._C",
            sources,
            extra_compile_args={
                "cxx": cxx + ["-DOPFORGE_WITH_CUDA"],
                "nvcc": ["-O3", "-DOPFORGE_WITH_CUDA", "--expt-relaxed-constexpr"],
            },
            **kwargs,
        )
    return cpp_extension.CppExtension("opforge._C", sources, extra_compile_args={"cxx": cxx}, **kwargs)


def ort_library():
    csrc = rel("opforge", "ort_kernels", "csrc")
    return Extension(
        ORT_LIB_NAME,
        sources=sorted(glob.glob(os.path.join(csrc, "*.cc"))),
        include_dirs=[CORE_INCLUDE, find_ort_include()],
        language="c++",
        extra_compile_args=opt_flags() + ["-std=c++17", "-fvisibility=hidden", "-Wall", "-DORT_API_MANUAL_INIT"],
        extra_link_args=[f"-Wl,--version-script={os.path.join(csrc, 'exports.map')}", "-Wl,--as-needed"],
        py_limited_api=False,
    )


def aten_library():
    """libopforge_aten.so: org.pytorch.aten::ATen for ORT, through libtorch (which it links)."""
    from torch.utils import cpp_extension

    csrc = rel("opforge", "ort_kernels", "aten_csrc")
    lib_dirs = cpp_extension.library_paths()
    return Extension(
        ATEN_LIB_NAME,
        sources=sorted(glob.glob(os.path.join(csrc, "*.cc"))),
        include_dirs=[os.path.join(ROOT, "opforge", "ort_kernels", "csrc"), find_ort_include(), *cpp_extension.include_paths()],
        library_dirs=lib_dirs,
        libraries=["c10", "torch_cpu"],  # not torch_python: usable by any ORT process, no Python needed
        language="c++",
        extra_compile_args=opt_flags() + ["-std=c++20", "-fvisibility=hidden", "-Wall", "-DORT_API_MANUAL_INIT"],
        extra_link_args=[f"-Wl,--version-script={rel('opforge', 'ort_kernels', 'csrc', 'exports.map')}",
                         *(f"-Wl,-rpath,{d}" for d in lib_dirs)],
        py_limited_api=False,
    )


def make_build_ext():
    from torch.utils.cpp_extension import BuildExtension

    class OpforgeBuildExt(BuildExtension):
        """torch's BuildExtension (ninja, ABI flags) plus a plain-named ORT library."""

        def get_ext_filename(self, fullname):
            # A dlopen()ed library, not a Python module: no ABI suffix. distutils
            # asks with the full dotted name and with just the last component.
            for lib in PLAIN_LIBS:
                if fullname == lib or fullname == lib.rsplit(".", 1)[1]:
                    return os.path.join(*fullname.split(".")) + ".so"
            return super().get_ext_filename(fullname)

        def get_export_symbols(self, ext):
            return [] if ext.name in PLAIN_LIBS else super().get_export_symbols(ext)

    return OpforgeBuildExt.with_options(use_ninja=True)


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


setup(
    ext_modules=[torch_extension(), ort_library(), aten_library()],
    cmdclass={"build_ext": make_build_ext(), "develop": DevelopNoIsolation},
)
