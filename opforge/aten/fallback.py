"""ATen fallback: export ops ONNX cannot express as ``org.pytorch.aten::ATen`` nodes, and
make such models runnable by ONNX Runtime with ``libopforge_aten``.

Encoding (what torch's ``OperatorExportTypes.ONNX_ATEN_FALLBACK`` emits, and what the
dynamo fallback, :mod:`.fallback_dynamo`, emits too): one ``ATen`` node per op, attributes ``operator``
(``"cummax"``) and ``overload_name`` (``""`` or e.g. ``"Tensor"``); inputs are the
schema's arguments in order, tensors as tensors and non-tensor arguments as constant
inputs (int/bool -> int64/bool scalars, float -> float64 scalar, int list -> 1-D int64).

:func:`prepare` normalises exported models for ONNX Runtime, which types custom-op
outputs from the model and rejects absent entries in a variadic input list:
interior ``""`` (None) inputs become the empty initializer ``opforge_aten_none``
(the kernel reads that name as None), trailing ones are dropped (defaults), and
every ATen output gets its element type in ``value_info``, found by running the op
on meta tensors.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.defs import OpSchema

from . import policy
from .nodes import (ATEN_DOMAIN, NONE_INPUT, ONNX_TO_TORCH, SCALAR_TYPES, TORCH_TO_ONNX, bind_overload,
                    check_constant, decode_constant, node_op, resolve, scalar_attrs)



class AtenFallbackWarning(UserWarning):
    """Raised (as a warning) by every export that fell back to ATen nodes, naming the ops."""


@functools.lru_cache(maxsize=None)
def schema() -> OpSchema:
    all_types = [f"tensor({t})" for t in ("float", "double", "float16", "bfloat16", "int8", "uint8", "int16",
                                          "int32", "int64", "bool", "string")]
    Param = OpSchema.FormalParameter
    variadic = OpSchema.FormalParameterOption.Variadic
    return OpSchema(
        "ATen", ATEN_DOMAIN, 1,
        "Runs the PyTorch ATen operator `operator`.`overload_name` (libopforge_aten in ONNX Runtime).",
        inputs=[Param("inputs", "T", "schema arguments in order", param_option=variadic, is_homogeneous=False, min_arity=0)],
        outputs=[Param("outputs", "T", "the op's returns", param_option=variadic, is_homogeneous=False, min_arity=1)],
        type_constraints=[("T", all_types, "any tensor type")],
        attributes=[
            OpSchema.Attribute("operator", OpSchema.AttrType.STRING, "ATen op name, e.g. cummax", required=True),
            OpSchema.Attribute("overload_name", OpSchema.AttrType.STRING, "overload, '' for the default", required=False),
        ],
    )


def register_schema() -> None:
    try:
        onnx.defs.get_schema("ATen", 1, ATEN_DOMAIN)
    except onnx.defs.SchemaError:
        onnx.defs.register_schema(schema())


# ---- post-processing of exported models -------------------------------------------------

class _Constants(dict):
    """name -> value of a graph's initializers and Constant nodes, made once per prepare() and
    converted to numpy only when read: the constants ATen arguments name are read, the model's
    weights never are. Constants prepare() adds are added here too (``add``)."""

    def __init__(self, graph: onnx.GraphProto):
        super().__init__()
        for init in graph.initializer:
            dict.__setitem__(self, init.name, init)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                for attr in node.attribute:
                    if attr.name == "value":
                        dict.__setitem__(self, node.output[0], attr.t)

    def __getitem__(self, name):
        value = dict.__getitem__(self, name)
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
            dict.__setitem__(self, name, value)
        return value

    def get(self, name, default=None):
        return self[name] if name in self else default

    def add(self, tensor: onnx.TensorProto) -> None:
        dict.__setitem__(self, tensor.name, tensor)


def _output_dtypes(op: torch._ops.OpOverload, node: onnx.NodeProto, types: dict, shapes: dict, consts: dict,
                   unknown_dim: int = 2):
    """Runs op on meta tensors built from the node's input types and shapes (a dim ONNX does not
    know becomes ``unknown_dim``); [(ONNX type, shape)] per output, or None when it cannot."""
    args, kwargs = [], {}
    for i, arg in enumerate(op._schema.arguments):
        name = node.input[i] if i < len(node.input) else ""
        put = (lambda v, a=arg: kwargs.__setitem__(a.name, v)) if arg.kwarg_only else args.append
        if arg.name == "device":  # factory ops (zeros, arange...): sizes only, nothing allocated
            put(torch.device("meta"))
            continue
        if name in ("", NONE_INPUT):
            if i >= len(node.input):
                break
            put(None)
            continue
        is_tensor = isinstance(arg.type, torch.TensorType) or (
            isinstance(arg.type, torch.OptionalType) and isinstance(arg.type.getElementType(), torch.TensorType))
        if is_tensor:
            if name not in types:
                return None
            shape = [d if isinstance(d, int) and d >= 0 else unknown_dim for d in shapes.get(name) or []]
            put(torch.empty(shape, dtype=ONNX_TO_TORCH[types[name]], device="meta"))
        elif name in consts:
            check_constant(op, i, arg, consts[name])
            put(decode_constant(arg, consts[name]))
        else:
            return None
    device = next((a for a in op._schema.arguments if a.name == "device"), None)
    if device is not None and device.name not in kwargs and not any(isinstance(a, torch.device) for a in args):
        if not device.kwarg_only:
            return None  # a positional device after the node's last input: cannot be put on meta
        # a factory op whose device the node leaves out (trailing defaults): on meta too, or the
        # typing run would make the model's zeros([1 << 20, 1 << 20]) for real, in this process
        kwargs["device"] = torch.device("meta")
    try:
        out = op(*args, **kwargs)
    except Exception:
        return None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [(TORCH_TO_ONNX.get(o.dtype), list(o.shape)) if isinstance(o, torch.Tensor) else None for o in outs]


def _known_types(model: onnx.ModelProto) -> tuple[dict, dict]:
    inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    types, shapes = {}, {}
    g = inferred.graph
    for v in list(g.input) + list(g.value_info) + list(g.output):
        tt = v.type.tensor_type
        if tt.elem_type:
            types[v.name] = tt.elem_type
            if tt.HasField("shape"):
                shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    for init in g.initializer:
        types[init.name] = init.data_type
        shapes[init.name] = list(init.dims)
    return types, shapes


def _fix_string_constants(g: onnx.GraphProto) -> None:
    """The TorchScript ATen fallback writes string arguments (``side="right"``) as
    ``Constant(value=<string attribute>)``, which is not valid ONNX: make them 0-d
    string tensors."""
    for node in g.node:
        if node.op_type != "Constant":
            continue
        for attr in node.attribute:
            if attr.name == "value" and attr.type == onnx.AttributeProto.STRING:
                text = attr.s
                attr.CopyFrom(helper.make_attribute("value", helper.make_tensor("value", TensorProto.STRING, [], [text])))


def _unpack_sequence_outputs(g: onnx.GraphProto, aten_nodes, consts: _Constants) -> None:
    """The dynamo exporter gives a custom node one output and reads multiple returns
    with ``SequenceAt(out, k)``; make those real outputs of the ATen node instead (the index
    constants nothing reads any more are dropped from the graph; ``consts`` may keep them)."""
    for node in aten_nodes:
        out = node.output[0]
        readers = [n for n in g.node if out in n.input]
        if not readers or not all(n.op_type == "SequenceAt" and n.input[0] == out for n in readers):
            continue
        picks = {int(consts[n.input[1]].reshape(-1)[0]): n.output[0] for n in readers}
        n_out = max(picks) + 1
        del node.output[:]
        node.output.extend(picks.get(k, f"{out}_unused_{k}") for k in range(n_out))
        for n in readers:
            g.node.remove(n)
        for index in {n.input[1] for n in readers}:  # drop index constants nothing reads any more
            if not any(index in n.input for n in g.node) and index not in {o.name for o in g.output}:
                for init in [i for i in g.initializer if i.name == index]:
                    g.initializer.remove(init)
                for c in [n for n in g.node if n.op_type == "Constant" and index in n.output]:
                    g.node.remove(c)
        kept = [v for v in g.value_info if v.name != out]
        del g.value_info[:]
        g.value_info.extend(kept)


def _resolve_node(g: onnx.GraphProto, node: onnx.NodeProto, index: int, consts: dict) -> None:
    """Names the overload of an ATen node that names none and rewrites typed scalar attributes
    into opforge's encoding: constant inputs in schema order (defaults in between spelled out)."""
    op, plan = bind_overload(node, consts)
    inputs = list(node.input)
    while plan and plan[-1][0] == "default":  # trailing defaults: left out, as the runtime fills them
        plan.pop()
    new_inputs = []
    for (kind, what), arg in zip(plan, op._schema.arguments):
        if kind == "input":
            new_inputs.append(inputs[what])
            continue
        value = what if kind == "value" else arg.default_value
        if value is None:
            new_inputs.append("")
            continue
        const = f"opforge_aten_{index}_{arg.name}"
        if const not in consts:  # (prepare may run twice on one model)
            g.initializer.append(_constant_tensor(value, arg, const))
            consts.add(g.initializer[-1])
        new_inputs.append(const)
    kept = [a for a in node.attribute if a.name == "operator"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("overload_name", op._schema.overload_name)])
    del node.input[:]
    node.input.extend(new_inputs)


#: metadata_props key prepare() sets on a model whose ATen nodes it normalised, so
#: opforge.ort_session does not prepare (copy, rewrite, serialize) it a second time.
PREPARED_KEY = "opforge.aten_prepared"


def is_prepared(model: onnx.ModelProto) -> bool:
    return any(p.key == PREPARED_KEY for p in model.metadata_props)


def prepare(model: onnx.ModelProto, allow_aten=None) -> tuple[onnx.ModelProto, list[str]]:
    """Normalises ATen nodes for ONNX Runtime (see module doc). Returns the model and the
    sorted list of ATen ops it contains (``["aten::cummax", ...]``).

    An operator libopforge_aten would refuse (:mod:`.policy`) raises
    :class:`~opforge.aten.policy.AtenOpRefused` first, before anything of the model is
    run, unless ``allow_aten`` names it."""
    g = model.graph
    policy.check_model(model, allow_aten)  # every ATen node, functions and subgraphs included
    aten_nodes = [n for n in g.node if n.op_type == "ATen" and n.domain == ATEN_DOMAIN]
    if not aten_nodes:
        return model, []
    register_schema()
    # The dynamo exporter cannot type multi-output custom nodes and leaves type-less
    # value_info behind (invalid ONNX); drop those, the types are filled in below.
    typed = [v for v in g.value_info if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type]
    if len(typed) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(typed)
    _fix_string_constants(g)
    consts = _Constants(g)  # name -> value: a constant must also fit the argument it fills
    _unpack_sequence_outputs(g, aten_nodes, consts)
    ops = set()
    need_none = False
    for index, node in enumerate(aten_nodes):
        if scalar_attrs(node):
            _resolve_node(g, node, index, consts)
        elif not node_op(node)[1]:
            try:
                _resolve_node(g, node, index, consts)
            except ValueError:
                pass  # computed values for scalar arguments (sizes from shapes): resolve()'s rule names it
        operator, overload = node_op(node)
        resolved = resolve(operator, overload)._schema.overload_name
        if resolved != overload:  # make the ambiguous "" explicit for the runtime
            for a in node.attribute:
                if a.name == "overload_name":
                    a.s = resolved.encode()
            if not any(a.name == "overload_name" for a in node.attribute):
                node.attribute.append(helper.make_attribute("overload_name", resolved))
            overload = resolved
        ops.add(f"aten::{operator}" + (f".{overload}" if overload else ""))
        inputs = list(node.input)
        while inputs and inputs[-1] == "":
            inputs.pop()
        if "" in inputs:
            need_none = True
            inputs = [NONE_INPUT if name == "" else name for name in inputs]
        del node.input[:]
        node.input.extend(inputs)
    if need_none and NONE_INPUT not in {i.name for i in g.initializer}:
        g.initializer.append(numpy_helper.from_array(np.zeros(0, np.int64), NONE_INPUT))

    # Type the ATen outputs, in graph order, re-running ONNX inference as types become known.
    # The value_info written keeps every dim unknown (they may be dynamic); the sizes the meta
    # run gave are kept here for the ATen nodes that read them (ATen -> ATen chains), where
    # placeholder sizes would not fit together (a (2, 2) result added to a (3, 4) input).
    typed_values = {v.name for v in list(g.value_info) + list(g.output) if v.type.tensor_type.elem_type}
    pending = [n for n in aten_nodes if not all(o in typed_values for o in n.output if o)]
    meta_shapes: dict = {}
    while pending:
        types, shapes = _known_types(model)
        for name, shape in meta_shapes.items():
            if name not in shapes or any(d is None for d in shapes[name]):
                shapes[name] = shape
        progress = False
        for node in list(pending):
            op = resolve(*node_op(node))
            # placeholder 2 keeps a rank (squeeze); 1 broadcasts against any known size
            dtypes = (_output_dtypes(op, node, types, shapes, consts)
                      or _output_dtypes(op, node, types, shapes, consts, unknown_dim=1))
            if dtypes is None:
                continue
            graph_outputs = {o.name: o for o in g.output}
            for out, meta in zip(node.output, dtypes):
                if out and out not in typed_values and meta is not None and meta[0] is not None:
                    meta_shapes[out] = meta[1]
                    type_proto = helper.make_tensor_type_proto(meta[0], [None] * len(meta[1]))
                    if out in graph_outputs:  # the exporter left it untyped
                        graph_outputs[out].type.CopyFrom(type_proto)
                    else:
                        g.value_info.append(helper.make_value_info(out, type_proto))
                    typed_values.add(out)
            pending.remove(node)
            progress = True
        if not progress:
            names = ", ".join(n.name or n.output[0] for n in pending)
            warnings.warn(f"opforge: could not infer output types of ATen node(s) {names}; "
                          "ONNX Runtime may reject the model", AtenFallbackWarning, stacklevel=2)
            break
    if not is_prepared(model):
        model.metadata_props.add(key=PREPARED_KEY, value="1")
    return model, sorted(ops)


def _constant_tensor(value: Any, arg: torch.Argument, name: str = "v") -> TensorProto:
    """A non-tensor argument value as the constant tensor libopforge_aten decodes (module doc)."""
    t = getattr(arg, "real_type", arg.type)  # .type shows ScalarType as int
    kind = t.getElementType().kind() if isinstance(t, torch.OptionalType) else t.kind()
    if kind == "ScalarTypeType" and not isinstance(value, torch.dtype):
        # the dynamo exporter hands dtypes to translations as ONNX data types (ir.DataType)
        value = ONNX_TO_TORCH[int(value)]
    if isinstance(value, torch.dtype):
        code = {v: k for k, v in SCALAR_TYPES.items()}[value]
        return helper.make_tensor(name, TensorProto.INT64, [], [code])
    if kind == "BoolType" and isinstance(value, int):  # a g.at int attribute (ONNX has no bool attribute)
        value = bool(value)
    if isinstance(value, bool):
        return helper.make_tensor(name, TensorProto.BOOL, [], [value])
    if isinstance(value, int) and kind != "FloatType":
        return helper.make_tensor(name, TensorProto.INT64, [], [value])
    if isinstance(value, (int, float)):
        return helper.make_tensor(name, TensorProto.DOUBLE, [], [float(value)])
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return helper.make_tensor(name, TensorProto.INT64, [len(value)], list(value))
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return helper.make_tensor(name, TensorProto.DOUBLE, [len(value)], [float(v) for v in value])
    if isinstance(value, str):
        return helper.make_tensor(name, TensorProto.STRING, [], [value.encode()])
    raise TypeError(f"opforge: cannot encode argument {arg.name}={value!r} of type {arg.type} as an ATen node input")
