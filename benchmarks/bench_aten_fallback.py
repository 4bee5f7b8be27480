"""Per-node overhead of an ATen-fallback node in ONNX Runtime (libopforge_aten), measured
side by side with calling the same op in eager torch.

    python benchmarks/bench_aten_fallback.py [--nodes 64] [--numel 16] [--json]

A chain of N ``org.pytorch.aten::ATen(operator="logcumsumexp")`` nodes on a small tensor
runs in ORT; the same N calls run in eager torch. overhead/node = (ORT time - eager time) / N:
the cost of decoding inputs, wrapping ORT buffers, the boxed dispatcher call and copying the
result out. An ORT chain of N native ``Abs`` nodes shows ORT's own per-node cost.
Target: <= 20 us/node. Never used to gate CI.
"""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

import opforge
from opforge.aten.fallback import ATEN_DOMAIN
from timing import bench_parser, cpu_session, ort_options, report, round_robin

#: (label, result key, unit) of each row of the table
ROWS = [("ORT ATen node (libopforge_aten)", "ort_aten_us_per_node", "us/node"),
        ("eager torch call", "eager_torch_us_per_call", "us/call"),
        ("ORT native Abs node (reference)", "ort_native_abs_us_per_node", "us/node"),
        ("overhead vs eager torch", "overhead_us_per_node", "us/node (target <= 20)")]


def chain_model(n: int, aten: bool):
    nodes, prev = [], "x"
    for i in range(n):
        out = f"h{i}"
        if aten:
            nodes.append(helper.make_node("ATen", [prev, "dim"], [out], domain=ATEN_DOMAIN, operator="logcumsumexp",
                                          overload_name=""))
        else:
            nodes.append(helper.make_node("Abs", [prev], [out]))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.array(0, np.int64), "dim")] if aten else [],
                              value_info=[helper.make_tensor_value_info(f"h{i}", TensorProto.FLOAT, None) for i in range(n - 1)])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(ATEN_DOMAIN, 1)] if aten else [])
    return helper.make_model(graph, opset_imports=opsets)


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=200, threads=None)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--numel", type=int, default=16)
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    x = torch.rand(args.numel)
    aten = opforge.ort_session(chain_model(args.nodes, True), ort_options(1), register_opforge=False,
                               register_aten=True)
    native = cpu_session(chain_model(args.nodes, False), 1)
    feeds = {"x": x.numpy()}

    def eager():
        y = x
        for _ in range(args.nodes):
            y = torch.logcumsumexp(y, 0)
        return y

    np.testing.assert_allclose(aten.run(None, feeds)[0], eager().numpy(), rtol=1e-5)
    with torch.inference_mode():
        ms = round_robin({"eager": eager, "aten": lambda: aten.run(None, feeds),
                          "native": lambda: native.run(None, feeds)}, args.repeats, warmup=5)
    t_eager, t_aten, t_native = (ms[k] / 1e3 for k in ("eager", "aten", "native"))
    n = args.nodes
    r = {
        "nodes": n, "numel": args.numel,
        "ort_aten_us_per_node": t_aten / n * 1e6,
        "eager_torch_us_per_call": t_eager / n * 1e6,
        "ort_native_abs_us_per_node": t_native / n * 1e6,
        "overhead_us_per_node": (t_aten - t_eager) / n * 1e6,
    }

    def table(r):
        print(f"ATen fallback per-node cost, chain of {n} logcumsumexp nodes on {args.numel} floats, 1 thread (medians)")
        for label, key, unit in ROWS:
            print(f"  {label:<33} {r[key]:7.2f} {unit}")

    return report(r, args.json, table)


if __name__ == "__main__":
    main()
