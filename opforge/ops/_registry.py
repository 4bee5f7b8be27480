"""Loads opforge's torch op library, libopforge_torch.so (its STABLE_TORCH_LIBRARY(opforge) ops,
kernels and shape rules)."""

from __future__ import annotations

import os

import torch

from ..torch_library import load_torch_library

#: opforge's torch op library: built once on LibTorch's stable ABI, for every torch >= 2.10.
LIBRARY_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "libopforge_torch.so")

#: The oldest torch opforge runs on: its torch op library targets LibTorch's stable ABI of 2.10.
MIN_TORCH = (2, 10)
if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < MIN_TORCH:
    raise ImportError(f"opforge needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (its ops are built on LibTorch's stable "
                      f"ABI of that version); this is torch {torch.__version__}. pip install 'torch>=2.10'")

try:
    _C = load_torch_library(LIBRARY_PATH)  # runs STABLE_TORCH_LIBRARY(opforge, ...)
except (OSError, RuntimeError) as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        f"opforge: the torch op library {LIBRARY_PATH} is not built or does not load in this torch "
        f"({torch.__version__}; opforge needs torch >= 2.10). Build it with `pip install --no-build-isolation -e .` "
        f"(or `python setup.py develop`) in the opforge checkout. Cause: {exc}"
    ) from exc


class Untraced:
    """Suspends the TorchScript tracer: sizes read inside are plain ints, not traced values.

    For values the exported graph records as constants anyway (deform_conv2d's groups and
    offset groups, MSDeformAttn's number of reference coordinates): read from traced sizes
    they only make the tracer warn about Python values it freezes."""

    def __enter__(self):
        self.state = torch._C._get_tracing_state()
        torch._C._set_tracing_state(None)

    def __exit__(self, *exc):
        torch._C._set_tracing_state(self.state)
