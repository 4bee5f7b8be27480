"""Concurrency and leaks (issue #10): one ORT session shared by 8 threads must give every thread
torch's answer, and creating / running / destroying sessions in a loop must not grow memory."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import torch

import opforge
from opforge.spec import find
from opforge.testing import single_node_model

from helpers import deform_inputs


def test_one_session_many_threads_agree_with_torch():
    spec = find("deform_conv2d")
    cases = []
    for seed in range(8):
        x, w, off, mask, bias = deform_inputs(n=2, c=6, o=4, h=9, w=8, dtype=torch.float32, seed=seed)
        values = [x, w, off, mask, bias, 1, 2, 1, 0, 1, 2, 2, 3, True]
        want = torch.ops.opforge.deform_conv2d(*values).numpy()
        cases.append(({a.onnx_name: v.numpy() for a, v in zip(spec.tensor_args, values[:5])}, want))
    sess = opforge.ort_session(single_node_model(spec, values), intra_op_num_threads=2)
    errors = []
    start = threading.Barrier(8)

    def worker(k):
        try:
            start.wait()
            for i in range(40):
                feeds, want = cases[(k + i) % len(cases)]
                got = sess.run(None, feeds)[0]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        except Exception as e:  # noqa: BLE001 (collected, asserted below)
            errors.append(f"thread {k}: {e}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[:3]


LEAK_SCRIPT = textwrap.dedent("""
    import gc, os, numpy as np, onnx, torch
    import opforge
    from onnx import TensorProto, helper
    from opforge.spec import find
    from opforge.spec import ATEN_DOMAIN
    from opforge.testing import single_node_model

    spec = find("deform_conv2d")
    x = torch.randn(1, 4, 6, 6); w = torch.randn(3, 4, 3, 3); off = torch.randn(1, 18, 4, 4)
    values = [x, w, off, torch.rand(1, 9, 4, 4), torch.randn(3), 1, 1, 0, 0, 1, 1, 1, 1, True]
    deform = single_node_model(spec, values).SerializeToString()
    feeds = {a.onnx_name: v.numpy() for a, v in zip(spec.tensor_args, values[:5])}
    add = single_node_model(find("my_add"), [x, x]).SerializeToString()
    node = helper.make_node("ATen", ["x"], ["y"], domain=ATEN_DOMAIN, operator="lgamma", overload_name="")
    aten = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ATEN_DOMAIN, 1)])
    aten = aten.SerializeToString()

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def cycle():
        opforge.ort_session(deform).run(None, feeds)
        opforge.ort_session(add).run(None, {"A": feeds["input"], "B": feeds["input"]})
        opforge.ort_session(aten).run(None, {"x": feeds["input"]})
        try:  # a failing run must not leak either
            opforge.ort_session(deform).run(None, dict(feeds, bias=np.zeros(2, np.float32)))
        except Exception:
            pass

    for _ in range(60):
        cycle()
    gc.collect()
    before = rss_mib()
    for _ in range(400):
        cycle()
    gc.collect()
    print(f"RSS {before:.1f} -> {rss_mib():.1f} MiB")
""")


def test_session_create_run_destroy_loop_does_not_grow_memory():
    out = subprocess.run([sys.executable, "-c", LEAK_SCRIPT], capture_output=True, text=True, timeout=600, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = map(float, out.stdout.split("RSS ")[1].split(" MiB")[0].split(" -> "))
    # 400 cycles x 4 sessions: a leak of even one small buffer per session shows as megabytes
    assert after - before < 24, out.stdout
