"""mmdeploy::MMCVModulatedDeformConv2d (libopforge_mmdeploy) speed, measured side by side in one run.

    python benchmarks/bench_mmdeploy_dcn.py [--batch 4] [--channels 64] [--size 56] [--groups 1]
        [--deform-groups 1] [--threads 2] [--repeats 15] [--quick] [--json]

Shape: N x C -> C, HxW, 3x3, padding 1, DCNv2 (mask), float32; by default the shape of
bench_deform_conv2d.py, also run with groups 2 x deform_groups 2 (the case mmdeploy's own kernel
computes wrongly).
  mmdeploy node (libopforge_mmdeploy)  vs  opforge::deform_conv2d (libopforge_ort)   target <= 1.0x
  mmdeploy node                        vs  ORT's built-in DeformConv (opset 19)      for information
The two opforge nodes run the same code (ort_kernels/csrc/deform_conv2d_cpu.h); the first ratio
shows the mmdeploy node form costs nothing on top. Outputs are compared with torchvision before
anything is timed. Candidates run round-robin (one call each per round); medians are reported.
mmdeploy's own library is not timed: it needs its bundled ONNX Runtime 1.15 in the process.
--quick: small shapes and two rounds, a smoke test. Never used to gate CI.
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision

import opforge
from timing import bench_parser, cpu_session, float_node_model, report, round_robin

TARGETS = {"ratio_vs_opforge": 1.0}  # mmdeploy node time / opforge node time, at most
QUICK = dict(batch=1, channels=8, size=12, repeats=2)


def measure(n, c, s, groups, dg, threads, repeats) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, s, s, generator=g)
    w = torch.randn(c, c // groups, 3, 3, generator=g) * 0.05
    b = torch.randn(c, generator=g)
    off = torch.randn(n, 2 * dg * 9, s, s, generator=g) * 2
    mask = torch.rand(n, dg * 9, s, s, generator=g)
    want = torchvision.ops.deform_conv2d(x, off, w, b, padding=1, mask=mask).numpy()

    mmdeploy = cpu_session(float_node_model("MMCVModulatedDeformConv2d", "mmdeploy",
                                            ["input", "offset", "mask", "weight", "bias"],
                                            dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=groups,
                                                 deform_groups=dg), [("", 11), ("mmdeploy", 1)]),
                           threads, opforge.mmdeploy_library_path())
    own = cpu_session(float_node_model("deform_conv2d", "opforge", ["input", "weight", "offset", "mask", "bias"],
                                       dict(stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1,
                                            groups=groups, offset_groups=dg, use_mask=1), [("", 18), ("opforge", 1)]),
                      threads, opforge.ort_library_path())
    builtin = cpu_session(float_node_model("DeformConv", "", ["input", "weight", "offset", "bias", "mask"],
                                           dict(pads=[1, 1, 1, 1], group=groups, offset_group=dg), [("", 19)]),
                          threads)
    feeds = {"input": x.numpy(), "weight": w.numpy(), "offset": off.numpy(), "mask": mask.numpy(), "bias": b.numpy()}
    errors = {}
    for name, sess in (("mmdeploy", mmdeploy), ("opforge", own), ("ort_builtin", builtin)):
        names = {i.name for i in sess.get_inputs()}
        errors[name] = float(np.abs(sess.run(None, {k: v for k, v in feeds.items() if k in names})[0] - want).max())
    assert errors["mmdeploy"] < 1e-3 and errors["opforge"] < 1e-3, errors

    def call(sess):
        names = {i.name for i in sess.get_inputs()}
        sub = {k: v for k, v in feeds.items() if k in names}
        return lambda: sess.run(None, sub)

    ms = round_robin({"opforge": call(own), "mmdeploy": call(mmdeploy), "ort_builtin": call(builtin)}, repeats)
    return {"shape": dict(batch=n, channels=c, size=s, groups=groups, deform_groups=dg, threads=threads),
            "ms": ms, "max_abs_error_vs_torchvision": errors,
            "ratio_vs_opforge": ms["mmdeploy"] / ms["opforge"], "speedup_vs_ort_builtin": ms["ort_builtin"] / ms["mmdeploy"]}


def table(results: dict) -> None:
    for r in results["results"]:
        ms, sh = r["ms"], r["shape"]
        print(f"N={sh['batch']} C={sh['channels']} {sh['size']}x{sh['size']} groups={sh['groups']} "
              f"deform_groups={sh['deform_groups']} threads={sh['threads']}")
        print(f"  mmdeploy node {ms['mmdeploy']:.2f} ms | opforge node {ms['opforge']:.2f} ms | "
              f"ORT DeformConv {ms['ort_builtin']:.2f} ms")
        print(f"  mmdeploy / opforge = {r['ratio_vs_opforge']:.2f}x (target <= {TARGETS['ratio_vs_opforge']:.1f}x); "
              f"ORT DeformConv / mmdeploy = {r['speedup_vs_ort_builtin']:.2f}x")


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=15, quick="small shapes, two rounds: a smoke test")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--size", type=int, default=56)
    p.add_argument("--groups", type=int, default=None, help="one configuration only (default: 1x1 and 2x2)")
    p.add_argument("--deform-groups", type=int, default=None)
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    configs = [(args.groups or 1, args.deform_groups or 1)] if args.groups or args.deform_groups else [(1, 1), (2, 2)]
    results = [measure(args.batch, args.channels, args.size, g, dg, args.threads, args.repeats) for g, dg in configs]
    return report({"results": results, "targets": TARGETS}, args.json, table)


if __name__ == "__main__":
    main()
