"""Build helpers for a package's own ops (and opforge's own build): the torch op library (LibTorch's
stable ABI: one build for every torch >= 2.10) and the ONNX Runtime custom-op library, with
opforge's C++ headers, ORT's headers and one CUDA switch.

In a package's ``setup.py``::

    from setuptools import setup
    from opforge.build import OrtLibrary, TorchLibrary, build_ext

    setup(
        ext_modules=[
            TorchLibrary("my_ops.libmy_ops_torch", ["my_ops/csrc/swish_torch.cpp"],
                         cuda_sources=["my_ops/csrc/swish_torch_cuda.cu"]),
            OrtLibrary("my_ops.libmy_ops_ort", ["my_ops/csrc/swish_ort.cc"],
                       cuda_sources=["my_ops/csrc/swish_ort_cuda.cu"]),
        ],
        cmdclass={"build_ext": build_ext()},
    )

Build it with ``pip install --no-build-isolation -e .`` (an isolated build would download
torch again). ``OPFORGE_CUDA=auto|1|0`` decides about ``cuda_sources`` for every library
(auto: when torch is a CUDA build and nvcc + cuBLAS headers exist; 1: required; 0: never);
in a CUDA build ``OPFORGE_WITH_CUDA`` is defined. Objects are kept in ``build/`` and
rebuilt by ninja only when their source or a header it includes changed.

In a notebook, :func:`load` and :func:`load_ort_library` build and load the same sources just
in time. At import, this module imports nothing from the rest of opforge (opforge's own setup.py
loads it by path, before opforge is built).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Sequence

PACKAGE_DIR = Path(__file__).resolve().parent
#: opforge's C++ headers: ``core/`` (compute cores and their utilities) and ``opforge/`` (torch
#: glue, ORT lite-op registration, CUDA-EP stream glue).
CSRC_DIR = PACKAGE_DIR / "csrc"
#: Where opforge's build copies ORT's headers, so installed opforge ships them.
BUNDLED_ORT_INCLUDE = PACKAGE_DIR / "include" / "onnxruntime"
ORT_EXPORTS_MAP = CSRC_DIR / "opforge" / "ort_exports.map"
ORT_CUDA_EXPORTS_MAP = CSRC_DIR / "opforge" / "ort_cuda_exports.map"
ORT_HEADER = "onnxruntime_cxx_api.h"
ORT_LITE_HEADER = "onnxruntime_lite_custom_op.h"
#: The Debian package (trixie: ORT 1.21) fetch_ort_headers takes the headers from.
ORT_HEADERS_DEB = "libonnxruntime-dev"

NVCC_FLAGS = ["-O3", "-std=c++17", "-DOPFORGE_WITH_CUDA", "--expt-relaxed-constexpr", "-Xcompiler",
              "-fvisibility=hidden"]


def _log(msg: str) -> None:
    print(f"opforge.build: {msg}", file=sys.stderr, flush=True)


# ---- ONNX Runtime headers -------------------------------------------------------------


def _has_ort_headers(d) -> bool:
    return d is not None and os.path.isfile(os.path.join(d, ORT_HEADER)) and os.path.isfile(
        os.path.join(d, ORT_LITE_HEADER))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opforge"


def _ort_candidates(extra: Sequence[str] = ()) -> list[str]:
    return [*extra, str(BUNDLED_ORT_INCLUDE), str(cache_dir() / "onnxruntime" / "include" / "onnxruntime"),
            "/usr/include/onnxruntime", "/usr/local/include/onnxruntime"]


def ort_include_dir(*, fetch: bool = True, extra_candidates: Sequence[str] = ()) -> str:
    """The directory holding ORT's C/C++ headers (``onnxruntime_cxx_api.h`` and the lite
    custom-op API, ORT >= 1.21): ``OPFORGE_ORT_INCLUDE_DIR``, else the copy installed with
    opforge, opforge's cache, a system install; else (``fetch=True``) fetched into the cache
    by :func:`fetch_ort_headers`."""
    explicit = os.environ.get("OPFORGE_ORT_INCLUDE_DIR")
    if explicit:
        if not _has_ort_headers(explicit):
            raise FileNotFoundError(f"opforge: OPFORGE_ORT_INCLUDE_DIR={explicit} has no {ORT_HEADER} and "
                                    f"{ORT_LITE_HEADER}")
        return explicit
    for c in _ort_candidates(extra_candidates):
        if _has_ort_headers(c):
            return c
    if fetch:
        return fetch_ort_headers()
    raise FileNotFoundError(
        "opforge: ONNX Runtime C/C++ headers (onnxruntime_cxx_api.h, onnxruntime_lite_custom_op.h, ORT >= 1.21) "
        f"not found in {', '.join(_ort_candidates(extra_candidates))}. Fetch them with `opforge fetch-ort-headers`, "
        "or point OPFORGE_ORT_INCLUDE_DIR at a directory containing onnxruntime_cxx_api.h."
    )


def fetch_ort_headers(dest: Optional[os.PathLike] = None, *, force: bool = False) -> str:
    """Fetches ORT's C/C++ headers (no pip wheel ships them) from Debian trixie's
    ``libonnxruntime-dev`` into ``dest`` (default: opforge's cache) and returns the include
    directory. Uses a private apt state: the system's apt sources are not touched and
    nothing is installed. Needs apt-get and dpkg (Debian/Ubuntu)."""
    dest = Path(dest) if dest is not None else cache_dir() / "onnxruntime"
    include = dest / "include" / "onnxruntime"
    if _has_ort_headers(include) and not force:
        return str(include)
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"opforge fetch-ort-headers: needs {tool} (Debian/Ubuntu); elsewhere get ONNX Runtime's "
                               "headers (e.g. its release archive) and set OPFORGE_ORT_INCLUDE_DIR")
    with tempfile.TemporaryDirectory(prefix="opforge-ort-headers-") as tmp:
        work = Path(tmp)
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        signed = f"[signed-by={keyring}] " if os.path.isfile(keyring) else ""
        (work / "sources.list").write_text(f"deb {signed}http://deb.debian.org/debian trixie main\n")
        opts = ["-o", f"Dir::Etc::SourceList={work / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
                "-o", f"Dir::State::Lists={work / 'lists'}", "-o", f"Dir::Cache={work / 'cache'}",
                "-o", "Dir::State::Status=/dev/null", "-o", "APT::Architecture=amd64", "-o", "Debug::NoLocking=1",
                "-o", "APT::Sandbox::User=root", "-q"]
        _log(f"fetching Debian trixie's {ORT_HEADERS_DEB} (ONNX Runtime 1.21 headers) ...")
        for step in (["update"], ["download", ORT_HEADERS_DEB]):
            run = subprocess.run(["apt-get", *opts, *step], cwd=work, capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(f"opforge fetch-ort-headers: apt-get {step[0]} failed: {run.stderr.strip()[-2000:]}")
        debs = sorted(work.glob(f"{ORT_HEADERS_DEB}_*.deb"))
        if not debs:
            raise RuntimeError(f"opforge fetch-ort-headers: apt-get downloaded no {ORT_HEADERS_DEB} package")
        subprocess.run(["dpkg", "-x", str(debs[0]), str(work / "x")], check=True)
        include.parent.mkdir(parents=True, exist_ok=True)
        if include.exists():
            shutil.rmtree(include)
        shutil.copytree(work / "x" / "usr" / "include" / "onnxruntime", include)
        (dest / "SOURCE").write_text(debs[0].name + "\n")
    _log(f"ONNX Runtime headers in {include} ({debs[0].name})")
    return str(include)


def include_paths(*, ort: bool = True, cuda: bool = False) -> list[str]:
    """Include directories for a package's kernels: opforge's headers (``#include
    "opforge/torch_op.h"``, ``"opforge/ort_op.h"``, ``"core/half.h"`` ...), ORT's headers
    (``ort=True``; fetched if needed) and, with ``cuda=True``, the CUDA toolkit's."""
    return [str(CSRC_DIR)] + ([ort_include_dir()] if ort else []) + (cuda_include_dirs() if cuda else [])


# ---- CUDA -----------------------------------------------------------------------------


def resolve_cuda_home() -> None:
    """Sets CUDA_HOME for torch.utils.cpp_extension, which reads it once at import. Its own
    guess takes the parent of `which nvcc`, wrong for wrapper scripts such as
    /usr/local/bin/nvcc: prefer /usr/local/cuda, then nvcc's real location."""
    if os.environ.get("CUDA_HOME") or cuda_mode() == "0":
        return
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
        return
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        if os.path.isdir(os.path.join(home, "include")):
            os.environ["CUDA_HOME"] = home


def cuda_mode() -> str:
    """``OPFORGE_CUDA``: ``auto`` (default), ``1`` or ``0``."""
    mode = os.environ.get("OPFORGE_CUDA", "auto").strip().lower()
    modes = {**dict.fromkeys(("0", "off", "false", "no", ""), "0"), **dict.fromkeys(("1", "on", "true", "yes"), "1")}
    if mode not in (*modes, "auto"):
        raise ValueError(f"opforge: OPFORGE_CUDA={mode!r}; use auto, 1 or 0")
    return modes.get(mode, "auto")


def _site_packages() -> Path:
    import torch
    return Path(torch.__file__).resolve().parent.parent


def nvidia_dir(*parts: str) -> str:
    """site-packages/nvidia/cu13/<parts>: the CUDA runtime, cuBLAS and headers torch's wheels ship."""
    return str(_site_packages().joinpath("nvidia", "cu13", *parts))


def cuda_include_dirs() -> list[str]:
    resolve_cuda_home()
    from torch.utils import cpp_extension

    dirs = [os.path.join(cpp_extension.CUDA_HOME or "/usr/local/cuda", "include")]
    if os.path.isdir(nvidia_dir("include")):
        dirs.append(nvidia_dir("include"))  # cublas_v2.h (not in every toolkit install)
    return dirs


def find_cuda_lib(stem: str) -> Optional[str]:
    """Full path of a CUDA runtime library (``libcublas``, CUDA 13 or 12): torch's nvidia
    wheels first (what torch and onnxruntime-gpu load at run time), else the toolkit."""
    from torch.utils import cpp_extension

    for d in (nvidia_dir("lib"), os.path.join(cpp_extension.CUDA_HOME or "", "lib64")):
        for name in (f"{stem}.so.13", f"{stem}.so.12", f"{stem}.so"):
            if os.path.isfile(os.path.join(d, name)):
                return os.path.join(d, name)
    return None


_CUDA_DECISION: Optional[bool] = None


def cuda_enabled() -> bool:
    """Whether this build compiles ``cuda_sources`` (decided once per process, says why)."""
    global _CUDA_DECISION
    if _CUDA_DECISION is not None:
        return _CUDA_DECISION
    mode = cuda_mode()
    if mode == "0":
        _CUDA_DECISION = False
        return _CUDA_DECISION
    resolve_cuda_home()
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
    if missing and mode == "1":
        raise RuntimeError("opforge: OPFORGE_CUDA=1 but " + "; ".join(missing) + ". Set CUDA_HOME, or OPFORGE_CUDA=0.")
    _CUDA_DECISION = not missing
    if missing:
        _log("building CPU-only (" + "; ".join(missing) + ")")
    else:
        if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
            # No GPU to ask: Ampere + Hopper SASS, and Hopper PTX for newer GPUs to JIT.
            os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"
        _log(f"building CUDA kernels (CUDA_HOME={cpp_extension.CUDA_HOME}, "
             f"archs {os.environ.get('TORCH_CUDA_ARCH_LIST', 'of the visible GPUs')})")
    return _CUDA_DECISION


# ---- compiler flags and run-time search paths -----------------------------------------


def sanitizer_flags() -> list[str]:
    """``OPFORGE_SANITIZE=address,undefined`` (any -fsanitize list): instrumented builds for
    scripts/sanitize.sh, with frame pointers and line tables for readable reports, and UB
    reports fatal so a test fails on the first one. Compile and link flags alike. Empty
    when unset."""
    kinds = os.environ.get("OPFORGE_SANITIZE", "").strip()
    if not kinds:
        return []
    return [f"-fsanitize={kinds}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]


def opt_flags() -> list[str]:
    """``-O3 -g0``; ``OPFORGE_DEBUG=1``: ``-O0 -g``; sanitized builds: ``-O1 -g`` + the
    sanitizer flags."""
    if sanitizer_flags():
        return ["-O1", "-g"] + sanitizer_flags()
    return ["-O0", "-g"] if os.environ.get("OPFORGE_DEBUG") == "1" else ["-O3", "-g0"]


def path_map_flags() -> list[str]:
    """Compiler flags that write the project's and site-packages' paths as relative ones
    wherever the compiler records a path (``__FILE__`` in torch's and our checks, debug
    info): built libraries name no directory of the build machine. Not in OPFORGE_DEBUG
    builds, where a debugger needs the real paths."""
    if os.environ.get("OPFORGE_DEBUG") == "1":
        return []
    prefixes = {os.path.realpath(p) for p in (os.getcwd(), _site_packages(), sys.prefix, sys.base_prefix)}
    # The compiler takes the last matching map: nested directories after their parents.
    return [f"-ffile-prefix-map={p}/=" for p in sorted(prefixes - {"/", "/usr"}, key=len)]


def nvcc_flags() -> list[str]:
    return NVCC_FLAGS + [f for flag in path_map_flags() for f in ("-Xcompiler", flag)]


def ort_cxx_flags(std: str = "c++17") -> list[str]:
    """Host-compiler flags of an ORT custom-op library: the running ORT hands over its API
    (ORT_API_MANUAL_INIT), and nothing but RegisterCustomOps is visible."""
    return opt_flags() + path_map_flags() + [f"-std={std}", "-fvisibility=hidden", "-Wall", "-DORT_API_MANUAL_INIT"]


def _is_temporary(path: str) -> bool:
    """A directory of an isolated build env (pip's or `python -m build`'s), deleted after the build."""
    return any(p.startswith(("pip-build-env-", "build-env-")) for p in os.path.realpath(path).split(os.sep))


def rpath_flags(lib_dirs: Iterable[str], module_name: str) -> list[str]:
    """Run-time search paths for a library ``module_name`` (``pkg.sub.libfoo``) that needs
    libraries in ``lib_dirs`` (inside site-packages: torch/lib, nvidia/cu13/lib): first
    relative to the library itself (``$ORIGIN/..``), which holds wherever the package is
    installed next to those wheels; then the absolute directory, for editable installs
    (whose sources live outside site-packages) — except a temporary build env's."""
    depth = module_name.count(".")  # pkg/libfoo.so -> 1 level below site-packages
    site = _site_packages()
    flags = []
    for d in lib_dirs:
        d = os.path.realpath(d)
        try:
            rel = os.path.relpath(d, site)
        except ValueError:
            rel = None
        if rel is not None and not rel.startswith(".."):
            flags.append("-Wl,-rpath,$ORIGIN/" + "/".join([".."] * depth + [rel]))
        if not _is_temporary(d):
            flags.append(f"-Wl,-rpath,{d}")
    return flags + ["-Wl,-z,origin"]


# ---- extensions -----------------------------------------------------------------------


def _paths(sources: Iterable[str]) -> list[str]:
    out = []
    for s in sources:
        hits = sorted(glob.glob(s)) if any(ch in s for ch in "*?[") else [s]
        out += hits
    return out


#: The oldest torch a stable-ABI library targets (``TORCH_TARGET_VERSION``): it loads in every later one.
TORCH_TARGET = (2, 10)


def torch_target_version_flag(target: tuple = TORCH_TARGET) -> str:
    """``-DTORCH_TARGET_VERSION`` for torch ``target``: the stable headers offer only what it has."""
    return f"-DTORCH_TARGET_VERSION=0x{target[0]:02x}{target[1]:02x}000000000000ULL"


def stable_cxx_flags() -> list[str]:
    """Host-compiler flags of a stable-ABI torch library (C++20: templated lambdas dispatch dtypes)."""
    return opt_flags() + path_map_flags() + ["-std=c++20", "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas",
                                             torch_target_version_flag()]


def TorchLibrary(name: str, sources: Sequence[str], *, cuda_sources: Sequence[str] = (),
                 include_dirs: Sequence[str] = (), define_macros: Sequence = (), extra_cxx_flags: Sequence[str] = (),
                 extra_nvcc_flags: Sequence[str] = ()):
    """A torch op library ``name`` (``pkg.libfoo`` -> ``pkg/libfoo.so``) on LibTorch's **stable
    ABI** (opforge/torch_op.h): built once, it loads in every torch from :data:`TORCH_TARGET` on, and
    without Python (an AOTInductor runner). It links libtorch_cpu for the stable C shims only, through
    ``$ORIGIN``-relative run paths. Load it with :func:`opforge.load_torch_library`. With
    ``cuda_sources`` in a CUDA build, the CUDA kernels go into ``pkg/libfoo_cuda.so``, which links
    the CUDA runtime; the library loads it when it loads, and goes on without it where it cannot load
    (opforge/torch_library.h): the CPU part never depends on one CUDA major."""
    from setuptools import Extension
    resolve_cuda_home()  # before torch.utils.cpp_extension reads CUDA_HOME (its own guess can be wrong)
    from torch.utils import cpp_extension
    torch_lib, cxx = cpp_extension.library_paths()[0], stable_cxx_flags() + list(extra_cxx_flags)
    incs = [str(CSRC_DIR), *include_dirs, *cpp_extension.include_paths()[:1]]
    link = ["-Wl,--as-needed", *sanitizer_flags(), *rpath_flags([torch_lib], name)]
    with_cuda = bool(cuda_sources) and cuda_enabled()
    ext = Extension(name, sources=_paths(sources), include_dirs=incs, define_macros=list(define_macros), language="c++",
                    library_dirs=[torch_lib], libraries=["torch_cpu"], extra_compile_args=cxx,
                    # the soname: a .pt2 that calls the library's C shims (opforge/torch_c_shim.h) links it by name
                    extra_link_args=[*link, f"-Wl,-soname,{name.rsplit('.', 1)[-1]}.so"], py_limited_api=False)
    ext.opforge_plain_library = True
    ext.opforge_stale_companion = f"{name.rsplit('.', 1)[-1]}_cuda.so" if cuda_sources and not with_cuda else None
    if with_cuda:
        libs = [find_cuda_lib("libcudart"), find_cuda_lib("libcublas")]
        part = f"{name}_cuda"
        companion = Extension(
            part, sources=_paths(cuda_sources), include_dirs=incs + cuda_include_dirs(),
            define_macros=list(define_macros), language="c++", library_dirs=[torch_lib],
            # torch_cuda and USE_CUDA: the CUDA shims (the current stream), declared whatever the include order
            libraries=["torch_cpu", "torch_cuda"],
            extra_compile_args={"cxx": cxx + ["-DOPFORGE_WITH_CUDA", "-DUSE_CUDA"],
                                "nvcc": nvcc_flags() + [torch_target_version_flag()] + list(extra_nvcc_flags)},
            extra_link_args=[*link, *libs, *rpath_flags(sorted({os.path.dirname(p) for p in libs}), part)],
            py_limited_api=False)
        companion.opforge_plain_library = companion.opforge_cuda_part = True
        ext.opforge_cuda_companion = companion
    return ext


def _write_build_id(name: str, sources: Sequence[str], include_dirs: Sequence[str], flags: Sequence[str]) -> str:
    """Writes ``opforge_ort_build_id.h`` (``OPFORGE_ORT_BUILD_ID``: a hash of the sources, the
    headers under ``include_dirs`` and the flags) for library ``name``; returns its directory,
    which the library and its CUDA companion include, so a companion of another build is refused
    (``ort_cuda_companion.h``). Rewritten only when the id changes; only the entry file includes it."""
    import hashlib

    digest, files = hashlib.sha256(), set(map(os.path.abspath, sources))
    for d in filter(os.path.isdir, include_dirs):  # (not ORT's headers: the runtime is asked for its API)
        files.update(os.path.join(r, n) for r, _, names in os.walk(d) for n in names if n.endswith((".h", ".cuh", ".inc")))
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + Path(path).read_bytes())
    digest.update("\0".join(flags).encode())
    out_dir = os.path.join(os.getcwd(), "build", "opforge-build-id", name)
    os.makedirs(out_dir, exist_ok=True)
    header, text = os.path.join(out_dir, "opforge_ort_build_id.h"), (
        f'// opforge.build.OrtLibrary\n#pragma once\n#define OPFORGE_ORT_BUILD_ID "{digest.hexdigest()[:16]}"\n')
    if not os.path.isfile(header) or Path(header).read_text() != text:
        Path(header).write_text(text)
    return out_dir


def OrtLibrary(name: str, sources: Sequence[str], *, cuda_sources: Sequence[str] = (),
               include_dirs: Sequence[str] = (), define_macros: Sequence = (), extra_cxx_flags: Sequence[str] = (),
               extra_nvcc_flags: Sequence[str] = (), ort_include_candidates: Sequence[str] = ()):
    """An ONNX Runtime custom-op library ``name`` (``pkg.libfoo`` -> ``pkg/libfoo.so``) from
    ``sources``: links neither libonnxruntime nor libtorch (``ORT_API_MANUAL_INIT``: the running
    ORT hands over its API), exports only ``RegisterCustomOps``. With ``cuda_sources`` in a CUDA
    build, the CUDA EP kernels go into ``pkg/libfoo_cuda.so`` (``sources`` + ``cuda_sources`` with
    ``OPFORGE_WITH_CUDA``, linking the CUDA runtime and cuBLAS through ``$ORIGIN``-relative run
    paths); ``libfoo.so`` keeps the CPU kernels, no CUDA dependency, and loads the companion when
    the running ORT has a CUDA EP (``opforge/ort_cuda_companion.h``). Both carry the build's id
    (:func:`_write_build_id`): the library refuses a companion of another build."""
    from setuptools import Extension

    cxx = ort_cxx_flags() + list(extra_cxx_flags)
    link = ["-Wl,--as-needed", *sanitizer_flags()]
    incs = [str(CSRC_DIR), *include_dirs, ort_include_dir(extra_candidates=ort_include_candidates)]
    srcs = _paths(sources)
    with_cuda = bool(cuda_sources) and cuda_enabled()
    macros = list(define_macros) + ([("OPFORGE_ORT_CUDA_COMPANION", "1")] if with_cuda else [])
    ext = Extension(name, sources=srcs, include_dirs=incs, define_macros=macros, language="c++",
                    extra_compile_args=cxx, extra_link_args=[f"-Wl,--version-script={ORT_EXPORTS_MAP}", *link],
                    py_limited_api=False)
    ext.opforge_plain_library = True  # build_ext names it libfoo.so and exports nothing Python needs
    # A build without the companion removes one an earlier CUDA build left beside the library.
    ext.opforge_stale_companion = f"{name.rsplit('.', 1)[-1]}_cuda.so" if cuda_sources and not with_cuda else None
    if with_cuda:
        libs = [find_cuda_lib("libcudart"), find_cuda_lib("libcublas")]
        part = f"{name}_cuda"
        id_dir = _write_build_id(name, srcs + _paths(cuda_sources), [str(CSRC_DIR), *include_dirs],
                                 [*cxx, *nvcc_flags(), *extra_nvcc_flags, repr(define_macros)])
        ext.include_dirs.append(id_dir)
        companion = Extension(
            part, sources=srcs + _paths(cuda_sources), include_dirs=incs + cuda_include_dirs() + [id_dir],
            define_macros=list(define_macros) + [("OPFORGE_ORT_CUDA_PART", "1")], language="c++",
            extra_compile_args={"cxx": cxx + ["-DOPFORGE_WITH_CUDA"], "nvcc": nvcc_flags() + list(extra_nvcc_flags)},
            extra_link_args=[f"-Wl,--version-script={ORT_CUDA_EXPORTS_MAP}", *link, *libs,
                             *rpath_flags(sorted({os.path.dirname(p) for p in libs}), part)],
            py_limited_api=False)
        companion.opforge_plain_library = True
        companion.opforge_cuda_part = True
        ext.opforge_cuda_companion = companion  # build_ext adds it to the extensions it builds
    return ext


def plain_libraries(ext_modules: Iterable) -> list:
    """``ext_modules`` with each :func:`OrtLibrary`'s CUDA companion right after it."""
    out = []
    for ext in ext_modules:
        if ext not in out:
            out.append(ext)
        companion = getattr(ext, "opforge_cuda_companion", None)
        if companion is not None and companion not in out:
            out.append(companion)
    return out


def build_ext(*, build_dir: Optional[str] = None):
    """The ``build_ext`` command class: torch's BuildExtension (ninja, ABI flags) plus plain
    library names for :func:`OrtLibrary` and a persistent build directory (``build/`` next to
    setup.py), so a rebuild recompiles only what changed, also under ``pip install -e``."""
    from torch.utils.cpp_extension import BuildExtension

    class OpforgeBuildExt(BuildExtension):
        def finalize_options(self):
            # CUDA companions are extensions like the others (built, installed, put in wheels),
            # added before setuptools sets up its per-extension bookkeeping.
            if self.distribution.ext_modules:
                self.distribution.ext_modules = plain_libraries(self.distribution.ext_modules)
            if self.extensions:
                self.extensions = plain_libraries(self.extensions)
            super().finalize_options()
            root = build_dir or os.path.join(os.getcwd(), "build")
            tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
            self.build_temp = os.path.join(root, f"temp.{tag}")

        def _plain(self, fullname: str) -> Optional[str]:
            for ext in self.extensions:
                if getattr(ext, "opforge_plain_library", False) and fullname in (ext.name, ext.name.rsplit(".", 1)[-1]):
                    return ext.name
            return None

        def get_ext_filename(self, fullname):
            # A dlopen()ed library, not a Python module: no ABI suffix. distutils asks with the
            # full dotted name and with just the last component.
            plain = self._plain(fullname)
            if plain is not None:
                return os.path.join(*fullname.split(".")) + ".so"
            return super().get_ext_filename(fullname)

        def build_extension(self, ext):
            # Absolute run paths serve in-place / editable builds (the library lives in the source
            # tree, outside site-packages); a wheel (also what `pip install .` builds) keeps only the
            # $ORIGIN-relative ones, so it never reaches into the builder's environment. (build_ext's
            # own inplace/editable_mode flags are not reliable here: PEP 660 editable builds may
            # compile out of place and copy the results into the tree.)
            if "bdist_wheel" in (self.distribution.commands or []):
                ext.extra_link_args = [a for a in ext.extra_link_args if not a.startswith("-Wl,-rpath,/")]
            if getattr(ext, "opforge_stale_companion", None):
                self._remove_stale_companion(ext)
            if not getattr(ext, "opforge_cuda_part", False):
                return super().build_extension(ext)
            # Each companion compiles into its own objects (two share kernels.cu: one path rebuilt it twice).
            build_temp = self.build_temp
            self.build_temp = os.path.join(build_temp, "cuda_companion", ext.name)
            try:
                return super().build_extension(ext)
            finally:
                self.build_temp = build_temp

        def _remove_stale_companion(self, ext):
            """Deletes the CUDA companion of ``ext`` an earlier CUDA build left where the library goes
            (the build output; the source tree's package for in-place and editable builds)."""
            package = ext.name.rpartition(".")[0]
            places = {os.path.dirname(self.get_ext_fullpath(ext.name))}
            try:
                places.add(self.get_finalized_command("build_py").get_package_dir(package))
            except Exception:  # noqa: BLE001 - no build_py (a bare build_ext run): the output dir only
                pass
            for place in places:
                stale = os.path.join(place, ext.opforge_stale_companion)
                if os.path.isfile(stale):
                    os.remove(stale)
                    print(f"opforge.build: removed {stale}, a CUDA companion this build (no CUDA) does not make")

        def get_export_symbols(self, ext):
            return [] if getattr(ext, "opforge_plain_library", False) else super().get_export_symbols(ext)

    return OpforgeBuildExt.with_options(use_ninja=True)


# ---- just in time (notebooks) ---------------------------------------------------------


def load(name: str, sources: Sequence[str], *, extra_include_paths=(), extra_cflags=(),
         build_directory: Optional[str] = None, verbose: bool = False) -> str:
    """Builds (incrementally: ninja, in a cache directory) and loads a stable-ABI torch op library
    ``lib<name>.so`` (CPU kernels) from ``sources`` with opforge's headers and flags; its ops are
    then in ``torch.ops``. Returns its path. Register the ops' specs with ``opforge.register_op``."""
    resolve_cuda_home()  # before torch.utils.cpp_extension reads CUDA_HOME (its own guess warns)
    from torch.utils import cpp_extension
    from .ninja_build import build_just_in_time
    from .torch_library import load_torch_library

    torch_lib = cpp_extension.library_paths()[0]
    incs = [str(CSRC_DIR), *map(os.path.abspath, extra_include_paths), cpp_extension.include_paths()[0]]
    out = build_just_in_time(Path(build_directory or cache_dir() / "jit" / f"torch_{name}") / f"lib{name}.so",
                             _paths(sources), ["-fPIC", *stable_cxx_flags(), *(f"-I{d}" for d in incs), *extra_cflags],
                             ["-shared", f"-L{torch_lib}", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"], verbose=verbose,
                             what="opforge.build.load")
    load_torch_library(out)
    return out


def load_ort_library(name: str, sources: Sequence[str], *, domain: Optional[str] = None,
                     include_dirs: Sequence[str] = (), extra_cflags: Sequence[str] = (),
                     build_directory: Optional[str] = None, verbose: bool = False) -> str:
    """Builds (incrementally: ninja, header dependencies tracked) an ORT custom-op library
    ``lib<name>.so`` from ``sources`` (CPU kernels) and returns its path; with ``domain``, also
    ``opforge.register_ort_library(domain, path)``."""
    from .ninja_build import build_just_in_time

    incs = [str(CSRC_DIR), *map(os.path.abspath, include_dirs), ort_include_dir()]
    out = build_just_in_time(Path(build_directory or cache_dir() / "jit" / f"ort_{name}") / f"lib{name}.so",
                             _paths(sources), ["-fPIC", *ort_cxx_flags(), *(f"-I{d}" for d in incs), *extra_cflags],
                             ["-shared", f"-Wl,--version-script={ORT_EXPORTS_MAP}", "-Wl,--as-needed"],
                             verbose=verbose, what="opforge.build.load_ort_library")
    if domain is not None:
        from .ort_kernels import register_ort_library

        register_ort_library(domain, out, provider=f"opforge.build.load_ort_library({name!r})", replace=True)
    return out


def _main(argv=None) -> int:
    """``python opforge/build.py fetch-ort-headers [--dest DIR]``: usable before opforge is built."""
    import argparse

    parser = argparse.ArgumentParser(prog="opforge.build")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch-ort-headers")
    fetch.add_argument("--dest", default=None)
    fetch.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    print(fetch_ort_headers(args.dest, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
