"""The findings of issue #43 as explicit cases (``EXTRAS``: an overload and the arguments that
replace its baseline's), and the model-structure cases (``MODEL_CASES``: a node without
``operator``, an empty first output name, an ATen node inside a model-local function)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .baselines import _t
from .hostile import INT64_MIN
from .models import ATEN_DOMAIN


@dataclasses.dataclass
class Extra:
    target: str  # qualname
    desc: str
    args: object  # () -> {arg name: value}


def _i64(*values, shape=None):
    t = torch.tensor(values, dtype=torch.int64)
    return t.reshape(shape) if shape is not None else t


EXTRAS = [
    # 1. reading process memory
    Extra("aten::segment_reduce", "segment_reduce unsafe, offsets past the end ([0, 2, 64])",
          lambda: dict(lengths=None, offsets=_i64(0, 2, 64), unsafe=True)),
    Extra("aten::segment_reduce", "segment_reduce unsafe, offsets [0, 2**40] (SIGSEGV)",
          lambda: dict(lengths=None, offsets=_i64(0, 2**40), unsafe=True)),
    Extra("aten::segment_reduce", "segment_reduce unsafe, offsets [-5, 3]",
          lambda: dict(lengths=None, offsets=_i64(-5, 3), unsafe=True)),
    Extra("aten::segment_reduce", "segment_reduce unsafe, lengths summing past the end ([2, 40])",
          lambda: dict(lengths=_i64(2, 40), unsafe=True)),
    Extra("aten::unfold_backward", "unfold_backward, window 10 larger than its grad (4, 2)",
          lambda: dict(grad_in=_t(4, 2), input_sizes=[5], dim=0, size=10, step=1)),
    Extra("aten::unfold_backward", "unfold_backward, input_sizes [64] with a grad of (4, 2)",
          lambda: dict(grad_in=_t(4, 2), input_sizes=[64], dim=0, size=2, step=1)),
    # 2. uninitialised memory
    *[Extra(f"aten::{op}", f"{op} interpolation_mode={m} padding_mode={p}",
            (lambda m=m, p=p: dict(interpolation_mode=m, padding_mode=p)))
      for op in ("grid_sampler_2d", "grid_sampler_3d", "grid_sampler", "grid_sampler_2d_backward",
                 "grid_sampler_3d_backward") for m, p in ((3, 0), (0, 7))],
    # 3. crashes
    *[Extra(f"aten::{op}", f"{op} index {what}",
            (lambda shape=shape, val=val: dict(indices=torch.full(shape, val, dtype=torch.int64))))
      for op, shape in (("max_pool2d_with_indices_backward", (1, 1, 2, 2)),
                        ("max_pool3d_with_indices_backward", (1, 1, 1, 2, 2)),
                        ("adaptive_max_pool2d_backward", (1, 1, 2, 2)),
                        ("adaptive_max_pool3d_backward", (1, 1, 1, 2, 2)))
      for what, val in (("2**33", 2**33), ("-2**33", -(2**33)), ("17 into a 16-element plane", 17))],
    Extra("aten::max_pool2d_with_indices_backward", "max_pool2d_with_indices_backward index 6 into a 4-element input",
          lambda: dict(grad_output=_t(1, 1, 1, 1), self=_t(1, 1, 2, 2), kernel_size=[2, 2], stride=[2, 2],
                       indices=_i64(6, shape=(1, 1, 1, 1)))),
    Extra("aten::adaptive_max_pool2d_backward", "adaptive_max_pool2d_backward index 6 into a 4-element input",
          lambda: dict(grad_output=_t(1, 1, 1, 1), self=_t(1, 1, 2, 2), indices=_i64(6, shape=(1, 1, 1, 1)))),
    Extra("aten::embedding_dense_backward", "embedding_dense_backward indices 2**40, scale_grad_by_freq",
          lambda: dict(indices=_i64(0, 2**40, 1), scale_grad_by_freq=True)),
    Extra("aten::embedding_dense_backward", "embedding_dense_backward indices -7, scale_grad_by_freq",
          lambda: dict(indices=_i64(0, -7, 1), scale_grad_by_freq=True)),
    Extra("aten::embedding_dense_backward", "embedding_dense_backward num_weights 6e8",
          lambda: dict(num_weights=600_000_000)),
    Extra("aten::ctc_loss.IntList", "ctc_loss targets out of range ([7, 9], 4 classes)",
          lambda: dict(targets=_i64(7, 9, shape=(1, 2)))),
    Extra("aten::ctc_loss.IntList", "ctc_loss targets 2**40",
          lambda: dict(targets=_i64(2**40, 1, shape=(1, 2)))),
    Extra("aten::ctc_loss.Tensor", "ctc_loss.Tensor targets -3 and target_lengths 9",
          lambda: dict(targets=_i64(-3, 1, shape=(1, 2)), target_lengths=_i64(9))),
    Extra("aten::ctc_loss.IntList", "ctc_loss input_lengths [2**40]", lambda: dict(input_lengths=[2**40])),
    *[Extra(f"aten::{op}", f"{op} INT64_MIN / -1 (int64){' rounding_mode=' + mode if mode else ''}",
            (lambda mode=mode, op=op: {"self": _i64(INT64_MIN, 7), "other": _i64(-1, 2),
                                       **({"rounding_mode": mode} if mode else {})}))
      for op, mode in (("div.Tensor_mode", "trunc"), ("div.Tensor_mode", "floor"), ("remainder.Tensor", None),
                       ("fmod.Tensor", None), ("floor_divide", None))],
    *[Extra(f"aten::{op}", f"{op} INT64_MIN / -1 (int64 tensor, Scalar -1){' rounding_mode=' + mode if mode else ''}",
            (lambda mode=mode: {"self": _i64(INT64_MIN, 7), "other": -1, **({"rounding_mode": mode} if mode else {})}))
      for op, mode in (("div.Scalar_mode", "trunc"), ("div.Scalar_mode", "floor"), ("remainder.Scalar", None),
                       ("fmod.Scalar", None), ("floor_divide.Scalar", None))],
    # 5. gigabytes from a few bytes
    Extra("aten::eye", "eye(25000)", lambda: dict(n=25000)),
    Extra("aten::one_hot", "one_hot(num_classes=-1) of [300000000]", lambda: dict(self=_i64(300_000_000))),
    Extra("aten::bincount", "bincount([300000000])", lambda: dict(self=_i64(300_000_000))),
    Extra("aten::repeat_interleave.Tensor", "repeat_interleave([300000000])",
          lambda: dict(repeats=_i64(300_000_000))),
    Extra("aten::select_backward", "select_backward input_sizes [600000000]",
          lambda: dict(grad_output=_t(), input_sizes=[600_000_000], dim=0, index=0)),
    Extra("aten::index_select_backward", "index_select_backward self_sizes [600000000]",
          lambda: dict(grad=_t(1), self_sizes=[600_000_000], dim=0, index=_i64(0))),
    Extra("aten::constant_pad_nd", "constant_pad_nd pads [30000, 0, 30000, 0]",
          lambda: dict(self=_t(1, 1), pad=[30000, 0, 30000, 0])),
    Extra("aten::conv2d", "conv2d padding 10000",
          lambda: dict(input=_t(1, 1, 1, 1), weight=_t(1, 1, 1, 1), padding=[10000, 10000])),
    Extra("aten::upsample_nearest2d", "upsample_nearest2d to 8192x8192 (float64, 2 channels)",
          lambda: dict(self=_t(1, 2, 1, 1, dtype=torch.float64), output_size=[8192, 8192])),
    Extra("aten::kron", "kron of two 25000-element vectors", lambda: dict(self=_t(25000), other=_t(25000, seed=1))),
    Extra("aten::add.Tensor", "add [25000, 1] + [1, 25000]",
          lambda: dict(self=_t(25000, 1), other=_t(1, 25000, seed=1), alpha=1)),
    Extra("aten::pdist", "pdist of a (30000, 1) float64 input", lambda: dict(self=_t(30000, 1, dtype=torch.float64))),
    Extra("aten::vander", "vander(x, N=60000000)", lambda: dict(x=_t(2, dtype=torch.float64), N=60_000_000)),
    Extra("aten::mvlgamma", "mvlgamma(x, p=300000000)", lambda: dict(self=_t(1, fill="positive"), p=300_000_000)),
    # 6. hours
    Extra("aten::choose_qparams_optimized", "choose_qparams_optimized(n_bins=2**40)", lambda: dict(n_bins=2**40)),
    Extra("aten::matrix_power", "matrix_power(x, n=INT64_MIN)", lambda: dict(n=INT64_MIN)),
    # 7. sparse layout
    Extra("aten::zeros", "zeros(layout=sparse_coo)", lambda: dict(layout=1)),
]


@dataclasses.dataclass
class ModelCase:
    desc: str
    op: str  # the op the error must name
    build: object  # () -> (onnx model, feeds)
    python_refuses: bool = False  # path (a) must raise AtenOpRefused


def _model_no_operator():
    from onnx import TensorProto, helper

    node = helper.make_node("ATen", ["x"], ["y"], domain=ATEN_DOMAIN, overload_name="")
    return _wrap([node], [("x", TensorProto.FLOAT, [2, 3])], [("y", TensorProto.FLOAT)]), \
        {"x": np.ones((2, 3), np.float32)}


def _model_empty_first_output():
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("ATen", ["x", "dim"], ["", "z"], domain=ATEN_DOMAIN, operator="max", overload_name="dim")
    return _wrap([node], [("x", TensorProto.FLOAT, [2, 3])], [("z", TensorProto.INT64)],
                 [numpy_helper.from_array(np.array(1, np.int64), "dim")]), \
        {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}


def _model_function_from_file():
    from onnx import TensorProto, helper

    inner = helper.make_node("ATen", ["fname", "none", "size"], ["y"], domain=ATEN_DOMAIN, operator="from_file",
                             overload_name="")
    consts = [helper.make_node("Constant", [], ["fname"], value=helper.make_tensor("v", TensorProto.STRING, [],
                                                                                   [b"/etc/passwd"])),
              helper.make_node("Constant", [], ["none"], value=helper.make_tensor("v", TensorProto.INT64, [0], [])),
              helper.make_node("Constant", [], ["size"], value=helper.make_tensor("v", TensorProto.INT64, [], [16]))]
    fn = helper.make_function("local", "Reader", [], ["y"], consts + [inner],
                              [helper.make_opsetid("", 17), helper.make_opsetid(ATEN_DOMAIN, 1)])
    node = helper.make_node("Reader", [], ["y"], domain="local")
    model = _wrap([node], [], [("y", TensorProto.FLOAT)], extra_opsets=[("local", 1)])
    model.functions.append(fn)
    return model, {}


def _wrap(nodes, inputs, outputs, initializers=(), extra_opsets=()):
    from onnx import helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ATEN_DOMAIN, 1)]
                             + [helper.make_opsetid(d, v) for d, v in extra_opsets], ir_version=9)


MODEL_CASES = [
    ModelCase("an ATen node without an 'operator' attribute", "ATen", _model_no_operator),
    ModelCase("max.dim with outputs ['', 'z'] (empty first output name)", "max", _model_empty_first_output),
    ModelCase("aten::from_file inside a model-local function", "from_file", _model_function_from_file,
              python_refuses=True),
]
