"""Exports the C++ example's model and saves inputs and torch's outputs for main.cc to check.

Run it:  .venv/bin/python tutorials/cpp/export_model.py OUT_DIR      (after scripts/bootstrap.sh)

The model is a DCNv2 block (offsets and mask predicted by a conv, as in tutorial 02) followed
by opforge.my_add, exported so that both ops are opforge custom nodes: the C++ program can only
run it with libopforge_ort.so registered.

OUT_DIR gets:
  model.onnx
  manifest.txt    one line per tensor: `input|output NAME FILE RANK DIM...`
  *.bin           the tensors, raw little-endian float32, C order
"""

import argparse
from pathlib import Path

import torch

import opforge


class DCNv2MyAdd(torch.nn.Module):
    def __init__(self, channels=8):
        super().__init__()
        self.offset_mask = torch.nn.Conv2d(channels, 27, 3, padding=1)  # 18 offsets + 9 mask logits
        self.dcn = opforge.DeformConv2d(channels, channels, 3, padding=1)

    def forward(self, x, shift):
        om = self.offset_mask(x)
        features = self.dcn(x, om[:, :18], torch.sigmoid(om[:, 18:]))
        return opforge.my_add(features, shift), features


def save_tensors(out_dir: Path, kind: str, tensors: dict) -> list:
    lines = []
    for name, tensor in tensors.items():
        array = tensor.detach().numpy().astype("<f4")
        file = f"{kind}_{name}.bin"
        array.tofile(out_dir / file)
        lines.append(" ".join([kind, name, file, str(array.ndim), *map(str, array.shape)]))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    out_dir = parser.parse_args().out_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = DCNv2MyAdd().eval()
    # Exported at batch 1 with a dynamic batch, checked at batch 3: the C++ side reads shapes
    # from the manifest, not from the model.
    example = (torch.randn(1, 8, 16, 16), torch.randn(8, 1, 1))
    x, shift = torch.randn(3, 8, 16, 16), torch.randn(8, 1, 1)
    # standard_onnx=False keeps deform_conv2d an opforge node at any opset (no standard DeformConv).
    opforge.export(model, example, out_dir / "model.onnx", dynamo=True, standard_onnx=False,
                   input_names=["x", "shift"], output_names=["out", "features"],
                   dynamic_shapes=({0: torch.export.Dim("batch")}, None), verbose=False)

    with torch.no_grad():
        out, features = model(x, shift)
    manifest = save_tensors(out_dir, "input", {"x": x, "shift": shift})
    manifest += save_tensors(out_dir, "output", {"out": out, "features": features})
    (out_dir / "manifest.txt").write_text("\n".join(manifest) + "\n")
    print(f"wrote {out_dir / 'model.onnx'} and {len(manifest)} tensors ({out_dir / 'manifest.txt'})")


if __name__ == "__main__":
    main()
