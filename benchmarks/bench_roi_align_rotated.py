"""roi_align_rotated speed, measured side by side in one run against a pure-PyTorch grid_sample anchor.

    python benchmarks/bench_roi_align_rotated.py [--rois 512] [--channels 256] [--size 64] [--batch 2]
        [--output 7] [--sampling-ratio 2] [--threads 2] [--repeats 10] [--quick] [--json]

Shapes (float32; an FPN P2 level): N=2 maps of C=256 x 64x64 at spatial_scale 1/4 (256x256 images),
K=512 rotated rois (16..96 x 8..48 image pixels, any angle, centres in the inner 3/4 of the
image; a few reach over its border), 7x7 output, sampling_ratio 2 (a 14x14 grid of samples per roi),
aligned=True.
Anchor: the same computation in plain PyTorch, what a model without a compiled op runs: the
rotated sampling grid built with torch ops, mmcv's rules applied to it (points outside
[-1, H] x [-1, W] give 0, the rest are clamped into [0, H-1] x [0, W-1]), converted to
grid_sample's normalised coordinates (align_corners=False: g = (2 x + 1) / W - 1), one
F.grid_sample per image over its rois, then the mean over each bin's samples (reshape, mean).
Clamping first makes grid_sample's zero padding unused inside [-1, H], so the anchor is mmcv's
op exactly, border rois included; the points outside are sent far outside the map, where the
padding gives the 0 (the same as multiplying by the inside mask, on the grid instead of on the
C-times-larger samples, which is faster).
  torch forward: opforge vs the anchor                                  target >= 10x faster
  torch forward+backward (gradient of the map): opforge vs the anchor   target >= 5x faster
  ONNX Runtime: the exported opforge::roi_align_rotated node (libopforge_ort), for information
Outputs and gradients are compared (max |diff| printed) before anything is timed.
Candidates of a group run round-robin (one call each per round); medians are reported.
--quick: small shapes and two rounds, a smoke test. Never used to gate CI.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

import opforge
from timing import bench_parser, ort_options, print_ms, report, round_robin

TARGETS = {"ratio_forward": 10.0, "ratio_fwd_bwd": 5.0}  # anchor time / opforge time
QUICK = dict(rois=24, channels=8, size=16, batch=2, output=3, sampling_ratio=2)


def rotated_rois(k, batch, image, generator):
    """(K, 6) rois (batch index, cx, cy, w, h, angle) in image pixels: centres in the image's inner
    3/4, 1/16..3/8 x 1/32..3/16 of its size, any angle."""
    r = torch.rand(k, 6, generator=generator)
    return torch.stack([(r[:, 0] * batch).floor().clamp(max=batch - 1), image * (1 / 8 + 3 / 4 * r[:, 1]),
                        image * (1 / 8 + 3 / 4 * r[:, 2]), image * (1 / 16 + 5 / 16 * r[:, 3]),
                        image * (1 / 32 + 5 / 32 * r[:, 4]), math.pi * (2 * r[:, 5] - 1)], 1)


def roi_align_rotated_grid_sample(input, rois, output_size, spatial_scale, sampling_ratio, aligned=True,
                                  clockwise=False):
    """mmcv's roi_align_rotated in plain PyTorch for a fixed sampling_ratio >= 1: (K, C, oh, ow)."""
    n, c, h, w = input.shape
    oh, ow = output_size
    sr = sampling_ratio
    k = rois.shape[0]
    batch, cx, cy, rw, rh, angle = rois.unbind(1)
    offset = 0.5 if aligned else 0.0
    cx, cy, rw, rh = cx * spatial_scale - offset, cy * spatial_scale - offset, rw * spatial_scale, rh * spatial_scale
    if not aligned:
        rw, rh = rw.clamp(min=1), rh.clamp(min=1)
    theta = -angle if clockwise else angle
    # sample (i, j) of the roi's (oh*sr) x (ow*sr) grid, relative to its centre, before rotation
    fy = (torch.arange(oh * sr, dtype=input.dtype) + 0.5) / (oh * sr) - 0.5
    fx = (torch.arange(ow * sr, dtype=input.dtype) + 0.5) / (ow * sr) - 0.5
    yy, xx = fy[None, :, None] * rh[:, None, None], fx[None, None, :] * rw[:, None, None]
    cos, sin = theta.cos()[:, None, None], theta.sin()[:, None, None]
    y = yy * cos - xx * sin + cy[:, None, None]  # (K, oh*sr, ow*sr)
    x = yy * sin + xx * cos + cx[:, None, None]
    inside = (y >= -1) & (y <= h) & (x >= -1) & (x <= w)
    y, x = y.clamp(0, h - 1), x.clamp(0, w - 1)
    gx = torch.where(inside, (2 * x + 1) / w - 1, -3.0)  # -3: outside grid_sample's range, sampled as 0
    gy = (2 * y + 1) / h - 1
    grid = torch.stack([gx, gy], -1)  # (K, oh*sr, ow*sr, 2)
    # one grid_sample per image, over the rois of that image
    order = torch.argsort(batch, stable=True)
    pieces, start = [], 0
    for image, count in enumerate(torch.bincount(batch.long(), minlength=n).tolist()):
        if count == 0:
            continue
        rows = order[start:start + count]
        start += count
        sampled = F.grid_sample(input[image:image + 1], grid[rows].reshape(1, count * oh * sr, ow * sr, 2),
                                mode="bilinear", padding_mode="zeros", align_corners=False)
        pieces.append(sampled.view(c, count, oh, sr, ow, sr).mean((3, 5)).transpose(0, 1))
    if not pieces:
        return input.new_zeros(k, c, oh, ow)
    return torch.cat(pieces)[torch.argsort(order)]


def crossing_border(rois, image):
    """How many rois have a corner outside the image (their samples near the edge take mmcv's
    border rules)."""
    _, cx, cy, w, h, a = rois.unbind(1)
    reach_x = (w * a.cos()).abs() / 2 + (h * a.sin()).abs() / 2
    reach_y = (w * a.sin()).abs() / 2 + (h * a.cos()).abs() / 2
    return int(((cx - reach_x < 0) | (cx + reach_x > image) | (cy - reach_y < 0) | (cy + reach_y > image)).sum())


class RoIAlignRotatedModel(torch.nn.Module):
    def __init__(self, output_size, spatial_scale, sampling_ratio):
        super().__init__()
        self.pool = opforge.RoIAlignRotated(output_size, spatial_scale, sampling_ratio, aligned=True)

    def forward(self, input, rois):
        return self.pool(input, rois)


def time_ort(model, input, rois, threads, repeats, expected):
    """ORT on the exported single opforge::roi_align_rotated node: (ms, max |diff| vs torch), or None
    when onnxruntime is not importable."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    proto = opforge.export(model, (input, rois), dynamo=True, verbose=False,  # verbose: keeps stdout for --json
                           input_names=["input", "rois"], output_names=["output"])
    assert [n.op_type for n in proto.graph.node if n.domain == "opforge"] == ["roi_align_rotated"]
    session = opforge.ort_session(proto, ort_options(threads))
    feeds = {"input": input.numpy(), "rois": rois.numpy()}
    got = session.run(None, feeds)[0]
    ms = round_robin({"ORT opforge::roi_align_rotated": lambda: session.run(None, feeds)}, repeats)
    return ms["ORT opforge::roi_align_rotated"], float(np.abs(got - expected).max())


def table(r: dict) -> None:
    sh = r["shape"]
    print(f"roi_align_rotated: N={sh['N']} C={sh['C']} {sh['H']}x{sh['W']} map, K={sh['K']} rois, "
          f"{sh['output'][0]}x{sh['output'][1]} output, sampling_ratio {sh['sampling_ratio']}, spatial_scale "
          f"{sh['spatial_scale']:g}, float32, {r['threads']} threads (medians)")
    print("  max |diff| opforge vs grid_sample: " + ", ".join(f"{k} {v:.1e}" for k, v in r["max_abs_diff"].items())
          + f" (all rois, {sh['rois_crossing_border']} of them crossing the image border)")
    for group in ("forward_ms", "forward_backward_ms"):
        print_ms(r[group], 32)
    if "ort_ms" in r:
        print(f"  {'ORT opforge::roi_align_rotated':<32} {r['ort_ms']:9.2f} ms (for information)")
    for key, label in (("ratio_forward", "forward: speed-up vs grid_sample"),
                       ("ratio_fwd_bwd", "forward+backward: speed-up vs grid_sample")):
        verdict = "PASS" if r[key] >= TARGETS[key] else "BELOW"
        print(f"  {label:<42} = {r[key]:5.1f}x (target >= {TARGETS[key]:g}x) {verdict}")


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=10, quick="small shapes, two rounds: a smoke test")
    p.add_argument("--rois", type=int, default=512)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--size", type=int, default=64, help="feature map height and width")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--output", type=int, default=7, help="output height and width")
    p.add_argument("--sampling-ratio", type=int, default=2, help=">= 1 (the anchor has a fixed grid)")
    p.add_argument("--spatial-scale", type=float, default=0.25)
    args = p.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK, repeats=2)
    if args.sampling_ratio < 1:
        p.error("--sampling-ratio must be >= 1: the anchor samples a fixed grid")
    torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    image = args.size / args.spatial_scale
    input = torch.randn(args.batch, args.channels, args.size, args.size, generator=g)
    rois = rotated_rois(args.rois, args.batch, image, g)
    size, scale, sr = (args.output, args.output), args.spatial_scale, args.sampling_ratio
    grad_out = torch.randn(args.rois, args.channels, *size, generator=g)

    def ours(x):
        return opforge.roi_align_rotated(x, rois, size, scale, sr, True, False)

    def anchor(x):
        return roi_align_rotated_grid_sample(x, rois, size, scale, sr, True, False)

    # agreement, before timing: outputs and the gradient of the map
    leaves = {fn: input.clone().requires_grad_() for fn in (ours, anchor)}
    results = {}
    for fn, x in leaves.items():
        out = fn(x)
        out.backward(grad_out)
        results[fn] = (out.detach(), x.grad)
    diffs = {name: (a - b).abs().max().item() for name, a, b in zip(("output", "grad_input"), results[ours],
                                                                     results[anchor])}
    for a, b in zip(results[ours], results[anchor]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    with torch.no_grad():
        fwd_ms = round_robin({"opforge forward": lambda: ours(input), "grid_sample forward": lambda: anchor(input)},
                             args.repeats)

    def fwd_bwd(fn):
        x = leaves[fn]

        def run():
            x.grad = None
            fn(x).backward(grad_out)
        return run

    fb_ms = round_robin({"opforge forward+backward": fwd_bwd(ours),
                         "grid_sample forward+backward": fwd_bwd(anchor)}, args.repeats)

    r = {
        "threads": args.threads, "quick": args.quick, "targets": TARGETS,
        "shape": dict(N=args.batch, C=args.channels, H=args.size, W=args.size, K=args.rois, output=list(size),
                      sampling_ratio=sr, spatial_scale=scale, aligned=True, dtype="float32",
                      rois_crossing_border=crossing_border(rois, image)),
        "max_abs_diff": diffs,
        "forward_ms": fwd_ms, "forward_backward_ms": fb_ms,
        "ratio_forward": fwd_ms["grid_sample forward"] / fwd_ms["opforge forward"],
        "ratio_fwd_bwd": fb_ms["grid_sample forward+backward"] / fb_ms["opforge forward+backward"],
    }
    ort_result = time_ort(RoIAlignRotatedModel(size, scale, sr), input, rois, args.threads, args.repeats,
                          results[ours][0].numpy())
    if ort_result is not None:
        r["ort_ms"], r["max_abs_diff"]["ort_vs_torch_output"] = ort_result
    return report(r, args.json, table)


if __name__ == "__main__":
    main()
