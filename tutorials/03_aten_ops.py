"""Tutorial 3: ATen ops that won't export -- a symbolic where ONNX has the op, the ATen fallback where it doesn't.

Run it:  .venv/bin/python tutorials/03_aten_ops.py      (after scripts/bootstrap.sh)

The flowchart users follow when an export fails, with opforge doing each branch:
  1. ask opforge.diagnose which ops fail and which way applies;
  2. ATen op with an ONNX equivalent (asinh -> Asinh): opforge registers the missing symbolic;
     ATen op the dynamo exporter knows (logcumsumexp): opforge's ATen bridge gives the
     TorchScript exporter the same translation, in standard ONNX (`opforge coverage` lists them);
  3. ATen op with neither (cummax): export it as an org.pytorch.aten::ATen node
     and run it in ONNX Runtime through libtorch with libopforge_aten.
"""

import warnings

import numpy as np
import onnxruntime as ort
import torch

import opforge


class Model(torch.nn.Module):
    def forward(self, x):
        running_max, where = torch.cummax(x, dim=1)          # no ONNX equivalent
        smooth = torch.logcumsumexp(x, dim=1)                 # no ONNX op: opforge's ATen bridge composes one
        return torch.asinh(running_max) + smooth, where       # asinh: ONNX Asinh, but torch has no rule


model = Model().eval()
x = torch.randn(2, 6)

# --- 1. What fails, and what to do (both exporters)
print(opforge.diagnose(model, (x,), opset_version=17))

# --- 2. asinh alone: `import opforge` registered the symbolic torch lacks (opsets 9..20)
class Asinh(torch.nn.Module):
    def forward(self, x):
        return torch.asinh(x)


proto = opforge.export(Asinh(), (x,), dynamo=False, opset_version=9, input_names=["x"])
print("2. asinh at opset 9 exports as:", [n.op_type for n in proto.graph.node])
(got,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
np.testing.assert_allclose(got, torch.asinh(x).numpy(), rtol=1e-6)
print("   plain onnxruntime matches torch")

# --- 3. The whole model with the ATen fallback, with each exporter
x_big = torch.randn(5, 6)  # dynamic batch
with torch.no_grad():
    expected = model(x_big)
for dynamo in (False, True):
    with warnings.catch_warnings(record=True) as caught:  # the fallback is never silent
        warnings.simplefilter("always")
        proto = opforge.export(model, (x,), dynamo=dynamo, aten_fallback=True, input_names=["x"],
                               dynamic_axes=None if dynamo else {"x": {0: "n"}},
                               dynamic_shapes=({0: torch.export.Dim("n")},) if dynamo else None)
    name = "dynamo" if dynamo else "TorchScript"
    report = [str(w.message) for w in caught if issubclass(w.category, opforge.aten.AtenFallbackWarning)]
    print(f"3. {name}: {report[-1]}")
    # ORT needs libopforge_aten for the ATen nodes (opforge.ort_session registers it by itself):
    so = ort.SessionOptions()
    so.register_custom_ops_library(opforge.aten_library_path())
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    values, where = sess.run(None, {"x": x_big.numpy()})
    np.testing.assert_allclose(values, expected[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(where, expected[1].numpy())
    print(f"   {name}: ORT with libopforge_aten matches torch at batch 5")
