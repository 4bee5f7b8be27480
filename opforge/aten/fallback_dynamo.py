"""The ATen fallback in the dynamo exporter: which ATen ops a program must keep whole because
nothing translates them (:func:`decompose_keeping_fallbacks`), and the translation that writes
one ``org.pytorch.aten::ATen`` node for each (:func:`fallback_translation`). The nodes are made
runnable afterwards by :func:`opforge.aten.fallback.prepare`, as the TorchScript exporter's are."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..exporter_cache import DROPPED_CHECKS, torchlib_registry
from .fallback import _constant_tensor, register_schema
from .nodes import ATEN_DOMAIN


def _constant(op, value: Any, arg: torch.Argument):
    return op.Constant(value=_constant_tensor(value, arg))


def fallback_translation(target: torch._ops.OpOverload) -> Callable:
    """A dynamo translation emitting ``org.pytorch.aten::ATen`` for ``target``."""
    from onnxscript import opset18 as op
    from onnxscript import values as osv

    register_schema()
    aten = osv.Opset(ATEN_DOMAIN, 1)
    s = target._schema
    name, overload = s.name.split("::")[1], s.overload_name
    n_out = len(s.returns)

    def translation(*args, **kwargs):
        inputs = []
        for i, arg in enumerate(s.arguments):
            if i < len(args):
                value = args[i]
            elif arg.name in kwargs:
                value = kwargs[arg.name]
            elif arg.has_default_value():
                value = arg.default_value
            else:
                value = None
            if value is None or isinstance(value, (bool, int, float, str, list, tuple, torch.dtype)) and not _is_value(value):
                inputs.append(None if value is None else _constant(op, value, arg))
            else:
                inputs.append(value)
        while inputs and inputs[-1] is None:
            inputs.pop()
        return aten.ATen(*inputs, operator=name, overload_name=overload, _num_outputs=n_out)

    translation.__name__ = f"aten_fallback_{name}_{overload or 'default'}"
    return translation


def _is_value(x) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_is_value(v) for v in x)
    return not isinstance(x, (bool, int, float, str, torch.dtype, type(None)))


def _canonical(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    # Graph metadata can hold distinct-but-equal OpOverload objects; sets need one identity.
    return getattr(getattr(torch.ops.aten, op._schema.name.split("::")[1]), op._overloadname)


def untranslatable_ops(decomposed: torch.export.ExportedProgram, translated: Callable[[Any], bool], *,
                       strict: bool = True) -> tuple[set, dict, bool]:
    """The ops of the decomposed program that nothing translates (``translated(op)`` is False):
    (the ATen ops to keep whole, {name: op} of the non-ATen ones with no ATen op to fall back to,
    whether an ATen op was found only as the source of other ops: ``prims.frexp`` from
    ``aten.frexp``, whose decomposition a next round must keep). With ``strict``, a non-ATen op
    raises instead."""
    aten_ops, others, via_source = set(), {}, False
    for node in decomposed.graph.nodes:
        t = node.target
        if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or translated(t):
            continue
        if t._opname.startswith(DROPPED_CHECKS):
            continue
        if t.namespace == "aten":
            aten_ops.add(_canonical(t))
            continue
        source = node.meta.get("original_aten")
        if isinstance(source, torch._ops.OpOverload) and source.namespace == "aten":
            aten_ops.add(_canonical(source))
            via_source = True
        elif strict:
            raise ValueError(f"opforge: {t} has no ONNX translation and no ATen op to fall back to "
                             "(it is not an ATen op: give it a custom op or a translation)")
        else:
            others[str(t)] = t
    return aten_ops, others, via_source


def decompose_keeping_fallbacks(exported: torch.export.ExportedProgram, custom: dict, *, strict: bool = True):
    """Decomposes ``exported`` like the dynamo exporter does, except that ATen ops which
    would end up untranslatable (directly, or as the ``prims.*`` ops they decompose to)
    are kept whole so they can fall back to one ATen node each. Returns the decomposed
    program and the ATen ops that need the fallback (with ``strict=False``, also the
    non-ATen ops nothing can translate, as a third item, instead of raising).

    A round that finds new ops only as themselves ends the planning: they came through the
    decomposition whole, so keeping them changes no decomposition and another round (a whole
    retrace) would find the same graph (D-FINE's export with the fallback: 20-21 s with that round,
    14-15 s without). Only an op found as the source of others (``prims.frexp`` from
    ``aten.frexp``) needs the next round, which keeps it."""
    from torch.onnx._internal.exporter import _decomp

    registry = torchlib_registry()
    implemented = set(_decomp.get_onnx_implemented_overloads(registry)) | set(custom)
    keep: set = set()
    others: dict = {}
    for _ in range(8):  # each round keeps the sources of newly found untranslatable ops
        table = _decomp.create_onnx_friendly_decomposition_table(implemented | keep)
        decomposed = exported.run_decompositions(table)
        new, found_others, via_source = untranslatable_ops(
            decomposed, lambda t: t in implemented or t in keep or registry.is_registered(t), strict=strict)
        others.update(found_others)
        if not via_source or not new - keep:
            fallbacks = sorted(keep | new, key=str)
            return (decomposed, fallbacks) if strict else (decomposed, fallbacks, list(others.values()))
        keep |= new
    raise RuntimeError("opforge: ATen fallback planning did not converge")
