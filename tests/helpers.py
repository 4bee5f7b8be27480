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
