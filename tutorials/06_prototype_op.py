"""Tutorial 6: a brand-new op in minutes, before any C++: the prototype tier.

An op is a spec (schema, fake impl, autograd) plus a numpy kernel; ``opforge.register_prototype``
makes from them the torch op, both exporters' rules and an ONNX Runtime kernel (an
onnxruntime-extensions Python op). As a package, the same in three shell commands:

    opforge new-op swish --package my_ops --domain com.example --prototype
    pip install --no-build-isolation -e my_ops       # pure Python: nothing to compile
    python -m pytest my_ops

This script defines a prototype op inline (``gelu_tanh``, with a float attribute), checks it with
``opforge.testing``, and runs a model that mixes four kinds of kernels in ONE
``opforge.ort_session`` with no manual registration: an onnxruntime-extensions C++ op
(``StringLength``, text pre-processing), opforge's compiled ``my_add``, an ATen-fallback node
(``cummax``, run by libtorch) and the prototype op. It ends with what the prototype costs per call.

    .venv/bin/python tutorials/06_prototype_op.py
"""

import time
import warnings

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

import opforge
from opforge.aten import AtenFallbackWarning
from opforge.testing import BadSample, Sample, check_op


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


# --- 1. The op: spec + numpy kernel ------------------------------------------------------------
step("1. a prototype op: spec + numpy kernel, no C++")


def gelu_fake(x, scale):
    if not x.dtype.is_floating_point:  # the fake impl runs before the kernel in torch AND in ORT
        raise TypeError(f"tutorial_proto::gelu_tanh: x has dtype {x.dtype}; it must be floating point")
    return torch.empty_like(x)


def gelu_kernel(x, *, scale):
    """numpy in, numpy out; ``scale`` arrives rounded to float32, as ONNX stores it."""
    inner = np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)
    return (scale * 0.5 * x * (1 + np.tanh(inner))).astype(x.dtype)


def gelu_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x)
    ctx.scale = float(np.float32(scale))


def gelu_backward(ctx, grad):
    # written in torch ops: runs on any device and is itself differentiable (double backward)
    (x,) = ctx.saved_tensors
    c = (2 / torch.pi) ** 0.5
    t = torch.tanh(c * (x + 0.044715 * x ** 3))
    dy = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    return grad * ctx.scale * dy, None


GELU = opforge.OpSpec(
    name="gelu_tanh", namespace="tutorial_proto", domain="com.example.tutorial_proto",
    schema="gelu_tanh(Tensor x, float scale) -> Tensor",
    args=(opforge.TensorArg("x", "X"), opforge.AttrArg("scale", kind="float")), outputs=("Y",),
    doc="scale * gelu(x) (tanh approximation)", fake=gelu_fake, setup_context=gelu_setup, backward=gelu_backward,
    # the independent check: torch's own gelu
    reference=lambda x, *, scale: ((scale * torch.nn.functional.gelu(torch.from_numpy(x).double(),
                                                                     approximate="tanh")).numpy().astype(x.dtype),),
    onnx_output_shapes=lambda shapes, attrs: [shapes[0]],
    onnx_types=("tensor(float)", "tensor(double)"),  # what onnxruntime-extensions' Python ops can return
)
gelu = opforge.register_prototype(GELU, impl=gelu_kernel)
x = torch.linspace(-4, 4, 9)
print("torch.ops.tutorial_proto.gelu_tanh(x, 1.0) =", [round(v, 4) for v in gelu(x, 1.0).tolist()])
print("exports as ONNX node com.example.tutorial_proto::gelu_tanh; ORT kernel: onnxruntime-extensions Python op")

# --- 2. Every generic check, ORT included -------------------------------------------------------
step("2. opforge.testing.check_op: opcheck, gradcheck, reference, both exporters + ORT, bad inputs")
check_op(GELU, [Sample(torch.randn(3, 5), 1.0, name="2d"), Sample(torch.randn(2, 2, 4) * 3, 0.7, name="3d")],
         bad_samples=[BadSample(torch.arange(4), 1.0, match="gelu_tanh")], torchscript_opsets=[17])
print("all checks passed")


# --- 3. Four kinds of kernels, one session --------------------------------------------------------
step("3. ortx StringLength + opforge my_add + ATen cummax + prototype gelu_tanh in one ORT session")


class TextModel(torch.nn.Module):
    def forward(self, x, lengths):
        y = opforge.my_add(x, lengths)       # compiled opforge op
        running_max, _ = torch.cummax(y, 1)  # ATen fallback (no ONNX op)
        return gelu(running_max, 0.5)        # prototype op


model = TextModel().eval()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", AtenFallbackWarning)
    main = opforge.export(model, (torch.randn(2, 4), torch.ones(2, 1)), aten_fallback=True,
                          input_names=["x", "lengths"],
                          dynamic_shapes=({0: torch.export.Dim("B")}, {0: torch.export.Dim("B")}))
opset = next(o.version for o in main.opset_import if o.domain == "")
pre = helper.make_model(helper.make_graph(
    [helper.make_node("StringLength", ["text"], ["n"], domain="ai.onnx.contrib"),
     helper.make_node("Cast", ["n"], ["n_f"], to=TensorProto.FLOAT),
     helper.make_node("Unsqueeze", ["n_f", "axis"], ["lengths_f"])],
    "pre", [helper.make_tensor_value_info("text", TensorProto.STRING, ["B"])],
    [helper.make_tensor_value_info("lengths_f", TensorProto.FLOAT, ["B", 1])],
    initializer=[onnx.numpy_helper.from_array(np.array([1], np.int64), "axis")]),
    opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.contrib", 1)], ir_version=main.ir_version)
mixed = onnx.compose.merge_models(pre, main, io_map=[("lengths_f", "lengths")])
print("custom ops by domain:", opforge.ort_kernels.custom_ops(mixed))
session = opforge.ort_session(mixed)  # registers onnxruntime-extensions, libopforge_ort, libopforge_aten
texts = ["a", "prototype", "", "onnx runtime", "xyz"]
x5 = torch.randn(5, 4)
(got,) = session.run(None, {"text": np.array(texts, object), "x": x5.numpy()})
with torch.no_grad():
    want = model(x5, torch.tensor([[float(len(t))] for t in texts]))
np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
print("ORT matches torch at batch 5 (exported at 2)")

# --- 4. The price ---------------------------------------------------------------------------------
step("4. per call, 4096 elements: prototype vs torch's compiled gelu")
a = torch.randn(4096)
for name, fn in (("prototype gelu_tanh", lambda: gelu(a, 1.0)),
                 ("torch gelu (compiled)", lambda: torch.nn.functional.gelu(a, approximate="tanh"))):
    fn()
    t0 = time.perf_counter()
    for _ in range(200):
        fn()
    print(f"  {name:<22} {(time.perf_counter() - t0) / 200 * 1e6:7.1f} us")
print("benchmarks/bench_prototype.py measures prototype vs compiled in torch and ORT")
print("\ntutorial 06: all checks passed")
