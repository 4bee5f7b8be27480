"""ATen nodes as exporters write them, read back: which operator and overload a node means, and
how its inputs and typed attributes fill the overload's arguments.

A node names its operator by attribute (``operator``, ``overload_name``); a node written by a
``g.at(...)`` symbolic names no overload and gives scalars as typed attributes, so the overload is
chosen the way the dispatcher picks one for a call (:func:`bind_overload`). Only operators of
libtorch's dispatcher are meant: TorchScript's builtins on Python numbers share ``torch.ops.aten``
but libopforge_aten cannot run them. Constant arguments are decoded for the meta run that types a
node's outputs, after :mod:`.policy`'s range checks: torch's meta kernels trust enums too.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import onnx
import torch
from onnx import helper

from ..spec import ATEN_DOMAIN, DTYPE_NAME_OF_ELEM
from . import policy

NONE_INPUT = "opforge_aten_none"  # must match csrc/aten_op.cc: kNoneInput

ONNX_TO_TORCH = {elem: getattr(torch, name) for elem, name in DTYPE_NAME_OF_ELEM.items()}
TORCH_TO_ONNX = {v: k for k, v in ONNX_TO_TORCH.items()}


def resolve(operator: str, overload_name: str = "") -> torch._ops.OpOverload:
    """``("frexp", "Tensor")`` -> ``torch.ops.aten.frexp.Tensor``; clear error if unknown.

    The TorchScript exporter writes ``overload_name=""`` even for ops without a default
    overload (``aten::searchsorted``); then the ``Tensor`` overload (or else the only
    non-``out`` one) is meant.
    """
    name = operator.split("::")[-1]
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        raise ValueError(f"opforge: aten::{name} is not an ATen operator in torch {torch.__version__}")
    overloads = packet.overloads()
    if not overload_name and "default" not in overloads:
        candidates = [o for o in overloads if not o.endswith("out")]
        if "Tensor" in candidates:
            overload_name = "Tensor"
        elif len(candidates) == 1:
            overload_name = candidates[0]
    try:
        op = getattr(packet, overload_name or "default")
    except AttributeError:
        raise ValueError(f"opforge: aten::{name} has no overload {overload_name!r}; overloads: {overloads}") from None
    if not in_dispatcher(op):
        raise ValueError(f"ATen op aten::{name}{'.' + overload_name if overload_name else ''}: no such operator (or "
                         "overload) in this libtorch (a TorchScript builtin on Python numbers, which libopforge_aten "
                         "does not run)")
    return op


def in_dispatcher(op: torch._ops.OpOverload) -> bool:
    """Whether libtorch's dispatcher has ``op``, as libopforge_aten looks it up. TorchScript's
    builtins on Python numbers (aten::remainder.int, aten::gcd.int) are under ``torch.ops.aten``
    too, but are not: and running one on a model's constants traps (INT64_MIN % -1: SIGFPE)."""
    try:
        torch._C._dispatch_find_schema_or_throw(op._schema.name, op._schema.overload_name)
        return True
    except RuntimeError:
        return False


def decode_constant(arg: torch.Argument, value: np.ndarray) -> Any:
    t = getattr(arg, "real_type", arg.type)  # .type shows ScalarType as int
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    kind = t.kind()
    if kind != "ListType" and value.size != 1:
        raise ValueError(f"opforge: argument '{arg.name}' takes one value, the node gives {value.size}")
    if kind in ("IntType", "SymIntType"):
        return int(value.reshape(-1)[0])
    if kind == "FloatType":
        return float(value.reshape(-1)[0])
    if kind == "BoolType":
        return bool(value.reshape(-1)[0])
    if kind == "NumberType":
        return value.reshape(-1)[0].item()
    if kind == "ListType":
        return [int(v) if np.issubdtype(value.dtype, np.integer) else float(v) for v in value.reshape(-1)]
    if kind == "ScalarTypeType":
        code = int(value.reshape(-1)[0])
        if code not in SCALAR_TYPES:
            raise ValueError(f"opforge: argument '{arg.name}': ScalarType {code} has no ONNX type")
        return SCALAR_TYPES[code]
    return value.item() if value.size == 1 else value.tolist()


def check_constant(op: torch._ops.OpOverload, index: int, arg: torch.Argument, value: np.ndarray) -> None:
    """Refuses an integer constant libopforge_aten would refuse (an enum out of range, a loop count
    past its bound), before it reaches even a meta run: torch's meta kernels trust them too
    (full_like with memory_format=-1 crashed the process)."""
    t = getattr(arg, "real_type", arg.type)
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    kind = t.kind()
    if kind == "ListType" and t.getElementType().kind() in ("IntType", "SymIntType"):
        kind = "IntType"  # each element
    elif kind not in ("IntType", "SymIntType", "ScalarTypeType", "LayoutType", "MemoryFormatType") or value.size != 1:
        return
    if not np.issubdtype(value.dtype, np.integer):
        return  # the library names what is wrong with its type
    for v in value.reshape(-1):
        problem = policy.argument_problem(op._schema.name.split("::")[-1], arg.name, kind, int(v))
        if problem is not None:
            raise ValueError(f"opforge: ATen op {op._schema.name}, argument {index} '{arg.name}' ({t}): {problem}")


SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 5: torch.float16,
                 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}


def node_op(node: onnx.NodeProto) -> tuple[str, str]:
    """(operator, overload_name) of an ATen node."""
    attrs = {a.name: a.s.decode() for a in node.attribute if a.name in ("operator", "overload_name")}
    return attrs["operator"], attrs.get("overload_name", "")


_NODE_ATTRS = ("operator", "overload_name")


def scalar_attrs(node: onnx.NodeProto) -> dict:
    """Non-tensor arguments given as typed node attributes: the encoding of the TorchScript
    exporter's ``g.at("pow", x, exponent_f=2.0)`` (the reference documents' ATen flow), where
    opforge's own encoding passes them as constant inputs."""
    out = {}
    for a in node.attribute:
        if a.name in _NODE_ATTRS:
            continue
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else (list(value) if isinstance(value, list) else value)
    return out


def has_scalar_attrs(model: onnx.ModelProto) -> bool:
    """Whether any ATen node of ``model`` carries typed scalar attributes (the ``g.at`` encoding)."""
    return any(n.op_type == "ATen" and n.domain == ATEN_DOMAIN and scalar_attrs(n) for n in model.graph.node)


def is_tensor_arg(arg: torch.Argument) -> bool:
    t = arg.type
    return isinstance(t, torch.TensorType) or (isinstance(t, torch.OptionalType)
                                                and isinstance(t.getElementType(), torch.TensorType))


def _fits(arg: torch.Argument, value: Any) -> bool:
    """Whether a typed attribute value can be ``arg`` (as the dispatcher's schema matching would accept
    the Python value): int for int/bool/Scalar, float for float/Scalar, ints for int[], a string for str."""
    t = getattr(arg, "real_type", arg.type)
    kind = t.getElementType().kind() if isinstance(t, torch.OptionalType) else t.kind()
    if isinstance(value, list):
        return kind == "ListType" and all(isinstance(v, int) for v in value)
    if isinstance(value, str):
        return kind == "StringType"
    if isinstance(value, int):
        return kind in ("IntType", "SymIntType", "NumberType", "FloatType") or (kind == "BoolType" and value in (0, 1))
    if isinstance(value, float):
        return kind in ("FloatType", "NumberType")
    return False


def _bind(op: torch._ops.OpOverload, inputs: list, attrs: dict, consts) -> Optional[list]:
    """How the node's inputs (names) and typed attributes fill ``op``'s arguments, or None if they
    cannot: [("input", k) | ("value", v) | ("default", arg)] in schema order. A tensor argument takes
    any input; a non-tensor one takes an attribute of its name, or a constant input (opforge's
    encoding), never a computed value; the rest must have defaults."""
    plan, k, used = [], 0, set()
    for arg in op._schema.arguments:
        if arg.name in attrs:
            if is_tensor_arg(arg) or not _fits(arg, attrs[arg.name]):
                return None
            plan.append(("value", attrs[arg.name]))
            used.add(arg.name)
        elif k < len(inputs) and (is_tensor_arg(arg) or inputs[k] in ("", NONE_INPUT) or
                                  (inputs[k] in consts and _constant_fits(arg, consts, inputs[k]))):
            plan.append(("input", k))
            k += 1
        elif k >= len(inputs) and (arg.has_default_value() or isinstance(arg.type, torch.OptionalType)):
            plan.append(("default", arg))
        else:
            return None
    return plan if k == len(inputs) and used == set(attrs) else None


def _constant_fits(arg: torch.Argument, consts, name: str) -> bool:
    """Whether constant input ``name`` can be ``arg``: one value for a number, a list for a list (so
    ``split(x, [2, 2])`` binds split.sizes, not split.Tensor's single size). ``consts``: the
    constants' values by name, or only their names (then any constant fits)."""
    value = consts.get(name) if isinstance(consts, dict) else None
    if not isinstance(value, np.ndarray):
        return True
    t = arg.type.getElementType() if isinstance(arg.type, torch.OptionalType) else arg.type
    if isinstance(t, torch.ListType):
        return value.ndim <= 1
    return value.size == 1


def dispatch_order(packet) -> list:
    """The overloads of an ATen op a call may mean, in the order the dispatcher tries them:
    ``default``, then ``Tensor``, then the others in registration order; never ``out`` or
    in-place ones (ORT's and ONNX's inputs are read-only)."""
    names = packet.overloads()
    names = [o for o in ("default", "Tensor") if o in names] + [
        o for o in names if o not in ("default", "Tensor") and not o.endswith("out")]
    ops = [op for op in (getattr(packet, o, None) for o in names) if op is not None and in_dispatcher(op)]
    return [op for op in ops if not any(a.alias_info is not None and a.alias_info.is_write
                                        for a in op._schema.arguments)]


def bind_overload(node: onnx.NodeProto, consts) -> tuple[torch._ops.OpOverload, list]:
    """The overload an ATen node means when it names none (``overload_name=""``), chosen the way the
    dispatcher picks one for a call: the first overload -- ``default``, then ``Tensor``, then the
    others in registration order; never ``out`` or in-place ones -- whose schema the node's inputs
    (in order) and typed attributes (by name) fill, the rest taking defaults."""
    operator, overload = node_op(node)
    name = operator.split("::")[-1]
    attrs = scalar_attrs(node)
    inputs = list(node.input)
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        raise ValueError(f"opforge: aten::{name} is not an ATen operator in torch {torch.__version__}")
    overloads = packet.overloads()
    if overload:
        ops = [op for op in dispatch_order(packet) if op._overloadname == overload]
    else:
        ops = dispatch_order(packet)
    for op in ops:
        plan = _bind(op, inputs, attrs, consts)
        if plan is not None:
            return op, plan
    given = ", ".join([f"inputs {inputs}"] + [f"{k}={v!r}" for k, v in attrs.items()])
    raise ValueError(f"opforge: no overload of aten::{name}{'.' + overload if overload else ''} takes {given} "
                     f"(non-out overloads: {[o for o in overloads if not o.endswith('out')]})")
