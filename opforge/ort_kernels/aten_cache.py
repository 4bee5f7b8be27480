"""Which libopforge_aten.so the running torch gets.

libopforge_aten.so (the ORT kernel of ``org.pytorch.aten::ATen`` nodes) runs ATen ops through
libtorch's C++ API, which has no stable ABI: a build is good for the one torch it was compiled
against. setup.py builds it for the torch of the build and records that torch's version beside it
(``libopforge_aten.so.torch``). Under any other torch, opforge uses a build for that torch from its
cache (``~/.cache/opforge/aten/<torch version>/``), which ``opforge build-aten`` makes (about half a
minute: one translation unit), and otherwise refuses with an error that says so; it never loads a
build made for another torch. Everything else of opforge (the torch op library on the stable ABI,
libopforge_ort) needs no rebuild. The builder is opforge/build_aten.py; this module imports nothing
of opforge.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

#: Beside a libopforge_aten.so: the version of the torch it was built against.
STAMP_SUFFIX = ".torch"
LIB_NAME = "libopforge_aten.so"


def built_for(library: Path) -> Optional[str]:
    """The torch version ``library`` was built against, or None when it has no stamp."""
    stamp = Path(str(library) + STAMP_SUFFIX)
    return stamp.read_text().strip() if stamp.is_file() else None


def cached_library_path(torch_version: Optional[str] = None) -> Path:
    """Where ``opforge build-aten`` puts the build for ``torch_version`` (default: the running one):
    under opforge's cache, the directory opforge.build.cache_dir() names (a test keeps them equal)."""
    import torch

    cache = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "opforge"
    return cache / "aten" / (torch_version or torch.__version__) / LIB_NAME


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
