"""CUDA speed, measured side by side in one run against the anchors of issue #5.

    python benchmarks/bench_cuda.py [--batch 8] [--channels 64] [--size 56] [--repeats 50] [--json]

Needs a CUDA GPU and an opforge build with CUDA kernels (opforge.BUILT_WITH_CUDA).
  deform_conv2d (N x C -> C, HxW, 3x3, padding 1, mask, float32 and float16):
    forward + backward (all five gradients): opforge vs torchvision.ops.deform_conv2d   target >= 1.5x faster
    forward: opforge vs torchvision; and vs torch conv2d of the same shape (cuDNN) for scale
  my_add (16M float32): opforge vs torch.add(a, b, alpha=2) (same memory traffic)
  ORT CUDA EP (when onnxruntime-gpu is importable): opforge::deform_conv2d vs ORT's DeformConv
Timing: CUDA events around each call, candidates interleaved one call per round, medians.
Never used to gate CI.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
import torchvision

import opforge
from timing import bench_parser


def cuda_round_robin(candidates, repeats, warmup=3):
    """Median milliseconds per candidate (CUDA events, one call of each per round)."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end))
    return {name: statistics.median(s) for name, s in samples.items()}


def deform_case(n, c, s, dtype, repeats):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, c, s, s, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(c, c, 3, 3, device="cuda", dtype=dtype, generator=g) * 0.05
    b = torch.randn(c, device="cuda", dtype=dtype, generator=g)
    off = torch.randn(n, 18, s, s, device="cuda", dtype=dtype, generator=g) * 2
    mask = torch.rand(n, 9, s, s, device="cuda", dtype=dtype, generator=g)
    leaves = [t.clone().requires_grad_() for t in (x, w, off, mask, b)]
    grad = torch.randn(n, c, s, s, device="cuda", dtype=dtype, generator=g)

    def fwd(fn):
        return lambda: fn(x, off, w, b, padding=1, mask=mask)

    def fwd_bwd(fn):
        def run():
            xx, ww, oo, mm, bb = leaves
            out = fn(xx, oo, ww, bb, padding=1, mask=mm)
            torch.autograd.grad(out, leaves, grad)
        return run

    with torch.no_grad():
        fw = cuda_round_robin({"opforge": fwd(opforge.deform_conv2d), "torchvision": fwd(torchvision.ops.deform_conv2d),
                               "conv2d": lambda: torch.nn.functional.conv2d(x, w, b, padding=1)}, repeats)
    fb = cuda_round_robin({"opforge": fwd_bwd(opforge.deform_conv2d),
                           "torchvision": fwd_bwd(torchvision.ops.deform_conv2d)}, repeats)
    return fw, fb


def ort_case(n, c, s, repeats):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    import numpy as np
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, s, s), dtype=np.float32)
    w = (rng.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.05)
    b = rng.standard_normal(c, dtype=np.float32)
    off = rng.standard_normal((n, 18, s, s), dtype=np.float32) * 2
    mask = rng.random((n, 9, s, s), dtype=np.float32)
    ints = dict(stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, groups=1, offset_groups=1, use_mask=1)

    def model(node, opsets):
        graph = helper.make_graph([node], "bench", [helper.make_tensor_value_info(i, TensorProto.FLOAT, None) for i in node.input],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])

    ours = model(helper.make_node("deform_conv2d", ["x", "w", "off", "mask", "b"], ["y"], domain="opforge", **ints),
                 [("", 19), ("opforge", 1)])
    builtin = model(helper.make_node("DeformConv", ["x", "w", "off", "b", "mask"], ["y"], kernel_shape=[3, 3],
                                     pads=[1, 1, 1, 1]), [("", 19)])
    providers = ["CUDAExecutionProvider"]
    feeds = {"x": x, "w": w, "off": off, "mask": mask, "b": b}
    sessions = {"opforge": opforge.ort_session(ours, providers=providers),
                "ort DeformConv": ort.InferenceSession(builtin.SerializeToString(), providers=providers)}
    # device-resident inputs/outputs: time the kernels, not PCIe copies
    bindings = {}
    for name, sess in sessions.items():
        io = sess.io_binding()
        for k, v in feeds.items():
            io.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
        io.bind_output("y", "cuda")
        bindings[name] = (sess, io)
    return cuda_round_robin({name: (lambda s=s_, io=io_: s.run_with_iobinding(io)) for name, (s_, io_) in bindings.items()},
                            repeats)


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=50, threads=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--size", type=int, default=56)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_cuda: no CUDA GPU visible to torch (torch.cuda.is_available() is False)")
    if not opforge.BUILT_WITH_CUDA:
        sys.exit("bench_cuda: this opforge build has no CUDA kernels; rebuild with OPFORGE_CUDA=1")
    n, c, s = args.batch, args.channels, args.size

    def say(*parts):  # with --json, stdout carries only the JSON
        print(*parts, file=sys.stderr if args.json else sys.stdout)

    results = {"device": torch.cuda.get_device_name(), "shape": f"N={n} C={c}->{c} {s}x{s} k=3 mask"}
    say(f"{results['device']}; deform_conv2d {results['shape']}; torch {torch.__version__}; medians of {args.repeats}")
    for dtype in (torch.float32, torch.float16):
        fw, fb = deform_case(n, c, s, dtype, args.repeats)
        name = str(dtype).replace("torch.", "")
        results[f"deform_{name}"] = {"forward_ms": fw, "forward_backward_ms": fb,
                                     "fwd_bwd_speedup_vs_torchvision": fb["torchvision"] / fb["opforge"],
                                     "fwd_speedup_vs_torchvision": fw["torchvision"] / fw["opforge"],
                                     "fwd_ratio_vs_conv2d": fw["opforge"] / fw["conv2d"]}
        say(f"[{name}] forward: opforge {fw['opforge']:.3f} ms, torchvision {fw['torchvision']:.3f} ms "
              f"({fw['torchvision'] / fw['opforge']:.2f}x faster), conv2d {fw['conv2d']:.3f} ms "
              f"(opforge = {fw['opforge'] / fw['conv2d']:.2f}x conv2d)")
        say(f"[{name}] forward+backward: opforge {fb['opforge']:.3f} ms, torchvision {fb['torchvision']:.3f} ms "
              f"-> {fb['torchvision'] / fb['opforge']:.2f}x faster (target >= 1.5x)")
    a, b = torch.randn(1 << 24, device="cuda"), torch.randn(1 << 24, device="cuda")
    ma = cuda_round_robin({"opforge": lambda: opforge.my_add(a, b), "torch.add(alpha=2)": lambda: torch.add(b, a, alpha=2)},
                          args.repeats)
    results["my_add_ms"] = ma
    say(f"my_add 16M fp32: opforge {ma['opforge']:.3f} ms, torch.add(alpha=2) {ma['torch.add(alpha=2)']:.3f} ms "
          f"({ma['opforge'] / ma['torch.add(alpha=2)']:.2f}x)")
    o = ort_case(n, c, s, args.repeats)
    if o is None:
        say("ORT CUDA EP: skipped (onnxruntime-gpu not importable)")
    else:
        results["ort_cuda_ms"] = o
        say(f"ORT CUDA EP: opforge {o['opforge']:.3f} ms, DeformConv {o['ort DeformConv']:.3f} ms "
              f"({o['opforge'] / o['ort DeformConv']:.2f}x)")
    if args.json:
        print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
