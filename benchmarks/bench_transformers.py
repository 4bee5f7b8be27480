"""opforge.patch_transformers() on transformers' Deformable DETR: eager and ONNX Runtime, stock
vs patched, side by side in one run, with the share of time in multi-scale deformable attention.

    python benchmarks/bench_transformers.py [--size 512] [--batch 1] [--repeats 3] [--threads 2]
                                            [--quick] [--json PATH]

Needs transformers (not an opforge dependency): run it with a python that has it, e.g. the test
suite's venv, build/transformers-venvs/transformers-5.23/venv/bin/python.

Model: transformers' DeformableDetrForObjectDetection with its default architecture (d_model 256,
6 encoder and 6 decoder layers, 8 heads, 4 levels, 4 points, 300 queries) on transformers' own
ResNet-50 backbone (the timm default would need timm), random init, float32, eval, no_grad;
image --size x --size. --quick: a tiny config at 128x128, one round (the test suite's smoke run).

Rounds alternate stock and patched (patch, call, undo; the patching is outside the timed call);
medians reported. The MSDA time is measured where the work is: in eager, the time inside every
MultiScaleDeformableAttention layer call (forward hooks, the same layers on both sides); in ORT,
from ORT's own profile, the ms_deform_attn nodes (patched) and, for stock, the GridSample nodes
(a lower bound: the stock form's reshapes, multiply and sum around them are not counted). Also
checks that patched and stock outputs agree, eager and in ORT. Never used to gate CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import opforge  # noqa: E402

try:
    import transformers  # noqa: F401
except ImportError:
    sys.exit("bench_transformers: transformers is not importable; run this with a python that has it, e.g. "
             "build/transformers-venvs/transformers-5.23/venv/bin/python (made by tests/test_transformers.py)")


def deformable_detr(quick: bool):
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection, ResNetConfig

    if quick:
        backbone = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                                layer_type="basic", out_features=["stage2", "stage3", "stage4"])
        config = DeformableDetrConfig(backbone_config=backbone, d_model=32, encoder_layers=1, decoder_layers=2,
                                      encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_attention_heads=2,
                                      decoder_attention_heads=2, num_queries=10, num_labels=3)
    else:
        backbone = ResNetConfig(out_features=["stage2", "stage3", "stage4"])  # ResNet-50
        config = DeformableDetrConfig(backbone_config=backbone)
    torch.manual_seed(0)
    model = DeformableDetrForObjectDetection(config).eval()
    # Trained offsets do not sit on the pixel grid as transformers' initial ones do: sampling is
    # then really deformed, as in use (the speed of both sides does not depend on it).
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("sampling_offsets"):
                module.weight.normal_(0, 0.01)
    return model


class Outputs(torch.nn.Module):
    """The model with tensor outputs (logits, boxes), for the exporter."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return out.logits, out.pred_boxes


class MsdaTimer:
    """Time spent inside the MultiScaleDeformableAttention layers, per forward."""

    def __init__(self, model):
        self.total, self._start = 0.0, 0.0
        layers = [m for m in model.modules() if type(m).__name__ == "MultiScaleDeformableAttention"]
        for layer in layers:
            layer.register_forward_pre_hook(self._enter)
            layer.register_forward_hook(self._leave)
        self.layers = len(layers)

    def _enter(self, module, args):
        self._start = time.perf_counter()

    def _leave(self, module, args, output):
        self.total += time.perf_counter() - self._start

    def reset(self):
        self.total = 0.0


def alternate(stock, patched, repeats: int, warmup: int = 1) -> tuple:
    """Median ms of stock() and of patched() run under the patch, alternating; and every round's ms."""
    samples = {"stock": [], "patched": []}
    for round_ in range(warmup + repeats):
        for side, fn in (("stock", stock), ("patched", patched)):
            patch = opforge.patch_transformers() if side == "patched" else None
            try:
                t0 = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - t0
            finally:
                if patch is not None:
                    patch.undo()
            if round_ >= warmup:
                samples[side].append(elapsed * 1e3)
    return {side: statistics.median(s) for side, s in samples.items()}, samples


def ort_profile(session_maker, feeds) -> dict:
    """Milliseconds per op type in the last of three profiled runs (ORT's own profile; the first
    runs pay for allocations)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = session_maker(options)
        for _ in range(3):
            session.run(None, feeds)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    last = [e for e in events if e.get("name") == "model_run"][-1]
    per_op: dict = {"(model_run)": last["dur"] / 1e3}
    for e in events:
        inside = last["ts"] <= e.get("ts", -1) <= last["ts"] + last["dur"]
        if inside and e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + e["dur"] / 1e3
    return per_op


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.repeats = 128, 1
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # the exporters' notes about this model: not what is measured

    model = deformable_detr(args.quick)
    wrapped = Outputs(model)
    image = torch.randn(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(1))
    timer = MsdaTimer(model)

    # eager: total and the MSDA share; outputs compared first
    with torch.no_grad():
        stock_out = wrapped(image)
        with opforge.patch_transformers():
            patched_out = wrapped(image)
    eager_diff = max(float((a - b).abs().max()) for a, b in zip(stock_out, patched_out))

    msda = {"stock": [], "patched": []}

    def measured(side):
        def run():
            timer.reset()
            with torch.no_grad():
                wrapped(image)
            msda[side].append(timer.total * 1e3)
        return run

    eager_ms, eager_rounds = alternate(measured("stock"), measured("patched"), args.repeats)
    msda_ms = {side: statistics.median(v[1:]) for side, v in msda.items()}  # the warm-up round left out

    # ONNX Runtime: each side's own export (opforge.export, dynamo), then alternating runs
    protos = {"stock": opforge.export(wrapped, (image,), dynamo=True)}
    with opforge.patch_transformers():
        protos["patched"] = opforge.export(wrapped, (image,), dynamo=True)
    nodes = {side: {op: sum(n.op_type == op for n in proto.graph.node) for op in ("ms_deform_attn", "GridSample")}
             for side, proto in protos.items()}
    sessions = {side: opforge.ort_session(proto, intra_op_num_threads=args.threads) for side, proto in protos.items()}
    feeds = {side: {s.get_inputs()[0].name: image.numpy()} for side, s in sessions.items()}
    ort_out = {side: s.run(None, feeds[side]) for side, s in sessions.items()}
    ort_diff = max(float(np.abs(a - b.numpy()).max()) for side in ort_out for a, b in zip(ort_out[side], stock_out))
    samples = {"stock": [], "patched": []}
    for round_ in range(1 + args.repeats):
        for side, session in sessions.items():
            t0 = time.perf_counter()
            session.run(None, feeds[side])
            if round_:
                samples[side].append((time.perf_counter() - t0) * 1e3)
    ort_ms = {side: statistics.median(s) for side, s in samples.items()}
    profiles = {side: ort_profile(lambda o, side=side: opforge.ort_session(protos[side], o,
                                                                            intra_op_num_threads=args.threads),
                                  feeds[side]) for side in protos}
    ort_msda_ms = {"stock": profiles["stock"].get("GridSample", 0.0),
                   "patched": profiles["patched"].get("ms_deform_attn", 0.0)}

    result = {
        "model": "DeformableDetrForObjectDetection" + (" (tiny, --quick)" if args.quick else " (ResNet-50, default)"),
        "image": [args.batch, 3, args.size, args.size], "threads": args.threads, "repeats": args.repeats,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "msda_calls": timer.layers,  # each layer runs once per forward
        "eager_ms": eager_ms, "msda_ms": msda_ms, "eager_rounds_ms": eager_rounds, "msda_rounds_ms": msda,
        "ort_ms": ort_ms, "ort_msda_ms": ort_msda_ms, "ort_rounds_ms": samples,
        "ort_profile_run_ms": {side: profile["(model_run)"] for side, profile in profiles.items()},
        "ort_nodes": nodes, "max_abs_diff": {"eager": eager_diff, "ort": ort_diff},
    }
    print(f"{result['model']}, image {result['image']}, {args.threads} threads, medians of {args.repeats}")
    print(f"{'':22}{'stock':>12}{'patched':>12}{'speed-up':>10}")
    rows = [("eager forward", eager_ms), ("  in MSDA", msda_ms), ("ORT run", ort_ms),
            ("  in MSDA (profile)", ort_msda_ms)]
    for label, values in rows:
        print(f"{label:22}{values['stock']:10.1f}ms{values['patched']:10.1f}ms"
              f"{values['stock'] / max(values['patched'], 1e-9):9.1f}x")
    print(f"MSDA share, eager: stock {msda_ms['stock'] / eager_ms['stock']:.0%}, "
          f"patched {msda_ms['patched'] / eager_ms['patched']:.0%}; ORT (profile): stock GridSample nodes "
          f"{ort_msda_ms['stock'] / result['ort_profile_run_ms']['stock']:.0%} (lower bound), patched "
          f"{ort_msda_ms['patched'] / result['ort_profile_run_ms']['patched']:.0%}")
    print(f"agreement: eager {eager_diff:.2e}, ORT {ort_diff:.2e} (max abs vs eager stock)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
