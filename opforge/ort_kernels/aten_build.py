"""libopforge_aten.so for the running torch.

libopforge_aten.so (the ORT kernel of ``org.pytorch.aten::ATen`` nodes) runs ATen ops through
libtorch's C++ API, which has no stable ABI: a build is good for the one torch it was compiled
against. setup.py builds it for the torch of the build and records that torch's version beside it
(``libopforge_aten.so.torch``). Under any other torch, opforge uses a build for that torch from its
cache (``~/.cache/opforge/aten/<torch version>/``), which ``opforge build-aten`` makes (about half a
minute: one translation unit), and otherwise refuses with an error that says so; it never loads a
build made for another torch. The everything-else of opforge (the torch op library on the stable
ABI, libopforge_ort) needs no rebuild.
"""

from __future__ import annotations

import glob
import os
import sys
import time
from pathlib import Path
from typing import Optional

#: Beside a libopforge_aten.so: the version of the torch it was built against.
STAMP_SUFFIX = ".torch"
_LIB_NAME = "libopforge_aten.so"
_PACKAGE = Path(__file__).resolve().parents[1]


def built_for(library: Path) -> Optional[str]:
    """The torch version ``library`` was built against, or None when it has no stamp."""
    stamp = Path(str(library) + STAMP_SUFFIX)
    return stamp.read_text().strip() if stamp.is_file() else None


def cached_library_path(torch_version: Optional[str] = None) -> Path:
    """Where :func:`build_aten_library` puts the build for ``torch_version`` (default: the running one)."""
    import torch

    from ..build import cache_dir

    return cache_dir() / "aten" / (torch_version or torch.__version__) / _LIB_NAME


def build_aten_library(*, verbose: bool = False, log=print) -> str:
    """Builds libopforge_aten.so for the running torch into opforge's cache (incremental: ninja) and
    returns its path. CPU kernels only (the CUDA EP variant comes from setup.py's CUDA build)."""
    import torch
    from torch.utils import cpp_extension

    from .. import build
    from ..ninja_build import build_just_in_time

    out = cached_library_path()
    sources = sorted(glob.glob(str(_PACKAGE / "aten" / "csrc" / "*.cc")))
    if not sources:
        raise FileNotFoundError(f"opforge build-aten: no sources in {_PACKAGE / 'aten' / 'csrc'}")
    torch_lib = cpp_extension.library_paths()[0]
    includes = [str(build.CSRC_DIR), build.ort_include_dir(), *cpp_extension.include_paths()]
    log(f"opforge build-aten: building {_LIB_NAME} for torch {torch.__version__} into {out.parent} "
        f"(one translation unit, about half a minute) ...")
    start = time.monotonic()
    build_just_in_time(out, sources, ["-fPIC", *build.ort_cxx_flags("c++20"), *(f"-I{d}" for d in includes)],
                       ["-shared", f"-Wl,--version-script={build.ORT_EXPORTS_MAP}", "-Wl,-z,nodelete",
                        f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"],
                       verbose=verbose, what="opforge build-aten")
    Path(str(out) + STAMP_SUFFIX).write_text(torch.__version__ + "\n")
    log(f"opforge build-aten: done in {time.monotonic() - start:.0f} s: {out}")
    return str(out)


def aten_library_for_this_torch(packaged: Path) -> str:
    """The libopforge_aten.so built for the running torch: the packaged one when it was, else the
    cached build for this torch; else a RuntimeError saying how to make one."""
    import torch

    if built_for(packaged) == torch.__version__:
        return str(packaged)
    cached = cached_library_path()
    if cached.is_file() and built_for(cached) == torch.__version__:
        return str(cached)
    raise RuntimeError(
        f"opforge: {packaged} (the ATen fallback's ORT kernel) was built for torch "
        f"{built_for(packaged) or 'an unknown version (no stamp beside it)'}, but this process runs torch "
        f"{torch.__version__}. It links libtorch's C++ API, which changes between versions, so opforge does not "
        f"load it here. Build it for this torch with `{Path(sys.executable).name} -m opforge build-aten` (into "
        f"{cached.parent}, about half a minute), or rebuild opforge (`pip install --no-build-isolation -e .`). "
        "Everything else in opforge (its torch ops, libopforge_ort.so) works on every torch >= 2.10 as it is.")


def main(verbose: bool = False) -> int:
    build_aten_library(verbose=verbose, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(cached_library_path())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main("-v" in sys.argv or os.environ.get("OPFORGE_VERBOSE") == "1"))
