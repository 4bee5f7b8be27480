"""Helpers shared by the tests (imported as a plain module: pytest puts tests/ on sys.path)."""

import numpy as np
import torch
from onnx import helper

import opforge


def single_node_model(op_type: str, input_types, n_outputs: int = 1, domain: str = opforge.spec.DOMAIN, **attrs):
    """A model with one node (inputs I0.., outputs O0..) of unknown shapes."""
    names = [f"I{i}" for i in range(len(input_types))]
    outs = [f"O{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        op_type,
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, input_types)],
        [helper.make_tensor_value_info(o, input_types[0], None) for o in outs],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)], ir_version=9
    )


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def deform_inputs(n=2, c=6, o=4, h=9, w=8, kh=3, kw=2, stride=(1, 2), pad=(1, 0), dil=(1, 2), groups=2,
                  offset_groups=3, dtype=torch.float64, offset_scale=2.0, seed=0):
    """Random deform_conv2d arguments (input, weight, offset, mask, bias, oh, ow)."""
    g = torch.Generator().manual_seed(seed)
    oh = (h + 2 * pad[0] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * pad[1] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype)
    weight = torch.randn(o, c // groups, kh, kw, generator=g, dtype=dtype)
    offset = torch.randn(n, 2 * offset_groups * kh * kw, oh, ow, generator=g, dtype=dtype) * offset_scale
    mask = torch.rand(n, offset_groups * kh * kw, oh, ow, generator=g, dtype=dtype)
    bias = torch.randn(o, generator=g, dtype=dtype)
    return x, weight, offset, mask, bias
