"""mmdeploy::grid_sampler (libopforge_mmdeploy) speed, measured side by side in one run against ONNX
Runtime's built-in GridSample on the same shapes.

    python benchmarks/bench_mmdeploy_grid_sampler.py [--threads 2] [--repeats 10] [--quick] [--json]

Shapes (float32):
  warp:   N=2, C=64, 128x128 input, 128x128 grid (a feature-map warp: the identity grid plus a
          smooth displacement of up to ~4 pixels, a few points past the border)
  sparse: N=4, C=256, 32x32 input, 100x4 grid points anywhere in [-1.1, 1.1] (a detection head
          sampling 100 boxes' corners)
Each shape runs for every interpolation mode (bilinear, nearest, bicubic) with zeros padding and
align_corners=False, plus bilinear with border / reflection padding and bilinear with
align_corners=True: the one-node mmdeploy model (grid_sampler, domain mmdeploy) against the
one-node opset-16 model (GridSample, mode "bilinear" / "nearest" / "bicubic"), both in sessions
with the same intra_op_num_threads. Outputs are compared with each other and with
torch.nn.functional.grid_sample (max |diff| printed) before anything is timed.
ratio = ORT GridSample time / mmdeploy::grid_sampler time      target >= 1/1.2 (within 1.2x or faster)
Candidates of a group run round-robin (one call each per round); medians are reported.
--quick: small shapes and two rounds, a smoke test. Never used to gate CI.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from timing import bench_parser, cpu_session, report, round_robin

TARGET = 1 / 1.2  # ORT GridSample time / ours
MODES = ["bilinear", "nearest", "bicubic"]
PADDINGS = ["zeros", "border", "reflection"]
# (mode, padding, align_corners) per shape
CASES = [("bilinear", "zeros", False), ("nearest", "zeros", False), ("bicubic", "zeros", False),
         ("bilinear", "border", False), ("bilinear", "reflection", False), ("bilinear", "zeros", True)]
FULL = {"warp": dict(N=2, C=64, H=128, W=128, Ho=128, Wo=128), "sparse": dict(N=4, C=256, H=32, W=32, Ho=100, Wo=4)}
QUICK = {"warp": dict(N=2, C=4, H=16, W=16, Ho=16, Wo=16), "sparse": dict(N=2, C=8, H=8, W=8, Ho=10, Wo=4)}


def library_path() -> str:
    try:
        import opforge
        return opforge.mmdeploy_library_path()
    except (ImportError, AttributeError):
        return os.path.join(os.path.dirname(__file__), "..", "opforge", "ort_kernels", "libopforge_mmdeploy.so")


def one_node(op_type, domain, attrs, opsets):
    node = helper.make_node(op_type, ["input", "grid"], ["output"], domain=domain, **attrs)
    graph = helper.make_graph([node], op_type,
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("grid", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def inputs(shape, kind, generator):
    n, c, h, w, ho, wo = (shape[k] for k in ("N", "C", "H", "W", "Ho", "Wo"))
    x = torch.randn(n, c, h, w, generator=generator)
    if kind == "warp":
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, ho), torch.linspace(-1, 1, wo), indexing="ij")
        base = torch.stack([xs, ys], -1).expand(n, ho, wo, 2)
        flow = F.interpolate(torch.randn(n, 2, 8, 8, generator=generator), size=(ho, wo), mode="bilinear",
                             align_corners=False).permute(0, 2, 3, 1) * (8.0 / max(h, w))
        grid = base + flow
    else:
        grid = torch.rand(n, ho, wo, 2, generator=generator) * 2.2 - 1.1
    return x.contiguous(), grid.contiguous()


def run_case(shape, kind, mode, padding, align_corners, threads, repeats, library, generator):
    x, grid = inputs(shape, kind, generator)
    ours = cpu_session(one_node("grid_sampler", "mmdeploy",
                                dict(interpolation_mode=MODES.index(mode), padding_mode=PADDINGS.index(padding),
                                     align_corners=int(align_corners)),
                                [("", 16), ("mmdeploy", 1)]), threads, library)
    builtin = cpu_session(one_node("GridSample", "", dict(mode=mode, padding_mode=padding,
                                                          align_corners=int(align_corners)), [("", 16)]), threads)
    feeds = {"input": x.numpy(), "grid": grid.numpy()}
    got, ref = ours.run(None, feeds)[0], builtin.run(None, feeds)[0]
    want = F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align_corners).numpy()
    diffs = {"ours_vs_torch": float(np.abs(got - want).max()), "ort_vs_torch": float(np.abs(ref - want).max())}
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ms = round_robin({"mmdeploy::grid_sampler": lambda: ours.run(None, feeds),
                      "ORT GridSample": lambda: builtin.run(None, feeds)}, repeats)
    return {"shape": kind, "mode": mode, "padding": padding, "align_corners": align_corners, "ms": ms,
            "max_abs_diff": diffs, "ratio": ms["ORT GridSample"] / ms["mmdeploy::grid_sampler"]}


def table(r: dict) -> None:
    print(f"mmdeploy::grid_sampler vs ORT GridSample (opset 16), float32, {r['threads']} threads (medians)")
    for kind, s in r["shapes"].items():
        print(f"  {kind}: N={s['N']} C={s['C']} {s['H']}x{s['W']} input, {s['Ho']}x{s['Wo']} grid")
    print(f"  {'shape':<7}{'mode':<9}{'padding':<11}{'ac':<4}{'ours ms':>9}{'ORT ms':>9}{'ratio':>7}  max|diff| vs torch")
    for c in r["cases"]:
        verdict = "PASS" if c["ratio"] >= TARGET else "BELOW"
        print(f"  {c['shape']:<7}{c['mode']:<9}{c['padding']:<11}{int(c['align_corners']):<4}"
              f"{c['ms']['mmdeploy::grid_sampler']:9.3f}{c['ms']['ORT GridSample']:9.3f}{c['ratio']:7.2f}  "
              f"ours {c['max_abs_diff']['ours_vs_torch']:.1e}, ORT {c['max_abs_diff']['ort_vs_torch']:.1e}  {verdict}")
    print(f"  min ratio {r['min_ratio']:.2f} (target >= {TARGET:.3f})")



def main(argv=None) -> dict:
    args = bench_parser(__doc__, repeats=10, quick="small shapes, two rounds: a smoke test").parse_args(argv)
    shapes = QUICK if args.quick else FULL
    repeats = 2 if args.quick else args.repeats
    library = library_path()
    g = torch.Generator().manual_seed(0)
    results = [run_case(shapes[kind], kind, m, pad, ac, args.threads, repeats, library, g)
               for kind in shapes for m, pad, ac in CASES]
    r = {"threads": args.threads, "quick": args.quick, "target_ratio": TARGET, "shapes": shapes, "cases": results,
         "min_ratio": min(c["ratio"] for c in results)}
    return report(r, args.json, table)


if __name__ == "__main__":
    main()
