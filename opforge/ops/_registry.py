"""Loads the torch extension and attaches each spec's Python pieces to its C++ op."""

from __future__ import annotations

import torch

from ..spec import OpSpec

try:
    from .. import _C  # noqa: F401  (loading it runs TORCH_LIBRARY(opforge, ...))
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "opforge: the torch extension opforge._C is not built or does not match this torch "
        f"({torch.__version__}). Build it with `pip install --no-build-isolation -e .` "
        f"(or `python setup.py develop`) in the opforge checkout. Cause: {exc}"
    ) from exc


def torch_op(spec: OpSpec) -> torch._ops.OpOverload:
    return getattr(getattr(torch.ops, spec.domain), spec.name).default


def register_torch_op(spec: OpSpec) -> torch._ops.OpOverload:
    """Checks the C++ schema against the spec, then registers fake impl and autograd."""
    op = torch_op(spec)
    declared = str(op._schema)
    expected = f"{spec.domain}::{spec.schema}"
    if declared != expected:
        raise RuntimeError(
            f"opforge: C++ schema of {spec.qualname} is {declared!r} but the spec says {expected!r}; "
            "rebuild the extension (pip install --no-build-isolation -e .) or fix the spec"
        )
    torch.library.register_fake(spec.qualname)(spec.fake)
    torch.library.register_autograd(spec.qualname, spec.backward, setup_context=spec.setup_context)
    return op
