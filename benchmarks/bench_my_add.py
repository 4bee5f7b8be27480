"""my_add throughput, measured side by side in one run against its anchors.

    python benchmarks/bench_my_add.py [--numel 16777216] [--threads 2] [--repeats 30] [--json]

torch (torch.set_num_threads(threads)):
    opforge.my_add(a, b)  vs  2*a + b  vs  torch.add(b, a, alpha=2)    target: <= 1.0x torch.add(alpha=2)
ONNX Runtime (intra_op_num_threads=threads):
    opforge::my_add node   vs  Mul + Add graph                          target: <= 0.8x Mul+Add

Candidates run round-robin (one call each per round) so drift and thermal state hit all
alike; the reported time is the median over rounds. Never used to gate CI.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

import opforge
from timing import bench_parser, ort_options, print_ms, report, round_robin


def ort_graph(custom: bool) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N"]) for n in ("A", "B")]
    output = helper.make_tensor_value_info("C", TensorProto.FLOAT, ["N"])
    if custom:
        nodes = [helper.make_node("my_add", ["A", "B"], ["C"], domain=opforge.spec.DOMAIN)]
        inits = []
    else:
        nodes = [helper.make_node("Mul", ["A", "two"], ["A2"]), helper.make_node("Add", ["A2", "B"], ["C"])]
        inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    graph = helper.make_graph(nodes, "bench", inputs, [output], initializer=inits)
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(opforge.spec.DOMAIN, 1)] if custom else [])
    return helper.make_model(graph, opset_imports=opsets)


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=30)
    p.add_argument("--numel", type=int, default=16 * 1024 * 1024)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    a = torch.randn(args.numel)
    b = torch.randn(args.numel)
    torch.testing.assert_close(opforge.my_add(a, b), torch.add(b, a, alpha=2))
    torch_ms = round_robin(
        {
            "opforge.my_add": lambda: opforge.my_add(a, b),
            "2*a+b": lambda: 2 * a + b,
            "torch.add(alpha=2)": lambda: torch.add(b, a, alpha=2),
        },
        args.repeats,
    )

    feeds = {"A": a.numpy(), "B": b.numpy()}
    ours = opforge.ort_session(ort_graph(custom=True), ort_options(args.threads))
    anchor = opforge.ort_session(ort_graph(custom=False), ort_options(args.threads), register_opforge=False)
    np.testing.assert_allclose(ours.run(None, feeds)[0], anchor.run(None, feeds)[0], rtol=1e-6)
    ort_ms = round_robin(
        {"ORT opforge::my_add": lambda: ours.run(None, feeds), "ORT Mul+Add": lambda: anchor.run(None, feeds)},
        args.repeats,
    )

    results = {
        "numel": args.numel,
        "threads": args.threads,
        "torch_ms": torch_ms,
        "ort_ms": ort_ms,
        "ratio_vs_torch_add_alpha": torch_ms["opforge.my_add"] / torch_ms["torch.add(alpha=2)"],
        "ratio_vs_2a_plus_b": torch_ms["opforge.my_add"] / torch_ms["2*a+b"],
        "ratio_ort_vs_mul_add": ort_ms["ORT opforge::my_add"] / ort_ms["ORT Mul+Add"],
    }

    def table(r):
        print(f"my_add, {args.numel} float32 elements, {args.threads} threads, median of {args.repeats} rounds")
        print_ms({**torch_ms, **ort_ms}, 22, "8.2f")
        print(f"  torch: opforge / torch.add(alpha=2) = {r['ratio_vs_torch_add_alpha']:.2f}x (target <= 1.0x: "
              f"{'met' if r['ratio_vs_torch_add_alpha'] <= 1.0 else 'MISSED'})")
        print(f"  torch: opforge / (2*a+b)           = {r['ratio_vs_2a_plus_b']:.2f}x")
        print(f"  ORT:   opforge::my_add / Mul+Add   = {r['ratio_ort_vs_mul_add']:.2f}x (target <= 0.8x: "
              f"{'met' if r['ratio_ort_vs_mul_add'] <= 0.8 else 'MISSED'})")

    return report(results, args.json, table)


if __name__ == "__main__":
    main()
