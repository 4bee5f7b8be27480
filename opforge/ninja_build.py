"""A shared library from C++ sources with ninja: one object per source, header dependencies
tracked (``-MMD``), so a rebuild compiles only what changed. Used by the just-in-time builds,
``opforge.build.load`` (a torch op library) and ``opforge.build.load_ort_library``; imports nothing
from opforge."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence


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
    if not os.path.isfile(ninja):  # no ninja (pip install ninja): the same commands, one after the other
        for obj, source in zip(objs, sources):
            run = subprocess.run([cxx, *cflags, "-c", source, "-o", str(build_directory / obj)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                return run
        return subprocess.run([cxx, *(str(build_directory / o) for o in objs), *ldflags, "-o", str(out)],
                              capture_output=True, text=True)
    return subprocess.run([ninja, "-C", str(build_directory)] + (["-v"] if verbose else []), capture_output=True,
                          text=True)


def build_just_in_time(out: Path, sources: Sequence[str], cflags: Sequence[str], ldflags: Sequence[str], *,
                       verbose: bool, what: str) -> str:
    """Builds ``out`` (its directory made first) and returns its path; the compiler's output on
    failure (raised as a RuntimeError naming ``what``) or with ``verbose``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run = ninja_shared_library(out, [os.path.abspath(s) for s in sources], cflags, ldflags, verbose=verbose)
    if verbose or run.returncode != 0:
        print(run.stdout + run.stderr, file=sys.stderr)
    if run.returncode != 0:
        raise RuntimeError(f"{what}: building {out.name} failed (see the compiler output above)")
    return str(out)
