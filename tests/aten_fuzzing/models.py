"""A call as an ONNX model: one ATen node, its tensors graph inputs and its other arguments
constant inputs (``build_model``), and the ONNX type of a torch value (``onnx_type_of``)."""

from __future__ import annotations

import numpy as np
import torch

from .schemas import Schema


ATEN_DOMAIN = "org.pytorch.aten"
NONE_INPUT = "opforge_aten_none"  # opforge.aten.nodes.NONE_INPUT

ONNX_OF = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
           torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}


def onnx_type_of(x) -> int:
    if isinstance(x, torch.Tensor):
        return ONNX_OF.get(x.dtype, 1)
    if isinstance(x, bool):
        return 9
    if isinstance(x, int):
        return 7
    if isinstance(x, float):
        return 11
    return 1


def encode_constant(kind, value, name):
    from onnx import TensorProto, helper, numpy_helper

    if kind == "str":
        return helper.make_tensor(name, TensorProto.STRING, [], [str(value).encode()])
    if kind in ("int", "dtype", "layout", "memfmt"):
        arr = np.array(value, np.int64)
    elif kind == "float":
        arr = np.array(value, np.float64)
    elif kind == "bool":
        arr = np.array(bool(value), np.bool_)
    elif kind == "number":
        arr = (np.array(value, np.bool_) if isinstance(value, bool) else
               np.array(value, np.int64) if isinstance(value, int) else np.array(value, np.float64))
    elif kind == "ints":
        arr = np.array(value, np.int64).reshape(-1)
    elif kind == "floats":
        arr = np.array(value, np.float64).reshape(-1)
    elif kind == "bools":
        arr = np.array(value, np.bool_).reshape(-1)
    else:
        raise ValueError(f"cannot encode {kind}")
    return numpy_helper.from_array(arr, name)


def build_model(s: Schema, values, out_types, typed: bool):
    """One ATen node: tensors are graph inputs (their shapes exact), the rest constant inputs;
    ``out_types`` the ONNX types of the outputs (typed=False: left for opforge to type)."""
    from onnx import TypeProto, helper

    last = max([i for i, v in enumerate(values) if v is not None] + [-1])
    inputs, inits, node_inputs, feeds = [], [], [], {}
    need_none = False
    for i in range(last + 1):
        v, kind = values[i], s.kinds[i]
        if v is None:
            node_inputs.append(NONE_INPUT)
            need_none = True
        elif kind == "tensor":
            name = f"t{i}"
            inputs.append(helper.make_tensor_value_info(name, ONNX_OF.get(v.dtype, 1), list(v.shape)))
            feeds[name] = v.contiguous().numpy()
            node_inputs.append(name)
        else:
            inits.append(encode_constant(kind, v, f"c{i}"))
            node_inputs.append(f"c{i}")
    if need_none:
        inits.append(helper.make_tensor(NONE_INPUT, 7, [0], []))
    outs = [f"y{k}" for k in range(len(out_types))]
    node = helper.make_node("ATen", node_inputs, outs, domain=ATEN_DOMAIN, operator=s.name, overload_name=s.overload)
    outputs = [helper.make_tensor_value_info(o, t, None) if typed else helper.make_value_info(o, TypeProto())
               for o, t in zip(outs, out_types)]
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ATEN_DOMAIN, 1)],
                              ir_version=9)
    return model, feeds
