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

import argparse
import json

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

import opforge
from timing import round_robin
from opforge.aten.fallback import ATEN_DOMAIN


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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--numel", type=int, default=16)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    x = torch.rand(args.numel)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    aten = opforge.ort_session(chain_model(args.nodes, True), so, register_opforge=False, register_aten=True)
    so2 = ort.SessionOptions()
    so2.intra_op_num_threads = 1
    native = ort.InferenceSession(chain_model(args.nodes, False).SerializeToString(), so2, providers=["CPUExecutionProvider"])
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
    if args.json:
        print(json.dumps(r, indent=2))
        return r
    print(f"ATen fallback per-node cost, chain of {n} logcumsumexp nodes on {args.numel} floats, 1 thread (medians)")
    print(f"  ORT ATen node (libopforge_aten)   {r['ort_aten_us_per_node']:7.2f} us/node")
    print(f"  eager torch call                  {r['eager_torch_us_per_call']:7.2f} us/call")
    print(f"  ORT native Abs node (reference)   {r['ort_native_abs_us_per_node']:7.2f} us/node")
    print(f"  overhead vs eager torch           {r['overhead_us_per_node']:7.2f} us/node (target <= 20)")
    return r


if __name__ == "__main__":
    main()
