"""``opforge build-aten``: builds libopforge_aten.so (the ATen fallback's ORT kernel, which links
libtorch's C++ API) for the running torch into opforge's cache, where opforge finds it
(opforge/ort_kernels/aten_cache.py) when the packaged build is for another torch."""

from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

from .ort_kernels.aten_cache import STAMP_SUFFIX, LIB_NAME, cached_library_path

_PACKAGE = Path(__file__).resolve().parent


def build_aten_library(*, verbose: bool = False, log=print) -> str:
    """Builds libopforge_aten.so for the running torch into opforge's cache (incremental: ninja) and
    returns its path. CPU kernels only (the CUDA EP variant comes from setup.py's CUDA build)."""
    import torch
    from torch.utils import cpp_extension

    from . import build
    from .ninja_build import build_just_in_time

    out = cached_library_path()
    sources = sorted(glob.glob(str(_PACKAGE / "aten" / "csrc" / "*.cc")))
    if not sources:
        raise FileNotFoundError(f"opforge build-aten: no sources in {_PACKAGE / 'aten' / 'csrc'}")
    torch_lib = cpp_extension.library_paths()[0]
    includes = [str(build.CSRC_DIR), build.ort_include_dir(), *cpp_extension.include_paths()]
    log(f"opforge build-aten: building {LIB_NAME} for torch {torch.__version__} into {out.parent} "
        f"(one translation unit, about half a minute) ...")
    start = time.monotonic()
    build_just_in_time(out, sources, ["-fPIC", *build.ort_cxx_flags("c++20"), *(f"-I{d}" for d in includes)],
                       ["-shared", f"-Wl,--version-script={build.ORT_EXPORTS_MAP}", "-Wl,-z,nodelete",
                        f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"],
                       verbose=verbose, what="opforge build-aten")
    Path(str(out) + STAMP_SUFFIX).write_text(torch.__version__ + "\n")
    log(f"opforge build-aten: done in {time.monotonic() - start:.0f} s: {out}")
    return str(out)


def main(verbose: bool = False) -> int:
    build_aten_library(verbose=verbose, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(cached_library_path())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main("-v" in sys.argv))
