"""Compiles a detection model that uses opforge's ops into an AOTInductor package (.pt2) and saves
the inputs and torch's eager outputs beside it, for the C++ runner in this folder (main.cc):

    python tutorials/aoti_cpp/export_model.py OUT_DIR

The model: a DCNv2 block (deform_conv2d), a multi-scale deformable attention layer
(ms_deform_attn) and rotated RoI Align (roi_align_rotated); the batch and the roi count are
dynamic. opforge.aoti_compile_and_package compiles it as torch._inductor.aoti_compile_and_package
does, with the package calling opforge's kernels straight through their C shims instead of torch's
proxy executor. A custom op is not packaged in the .pt2: the process that loads it loads opforge's
library first (Python: `import opforge`; C++: dlopen(opforge.torch_library_path())).
"""

import argparse
from pathlib import Path

import torch

import opforge


class Detector(torch.nn.Module):
    def __init__(self, channels=8, heads=2, levels=2, points=2):
        super().__init__()
        self.dcn = opforge.DeformConv2d(channels, channels, 3, padding=1)
        self.offsets = torch.nn.Conv2d(channels, 3 * 9, 3, padding=1)
        self.attn = opforge.MSDeformAttn(d_model=channels, n_levels=levels, n_heads=heads, n_points=points)
        self.align = opforge.RoIAlignRotated((4, 4), spatial_scale=0.5, sampling_ratio=2)

    def forward(self, image, query, reference_points, rois):
        o1, o2, mask = torch.chunk(self.offsets(image), 3, dim=1)
        feat = self.dcn(image, torch.cat([o1, o2], 1), torch.sigmoid(mask)).relu()
        n, c, h, w = feat.shape
        level0 = feat.flatten(2).transpose(1, 2)
        level1 = torch.nn.functional.avg_pool2d(feat, 2).flatten(2).transpose(1, 2)
        value = torch.cat([level0, level1], 1)
        shapes = torch.tensor([[h, w], [h // 2, w // 2]], dtype=torch.long)
        starts = torch.tensor([0, h * w], dtype=torch.long)
        attended = self.attn(query, reference_points, value, shapes, starts)
        pooled = self.align(feat, rois)
        return attended, pooled


def example_inputs(batch=2, queries=5, rois=3, channels=8, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randn(batch, channels, size, size, generator=g)
    query = torch.randn(batch, queries, channels, generator=g)
    reference_points = torch.rand(batch, queries, 2, 2, generator=g)
    boxes = torch.rand(rois, 5, generator=g) * torch.tensor([size, size, 6, 6, 1.0]) + torch.tensor([0, 0, 2, 2, 0])
    index = torch.randint(0, batch, (rois, 1), generator=g).float()
    return image, query, reference_points, torch.cat([index, boxes], 1)


def save_tensors(out_dir: Path, name: str, tensors) -> None:
    """What main.cc reads: NAME.txt, a line per tensor ("FILE DTYPE DIM..."), and each tensor's raw
    little-endian data in FILE."""
    lines = []
    for i, t in enumerate(tensors):
        file = f"{name}_{i}.bin"
        t.detach().contiguous().numpy().tofile(out_dir / file)
        lines.append(" ".join([file, str(t.dtype).removeprefix("torch."), *map(str, t.shape)]))
    (out_dir / f"{name}.txt").write_text("\n".join(lines) + "\n")


def compile_package(model, inputs, path):
    batch, rois = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("rois", min=1, max=1024)
    shapes = ({0: batch}, {0: batch}, {0: batch}, {0: rois})
    program = torch.export.export(model, inputs, dynamic_shapes=shapes)
    return opforge.aoti_compile_and_package(program, package_path=str(path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Detector().eval()
    compile_package(model, example_inputs(), args.out_dir / "detector.pt2")
    inputs = example_inputs(batch=3, rois=7, seed=1)  # another batch and roi count than compiled with
    with torch.no_grad():
        expected = model(*inputs)
    save_tensors(args.out_dir, "inputs", inputs)
    save_tensors(args.out_dir, "expected", expected)
    print(f"wrote {args.out_dir / 'detector.pt2'}, the inputs and torch's outputs (inputs.txt, expected.txt)")


if __name__ == "__main__":
    main()
