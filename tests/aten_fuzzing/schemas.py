"""The overloads to fuzz: an argument's class as a node input (``arg_kind``), ``Schema``, and
``schemas()``: every allowed operator's functional overloads, then the findings' overloads the
allow-list no longer has, and the allowed ones skipped, with why."""

from __future__ import annotations

import collections
import dataclasses
import functools

import torch


def arg_kind(arg) -> str | None:
    """The class of a schema argument as a node input, or None: it cannot be one."""
    t = arg.real_type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    kind = t.kind()
    simple = {"TensorType": "tensor", "IntType": "int", "SymIntType": "int", "FloatType": "float", "BoolType": "bool",
              "NumberType": "number", "StringType": "str", "ScalarTypeType": "dtype", "LayoutType": "layout",
              "MemoryFormatType": "memfmt", "DeviceObjType": "device"}
    if kind in simple:
        return simple[kind]
    if kind == "ListType":
        elem = t.getElementType().kind()
        return {"IntType": "ints", "SymIntType": "ints", "FloatType": "floats", "BoolType": "bools"}.get(elem)
    return None


def is_optional(arg) -> bool:
    return isinstance(arg.real_type, torch.OptionalType)


def writes(schema) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


@dataclasses.dataclass
class Schema:
    name: str  # operator, "div"
    overload: str  # schema overload name, "" for default
    op: object  # the OpOverload
    kinds: list  # per argument: its class, or None (passed as None / default: not fuzzed)
    allowed: bool = True  # in the allow-list (else only its findings run: both paths must refuse it)

    @property
    def qualname(self):
        return f"aten::{self.name}" + (f".{self.overload}" if self.overload else "")

    @property
    def args(self):
        return self.op._schema.arguments


def skip_reason(op) -> str | None:
    for a in op._schema.arguments:
        k = arg_kind(a)
        if k == "device" and not (is_optional(a) or a.has_default_value()):
            return "a Device argument (no node input can be a Device)"
        if k is None and not (is_optional(a) or a.has_default_value()):
            return f"a {a.real_type} argument"
    return None


@functools.lru_cache(maxsize=None)
def schemas() -> tuple[list, dict]:
    """([Schema] of every allowed op's functional overloads, then those of the findings' ops the
    allow-list no longer has; {reason: [qualnames]} of the allowed overloads skipped)."""
    from opforge.aten import policy

    from .findings import EXTRAS  # (here: the findings' module builds on modules that import this one)

    allowed = policy.committed()[0]
    out, skipped = [], collections.defaultdict(list)
    extra_ops = {e.target[len("aten::"):].split(".")[0] for e in EXTRAS}
    for name in sorted(allowed | extra_ops):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            skipped["not in this torch"].append(f"aten::{name}")
            continue
        for overload in sorted(packet.overloads()):
            op = getattr(packet, overload)
            s = op._schema
            if policy._writes(s):
                continue
            qualname = f"aten::{name}" + (f".{s.overload_name}" if s.overload_name else "")
            if name not in allowed and not any(e.target == qualname for e in EXTRAS):
                continue
            why = skip_reason(op)
            if why:
                skipped[why].append(qualname)
                continue
            kinds = [arg_kind(a) if arg_kind(a) != "device" else None for a in s.arguments]
            out.append(Schema(name, s.overload_name, op, kinds, name in allowed))
    return out, dict(skipped)
