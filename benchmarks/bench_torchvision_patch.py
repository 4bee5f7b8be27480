"""opforge.patch_torchvision() on a real DCN model: the speed-up with no model change.

    python benchmarks/bench_torchvision_patch.py [--batch 2] [--size 224] [--repeats 5] [--threads 2] [--json]

Model: torchvision's ResNet-50 with DCNv2 in stages c3-c5 (every 3x3 conv of layer2-layer4,
13 blocks, as in the DCNv2 paper): a 3x3 conv predicts offsets and mask (zero-initialised),
torchvision.ops.DeformConv2d applies them. float32, random weights (speed does not depend on
them; the zero-initialised offset convs are re-randomised so sampling is really deformed).

Anchor: the same model on torchvision's own kernels, measured in the same run; rounds
alternate plain torchvision and patched (patch, call, undo), medians reported.
  inference (eval, no_grad)             target: faster than torchvision
  training step (forward + backward)    target: faster than torchvision
Also checks that both give the same output. Never used to gate CI.
"""

from __future__ import annotations

import torch
import torchvision

import opforge
from timing import bench_parser, report, round_robin


class DCNv2Conv(torch.nn.Module):
    """A 3x3 conv made deformable (modulated): offsets and mask from a 3x3 conv."""

    def __init__(self, conv: torch.nn.Conv2d):
        super().__init__()
        self.offset_mask = torch.nn.Conv2d(conv.in_channels, 27, 3, stride=conv.stride, padding=1)
        torch.nn.init.normal_(self.offset_mask.weight, std=0.01)  # paper: zeros; non-zero to deform for real
        torch.nn.init.zeros_(self.offset_mask.bias)
        self.deform = torchvision.ops.DeformConv2d(conv.in_channels, conv.out_channels, 3, stride=conv.stride,
                                                   padding=1, bias=False)

    def forward(self, x):
        offset, mask = self.offset_mask(x).split([18, 9], 1)
        return self.deform(x, offset, mask.sigmoid())


def resnet50_dcnv2() -> torch.nn.Module:
    model = torchvision.models.resnet50(weights=None)
    for stage in (model.layer2, model.layer3, model.layer4):
        for block in stage:
            block.conv2 = DCNv2Conv(block.conv2)
    return model


def table(r: dict) -> None:
    print(f"{r['model']}, batch {r['batch']}, {r['size']}x{r['size']}, float32, {r['threads']} threads (medians)")
    for label, ms, speedup in (("inference", r["inference_ms"], r["inference_speedup"]),
                               ("training step", r["train_step_ms"], r["train_step_speedup"])):
        print(f"  {label:<14} torchvision {ms['torchvision']:9.1f} ms   patched {ms['patched']:9.1f} ms   "
              f"speed-up {speedup:5.2f}x")
    print(f"  outputs agree to {r['max_relative_output_difference']:.1e} (relative to the largest output)")


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=5, threads=torch.get_num_threads())
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = resnet50_dcnv2()
    x = torch.randn(args.batch, 3, args.size, args.size)

    def patched(fn):
        def run():
            with opforge.patch_torchvision():
                return fn()
        return run

    def inference():
        model.eval()
        with torch.no_grad():
            return model(x)

    def train_step():
        model.train()
        model.zero_grad(set_to_none=True)
        model(x).logsumexp(1).sum().backward()

    reference, ours = inference(), patched(inference)()
    max_diff = float((reference - ours).abs().max() / reference.abs().max())
    inference_ms = round_robin({"torchvision": inference, "patched": patched(inference)}, args.repeats, warmup=1)
    train_ms = round_robin({"torchvision": train_step, "patched": patched(train_step)}, args.repeats, warmup=1)
    result = {
        "model": "ResNet-50 + DCNv2 (c3-c5, 13 deformable convs)",
        "batch": args.batch, "size": args.size, "threads": args.threads,
        "inference_ms": inference_ms, "train_step_ms": train_ms,
        "inference_speedup": inference_ms["torchvision"] / inference_ms["patched"],
        "train_step_speedup": train_ms["torchvision"] / train_ms["patched"],
        "max_relative_output_difference": max_diff,
    }
    return report(result, args.json, table)


if __name__ == "__main__":
    main()
