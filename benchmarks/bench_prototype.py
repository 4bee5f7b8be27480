"""What a prototype op costs per call: the same op as a prototype (spec + numpy kernel) and
compiled, measured side by side in one run.

    python benchmarks/bench_prototype.py [--sizes 1 4096 1048576] [--threads 2] [--repeats 50] [--json]

The op is my_add (2*a + b). The compiled one is opforge's own ``opforge::my_add`` (C++ core,
libopforge_ort); the prototype is the same spec re-registered under another namespace/domain with
a numpy kernel. For each size (float32 elements):

torch (eager):   prototype torch.ops.bench_proto.my_add   vs  compiled torch.ops.opforge.my_add
ONNX Runtime:    prototype node (onnxruntime-extensions Python op, through opforge's hook)
                 vs  the same Python op as a plain ``onnx_op`` (ortx's own call path)
                 vs  compiled opforge::my_add node

Candidates run round-robin (one call each per round); medians. Never used to gate CI.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

import opforge
from timing import bench_parser, ort_options, report, round_robin

PROTO_NS, PROTO_DOMAIN = "bench_proto", "com.example.bench_proto"
PLAIN_OP = "BenchPlainMyAdd"  # ai.onnx.contrib, registered with onnxruntime_extensions.onnx_op


def _my_add_kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 2 * a + b


def register_prototype_my_add():
    """opforge's my_add spec, as a prototype in another namespace and domain."""
    compiled = opforge.spec.find("opforge::my_add")
    spec = dataclasses.replace(compiled, namespace=PROTO_NS, domain=PROTO_DOMAIN, torch_aliases=(), helper_ops=(),
                               onnx_types=("tensor(float)", "tensor(double)"), standard_torchscript=None,
                               standard_dynamo=None, standard_from_opset=None)
    return opforge.register_prototype(spec, impl=_my_add_kernel)


def register_plain_onnx_op():
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    dt = PyCustomOpDef.dt_float
    onnx_op(op_type=PLAIN_OP, inputs=[dt, dt], outputs=[dt])(_my_add_kernel)


def graph(op_type: str, domain: str) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N"]) for n in ("A", "B")]
    g = helper.make_graph([helper.make_node(op_type, ["A", "B"], ["C"], domain=domain)], "bench", inputs,
                          [helper.make_tensor_value_info("C", TensorProto.FLOAT, ["N"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)])


def table(results: dict) -> None:
    rows = results["rows"]
    print(f"my_add as a prototype (numpy kernel) vs compiled, float32, {results['threads']} threads, medians (us per call)")
    names = list(rows[0]["us"])
    print(f"  {'elements':>9} " + " ".join(f"{k:>18}" for k in names) + "  proto/compiled torch, ORT")
    for r in rows:
        print(f"  {r['numel']:>9} " + " ".join(f"{r['us'][k]:>18.1f}" for k in names) +
              f"  {r['torch_prototype_vs_compiled']:6.1f}x, {r['ort_prototype_vs_compiled']:6.1f}x")


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=50)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4096, 1024 * 1024])
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    proto_op = register_prototype_my_add()
    register_plain_onnx_op()

    sessions = {
        "ORT prototype": opforge.ort_session(graph("my_add", PROTO_DOMAIN), ort_options(args.threads)),
        "ORT plain onnx_op": opforge.ort_session(graph(PLAIN_OP, "ai.onnx.contrib"), ort_options(args.threads)),
        "ORT compiled": opforge.ort_session(graph("my_add", opforge.spec.DOMAIN), ort_options(args.threads)),
    }
    rows = []
    for n in args.sizes:
        a, b = torch.randn(n), torch.randn(n)
        want = 2 * a + b
        torch.testing.assert_close(proto_op(a, b), want)
        torch.testing.assert_close(opforge.my_add(a, b), want)
        feeds = {"A": a.numpy(), "B": b.numpy()}
        for s in sessions.values():
            np.testing.assert_allclose(s.run(None, feeds)[0], want.numpy(), rtol=1e-6)
        repeats = max(3, args.repeats if n <= 65536 else args.repeats // 5)
        torch_ms = round_robin({"torch prototype": lambda: proto_op(a, b),
                                "torch compiled": lambda: opforge.my_add(a, b)}, repeats)
        ort_ms = round_robin({name: (lambda s=s: s.run(None, feeds)) for name, s in sessions.items()}, repeats)
        rows.append({
            "numel": n,
            "us": {k: v * 1e3 for k, v in {**torch_ms, **ort_ms}.items()},
            "torch_prototype_vs_compiled": torch_ms["torch prototype"] / torch_ms["torch compiled"],
            "ort_prototype_vs_compiled": ort_ms["ORT prototype"] / ort_ms["ORT compiled"],
            "ort_plain_onnx_op_vs_prototype": ort_ms["ORT plain onnx_op"] / ort_ms["ORT prototype"],
        })
    return report({"threads": args.threads, "op": "my_add (2a+b), float32", "rows": rows}, args.json, table)


if __name__ == "__main__":
    main()
