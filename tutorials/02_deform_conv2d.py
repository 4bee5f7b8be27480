"""Tutorial 2: export torchvision's DeformConv2d with the TorchScript exporter and run it in ONNX Runtime.

Run it:  .venv/bin/python tutorials/02_deform_conv2d.py      (after scripts/bootstrap.sh)

The flow users could never finish: torchvision.ops.DeformConv2d has no TorchScript
symbolic (vision#2066), so `torch.onnx.export(..., dynamo=False)` fails on any model
using it. `import opforge` registers symbolics for torchvision::deform_conv2d (and
opforge::deform_conv2d), per opset:

  opset >= 19  -> the standard ONNX DeformConv (ORT runs it natively)
  opset <  19  -> opforge::deform_conv2d, run by opforge's ORT library
                  (ORT before 1.19 and other runtimes have no DeformConv)
"""

import io
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torchvision


class DCNv2Block(torch.nn.Module):
    """Modulated deformable conv as in DCNv2 detectors: offsets and mask predicted by a conv."""

    def __init__(self, channels=8):
        super().__init__()
        self.offset_mask = torch.nn.Conv2d(channels, 27, 3, padding=1)  # 18 offsets + 9 mask logits
        self.dcn = torchvision.ops.DeformConv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        om = self.offset_mask(x)
        return torch.relu(self.dcn(x, om[:, :18], torch.sigmoid(om[:, 18:])))


torch.manual_seed(0)
model = DCNv2Block().eval()
x = torch.randn(1, 8, 16, 16)
workdir = Path(tempfile.mkdtemp(prefix="opforge-tutorial-"))

# --- 1. Without opforge: the TorchScript exporter has no rule for torchvision::deform_conv2d
#     (torch also dumps its IR graph to stderr when this export fails)
try:
    torch.onnx.export(model, (x,), io.BytesIO(), dynamo=False, opset_version=17)
    print("1. (unexpected) exported without opforge")
except Exception as e:  # torch.onnx.errors.UnsupportedOperatorError
    print("1. without opforge:", str(e).splitlines()[0][:110])

# --- 2. With opforge: the same plain torch.onnx.export call works, at opset 17 and 19
import opforge  # noqa: E402  (registers the symbolics)

batch3 = torch.randn(3, 8, 20, 12)  # exported at 1x16x16; dynamic batch and spatial size
with torch.no_grad():
    expected = model(batch3).numpy()
for opset in (17, 19):
    path = workdir / f"dcn_opset{opset}.onnx"
    torch.onnx.export(model, (x,), path, dynamo=False, opset_version=opset, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}, "y": {0: "n", 2: "h", 3: "w"}})
    proto = onnx.load(path)
    dcn_nodes = [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node if "eform" in n.op_type]
    print(f"2. opset {opset}: exported, deformable node = {dcn_nodes}")

    # --- 3. Run in ONNX Runtime: register opforge's library (needed for the custom op; harmless otherwise)
    so = ort.SessionOptions()
    so.register_custom_ops_library(opforge.ort_library_path())
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"x": batch3.numpy()})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    print(f"3. opset {opset}: ORT output {got.shape} matches torch, max |diff| = {np.abs(got - expected).max():.1e}")

# --- 4. Want the custom op even at opset >= 19 (e.g. to use opforge's faster kernel)? Force it:
proto = opforge.export(model, (x,), dynamo=True, opset_version=20, standard_onnx=False, input_names=["x"],
                       dynamic_shapes=({0: torch.export.Dim("n"), 2: torch.export.Dim("h"), 3: torch.export.Dim("w")},))
(got,) = opforge.ort_session(proto).run(None, {"x": batch3.numpy()})
np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
print("4. dynamo exporter, opset 20, forced custom op:",
      [n.op_type for n in proto.graph.node if "eform" in n.op_type], "-> ORT matches torch")

# --- 5. opforge.DeformConv2d: a drop-in for torchvision's (same state_dict), 15x faster on CPU
ours = opforge.DeformConv2d(8, 8, 3, padding=1)
ours.load_state_dict(model.dcn.state_dict())
om = model.offset_mask(batch3)
with torch.no_grad():
    torch.testing.assert_close(ours(batch3, om[:, :18], torch.sigmoid(om[:, 18:])),
                               model.dcn(batch3, om[:, :18], torch.sigmoid(om[:, 18:])), rtol=1e-4, atol=1e-4)
print("5. opforge.DeformConv2d with torchvision's weights matches torch")
