"""Step 1 of the ATen bridge: the ATen call a TorchScript node makes.

:func:`call_of` binds an ``aten::`` node of the traced graph to its exact overload (the schema
the tracer recorded, else the dispatcher's order) and describes the call as a hashable
:class:`Call`: per schema argument a :class:`TensorInfo` (dtype and shape, dynamic dims as None),
a tuple of them (``Tensor[]``), or a constant. :func:`tensor_inputs` gives the node's tensor
values in the order the translated graph takes them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from .errors import BridgeError

#: TorchScript scalar type names -> torch dtypes.
DTYPES = {
    "Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
    "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8,
    "Byte": torch.uint8, "Bool": torch.bool,
    # Complex values travel through the ONNX graph as real pairs (a trailing dim of 2), the
    # dynamo exporter's convention; only ops the bridge translates may touch them (see
    # bridge._check_complex_consumers).
    "ComplexFloat": torch.complex64, "ComplexDouble": torch.complex128,
}
_COMPLEX_SCALAR_TYPES = frozenset({"ComplexFloat", "ComplexDouble", "ComplexHalf"})
#: Size given to a dynamic dim when the op is traced (not 0 or 1: torch.export specialises those).
DYNAMIC_DIM_HINT = 5


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    dtype: torch.dtype
    shape: tuple  # ints, None for a dynamic dim

    def example(self, hint: int = DYNAMIC_DIM_HINT) -> torch.Tensor:
        shape = [d if d is not None else hint for d in self.shape]
        if self.dtype == torch.bool:
            return torch.zeros(shape, dtype=torch.bool)
        return torch.ones(shape, dtype=self.dtype)


@dataclasses.dataclass(frozen=True)
class Call:
    """One ATen call: the overload, and per schema argument a TensorInfo, a tuple of them
    (Tensor[]), or a constant."""

    overload: str  # "aten::logcumsumexp" or "aten::xlogy.Scalar_Self"
    args: tuple
    keyword: tuple = ()  # names of the keyword-only arguments, in order, at the end of args

    @property
    def name(self) -> str:
        return self.overload.split("::")[1].split(".")[0]

    @property
    def op(self) -> torch._ops.OpOverload:
        name, _, overload = self.overload.partition(".")
        packet = getattr(torch.ops.aten, name.split("::")[1])
        return getattr(packet, overload or "default")


def _is_tensor_type(t) -> bool:
    if t.kind() == "OptionalType":
        t = t.getElementType()
    return t.kind() == "TensorType"


def _is_tensor_list_type(t) -> bool:
    return t.kind() == "ListType" and t.getElementType().kind() in ("TensorType", "OptionalType")


def _tensor_info(value, op: str, arg: str) -> TensorInfo:
    t = value.type()
    if t.kind() != "TensorType" or t.scalarType() is None:
        raise BridgeError(f"{op}: the dtype of argument '{arg}' is unknown in the traced graph; "
                          "opforge's bridge needs typed inputs (export with example inputs of the real dtype)")
    sizes = t.varyingSizes()
    if sizes is None:
        raise BridgeError(f"{op}: the rank of argument '{arg}' is unknown in the traced graph")
    if t.scalarType() not in DTYPES:
        raise BridgeError(f"{op}: argument '{arg}' has dtype {t.scalarType()}, which the bridge does not handle")
    return TensorInfo(DTYPES[t.scalarType()], tuple(sizes))


def _constant(value, arg_type, op: str, arg: str):
    from torch.onnx import symbolic_helper

    if symbolic_helper._is_none(value):
        return None
    node = value.node()
    kind = node.kind()
    if kind == "prim::ListConstruct":
        elem = arg_type.getElementType() if arg_type.kind() == "ListType" else arg_type
        return tuple(_constant(v, elem, op, arg) for v in node.inputs())
    if kind == "onnx::Constant":
        # Strings (einsum's equation, scatter_reduce's reduce) are string attributes.
        python = node.s("value") if node.kindOf("value") == "s" else node.t("value").tolist()
    elif kind == "prim::Constant":
        python = value.toIValue()
        if isinstance(python, torch.Tensor):
            python = python.tolist()
    else:
        raise BridgeError(f"{op}: argument '{arg}' is computed in the graph (from {kind}); opforge's bridge "
                          "needs it as a constant (a Python number, not a tensor value)")
    type_str = str(arg_type).rstrip("?")
    if isinstance(python, list) and not type_str.endswith("[]") and type_str.find("[") < 0:
        python = python[0] if len(python) == 1 else python
    if type_str in ("int", "SymInt") and isinstance(python, (int, float, bool)):
        return int(python)
    if type_str == "float" and isinstance(python, (int, float)):
        return float(python)
    if type_str == "bool" and isinstance(python, (int, bool)):
        return bool(python)
    if isinstance(python, list):
        return tuple(python)
    return python


def _is_constant(value) -> bool:
    from torch.onnx import symbolic_helper

    kind = value.node().kind()
    if kind == "prim::ListConstruct":
        return all(_is_constant(v) for v in value.node().inputs())
    return kind in ("onnx::Constant", "prim::Constant") or symbolic_helper._is_none(value)


def _overloads(kind: str, original_schema: str) -> list:
    """Candidate schemas for a node, best first: the one the tracer recorded when it is known;
    else the ATen fallback's dispatcher order (default, Tensor, the rest; never out= or in-place)."""
    from .nodes import dispatch_order

    if original_schema != "(no schema)":
        schema = torch._C.parse_schema(original_schema)
        # By the time symbolics run, an int argument is a 0-d tensor constant, and TorchScript's
        # schema lookup may then match an out= overload (squeeze_copy(x, 1) as squeeze_copy.out):
        # never the call the model made.
        if not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return [schema]
    return [op._schema for op in dispatch_order(getattr(torch.ops.aten, kind.split("::")[1]))]


def _binds(schema, values) -> bool:
    from torch.onnx import symbolic_helper

    if len(schema.arguments) != len(values):
        return False
    for a, v in zip(schema.arguments, values):
        if _is_tensor_type(a.type):
            if symbolic_helper._is_none(v) and a.type.kind() != "OptionalType":
                return False
        elif _is_tensor_list_type(a.type):
            if v.node().kind() != "prim::ListConstruct":
                return False
        elif not _is_constant(v):
            return False
    return True


def call_of(node, values: Sequence) -> Call:
    """The Call a TorchScript ``aten::`` node makes; ``values`` are its inputs as the symbolic
    receives them (in the graph being built)."""
    from torch.onnx import symbolic_helper

    kind = node.kind()
    candidates = _overloads(kind, node.schema())
    # A constant can be a Tensor argument too (a Python number traced into a 0-d tensor); the
    # overload that takes the most constants as numbers is the one the call meant.
    fitting = [s for s in candidates if _binds(s, values)]
    parsed = min(fitting, key=lambda s: sum(
        1 for a, v in zip(s.arguments, values) if _is_tensor_type(a.type) and _is_constant(v)), default=None)
    if parsed is None:
        raise BridgeError(f"{kind}: no overload takes these inputs as constants where it needs numbers "
                          "(an argument computed at run time where the op needs a Python number?)")
    op = parsed.name + (f".{parsed.overload_name}" if parsed.overload_name else "")
    args = []
    for value, original, a in zip(values, node.inputs(), parsed.arguments):
        # A complex input arrives as the real pair the bridge wrote for it; the traced graph
        # still has its complex dtype and shape, which is the call the model made.
        if _is_tensor_type(a.type):
            args.append(None if symbolic_helper._is_none(value) else
                        _tensor_info(original if is_complex(original) else value, op, a.name))
        elif _is_tensor_list_type(a.type):
            items = symbolic_helper._unpack_list(value)
            if is_complex(original) and original.node().kind() == "prim::ListConstruct":
                items = list(original.node().inputs())
            args.append(tuple(_tensor_info(v, op, a.name) for v in items))
        else:
            args.append(_constant(value, a.type, op, a.name))
    return Call(op, tuple(args), tuple(a.name for a in parsed.arguments if a.kwarg_only))


def tensor_inputs(call: Call, values: Sequence) -> list:
    """The call's tensor Values, in the order :func:`.translation.translate` numbers its graph inputs."""
    from torch.onnx import symbolic_helper

    out = []
    for a, value in zip(call.args, values):
        if isinstance(a, TensorInfo):
            out.append(value)
        elif isinstance(a, tuple) and a and isinstance(a[0], TensorInfo):
            out.extend(symbolic_helper._unpack_list(value))
    return out


def is_complex(value) -> bool:
    """Whether a traced value is a complex tensor (or a Tensor[] holding one)."""
    t = value.type()
    if t.kind() == "TensorType":
        return t.scalarType() in _COMPLEX_SCALAR_TYPES
    if t.kind() == "ListType":  # a Tensor[] argument (its ListConstruct) or result (its ListUnpack)
        if value.node().kind() == "prim::ListConstruct":
            return any(is_complex(v) for v in value.node().inputs())
        return any(is_complex(v) for use in value.uses() if use.user.kind() == "prim::ListUnpack"
                   for v in use.user.outputs())
    return False
