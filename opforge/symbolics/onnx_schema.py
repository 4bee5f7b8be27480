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
    "bool": OpSchema.AttrType.INT,
}


@functools.lru_cache(maxsize=None)
def schema(spec: OpSpec) -> OpSchema:
    Param = OpSchema.FormalParameter
    Option = OpSchema.FormalParameterOption
    inputs = [
        Param(a.onnx_name, "T", a.doc, param_option=Option.Optional if a.optional else Option.Single)
        for a in spec.tensor_args
    ]
    outputs = [Param(name, "T", "") for name in spec.outputs]
    attributes = [OpSchema.Attribute(a.onnx_name, _ATTR_TYPE[a.kind], a.doc, required=True) for a in spec.attr_args]
    op_schema = OpSchema(
        spec.name,
        spec.domain,
        spec.domain_version,
        spec.doc,
        inputs=inputs,
        outputs=outputs,
        type_constraints=[("T", list(spec.onnx_types), "Element type of all inputs and outputs")],
        attributes=attributes,
    )
    op_schema.set_type_and_shape_inference_function(functools.partial(_infer, spec))
    return op_schema


def _shape_of(type_proto: onnx.TypeProto):
    if not type_proto.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in type_proto.tensor_type.shape.dim
    ]


def _infer(spec: OpSpec, ctx) -> None:
    """Outputs take input 0's element type; shapes come from spec.onnx_output_shapes."""
    n = ctx.get_num_inputs()
    in_types = [ctx.get_input_type(i) if ctx.has_input(i) else None for i in range(n)]
    if not in_types or in_types[0] is None or not in_types[0].HasField("tensor_type"):
        return
    elem_type = in_types[0].tensor_type.elem_type
    shapes = None
    if spec.onnx_output_shapes is not None:
        attrs = {}
        for a in spec.attr_args:
            proto = ctx.get_attribute(a.onnx_name)
            attrs[a.onnx_name] = onnx.helper.get_attribute_value(proto) if proto is not None else None
        shapes = spec.onnx_output_shapes([_shape_of(t) if t is not None else None for t in in_types], attrs)
    for i in range(ctx.get_num_outputs()):
        shape = shapes[i] if shapes is not None else None
        ctx.set_output_type(i, onnx.helper.make_tensor_type_proto(elem_type, shape))


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
