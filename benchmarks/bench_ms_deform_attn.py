"""ms_deform_attn speed, measured side by side in one run against a pure-PyTorch grid_sample anchor.

    python benchmarks/bench_ms_deform_attn.py [--threads 2] [--repeats 10] [--quick] [--json]

Shapes (Deformable DETR's, float32): M=8 heads, D=32 channels per head, P=4 points, levels
64x64, 32x32, 16x16, 8x8 (S=5440 rows of value);
  decoder: N=2, Lq=300 object queries;   encoder: N=1, Lq=S=5440 (every pixel is a query).
Anchor: the same computation in plain PyTorch, one F.grid_sample per level (align_corners=False,
zeros outside), weighted and summed -- what models without a compiled op run.
  torch forward: opforge vs grid_sample                                          target >= 5x faster
  torch forward+backward (grads of value, locations, weights): opforge vs grid_sample  target >= 5x faster
  ONNX Runtime: opforge::ms_deform_attn (libopforge_ort) vs ORT running the
                grid_sample model's own export (GridSample nodes)                 target >= 3x faster
Outputs and gradients are compared (max |diff| printed) before anything is timed.
Candidates of a group run round-robin (one call each per round); medians are reported.
--quick: tiny shapes and two rounds, a smoke test. Never used to gate CI.
"""

from __future__ import annotations

import io
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F

import opforge
from timing import bench_parser, cpu_session, ort_options, print_ms, report, round_robin

TARGETS = {"speedup_forward": 5.0, "speedup_fwd_bwd": 5.0, "speedup_ort": 3.0}  # opforge vs grid_sample, x faster
FULL = dict(heads=8, channels=32, points=4, levels=[(64, 64), (32, 32), (16, 16), (8, 8)],
            shapes={"decoder": (2, 300), "encoder": (1, None)})  # (N, Lq); None: Lq = S
QUICK = dict(heads=2, channels=4, points=2, levels=[(8, 8), (4, 4)],
             shapes={"decoder": (2, 10), "encoder": (1, None)})


def ms_deform_attn_grid_sample(value, levels, sampling_locations, attention_weights):
    """The op in plain PyTorch: per level, the (N*M, D, H, W) map sampled by F.grid_sample at
    2*loc - 1, weighted and summed over points, accumulated over levels (per level rather than
    stacked, so no (N*M, D, Lq, L, P) intermediate). ``levels`` are Python (H, W) pairs, so the
    export is one static GridSample per level."""
    n, _, m, d = value.shape
    _, lq, _, _, points, _ = sampling_locations.shape
    maps = value.split([h * w for h, w in levels], dim=1)
    grids = 2 * sampling_locations - 1
    out = 0
    for level, (h, w) in enumerate(levels):
        level_maps = maps[level].permute(0, 2, 3, 1).reshape(n * m, d, h, w)
        grid = grids[:, :, :, level].transpose(1, 2).reshape(n * m, lq, points, 2)
        sampled = F.grid_sample(level_maps, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        weights = attention_weights[:, :, :, level].transpose(1, 2).reshape(n * m, 1, lq, points)
        out = out + (sampled * weights).sum(-1)  # (N*M, D, Lq)
    return out.view(n, m * d, lq).transpose(1, 2).contiguous()


class GridSampleAttention(torch.nn.Module):
    def __init__(self, levels):
        super().__init__()
        self.levels = levels

    def forward(self, value, sampling_locations, attention_weights):
        return ms_deform_attn_grid_sample(value, self.levels, sampling_locations, attention_weights)


class OpforgeAttention(torch.nn.Module):
    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return opforge.ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)


def export_grid_sample(model, args):
    """The anchor's own export, as its user would do it: the TorchScript exporter at opset 17
    (GridSample exists from 16), else the dynamo exporter. Returns (bytes, how)."""
    names = dict(input_names=["value", "sampling_locations", "attention_weights"], output_names=["output"])
    try:
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(model, args, buffer, dynamo=False, opset_version=17, **names)
        return buffer.getvalue(), "torch.onnx.export(dynamo=False, opset 17)"
    except Exception as e:  # noqa: BLE001 - fall back to the other exporter, saying why
        print(f"TorchScript export of the grid_sample model failed ({str(e).splitlines()[0][:100]}); using dynamo",
              file=sys.stderr)  # stdout stays clean for --json
        program = torch.onnx.export(model, args, dynamo=True, opset_version=18, verbose=False, **names)
        return program.model_proto.SerializeToString(), "torch.onnx.export(dynamo=True, opset 18)"


def bench_shape(batch, queries, cfg, args):
    m, d, p, levels = cfg["heads"], cfg["channels"], cfg["points"], cfg["levels"]
    s = sum(h * w for h, w in levels)
    lq = s if queries is None else queries
    nl = len(levels)
    g = torch.Generator().manual_seed(0)
    value = torch.randn(batch, s, m, d, generator=g)
    spatial_shapes = torch.tensor(levels, dtype=torch.int64)
    level_start_index = torch.cat([spatial_shapes.new_zeros(1), spatial_shapes.prod(1).cumsum(0)[:-1]])
    locations = torch.rand(batch, lq, m, nl, p, 2, generator=g)
    weights = torch.randn(batch, lq, m, nl * p, generator=g).softmax(-1).view(batch, lq, m, nl, p)
    grad_out = torch.randn(batch, lq, m * d, generator=g)

    def ours(v, loc, w):
        return opforge.ms_deform_attn(v, spatial_shapes, level_start_index, loc, w)

    def anchor(v, loc, w):
        return ms_deform_attn_grid_sample(v, levels, loc, w)

    # numerics: outputs and all three gradients, before timing
    leaves = {fn: [t.clone().requires_grad_() for t in (value, locations, weights)] for fn in (ours, anchor)}
    results = {}
    for fn, ts in leaves.items():
        out = fn(*ts)
        out.backward(grad_out)
        results[fn] = [out.detach()] + [t.grad for t in ts]
    diffs = {k: (a - b).abs().max().item() for k, a, b in zip(("output", "grad_value", "grad_locations", "grad_weights"),
                                                               results[ours], results[anchor])}
    for a, b in zip(results[ours], results[anchor]):
        # grad_locations scale with the map size (d/dloc = W * d/dpixel): compare relative to each tensor's size
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * max(1.0, b.abs().max().item()))

    # torch forward
    with torch.no_grad():
        fwd_ms = round_robin({"opforge forward": lambda: ours(value, locations, weights),
                              "grid_sample forward": lambda: anchor(value, locations, weights)}, args.repeats)

    # torch forward + backward
    def fwd_bwd(fn):
        ts = leaves[fn]

        def run():
            for t in ts:
                t.grad = None
            fn(*ts).backward(grad_out)
        return run

    fb_ms = round_robin({"opforge forward+backward": fwd_bwd(ours),
                         "grid_sample forward+backward": fwd_bwd(anchor)}, args.repeats)

    # ONNX Runtime: opforge's custom node vs the grid_sample model's own export
    custom = opforge.export(OpforgeAttention(), (value, spatial_shapes, level_start_index, locations, weights),
                            dynamo=True, standard_onnx=False, verbose=False,  # keeps stdout for --json
                            input_names=["value", "spatial_shapes", "level_start_index", "sampling_locations",
                                         "attention_weights"], output_names=["output"])
    assert [n.op_type for n in custom.graph.node if n.domain == "opforge"] == ["ms_deform_attn"]
    plain, plain_how = export_grid_sample(GridSampleAttention(levels), (value, locations, weights))
    assert "GridSample" in {n.op_type for n in onnx.load_from_string(plain).graph.node}
    ours_ort = opforge.ort_session(custom, ort_options(args.threads))
    plain_ort = cpu_session(plain, args.threads)
    feeds_plain = {"value": value.numpy(), "sampling_locations": locations.numpy(), "attention_weights": weights.numpy()}
    feeds_ours = {**feeds_plain, "spatial_shapes": spatial_shapes.numpy(), "level_start_index": level_start_index.numpy()}
    got_ours, got_plain = ours_ort.run(None, feeds_ours)[0], plain_ort.run(None, feeds_plain)[0]
    np.testing.assert_allclose(got_ours, got_plain, rtol=1e-4, atol=1e-4)
    diffs["ort_output"] = float(np.abs(got_ours - got_plain).max())
    diffs["ort_vs_torch_output"] = float(np.abs(got_ours - results[anchor][0].numpy()).max())
    ort_ms = round_robin({"ORT opforge::ms_deform_attn": lambda: ours_ort.run(None, feeds_ours),
                          "ORT GridSample export": lambda: plain_ort.run(None, feeds_plain)}, args.repeats)

    return {
        "shape": dict(N=batch, Lq=lq, M=m, D=d, P=p, levels=levels, S=s),
        "grid_sample_export": plain_how,
        "max_abs_diff": diffs,
        "forward_ms": fwd_ms, "forward_backward_ms": fb_ms, "ort_ms": ort_ms,
        "speedup_forward": fwd_ms["grid_sample forward"] / fwd_ms["opforge forward"],
        "speedup_fwd_bwd": fb_ms["grid_sample forward+backward"] / fb_ms["opforge forward+backward"],
        "speedup_ort": ort_ms["ORT GridSample export"] / ort_ms["ORT opforge::ms_deform_attn"],
    }


def table(r: dict, shapes) -> None:
    for name in shapes:
        res = r[name]
        sh = res["shape"]
        levels = ", ".join(f"{h}x{w}" for h, w in sh["levels"])
        print(f"ms_deform_attn {name}: N={sh['N']} Lq={sh['Lq']} M={sh['M']} D={sh['D']} P={sh['P']} "
              f"levels {levels} (S={sh['S']}), float32, {r['threads']} threads (medians)")
        print("  max |diff| opforge vs grid_sample: " + ", ".join(f"{k} {v:.1e}" for k, v in res["max_abs_diff"].items()))
        for group in ("forward_ms", "forward_backward_ms", "ort_ms"):
            print_ms(res[group], 32)
        for key, label in (("speedup_forward", "torch forward: speed-up vs grid_sample"),
                           ("speedup_fwd_bwd", "torch forward+backward: speed-up vs grid_sample"),
                           ("speedup_ort", "ORT: speed-up vs the GridSample export")):
            print(f"  {label:<47} = {res[key]:5.1f}x (target >= {TARGETS[key]:g}x)")
        print(f"  (the GridSample model exported with {res['grid_sample_export']})")


def main(argv=None) -> dict:
    args = bench_parser(__doc__, repeats=10, quick="tiny shapes, two rounds: a smoke test").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.quick:
        args.repeats = 2
    torch.set_num_threads(args.threads)

    r = {"threads": args.threads, "quick": args.quick, "targets": TARGETS}
    for name, (batch, queries) in cfg["shapes"].items():
        r[name] = bench_shape(batch, queries, cfg, args)
    return report(r, args.json, lambda r: table(r, cfg["shapes"]))


if __name__ == "__main__":
    main()
