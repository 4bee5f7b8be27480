"""Tutorial 4: the same model on the GPU — torch CUDA kernels and ONNX Runtime's CUDA execution provider.

Run it:  .venv/bin/python tutorials/04_cuda.py      (after scripts/bootstrap.sh)

Device-agnostic on purpose: with a GPU (and an opforge built with CUDA, see
`opforge info`) it runs everything on CUDA; without one it runs the identical
code on the CPU and says so. What changes on a GPU is only WHERE things run:

  torch: opforge.my_add / opforge.deform_conv2d dispatch to CUDA kernels for CUDA
         tensors, on torch's current stream (CUDA graphs and side streams work),
         with autograd, in float32/float64/float16/bfloat16.
  ORT:   the same libopforge_ort.so holds CPU and CUDAExecutionProvider kernels of
         each op; list the CUDA provider first (needs the onnxruntime-gpu package)
         and ORT places the opforge nodes on the GPU, running them on its stream.
"""

import json
import os
import tempfile

import numpy as np
import onnxruntime as ort
import torch

import opforge

on_gpu = torch.cuda.is_available() and opforge.BUILT_WITH_CUDA
device = "cuda" if on_gpu else "cpu"
if on_gpu:
    print(f"1. GPU: {torch.cuda.get_device_name()} — torch ops run on CUDA")
else:
    why = "no GPU visible to torch" if opforge.BUILT_WITH_CUDA else "this opforge build has no CUDA kernels"
    print(f"1. {why}: running the same code on the CPU")


class DcnBlock(torch.nn.Module):
    """A DCNv2 block with a residual my_add: offsets/mask predicted by a conv."""

    def __init__(self, channels=16):
        super().__init__()
        self.offset_mask = torch.nn.Conv2d(channels, 27, 3, padding=1)
        self.dcn = opforge.DeformConv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        om = self.offset_mask(x)
        y = self.dcn(x, om[:, :18], mask=torch.sigmoid(om[:, 18:]))
        return opforge.my_add(torch.relu(y), x)  # 2*relu(y) + x


torch.manual_seed(0)
model = DcnBlock().to(device)
x = torch.randn(4, 16, 24, 24, device=device)

# --- 2. Train-style step on the device: forward, backward through both custom ops
loss = model(x).square().mean()
loss.backward()
print(f"2. forward+backward on {device}: loss {loss.item():.4f}, |grad dcn.weight| = "
      f"{model.dcn.weight.grad.norm().item():.4f}")

# --- 3. Half precision inference (16-bit storage, float32 accumulation inside the kernels)
dtype = torch.float16 if on_gpu else torch.bfloat16  # CPU: bfloat16 is the usual 16-bit type
with torch.no_grad():
    full = model(x)
    half = model.to(dtype)(x.to(dtype)).float()
model.float()
print(f"3. {str(dtype).replace('torch.', '')} inference: max |diff| vs float32 = {(half - full).abs().max().item():.2e}")

# --- 4. Export (dynamo exporter, custom opforge nodes) and run in ONNX Runtime
model.eval()
proto = opforge.export(model.cpu(), (x.cpu(),), dynamo=True, opset_version=18, standard_onnx=False,
                       input_names=["x"], output_names=["y"])
providers = ["CPUExecutionProvider"]
if on_gpu and "CUDAExecutionProvider" in ort.get_available_providers():
    providers.insert(0, "CUDAExecutionProvider")
elif on_gpu:
    print("4. onnxruntime has no CUDAExecutionProvider here (pip install onnxruntime-gpu): ORT runs on the CPU")
so = ort.SessionOptions()
so.enable_profiling = True  # to show which provider ran each opforge node
so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "opforge_tutorial4")
sess = opforge.ort_session(proto, so, providers=providers)
(got,) = sess.run(None, {"x": x.cpu().numpy()})
with torch.no_grad():
    expected = model(x.cpu()).numpy()
np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
profile = sess.end_profiling()
with open(profile) as f:
    placed = {e["args"]["op_name"]: e["args"]["provider"] for e in json.load(f)
              if e.get("args", {}).get("op_name") in ("deform_conv2d", "my_add")}
os.unlink(profile)
print(f"4. ORT ({', '.join(providers)}): output matches torch; opforge nodes ran on {placed}")
