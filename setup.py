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
  OPFORGE_CUDA=auto|1|0   CUDA kernels for the torch extension and the ORT library's
                          CUDAExecutionProvider (default auto: when torch is a CUDA build and
                          nvcc + cuBLAS headers are found; 1: require them; 0: CPU-only, faster builds)
  CUDA_HOME               CUDA toolkit (default: /usr/local/cuda, else the nvcc on PATH)
  TORCH_CUDA_ARCH_LIST    GPU architectures (default without a visible GPU: "8.0;9.0+PTX")
  OPFORGE_ORT_INCLUDE_DIR directory holding onnxruntime_cxx_api.h
  OPFORGE_DEBUG=1         -O0 -g instead of -O3 -g0
"""
import glob
import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.develop import develop

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE_INCLUDE = os.path.join(ROOT, "opforge", "csrc")
ORT_LIB_NAME = "opforge.ort_kernels.libopforge_ort"
ATEN_LIB_NAME = "opforge.ort_kernels.libopforge_aten"
PLAIN_LIBS = (ORT_LIB_NAME, ATEN_LIB_NAME)  # dlopen()ed by ORT, not Python modules
ORT_HEADER = "onnxruntime_cxx_api.h"


def resolve_cuda_home():
    """CUDA_HOME for torch.utils.cpp_extension, which reads it once at import.

    Its own guess takes the parent of `which nvcc`, which is wrong for wrapper
    scripts such as /usr/local/bin/nvcc; prefer /usr/local/cuda, then nvcc's
    real location. Must run before anything imports torch.utils.cpp_extension.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("OPFORGE_CUDA", "auto").lower() in ("0", "off", "false"):
        return
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
        return
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = os.path.realpath(nvcc)
        home = os.path.dirname(os.path.dirname(real))
        if os.path.isdir(os.path.join(home, "include")):
            os.environ["CUDA_HOME"] = home


resolve_cuda_home()


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


def nvidia_dir(*parts):
    """site-packages/nvidia/cu13/<parts>: the CUDA runtime, cuBLAS and headers torch's wheels ship."""
    import torch

    return os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu13", *parts)


def cuda_include_dirs():
    from torch.utils import cpp_extension

    dirs = [os.path.join(cpp_extension.CUDA_HOME, "include")]
    if os.path.isdir(nvidia_dir("include")):
        dirs.append(nvidia_dir("include"))  # cublas_v2.h (not in every toolkit install)
    return dirs


def find_cuda_lib(stem):
    """Full path of a CUDA runtime library (e.g. "libcublas", CUDA 13 or 12): torch's nvidia
    wheels first (what torch and onnxruntime-gpu load at run time), else the toolkit."""
    from torch.utils import cpp_extension

    for d in (nvidia_dir("lib"), os.path.join(cpp_extension.CUDA_HOME or "", "lib64")):
        for name in (f"{stem}.so.13", f"{stem}.so.12", f"{stem}.so"):
            if os.path.isfile(os.path.join(d, name)):
                return os.path.join(d, name)
    return None


_CUDA_DECISION = None


def cuda_wanted():
    """Decides once whether to build CUDA kernels (OPFORGE_CUDA=auto|1|0), and says why."""
    global _CUDA_DECISION
    if _CUDA_DECISION is not None:
        return _CUDA_DECISION
    mode = os.environ.get("OPFORGE_CUDA", "auto").lower()
    if mode in ("0", "off", "false", ""):
        _CUDA_DECISION = False
        return False
    import torch
    from torch.utils import cpp_extension

    missing = []
    if torch.version.cuda is None:
        missing.append(f"torch {torch.__version__} is not a CUDA build")
    if cpp_extension.CUDA_HOME is None or not os.path.isfile(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")):
        missing.append(f"no nvcc (CUDA_HOME={cpp_extension.CUDA_HOME!r})")
    elif not any(os.path.isfile(os.path.join(d, "cublas_v2.h")) for d in cuda_include_dirs()):
        missing.append("no cublas_v2.h (pip nvidia-cublas or a full CUDA toolkit)")
    elif not (find_cuda_lib("libcublas") and find_cuda_lib("libcudart")):
        missing.append("no libcublas / libcudart")
    if missing and mode != "auto":
        sys.exit(f"opforge: OPFORGE_CUDA={mode} but " + "; ".join(missing) + ". Set CUDA_HOME, or OPFORGE_CUDA=0.")
    _CUDA_DECISION = not missing
    if missing:
        print("opforge: building CPU-only (" + "; ".join(missing) + ")", file=sys.stderr)
    else:
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            # No GPU to ask: Ampere + Hopper SASS, and Hopper PTX for newer GPUs to JIT.
            os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
        print(f"opforge: building CUDA kernels (CUDA_HOME={cpp_extension.CUDA_HOME}, "
              f"archs {os.environ.get('TORCH_CUDA_ARCH_LIST', 'of the visible GPUs')})", file=sys.stderr)
    return _CUDA_DECISION


NVCC_FLAGS = ["-O3", "-std=c++17", "-DOPFORGE_WITH_CUDA", "--expt-relaxed-constexpr", "-Xcompiler", "-fvisibility=hidden"]


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
        cuda_dir = rel("opforge", "ops", "csrc", "cuda")
        sources += sorted(glob.glob(os.path.join(cuda_dir, "*.cpp")) + glob.glob(os.path.join(cuda_dir, "*.cu")))
        kwargs["include_dirs"] += cuda_include_dirs()
        return cpp_extension.CUDAExtension(
            "opforge._C",
            sources,
            extra_compile_args={"cxx": cxx + ["-DOPFORGE_WITH_CUDA"], "nvcc": NVCC_FLAGS},
            **kwargs,
        )
    return cpp_extension.CppExtension("opforge._C", sources, extra_compile_args={"cxx": cxx}, **kwargs)


def ort_library():
    csrc = rel("opforge", "ort_kernels", "csrc")
    sources = sorted(glob.glob(os.path.join(csrc, "*.cc")))
    cxx = opt_flags() + ["-std=c++17", "-fvisibility=hidden", "-Wall", "-DORT_API_MANUAL_INIT"]
    link = [f"-Wl,--version-script={os.path.join(csrc, 'exports.map')}", "-Wl,--as-needed"]
    include_dirs = [CORE_INCLUDE, os.path.join(ROOT, csrc), find_ort_include()]  # absolute: ninja runs elsewhere
    if not cuda_wanted():
        return Extension(ORT_LIB_NAME, sources=sources, include_dirs=include_dirs, language="c++",
                         extra_compile_args=cxx, extra_link_args=link, py_limited_api=False)
    # CUDA EP kernels: still no libonnxruntime/libtorch; links the CUDA runtime and
    # cuBLAS dynamically (the same libraries onnxruntime-gpu and torch load), by rpath.
    cuda_dir = os.path.join(csrc, "cuda")
    sources += sorted(glob.glob(os.path.join(cuda_dir, "*.cc")) + glob.glob(os.path.join(cuda_dir, "*.cu")))
    libs = [find_cuda_lib("libcudart"), find_cuda_lib("libcublas")]
    return Extension(
        ORT_LIB_NAME,
        sources=sources,
        include_dirs=include_dirs + cuda_include_dirs(),
        language="c++",
        extra_compile_args={"cxx": cxx + ["-DOPFORGE_WITH_CUDA"], "nvcc": NVCC_FLAGS},
        extra_link_args=link + libs + sorted({f"-Wl,-rpath,{os.path.dirname(lib)}" for lib in libs}),
        py_limited_api=False,
    )


def aten_library():
    """libopforge_aten.so: org.pytorch.aten::ATen for ORT, through libtorch (which it links)."""
    from torch.utils import cpp_extension

    csrc = rel("opforge", "ort_kernels", "aten_csrc")
    lib_dirs = cpp_extension.library_paths()
    cuda_libs, cuda_flags, cuda_link, include_dirs = [], [], [], []
    if cuda_wanted():
        # CUDA EP variant: c10_cuda for streams; torch_cuda so ATen's CUDA kernels are
        # registered in the dispatcher (nothing references it directly, hence no-as-needed).
        cuda_libs, cuda_flags, include_dirs = ["c10_cuda"], ["-DOPFORGE_WITH_CUDA"], cuda_include_dirs()
        cuda_link = ["-Wl,--no-as-needed", "-ltorch_cuda", "-Wl,--as-needed"]
    return Extension(
        ATEN_LIB_NAME,
        sources=sorted(glob.glob(os.path.join(csrc, "*.cc"))),
        include_dirs=[os.path.join(ROOT, "opforge", "ort_kernels", "csrc"), find_ort_include(), *cpp_extension.include_paths(),
                      *include_dirs],
        library_dirs=lib_dirs,
        libraries=["c10", "torch_cpu"] + cuda_libs,  # not torch_python: any ORT process, no Python needed
        language="c++",
        extra_compile_args=opt_flags() + ["-std=c++20", "-fvisibility=hidden", "-Wall", "-DORT_API_MANUAL_INIT"] + cuda_flags,
        extra_link_args=[f"-Wl,--version-script={rel('opforge', 'ort_kernels', 'csrc', 'exports.map')}",
                         *(f"-Wl,-rpath,{d}" for d in lib_dirs), *cuda_link],
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
