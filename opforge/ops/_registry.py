"""Loads opforge's torch extension (its TORCH_LIBRARY(opforge) ops and kernels)."""

from __future__ import annotations

import torch

try:
    from .. import _C  # noqa: F401  (loading it runs TORCH_LIBRARY(opforge, ...))
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "opforge: the torch extension opforge._C is not built or does not match this torch "
        f"({torch.__version__}). Build it with `pip install --no-build-isolation -e .` "
        f"(or `python setup.py develop`) in the opforge checkout. Cause: {exc}"
    ) from exc
