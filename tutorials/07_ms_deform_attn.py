"""Tutorial 7: multi-scale deformable attention (Deformable DETR): train an encoder layer, export it
with both exporters, run it in ONNX Runtime at another image size.

Run it:  .venv/bin/python tutorials/07_ms_deform_attn.py      (after scripts/bootstrap.sh)

opforge.MSDeformAttn is Deformable DETR's attention module on opforge's compiled op
(opforge.ms_deform_attn: forward and the gradients of value, sampling locations and attention
weights). Here it sits in a small encoder layer over two feature levels:

  1. the layer: self-attention over the flattened levels + FFN, reference points = pixel centres
  2. train it a few Adam steps (the op's backward at work)
  3. export with the dynamo and the TorchScript exporter: one opforge::ms_deform_attn node, with
     spatial_shapes and level_start_index as real inputs, so one model serves any image size
  4. run both in ONNX Runtime (opforge's library) at another image size and batch
  5. standard_onnx=True: GridSample nodes only, for a plain onnxruntime with no opforge library
"""

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import opforge


def level_layout(sizes):
    """spatial_shapes (L, 2) and level_start_index (L,) for levels of (H, W) sizes."""
    spatial_shapes = torch.tensor(sizes, dtype=torch.int64)
    level_start_index = torch.cat([spatial_shapes.new_zeros(1), spatial_shapes.prod(1).cumsum(0)[:-1]])
    return spatial_shapes, level_start_index


def pixel_centres(spatial_shapes, level_start_index, tokens):
    """(tokens, 2) normalised (x, y) centre of the pixel each flattened token comes from, level by
    level: ((col + 0.5) / W_l, (row + 0.5) / H_l). Computed by gathers from the index tensors
    rather than a Python loop over their values, so the exported graph follows the inputs."""
    index = torch.arange(tokens, device=spatial_shapes.device)
    level = (index[:, None] >= level_start_index[None, :]).sum(1) - 1  # the level each token is in
    within = index - level_start_index[level]
    height, width = spatial_shapes[level, 0], spatial_shapes[level, 1]
    row, col = within // width, within % width
    return torch.stack([(col + 0.5) / width, (row + 0.5) / height], -1), level


class DeformableEncoderLayer(torch.nn.Module):
    """One Deformable DETR encoder layer: every pixel of every level queries all levels around its own
    position (post-norm residual blocks, as in the paper's encoder)."""

    def __init__(self, d_model=32, n_levels=2, n_heads=4, n_points=2, d_ffn=64, dropout=0.0):
        super().__init__()
        self.n_levels = n_levels
        self.level_embed = torch.nn.Parameter(torch.randn(n_levels, d_model) * 0.02)
        self.position = torch.nn.Linear(2, d_model)  # a learned position embedding of the pixel centre
        self.self_attn = opforge.MSDeformAttn(d_model, n_levels, n_heads, n_points)
        self.dropout1 = torch.nn.Dropout(dropout)
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(d_model, d_ffn), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(d_ffn, d_model))
        self.dropout2 = torch.nn.Dropout(dropout)
        self.norm2 = torch.nn.LayerNorm(d_model)

    def forward(self, src, spatial_shapes, level_start_index):
        batch, tokens, _ = src.shape
        centres, level = pixel_centres(spatial_shapes, level_start_index, tokens)
        # Without padding every level covers the whole image, so a pixel's reference point is the same
        # normalised position on each level: (N, S, L, 2).
        reference_points = centres[None, :, None, :].expand(batch, tokens, self.n_levels, 2)
        query = src + self.position(centres) + self.level_embed[level]
        src = self.norm1(src + self.dropout1(self.self_attn(query, reference_points, src, spatial_shapes,
                                                            level_start_index)))
        return self.norm2(src + self.dropout2(self.ffn(src)))


torch.manual_seed(0)
workdir = Path(tempfile.mkdtemp(prefix="opforge-tutorial-"))

# --- 1. The layer on two levels, 16x16 and 8x8 ------------------------------------------------
spatial_shapes, level_start_index = level_layout([(16, 16), (8, 8)])
tokens = int(spatial_shapes.prod(1).sum())
centres, _ = pixel_centres(spatial_shapes, level_start_index, tokens)
# The same points the plain way: a meshgrid of pixel centres per level, flattened row-major.
grids = [torch.stack(torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij")[::-1],
                     -1).reshape(-1, 2) for h, w in spatial_shapes.tolist()]
assert torch.allclose(centres, torch.cat(grids))
model = DeformableEncoderLayer()
src = torch.randn(2, tokens, 32)
print(f"1. encoder layer: levels {spatial_shapes.tolist()}, {tokens} tokens, d_model 32, 4 heads, 2 points; "
      f"reference points = pixel centres, e.g. level 1's first {centres[256].tolist()}")

# --- 2. Train: regress a fixed random target (gradients flow through the op's backward) ----------
target = torch.randn_like(src)
optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = []
for step in range(20):
    optimiser.zero_grad()
    loss = torch.nn.functional.mse_loss(model(src, spatial_shapes, level_start_index), target)
    loss.backward()
    optimiser.step()
    losses.append(loss.item())
    if step % 5 == 0 or step == 19:
        print(f"2. step {step:2d}: loss {loss.item():.4f}")
assert losses[-1] < 0.9 * losses[0]
assert model.self_attn.sampling_offsets.weight.grad.abs().sum() > 0  # the sampling locations learn too
model.eval()

# --- 3. Export with both exporters; batch and token count dynamic ---------------------------------
names = dict(input_names=["src", "spatial_shapes", "level_start_index"], output_names=["out"])
args = (src, spatial_shapes, level_start_index)
exported = {
    # verbose=False: no exporter progress lines
    "dynamo": opforge.export(model, args, workdir / "encoder_dynamo.onnx", dynamo=True, verbose=False, **names,
                             dynamic_shapes=({0: torch.export.Dim("batch"), 1: torch.export.Dim("tokens")}, None, None)),
    "torchscript": opforge.export(model, args, workdir / "encoder_torchscript.onnx", dynamo=False, opset_version=17,
                                  **names, dynamic_axes={"src": {0: "batch", 1: "tokens"},
                                                         "out": {0: "batch", 1: "tokens"}}),
}
for name, proto in exported.items():
    custom = [f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain == "opforge"]
    print(f"3. {name}: exported, custom nodes {custom}, inputs {[i.name for i in proto.graph.input]}")

# --- 4. ONNX Runtime at another image size and batch: 20x12 and 10x6 levels, batch 3 --------------
other_shapes, other_start = level_layout([(20, 12), (10, 6)])
other_src = torch.randn(3, int(other_shapes.prod(1).sum()), 32)
with torch.no_grad():
    expected = model(other_src, other_shapes, other_start).numpy()
feeds = {"src": other_src.numpy(), "spatial_shapes": other_shapes.numpy(), "level_start_index": other_start.numpy()}
for name, proto in exported.items():
    (got,) = opforge.ort_session(proto).run(None, feeds)  # registers libopforge_ort for the opforge node
    diff = np.abs(got - expected).max()
    assert got.shape == expected.shape and diff < 1e-4, diff
    print(f"4. {name}: ORT at batch 3, levels {other_shapes.tolist()} {got.shape} matches torch, "
          f"max |diff| = {diff:.1e}")

# --- 5. standard_onnx=True: GridSample graph (opset >= 16) for ONNX Runtime without opforge ---------
# The number of levels is fixed by the export (one GridSample per level); their sizes stay inputs.
standard = opforge.export(model, args, workdir / "encoder_standard.onnx", dynamo=False, opset_version=17,
                          standard_onnx=True, **names,
                          dynamic_axes={"src": {0: "batch", 1: "tokens"}, "out": {0: "batch", 1: "tokens"}})
domains = {n.domain or "ai.onnx" for n in standard.graph.node}
grid_samples = sum(n.op_type == "GridSample" for n in standard.graph.node)
plain = ort.InferenceSession(standard.SerializeToString(), providers=["CPUExecutionProvider"])  # no custom library
(got,) = plain.run(None, feeds)
diff = np.abs(got - expected).max()
assert diff < 1e-4, diff
print(f"5. standard ONNX (domains {sorted(domains)}, {grid_samples} GridSample nodes): plain onnxruntime "
      f"{got.shape} matches torch, max |diff| = {diff:.1e}")
print("   saved:", sorted(p.name for p in workdir.glob("*.onnx")), "in", workdir)
