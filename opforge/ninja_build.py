"""A shared library from C++ sources with ninja: one object per source, header dependencies
tracked (``-MMD``), so a rebuild compiles only what changed; and the just-in-time builds on it,
``opforge.build.load`` (a torch op library) and ``opforge.build.load_ort_library``."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from .build import CSRC_DIR, ORT_EXPORTS_MAP, _paths, cache_dir, ort_cxx_flags, ort_include_dir, stable_cxx_flags


def _escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def ninja_shared_library(out: Path, sources: Sequence[str], cflags: Sequence[str], ldflags: Sequence[str], *,
                         verbose: bool = False) -> subprocess.CompletedProcess:
    """Builds ``out`` from ``sources`` in ``out``'s directory (build.ninja rewritten only when it
    changes) with $CXX (default c++); returns ninja's completed process."""
    build_directory = Path(out).parent
    cxx = os.environ.get("CXX", "c++")
    objs = [f"obj_{i}_{Path(s).stem}.o" for i, s in enumerate(sources)]
    q = shlex.quote
    lines = ["ninja_required_version = 1.3", f"cxx = {cxx}", f"cflags = {' '.join(q(f) for f in cflags)}",
             f"ldflags = {' '.join(q(f) for f in ldflags)}",
             "rule compile", "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out", "  depfile = $out.d",
             "  deps = gcc", "rule link", "  command = $cxx $in $ldflags -o $out"]
    lines += [f"build {o}: compile {_escape(s)}" for o, s in zip(objs, sources)]
    lines += [f"build {_escape(str(out))}: link {' '.join(objs)}", f"default {_escape(str(out))}"]
    text = "\n".join(lines) + "\n"
    ninja_file = build_directory / "build.ninja"
    if not ninja_file.is_file() or ninja_file.read_text() != text:
        ninja_file.write_text(text)
    ninja = shutil.which("ninja") or os.path.join(os.path.dirname(sys.executable), "ninja")
    return subprocess.run([ninja, "-C", str(build_directory)] + (["-v"] if verbose else []), capture_output=True,
                          text=True)


def load_torch_library_just_in_time(name: str, sources: Sequence[str], *, cuda_sources: Sequence[str] = (), extra_include_paths=(),
         extra_cflags=(), build_directory: Optional[str] = None, verbose: bool = False) -> str:
    """Builds (incrementally: ninja, header dependencies tracked, in a cache directory) a stable-ABI
    torch op library ``lib<name>.so`` from ``sources`` with opforge's headers and flags (as
    :func:`TorchLibrary` does), loads it with :func:`opforge.load_torch_library` (its ops are then
    in ``torch.ops``) and returns its path. Register the ops' specs with ``opforge.register_op``
    afterwards. CPU kernels only (``cuda_sources`` need the setup.py build)."""
    from torch.utils import cpp_extension

    if cuda_sources:
        raise ValueError("opforge.build.load: builds CPU kernels only; build CUDA kernels with "
                         "opforge.build.TorchLibrary in setup.py (pip install --no-build-isolation -e .)")
    build_directory = Path(build_directory or cache_dir() / "jit" / f"torch_{name}")
    build_directory.mkdir(parents=True, exist_ok=True)
    torch_lib = cpp_extension.library_paths()[0]
    incs = [str(CSRC_DIR), *map(os.path.abspath, extra_include_paths), cpp_extension.include_paths()[0]]
    cflags = ["-fPIC", *stable_cxx_flags(), *(f"-I{d}" for d in incs), *extra_cflags]

    out = build_directory / f"lib{name}.so"
    run = ninja_shared_library(out, [os.path.abspath(s) for s in _paths(sources)], cflags,
                               ["-shared", f"-L{torch_lib}", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"],
                               verbose=verbose)
    if verbose or run.returncode != 0:
        print(run.stdout + run.stderr, file=sys.stderr)
    if run.returncode != 0:
        raise RuntimeError(f"opforge.build.load: building lib{name}.so failed (see the compiler output above)")
    from .torch_library import load_torch_library

    load_torch_library(out)
    return str(out)


def load_ort_library_just_in_time(name: str, sources: Sequence[str], *, domain: Optional[str] = None,
                     include_dirs: Sequence[str] = (), extra_cflags: Sequence[str] = (),
                     build_directory: Optional[str] = None, verbose: bool = False) -> str:
    """Builds (incrementally: ninja, one object per source, header dependencies tracked) an ORT
    custom-op library ``lib<name>.so`` from ``sources`` (CPU kernels) and returns its path;
    with ``domain``, also ``opforge.register_ort_library(domain, path)``."""
    build_directory = Path(build_directory or cache_dir() / "jit" / f"ort_{name}")
    build_directory.mkdir(parents=True, exist_ok=True)
    srcs = [os.path.abspath(s) for s in _paths(sources)]
    incs = [str(CSRC_DIR), *map(os.path.abspath, include_dirs), ort_include_dir()]
    cflags = ["-fPIC", *ort_cxx_flags(), *(f"-I{d}" for d in incs), *extra_cflags]

    out = build_directory / f"lib{name}.so"
    run = ninja_shared_library(out, srcs, cflags, ["-shared", f"-Wl,--version-script={ORT_EXPORTS_MAP}",
                                                   "-Wl,--as-needed"], verbose=verbose)
    if verbose or run.returncode != 0:
        print(run.stdout + run.stderr, file=sys.stderr)
    if run.returncode != 0:
        raise RuntimeError(f"opforge.build.load_ort_library: building lib{name}.so failed (see the compiler output above)")
    if domain is not None:
        from .ort_kernels import register_ort_library

        register_ort_library(domain, str(out), provider=f"opforge.build.load_ort_library({name!r})", replace=True)
    return str(out)
