"""``onnx.defs.OpSchema`` for each op of the custom domain, derived from its OpSpec.

Registered with ``onnx.defs.register_schema`` by :func:`opforge.register_op`, so that
``onnx.checker.check_model(full_check=True)`` and ``onnx.shape_inference`` know
our ops, and onnxscript can emit them in dynamo translations.
"""

from __future__ import annotations

import functools

import onnx
from onnx.defs import OpSchema

from ..spec import REGISTRY, OpSpec

_ATTR_TYPE = {
    "int": OpSchema.AttrType.INT,
    "ints": OpSchema.AttrType.INTS,
    "float": OpSchema.AttrType.FLOAT,
    "floats": OpSchema.AttrType.FLOATS,
    "bool": OpSchema.AttrType.INT,
}


@functools.lru_cache(maxsize=None)
def schema(spec: OpSpec) -> OpSchema:
    Param = OpSchema.FormalParameter
    Option = OpSchema.FormalParameterOption
    inputs = [
        Param(a.onnx_name, spec.type_variable_of(a), a.doc, param_option=Option.Optional if a.optional else Option.Single)
        for a in spec.tensor_args
    ]
    outputs = [Param(o.onnx_name, spec.type_variable_of(o) if o.own_types else "T", o.doc) for o in spec.output_args]
    untyped_outputs = [o.onnx_name for o in spec.output_args if not o.own_types]
    constraints = [(var, list(types), _constraint_doc(var, names, untyped_outputs)) for var, (types, names) in
                   spec.type_variables().items()]
    attributes = [OpSchema.Attribute(a.onnx_name, _ATTR_TYPE[a.kind], a.doc, required=True) for a in spec.attr_args]
    op_schema = OpSchema(
        spec.name,
        spec.domain,
        spec.domain_version,
        spec.doc,
        inputs=inputs,
        outputs=outputs,
        type_constraints=constraints,
        attributes=attributes,
    )
    op_schema.set_type_and_shape_inference_function(functools.partial(_infer, spec))
    return op_schema


def _constraint_doc(var: str, names, untyped_outputs) -> str:
    if var == "T":
        return (f"Element type of {', '.join(list(untyped_outputs) + list(names)) or 'no input or output'} "
                "(the op's onnx_types)")
    return f"Element type of {', '.join(names)} (declared with TensorArg(dtypes=...))"


def _shape_of(type_proto: onnx.TypeProto):
    if not type_proto.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in type_proto.tensor_type.shape.dim
    ]


def _infer(spec: OpSpec, ctx) -> None:
    """Each output takes the element type of its type variable: an input's of the same variable
    (the op's own type ``T``, or declared dtypes), else the variable's only type; shapes come from
    spec.onnx_output_shapes."""
    n = ctx.get_num_inputs()
    in_types = [ctx.get_input_type(i) if ctx.has_input(i) else None for i in range(n)]
    type_strings = [_TYPE_STRING_OF.get(t.tensor_type.elem_type) if t is not None and t.HasField("tensor_type")
                    else None for t in in_types]
    elem_types = []
    for i in range(ctx.get_num_outputs()):
        t = spec.output_elem_type(i, type_strings + [None] * (len(spec.tensor_args) - n)) \
            if i < len(spec.output_args) else None
        elem_types.append(_ELEM_TYPE_OF.get(t))
    if not any(elem_types):
        return
    shapes = None
    if spec.onnx_output_shapes is not None:
        attrs = {}
        for a in spec.attr_args:
            proto = ctx.get_attribute(a.onnx_name)
            attrs[a.onnx_name] = onnx.helper.get_attribute_value(proto) if proto is not None else None
        shapes = spec.onnx_output_shapes([_shape_of(t) if t is not None else None for t in in_types], attrs)
    for i, elem_type in enumerate(elem_types):
        if elem_type is None:
            continue
        shape = shapes[i] if shapes is not None and i < len(shapes) else None
        ctx.set_output_type(i, onnx.helper.make_tensor_type_proto(elem_type, shape))


# ONNX type strings ("tensor(int64)") and TensorProto element types, both ways.
_ELEM_TYPE_OF = {f"tensor({name.lower()})": value for name, value in onnx.TensorProto.DataType.items()
                 if name != "UNDEFINED"}
_TYPE_STRING_OF = {value: name for name, value in _ELEM_TYPE_OF.items()}


def _registered(spec: OpSpec) -> bool:
    try:
        onnx.defs.get_schema(spec.name, spec.domain_version, spec.domain)
        return True
    except onnx.defs.SchemaError:
        return False


def register(spec: OpSpec) -> None:
    if not _registered(spec):
        onnx.defs.register_schema(schema(spec))


def register_all() -> None:
    for spec in REGISTRY.values():
        register(spec)


class NodeTypeError(TypeError):
    """A node of an opforge-registered op has an input of an element type its OpSchema does not allow."""


def _known_elem_types(proto: onnx.ModelProto) -> dict:
    """``{value name: element type}`` for the values whose type the model states or ONNX's
    (non-strict) shape inference can tell."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False)
    except Exception:  # noqa: BLE001 - fall back to what the model states
        inferred = proto
    graph = inferred.graph
    types = {i.name: i.data_type for i in graph.initializer}
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    return types


def check_node_types(proto: onnx.ModelProto, *, where: str = "opforge") -> None:
    """Every node of a registered op gets inputs of the element types its spec declares; else
    :class:`NodeTypeError` names the op, the input, the type it got, the types allowed and where
    to declare others (before ONNX's checker or ORT says only ``typestr: T, has unsupported type``)."""
    nodes = [n for n in proto.graph.node if f"{n.domain}::{n.op_type}" in REGISTRY]
    if not nodes:
        return
    types = _known_elem_types(proto)
    for node in nodes:
        spec = REGISTRY[f"{node.domain}::{node.op_type}"]
        seen = {}  # type variable -> (input, type) of its first known input
        for arg, value in zip(spec.tensor_args, node.input):
            if not value or value not in types:
                continue
            got = f"tensor({onnx.helper.tensor_dtype_to_string(types[value]).replace('TensorProto.', '').lower()})"
            allowed = spec.onnx_types_of(arg)
            variable = spec.type_variable_of(arg)
            first = seen.setdefault(variable, (arg.onnx_name, got))
            if got in allowed and first[1] != got:
                raise NodeTypeError(
                    f"{where}: node {node.name or node.op_type!r} of {spec.onnx_qualname} gets input {arg.onnx_name!r} "
                    f"of type {got} but {first[0]!r} of type {first[1]}; they share one element type ({variable})")
            if got in allowed:
                continue
            how = (f"it is declared TensorArg({arg.name!r}, dtypes={arg.dtypes!r})" if arg.own_types else
                   f"it has the op's own element type (OpSpec.onnx_types); if the op takes other types there, declare "
                   f"them on the input: TensorArg({arg.name!r}, dtypes=(...)), e.g. dtypes=('int64',) for an index")
            raise NodeTypeError(
                f"{where}: node {node.name or node.op_type!r} of {spec.onnx_qualname} (opforge's OpSchema, from the op's "
                f"spec) gets input {arg.onnx_name!r} of type {got}, which it does not take: it allows "
                f"{', '.join(allowed)}; {how}")
