"""TorchScript-exporter (``dynamo=False``) symbolics, derived from each OpSpec.

``register(spec)`` (run by :func:`opforge.register_op`) registers, for every opset in
``spec.torchscript_opsets``, a symbolic for the C++ op (``opforge::my_add``) and its
aliases with ``torch.onnx.register_custom_op_symbolic``; the ops' autograd.Functions
reuse the same symbolic from their ``symbolic`` staticmethod.
"""

from __future__ import annotations

import functools

import torch
from torch.onnx import symbolic_helper

from ..spec import DTYPE_NAME_OF, ONNX_TYPE_OF, AttrArg, OpSpec
from . import lowering

# parse_args descriptors and g.op attribute suffixes per attribute kind.
_DESCRIPTOR = {"int": "i", "ints": "is", "float": "f", "floats": "fs", "bool": "b"}
_SUFFIX = {"int": "i", "ints": "i", "float": "f", "floats": "f", "bool": "i"}


def _traced_shape(value):
    """A value's traced shape for ``onnx_output_shapes``: static dims as ints, dynamic ones as names
    (the exporter's shape symbols: dims that share a dynamic axis share a name), None when its rank
    is unknown."""
    if value.type().kind() != "TensorType":
        return None
    sizes = value.type().symbolic_sizes()
    if sizes is None:
        return None
    return [d if d >= 0 else f"dynamic_dim_{-d}" for d in sizes]


def _set_output_types(spec: OpSpec, inputs, attrs, out) -> None:
    # The exporter's ONNX shape inference does not know custom domains: type the
    # outputs ourselves (each output's element type from the spec's type variables,
    # shape from the spec over the traced shapes, dynamic dims as None) so downstream
    # ops and graph outputs stay typed and dynamic dims stay dynamic.
    input_types = [_type_string(v) for v in inputs]
    out_shapes = spec.onnx_output_shapes([_traced_shape(v) for v in inputs], attrs) if spec.onnx_output_shapes \
        else None
    source = spec.output_type_input()
    for i, o in enumerate(out if isinstance(out, (list, tuple)) else (out,)):
        elem = spec.output_elem_type(i, input_types)
        if elem is None:
            continue
        own_type = not spec.output_args[i].own_types and source is not None and \
            inputs[source].type().kind() == "TensorType"
        base = inputs[source].type() if own_type else \
            torch._C.TensorType.get().with_dtype(getattr(torch, DTYPE_NAME_OF[elem]))
        shape = out_shapes[i] if out_shapes is not None else None
        if shape is not None:
            o.setType(base.with_sizes([d if isinstance(d, int) else None for d in shape]))
        elif spec.onnx_output_shapes is None and own_type:
            o.setType(base)  # no shape rule: the type source input's type (and shape), as before
        else:  # shapes unknown: the dtype alone
            o.setType(torch._C.TensorType.get().with_dtype(base.dtype()))


def _type_string(value):
    """A traced value's ONNX type string (``tensor(float)``), None when unknown."""
    if value.type().kind() != "TensorType" or value.type().dtype() is None:
        return None
    return ONNX_TYPE_OF.get(str(value.type().dtype()).replace("torch.", ""))


@functools.lru_cache(maxsize=None)
def symbolic(spec: OpSpec):
    """The symbolic ``(g, *torch_args) -> Value`` for one op."""
    descriptors = ["v" if not isinstance(a, AttrArg) else _DESCRIPTOR[a.kind] for a in spec.args]

    def op_symbolic(g, *values):
        if spec.standard_torchscript is not None and lowering.use_standard(spec, g.opset):
            return spec.standard_torchscript(g, *values)
        inputs, attrs = spec.split_args(values)
        kinds = {a.onnx_name: a.kind for a in spec.attr_args}
        g_attrs = {f"{name}_{_SUFFIX[kinds[name]]}": v for name, v in attrs.items()}
        out = g.op(f"{spec.domain}::{spec.name}", *inputs, outputs=len(spec.outputs), **g_attrs)
        _set_output_types(spec, inputs, attrs, out)
        return out

    op_symbolic.__name__ = f"{spec.name}_symbolic"
    op_symbolic.__signature__ = spec.signature(leading=("g",))  # parse_args reads argument names from it
    return symbolic_helper.parse_args(*descriptors)(op_symbolic)


def register(spec: OpSpec) -> None:
    for name in (spec.torch_qualname, *spec.torch_aliases):
        for opset in spec.torchscript_opsets:
            torch.onnx.register_custom_op_symbolic(name, symbolic(spec), opset)

