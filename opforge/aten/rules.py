"""Curated TorchScript symbolics for ATen ops that have an ONNX equivalent but no rule in
torch's TorchScript exporter (``torch.onnx.export(..., dynamo=False)``).

The candidates are found by asking the exporter's own registry (see
:func:`missing_in_torch`): ATen ops whose name matches a standard ONNX op and which
have no registered symbolic at any opset 9..20. Of those, each rule below maps an op
whose ONNX equivalent is faithful (same values, dtypes and broadcasting), registered
for every opset from the one the ONNX op appeared in to 20 (or, where part of the op's
dtypes work earlier, from that opset, refusing the rest with a clear error), or is a
faithful composition where no single op exists. ``import opforge`` registers them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import onnx
import torch
from torch.onnx import symbolic_helper

from ..spec import TORCHSCRIPT_OPSETS

_FLOAT_TYPES = {"Float", "Double", "Half", "BFloat16"}


def _scalar_type(v) -> str | None:
    t = v.type()
    return t.scalarType() if t.kind() == "TensorType" else None


def _as_float(g, x):
    """torch's unary float ops promote integer inputs to the default float dtype."""
    if _scalar_type(x) in _FLOAT_TYPES:
        return x
    return g.op("Cast", x, to_i=onnx.TensorProto.FLOAT)


def _unary(onnx_op: str) -> Callable:
    @symbolic_helper.parse_args("v")
    def symbolic(g, self):
        return g.op(onnx_op, _as_float(g, self))

    symbolic.__name__ = f"{onnx_op.lower()}_symbolic"
    return symbolic


@symbolic_helper.parse_args("v")
def _trunc(g, self):
    # ONNX has no Trunc: sign(x) * floor(|x|) is exact (trunc(-0.5) = -0.0 either way).
    if _scalar_type(self) not in _FLOAT_TYPES:
        return g.op("Identity", self)  # integers are already whole
    return g.op("Mul", g.op("Sign", self), g.op("Floor", g.op("Abs", self)))


def _bitwise(aten: str, logical: str, bitwise: str) -> Callable:
    # Bool tensors: the logical op, which ONNX has at every opset. Integers: the Bitwise op,
    # which ONNX has from opset 18; below, a clear error rather than a wrong answer.
    @symbolic_helper.parse_args("v", "v")
    def symbolic(g, self, other):
        if _scalar_type(self) == "Bool" and _scalar_type(other) in ("Bool", None):
            return g.op(logical, self, g.op("Cast", other, to_i=onnx.TensorProto.BOOL))
        if g.opset < 18:
            from torch.onnx import errors

            raise errors.SymbolicValueError(
                f"aten::{aten} on {_scalar_type(self) or 'non-bool'} tensors at opset {g.opset}: ONNX has "
                f"{bitwise} from opset 18 on (bool tensors export as {logical} at any opset); export at "
                "opset 18 or more", self)
        if _scalar_type(self) is None:
            raise symbolic_helper._onnx_unsupported(f"aten::{aten} on an input of unknown dtype", self)
        return g.op(bitwise, self, g.op("CastLike", other, self))

    symbolic.__name__ = f"{aten}_symbolic"
    return symbolic


@dataclasses.dataclass(frozen=True)
class AtenRule:
    aten: str  # "asinh"
    onnx: str  # what it exports as
    since: int  # first opset where the ONNX op(s) exist
    symbolic: Callable
    #: Registered from this opset (default: since), up to this one (default: the last).
    first: int | None = None
    last: int = TORCHSCRIPT_OPSETS[-1]

    @property
    def opsets(self) -> range:
        first = self.since if self.first is None else self.first
        return range(max(first, TORCHSCRIPT_OPSETS[0]), self.last + 1)


RULES: tuple[AtenRule, ...] = (
    AtenRule("asinh", "Asinh", 9, _unary("Asinh")),
    AtenRule("acosh", "Acosh", 9, _unary("Acosh")),
    AtenRule("atanh", "Atanh", 9, _unary("Atanh")),
    AtenRule("sinh", "Sinh", 9, _unary("Sinh")),
    AtenRule("cosh", "Cosh", 9, _unary("Cosh")),
    AtenRule("trunc", "Sign * Floor(Abs)", 9, _trunc),
    AtenRule("fix", "Sign * Floor(Abs)", 9, _trunc),  # alias of trunc
    # Bool tensors at every opset; integers from 18. torch's own bitwise_and starts at 18.
    AtenRule("bitwise_xor", "BitwiseXor (bool: Xor)", 18, _bitwise("bitwise_xor", "Xor", "BitwiseXor"), first=9),
    AtenRule("bitwise_and", "BitwiseAnd (bool: And)", 18,
             _bitwise("bitwise_and", "And", "BitwiseAnd"), first=9, last=17),
)


#: Candidates from missing_in_torch() that get no rule here, and why. A test checks that
#: every candidate is either ruled above or explained here, so a torch upgrade that
#: changes the list is noticed.
NOT_RULED: dict[str, str] = {
    "blackman_window": "exports already: torch traces it into elementary ops",
    "hamming_window": "exports already: torch traces it into elementary ops",
    "clip": "alias of aten::clamp, which the tracer records instead",
    "concat": "alias of aten::cat, which the tracer records instead",
    "greater": "alias of aten::gt, which the tracer records instead",
    "less": "alias of aten::lt, which the tracer records instead",
    "det": "exports already: the tracer records aten::linalg_det, which has a rule",
    "cumprod": "ONNX CumProd needs opset 26 (the TorchScript exporter stops at 20); use the ATen fallback",
    "equal": "returns a Python bool, not a tensor: nothing to export",
    "range": "not equivalent: aten::range includes its end point, ONNX Range excludes it",
    "resize": "not equivalent: aten::resize_ reallocates storage, ONNX Resize interpolates images",
}


def register_all() -> None:
    """Registers :data:`RULES` (every other op with a sample gets the bridge:
    :func:`opforge.aten.bridge.register_all`, called right after this)."""
    for rule in RULES:
        for opset in rule.opsets:
            torch.onnx.register_custom_op_symbolic(f"aten::{rule.aten}", rule.symbolic, opset)


def _torch_registry():
    # The registry is filled when the exporter's symbolic modules are imported.
    from torch.onnx._internal.torchscript_exporter import registration, utils

    utils._trigger_symbolic_function_registration()
    return registration.registry


def torch_rule(aten: str, opset: int) -> Callable | None:
    """torch's own TorchScript symbolic for ``aten::<aten>`` at ``opset`` (not opforge's; seen
    through opforge's torch-rule-then-bridge wrapper), or None."""
    group = _torch_registry().get_function_group(f"aten::{aten}")
    fn = group.get(opset) if group is not None else None
    while fn is not None and getattr(fn, "opforge_bridge_fallback", False):
        fn = fn.__wrapped__
    if fn is None or getattr(fn, "__module__", "").startswith("opforge."):
        return None
    return fn


def has_torch_rule(aten: str, opset: int) -> bool:
    """Whether torch itself (not opforge) has a TorchScript symbolic for ``aten::<aten>`` at ``opset``."""
    return torch_rule(aten, opset) is not None


def missing_in_torch(opsets: range = TORCHSCRIPT_OPSETS) -> dict[str, str]:
    """ATen ops named like a standard ONNX op that torch has no TorchScript rule for at any
    opset in ``opsets``: ``{"asinh": "Asinh", ...}`` (a candidate list; not all are faithful)."""
    onnx_ops = sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""})
    found = {}
    for name in onnx_ops:
        for cand in {name.lower(), re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()}:
            if hasattr(torch.ops.aten, cand) and not any(has_torch_rule(cand, o) for o in opsets):
                found[cand] = name
    return found
