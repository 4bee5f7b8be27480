"""deform_conv2d speed, measured side by side in one run against its anchors.

    python benchmarks/bench_deform_conv2d.py [--batch 4] [--channels 64] [--size 56] [--threads 2] [--json]

Shape: N x C -> C, HxW, 3x3, padding 1, with mask (DCNv2), offset_groups 1, float32.
  ONNX Runtime: opforge::deform_conv2d (libopforge_ort)  vs  ORT's built-in DeformConv   target <= 1.0x
  torch forward: opforge  vs  torch conv2d (same shape)                                  target <= 1.4x
                 opforge  vs  torchvision.ops.deform_conv2d                                target >= 10x faster
  torch forward+backward (all five gradients): opforge vs torchvision                      target >= 10x faster
Candidates of a group run round-robin (one call each per round); medians are reported.
Never used to gate CI.
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision

import opforge
from timing import bench_parser, cpu_session, float_node_model, ort_options, print_ms, report, round_robin


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=15)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--size", type=int, default=56)
    p.add_argument("--tv-repeats", type=int, default=3, help="rounds for the (slow) torchvision candidates")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, c, s = args.batch, args.channels, args.size
    x = torch.randn(n, c, s, s)
    w = torch.randn(c, c, 3, 3) * 0.05
    b = torch.randn(c)
    off = torch.randn(n, 18, s, s) * 2
    mask = torch.rand(n, 9, s, s)
    torch.testing.assert_close(opforge.deform_conv2d(x, off, w, b, padding=1, mask=mask),
                               torchvision.ops.deform_conv2d(x, off, w, b, padding=1, mask=mask), rtol=1e-4, atol=1e-4)

    # ONNX Runtime
    feeds = {"input": x.numpy(), "weight": w.numpy(), "offset": off.numpy(), "mask": mask.numpy(), "bias": b.numpy()}
    attrs = dict(stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, groups=1, offset_groups=1, use_mask=1)
    ours = opforge.ort_session(float_node_model("deform_conv2d", "opforge", list(feeds), attrs,
                                                [("", 19), ("opforge", 1)]), ort_options(args.threads))
    builtin = cpu_session(float_node_model("DeformConv", "", ["input", "weight", "offset", "bias", "mask"],
                                           dict(pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1], group=1,
                                                offset_group=1), [("", 19)]), args.threads)
    np.testing.assert_allclose(ours.run(None, feeds)[0], builtin.run(None, feeds)[0], rtol=1e-3, atol=1e-3)
    ort_ms = round_robin({"ORT opforge::deform_conv2d": lambda: ours.run(None, feeds),
                          "ORT built-in DeformConv": lambda: builtin.run(None, feeds)}, args.repeats)

    # torch forward
    fwd_ms = round_robin({
        "opforge forward": lambda: opforge.deform_conv2d(x, off, w, b, padding=1, mask=mask),
        "torch conv2d": lambda: torch.nn.functional.conv2d(x, w, b, padding=1),
    }, args.repeats)
    fwd_ms.update(round_robin({"torchvision forward": lambda: torchvision.ops.deform_conv2d(x, off, w, b, padding=1, mask=mask)},
                              args.tv_repeats, warmup=1))

    # torch forward + backward
    leaves = [t.clone().requires_grad_() for t in (x, off, w, b, mask)]
    grad = torch.randn(n, c, s, s)

    def fwd_bwd(fn):
        def run():
            for t in leaves:
                t.grad = None
            xi, oi, wi, bi, mi = leaves
            fn(xi, oi, wi, bi, padding=1, mask=mi).backward(grad)
        return run

    fb_ms = round_robin({"opforge forward+backward": fwd_bwd(opforge.deform_conv2d)}, args.repeats)
    fb_ms.update(round_robin({"torchvision forward+backward": fwd_bwd(torchvision.ops.deform_conv2d)}, args.tv_repeats, warmup=1))

    r = {
        "shape": dict(batch=n, channels=c, size=s, kernel=3, threads=args.threads),
        "ort_ms": ort_ms, "forward_ms": fwd_ms, "forward_backward_ms": fb_ms,
        "ort_vs_builtin": ort_ms["ORT opforge::deform_conv2d"] / ort_ms["ORT built-in DeformConv"],
        "forward_vs_conv2d": fwd_ms["opforge forward"] / fwd_ms["torch conv2d"],
        "speedup_forward_vs_torchvision": fwd_ms["torchvision forward"] / fwd_ms["opforge forward"],
        "speedup_fwd_bwd_vs_torchvision": fb_ms["torchvision forward+backward"] / fb_ms["opforge forward+backward"],
    }

    def table(r):
        print(f"deform_conv2d N={n} C={c}->{c} {s}x{s} k=3 pad=1 mask, float32, {args.threads} threads (medians)")
        print_ms({**ort_ms, **fwd_ms, **fb_ms}, 30)
        for label, key, fmt, target in (("ORT: opforge / built-in DeformConv", "ort_vs_builtin", ".2f", "<= 1.0x"),
                                        ("torch forward: opforge / conv2d", "forward_vs_conv2d", ".2f", "<= 1.4x"),
                                        ("torch forward: speed-up vs torchvision", "speedup_forward_vs_torchvision",
                                         ".1f", ">= 10x"),
                                        ("forward+backward: speed-up vs torchvision", "speedup_fwd_bwd_vs_torchvision",
                                         ".1f", ">= 10x")):
            print(f"  {label:<41} = {r[key]:{fmt}}x (target {target})")

    return report(r, args.json, table)


if __name__ == "__main__":
    main()
