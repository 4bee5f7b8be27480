"""A TorchScript symbolic for any ATen op the dynamo exporter can translate: the ATen bridge.

The TorchScript exporter (``dynamo=False``) has no rule for many ATen ops that the dynamo
exporter handles (through torchlib's onnxscript functions or through torch's decompositions).
For those, :func:`symbolic` derives a rule from the dynamo side at export time:

1. From the TorchScript node: its exact overload (``node.schema()``), its tensor inputs (dtype
   and shape, dynamic dims included) and its constant arguments (:mod:`.binding`).
2. The op alone, with those inputs, goes through the dynamo exporter's own pipeline
   (``torch.export`` -> torch's decompositions -> torchlib), giving an opset-18 ONNX graph
   (:mod:`.translation`, with :mod:`.compositions` where dynamo's own translation is wrong).
   Functions are inlined. The result is cached per signature.
3. That graph is brought to the target opset node by node (:mod:`.downgrade`): unchanged where
   the op's schema is the same, converted where the form changed (``axes`` inputs back to
   attributes, ``CastLike`` to ``Cast``, ...), refused with the ONNX op and opset named where
   ONNX cannot express it at that opset. A refused graph is retried in the other forms
   (:class:`~.translation.Form`): torch's decompositions of the op, then opforge's compositions
   for older opsets (:mod:`.lowerings`). What is kept must pass ONNX's checker at the target
   opset. (:func:`lowered`)
4. Its nodes are written into the TorchScript graph with ``g.op``, typed (:func:`emit`).

Where torch has its own rule, :func:`torch_rule_then_bridge` keeps it first and hands the bridge
only the calls it refuses. :func:`register_all` registers the bridge for every op with a sample
(:mod:`.samples`) and for the complex carriers.

Nothing here runs unless a bridged op is exported: torchlib's registry (about a second to
build) is loaded on first use, so models that need no bridge export exactly as fast as before.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np
import onnx
import torch

from ..spec import TORCHSCRIPT_OPSETS
from . import lowerings, rules, samples
from .binding import DTYPES, Call, call_of, is_complex, tensor_inputs
from .downgrade import Downgrade, Graph, check_valid
from .errors import BridgeError
from .translation import Form, translate


@functools.lru_cache(maxsize=8192)
def lowered(call: Call, opset: int) -> tuple:
    """``(inputs, nodes, outputs, types)`` of ``call`` at ``opset``; BridgeError if ONNX cannot
    express it. ``types``: value name -> (ONNX elem type, dims) where inferred."""
    first_error = None
    # torchlib's direct translation first (fewest nodes); where it needs an ONNX op newer than
    # the opset, the other forms in turn. The error reported is the direct form's: it names
    # the ONNX op that is too new.
    for form in Form:
        try:
            graph = Graph(translate(call, form))
            nodes = Downgrade(graph, opset, call.overload).run()
            check_valid(graph, nodes, opset, call.overload)
            types = {n: (t, graph.shapes.get(n)) for n, t in graph.types.items()}
            return graph.inputs, nodes, graph.outputs, types
        except BridgeError as exc:
            if not str(exc).startswith(call.overload):
                exc = BridgeError(f"{call.overload} at opset {opset}: {exc}")
            if first_error is None:
                first_error = exc
            if form == Form.LOWERING and call.name in lowerings.LOWERINGS:
                # opforge has a composition for older opsets and it failed: its reason matters.
                raise BridgeError(f"{first_error}; opforge's composition for older opsets: "
                                  f"{str(exc).removeprefix(call.overload + ': ')}") from None
    raise first_error


# --------------------------------------------------------------------------------------------
# Step 4: into the TorchScript graph


def _g_attrs(attrs: dict) -> dict:
    out = {}
    for name, v in attrs.items():
        if isinstance(v, np.ndarray):
            out[f"{name}_t"] = torch.from_numpy(np.array(v, copy=True, order="C"))  # (ascontiguousarray makes 0-d 1-d)
        elif isinstance(v, bool):
            out[f"{name}_i"] = int(v)
        elif isinstance(v, int):
            out[f"{name}_i"] = v
        elif isinstance(v, float):
            out[f"{name}_f"] = v
        elif isinstance(v, str):
            out[f"{name}_s"] = v
        elif isinstance(v, (list, tuple)):
            if all(isinstance(x, int) for x in v):
                out[f"{name}_i"] = list(v)
            elif all(isinstance(x, (int, float)) for x in v):
                out[f"{name}_f"] = [float(x) for x in v]
            elif all(isinstance(x, str) for x in v):
                out[f"{name}_s"] = list(v)
            else:
                raise BridgeError(f"attribute {name} of kind {type(v[0]).__name__} list")
        else:
            raise BridgeError(f"attribute {name} of kind {type(v).__name__}")
    return out


def emit(g, call: Call, values: Sequence) -> Any:
    """Write ``call`` into ``g`` at ``g.opset`` with ``values`` as its tensor inputs."""
    inputs, nodes, outputs, types = lowered(call, g.opset)
    env = dict(zip(inputs, values))
    for node in nodes:
        args = [env[i] if i else None for i in node.inputs]
        while args and args[-1] is None:
            args.pop()
        if any(a is None for a in args):
            from torch.onnx import symbolic_helper

            args = [a if a is not None else symbolic_helper._optional_input_placeholder_tensor(g) for a in args]
        result = g.op(node.op_type, *args, outputs=len(node.outputs), **_g_attrs(node.attrs))
        for name, v in zip(node.outputs, result if len(node.outputs) > 1 else (result,)):
            env[name] = v
            _set_type(v, types.get(name))
    results = [env[o] for o in outputs]
    return results[0] if len(results) == 1 else tuple(results)


_TORCH_DTYPES = {onnx.helper.np_dtype_to_tensor_dtype(torch.empty((), dtype=t).numpy().dtype): t
                 for t in DTYPES.values() if t != torch.bfloat16 and not t.is_complex}


def _set_type(value, known) -> None:
    # g.op outputs are untyped; the TorchScript exporter's scalar-type pass then treats a 0-d
    # untyped value as a float scalar and casts it (nll_loss's float64 result came out float32).
    # The translated graph knows each value's type and shape: give them to TorchScript.
    if known is None or known[0] not in _TORCH_DTYPES:
        return
    dtype, dims = _TORCH_DTYPES[known[0]], known[1]
    t = value.type()
    if t.kind() != "TensorType":
        return
    t = t.with_dtype(dtype)
    if dims is not None:
        t = t.with_sizes(dims)
    value.setType(t)


def touches_complex(node) -> bool:
    """Whether a traced node takes or gives a complex tensor (a Tensor[] of them included)."""
    return any(is_complex(v) for v in (*node.inputs(), *node.outputs()))


def _complex_consumers(value):
    """The nodes that use a complex value, through lists and tuples built or unpacked."""
    for use in value.uses():
        user = use.user
        if user.kind() in ("prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack", "prim::TupleUnpack"):
            for out in user.outputs():
                yield from _complex_consumers(out)
        else:
            yield user


def handles_complex(kind: str, opset: int) -> bool:
    """Whether the symbolic registered for ``kind`` at ``opset`` sends complex calls to the bridge."""
    group = rules._torch_registry().get_function_group(kind)
    fn = group.get(opset) if group is not None else None
    return fn is symbolic or getattr(fn, "opforge_complex_aware", False)


def _check_complex_consumers(node, opset: int) -> None:
    # The bridge writes a complex result as a real pair. An op that reads it with torch's rule
    # (which knows nothing of the pair) would compute a silently wrong answer: refuse first.
    op = node.kind()
    for out in node.outputs():
        if not is_complex(out):
            continue
        for user in _complex_consumers(out):
            if user.kind() == "prim::Return":
                raise BridgeError(f"the model returns the complex result of {op}; ONNX Runtime has no complex "
                                  "tensors, and opforge carries them as real pairs only inside the model: return "
                                  "torch.view_as_real(...) (or .abs(), .real, .imag) instead")
            if not user.kind().startswith("aten::") or not handles_complex(user.kind(), opset):
                raise BridgeError(f"{user.kind()} takes the complex result of {op}; opforge carries complex "
                                  "tensors (as real pairs) only through the ops the dynamo exporter translates "
                                  f"for them, and {user.kind()} is not one at opset {opset}: convert to real "
                                  "values first (torch.view_as_real, .abs(), .real, .imag) or use dynamo=True")


def symbolic(g, *args):
    """The TorchScript symbolic of every bridged op (registered by :func:`register`)."""
    node = g.original_node
    try:
        if any(is_complex(v) and v.node().kind() == "prim::Param" for v in node.inputs()):
            raise BridgeError("a model input is a complex tensor; ONNX Runtime has no complex tensors: pass "
                              "torch.view_as_real(z) and call torch.view_as_complex on it inside the model")
        call = call_of(node, args)
        if any(is_complex(v) for v in node.outputs()):
            _check_complex_consumers(node, g.opset)
        result = emit(g, call, tensor_inputs(call, args))
    except BridgeError as exc:
        from torch.onnx import errors

        raise errors.SymbolicValueError(f"opforge's ATen bridge cannot export {node.kind()}: {exc}",
                                        list(node.outputs())[0]) from None
    outputs = list(node.outputs())
    if len(outputs) == 1 and outputs[0].type().kind() == "ListType":
        # A Tensor[] result (hsplit, unbind_copy, gradient, ...) is one list value in the traced
        # graph; the exporter resolves the prim::ListUnpack that follows against this list.
        return g.op("prim::ListConstruct", *(result if isinstance(result, tuple) else (result,)))
    return result


#: Inputs for which torch's own rule writes a model ONNX Runtime rejects (measured: the If
#: branches of its diagonal disagree on float64; its per-channel QuantizeLinear takes no
#: float64) or one that computes wrong values (its index_add keeps one of the rows that share
#: an index instead of adding them all, with only a Python warning): the bridge handles those
#: calls instead.
_TORCH_RULE_INVALID_FOR: dict[str, Callable] = {
    "diagonal": lambda args: rules._scalar_type(args[0]) == "Double",
    "fake_quantize_per_channel_affine": lambda args: rules._scalar_type(args[0]) == "Double",
    "index_add": lambda args: True,
}


#: Follows torch's own refusal where the bridge cannot take the call either (opforge coverage
#: reads it: torch alone cannot export such a call).
BRIDGE_REFUSED_TOO = "and opforge's ATen bridge cannot export it either"


def torch_rule_then_bridge(name: str, torch_rule: Callable) -> Callable:
    """At an opset where torch has its own rule for ``aten::<name>``: torch's rule, always first;
    the bridge only where torch's rule refuses the call's arguments (cross_entropy's
    label_smoothing, scatter_reduce's mean and include_self=False, ...), leaves an output the
    model uses unwritten (native_dropout's mask), or is known to write an invalid model."""

    @functools.wraps(torch_rule)
    def symbolic_with_bridge(g, *args, **kwargs):
        from torch.onnx import errors

        invalid = _TORCH_RULE_INVALID_FOR.get(name)
        if invalid is not None and invalid(args):
            return symbolic(g, *args)
        written = len(g.new_nodes)
        try:
            result = torch_rule(g, *args, **kwargs)
        except errors.OnnxExporterError as exc:
            _discard_nodes_since(g, written)
            try:
                return symbolic(g, *args)
            except errors.SymbolicValueError as bridge_exc:
                reason = str(bridge_exc).split("  [Caused")[0].removeprefix("opforge's ATen bridge cannot export ")
                raise errors.SymbolicValueError(f"{str(exc).split('  [Caused')[0]} ({BRIDGE_REFUSED_TOO}: {reason})",
                                                list(g.original_node.outputs())[0]) from None
        outputs = list(g.original_node.outputs())
        results = result if isinstance(result, (tuple, list)) else (result,)
        if len(outputs) > 1 and any(r is None and o.uses() for r, o in zip(results, outputs)):
            _discard_nodes_since(g, written)
            return symbolic(g, *args)
        return result

    symbolic_with_bridge.opforge_bridge_fallback = True
    return symbolic_with_bridge


def _discard_nodes_since(g, written: int) -> None:
    # Nodes torch's rule wrote before the bridge took over would stay in the model, unused.
    # (g.op records every node it adds in g.new_nodes.)
    for node in reversed(g.new_nodes[written:]):
        node.destroy()
    del g.new_nodes[written:]


#: Ops torch has TorchScript rules for that the dynamo exporter also translates for complex
#: tensors (its translations checked against torch in ONNX Runtime: tests/test_aten_bridge.py).
#: Their rules are wrapped so that a call on complex tensors goes to the bridge. Ops not listed
#: here (unsqueeze, select, exp, pow, where, ...: dynamo cannot either) refuse a complex input.
COMPLEX_CARRIERS: tuple[str, ...] = (
    "abs", "add", "sub", "mul", "div", "neg", "reciprocal", "sum", "mean", "matmul",
    "slice", "transpose", "permute", "reshape", "view", "flatten", "squeeze", "flip", "roll",
    "cat", "stack", "clone", "contiguous", "stft", "_conj", "resolve_conj", "resolve_neg",
    "t", "numpy_T", "size",
)


def _complex_size(g, rule: Callable, self, dim=None):
    # x.size(d) of a complex x, on its real pair: a negative d counts from the dim before the
    # pair's (the tracer records one aten::size per dim a model reads).
    from torch.onnx import errors, symbolic_helper

    d = None if dim is None else symbolic_helper._maybe_get_const(dim, "i")
    if not isinstance(d, int):
        raise errors.SymbolicValueError("opforge's ATen bridge: aten::size of a complex tensor needs a constant dim",
                                        list(g.original_node.outputs())[0])
    return rule(g, self, g.op("Constant", value_t=torch.tensor(d - 1 if d < 0 else d)))


def complex_to_bridge(name: str, rule: Callable) -> Callable:
    """``rule`` for real tensors; the bridge for a call that takes or gives complex ones."""

    @functools.wraps(rule)
    def symbolic_complex_aware(g, *args, **kwargs):
        if touches_complex(g.original_node):
            return _complex_size(g, rule, *args) if name == "size" else symbolic(g, *args)
        return rule(g, *args, **kwargs)

    symbolic_complex_aware.opforge_bridge_fallback = True  # rules.torch_rule() unwraps it
    symbolic_complex_aware.opforge_complex_aware = True
    return symbolic_complex_aware


def register_complex_carriers(opsets: Sequence[int]) -> None:
    """Wraps the rule of each of :data:`COMPLEX_CARRIERS` (torch's, or opforge's wrapper of it)."""
    registry = rules._torch_registry()
    for name in COMPLEX_CARRIERS:
        group = registry.get_function_group(f"aten::{name}")
        for opset in opsets:
            fn = group.get(opset) if group is not None else None
            if fn is None or fn is symbolic or getattr(fn, "opforge_complex_aware", False):
                continue
            torch.onnx.register_custom_op_symbolic(f"aten::{name}", complex_to_bridge(name, fn), opset)


def register_all() -> None:
    """Every op with a sample (:mod:`.samples`) but the ones :mod:`.rules` maps gets the bridge:
    where torch has no rule of its own, and behind torch's rule where it has one (the bridge
    never shadows torch; it loads nothing until a bridged op is exported). Then the complex
    carriers. Runs after :func:`opforge.aten.rules.register_all`."""
    ruled = {r.aten for r in rules.RULES}
    register(sorted(set(samples.SAMPLES) - ruled), TORCHSCRIPT_OPSETS)
    register_complex_carriers(TORCHSCRIPT_OPSETS)


def register(names: Sequence[str], opsets: Sequence[int]) -> None:
    """For ``aten::<name>`` at each opset: :func:`symbolic` where torch has no rule; where it has
    one, that rule wrapped by :func:`torch_rule_then_bridge` (torch's rule stays first)."""
    for name in names:
        for opset in opsets:
            fn = rules.torch_rule(name, opset)
            torch.onnx.register_custom_op_symbolic(
                f"aten::{name}", symbolic if fn is None else torch_rule_then_bridge(name, fn), opset)
