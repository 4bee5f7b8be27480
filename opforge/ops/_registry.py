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
