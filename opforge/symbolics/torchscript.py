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

from ..spec import AttrArg, OpSpec
from . import lowering

# parse_args descriptors and g.op attribute suffixes per attribute kind.
_DESCRIPTOR = {"int": "i", "ints": "is", "float": "f", "floats": "fs", "bool": "b"}
_SUFFIX = {"int": "i", "ints": "i", "float": "f", "floats": "f", "bool": "i"}


def _set_output_types(spec: OpSpec, inputs, attrs, out) -> None:
    # The exporter's ONNX shape inference does not know custom domains: type the
    # outputs ourselves (input 0's dtype, shape from the spec over the traced
    # shapes, dynamic dims as None) so downstream ops and graph outputs stay
    # typed and dynamic dims stay dynamic.
    source = spec.output_type_input()
    if source is None:
        return
    first = inputs[source].type()
    if first.kind() != "TensorType":
        return
    shapes = [v.type().varyingSizes() if v.type().kind() == "TensorType" else None for v in inputs]
    out_shapes = spec.onnx_output_shapes(shapes, attrs) if spec.onnx_output_shapes else None
    for i, o in enumerate(out if isinstance(out, (list, tuple)) else (out,)):
        shape = out_shapes[i] if out_shapes is not None else None
        o.setType(first.with_sizes([d if isinstance(d, int) else None for d in shape]) if shape is not None else first)


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

