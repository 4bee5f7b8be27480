"""Tutorial 1: a C++ op end to end: torch extension -> autograd.Function -> symbolic -> ONNX Runtime.

Run it:  .venv/bin/python tutorials/01_my_add.py      (after scripts/bootstrap.sh)

This is the classic flow of the PyTorch-to-ONNX custom-op tutorials (a my_add
C++ extension wrapped in torch.autograd.Function with a `symbolic`, checked with
onnxruntime), done with opforge so that every step is real and repeatable:

  1. the kernel      opforge/csrc/core/my_add.h        one header-only core (no torch/ORT types)
                     opforge/ops/csrc/my_add.cpp       torch kernel   (TORCH_LIBRARY_IMPL(opforge, CPU))
                     opforge/ort_kernels/csrc/...      ORT kernel     (lite custom-op API)
  2. the op spec     opforge/ops/my_add.py             schema, fake impl, autograd, numpy reference
  3. export rules    derived from the spec             TorchScript symbolic (opsets 9-20), dynamo translation,
                                                       onnx OpSchema, onnx.reference op
"""

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import opforge  # loads the extension, registers fake/autograd, ONNX schemas and TorchScript symbolics

# --- 1. The op in torch ---------------------------------------------------------------
# The C++ kernel is registered as torch.ops.opforge.my_add; it broadcasts like numpy,
# takes float16/bfloat16/float32/float64 and is differentiable.
a = torch.randn(2, 3, 4, requires_grad=True)
b = torch.randn(4, requires_grad=True)
out = torch.ops.opforge.my_add(a, b)
assert torch.equal(out, 2 * a + b)
out.sum().backward()
print("1. torch op:", tuple(out.shape), "grad a =", a.grad.unique().tolist(), "grad b =", b.grad.tolist())
# Bad input is a Python exception naming the op and argument (a RuntimeError from the kernel, as
# torch's own kernels raise; opforge.my_add raises it as opforge.OpInputError, also a ValueError):
try:
    torch.ops.opforge.my_add(torch.ones(2, 3), torch.ones(4))
except RuntimeError as e:
    print("   bad shapes ->", e)


# --- 2. The autograd.Function with a symbolic ----------------------------------------
# MyAddFunction.apply is what TorchScript-era models call. Its `symbolic` staticmethod
# (shared with the op's registered symbolic) emits one `opforge::my_add` ONNX node.
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x, y):
        return opforge.MyAddFunction.apply(self.conv(x), y)


model = Model().eval()
workdir = Path(tempfile.mkdtemp(prefix="opforge-tutorial-"))
x, y = torch.randn(1, 3, 8, 8), torch.randn(3, 1, 1)

# --- 3. Export with the TorchScript exporter ------------------------------------------
# `import opforge` registered the symbolics, so the plain torch call works...
torch.onnx.export(model, (x, y), workdir / "my_add_torchscript.onnx", dynamo=False, opset_version=17,
                  input_names=["x", "y"], output_names=["out"], dynamic_axes={"x": {0: "batch"}})
# ...and opforge.export does the same for both exporters (plus onnx.checker, full check):
dynamo_model = opforge.export(model, (x, y), workdir / "my_add_dynamo.onnx", dynamo=True,
                              input_names=["x", "y"], output_names=["out"],
                              dynamic_shapes=({0: torch.export.Dim("batch")}, None))
print("3. dynamo graph:", [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in dynamo_model.graph.node])

# --- 4. Run in ONNX Runtime with opforge's kernel library ---------------------------
# Users register the .so once per SessionOptions; opforge.ort_session does exactly this.
so = ort.SessionOptions()
so.register_custom_ops_library(opforge.ort_library_path())
batch4 = torch.randn(4, 3, 8, 8)  # exported at batch 1, run at batch 4
with torch.no_grad():
    expected = model(batch4, y).numpy()
for name in ("my_add_torchscript.onnx", "my_add_dynamo.onnx"):
    sess = ort.InferenceSession(str(workdir / name), so, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"x": batch4.numpy(), "y": y.numpy()})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    print(f"4. {name}: ORT matches torch, max |diff| = {np.abs(got - expected).max():.1e}")

# --- 5. No custom op wanted? Export the standard-ONNX lowering (Mul + Add) ----------
standard = opforge.export(model, (x, y), dynamo=False, opset_version=11, standard_onnx=True, input_names=["x", "y"])
print("5. standard ONNX graph:", [n.op_type for n in standard.graph.node])
(got,) = ort.InferenceSession(standard.SerializeToString(), providers=["CPUExecutionProvider"]).run(
    None, {"x": x.numpy(), "y": y.numpy()})
with torch.no_grad():
    np.testing.assert_allclose(got, model(x, y).numpy(), rtol=1e-5, atol=1e-5)
print("   plain onnxruntime (no library) matches torch")

# --- 6. The reference implementation --------------------------------------------------
# onnx.reference knows opforge ops too: an independent check of any exported model.
(ref,) = opforge.symbolics.reference.evaluator(dynamo_model).run(None, {"x": batch4.numpy(), "y": y.numpy()})
np.testing.assert_allclose(ref, expected, rtol=1e-5, atol=1e-5)
print("6. onnx.reference matches torch")
