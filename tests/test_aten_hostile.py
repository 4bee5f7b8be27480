"""The held-out set of issue #43: about forty hand-written hostile one-node ATen models, each of a
kind a model file could use against libopforge_aten (read process memory, return uninitialised
memory, crash the process, demand gigabytes or hours from a few bytes, reach what the policy
should not). Each runs through both ways users run such a model: (a) ``opforge.ort_session(model)``
and (b) plain onnxruntime with the library registered. Each must end in a clean error naming the
op -- no signal, no timeout (60 s), peak RSS under 1.5 GB -- except where a defined result is the
right answer (INT64_MIN % -1 is 0, say): then the result must be that value, the same in two runs
under different malloc perturbation.

The models run one after another in a child process (forked from one that has imported torch:
tests/preloaded_python.py), each under its own memory cap and alarm. A crash or a hang ends the
child and fails that model's test; the models after it go on in a new child, and so do those after
a model that lifted the peak RSS past the limit (so each model's peak is its own). One child for
the set, not one per model: the models themselves take ~2 s, and each child ~0.6 s to start
(opforge and onnxruntime imported).

OPFORGE_ATEN_LIBRARY=/path/libopforge_aten.so tests another build of the library (both paths).

The child side: ``python tests/test_aten_hostile.py [--library PATH] <model id> ...`` prints, per
model, ``{"start": id}``, one JSON line per path and ``{"model": id, "peak_rss": ...}``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIBRARY = os.environ.get("OPFORGE_ATEN_LIBRARY")
ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
TIMEOUT = 180 if ASAN else 60
PEAK_RSS_LIMIT = 1.5e9
ATEN = "org.pytorch.aten"
NONE = "opforge_aten_none"  # opforge.aten.nodes.NONE_INPUT
INT64_MIN = -(2**63)
F32, F64, I64, BOOL = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL


# ---- building one-node models ------------------------------------------------------------

class Feed:
    """A graph input fed at run time (a tensor the attacker controls per run)."""

    def __init__(self, array):
        self.array = np.asarray(array)


def S(text: str):
    """A string argument (a 1-element string tensor)."""
    return ("str", text)


def aten(operator, overload, args, outputs, output_names=None):
    """One ATen node: ``args`` in schema order -- Feed (graph input), None (absent: the None
    marker in the middle, left out at the end), S("...") (string), or a value (a constant input:
    Python int / float / bool / list, or a numpy array). ``outputs``: ONNX types of the returns."""
    while args and args[-1] is None:
        args = args[:-1]
    inputs, inits, names, feeds = [], [], [], {}
    for i, a in enumerate(args):
        if a is None:
            names.append(NONE)
            if not any(t.name == NONE for t in inits):
                inits.append(helper.make_tensor(NONE, I64, [0], []))
        elif isinstance(a, Feed):
            name = f"x{i}"
            types = {np.dtype(np.float32): F32, np.dtype(np.float64): F64, np.dtype(np.int64): I64,
                     np.dtype(np.bool_): BOOL}
            inputs.append(helper.make_tensor_value_info(name, types[a.array.dtype], list(a.array.shape)))
            feeds[name] = a.array
            names.append(name)
        else:
            name = f"c{i}"
            if isinstance(a, tuple) and a[0] == "str":
                inits.append(helper.make_tensor(name, TensorProto.STRING, [], [a[1].encode()]))
            else:
                if isinstance(a, bool):
                    arr = np.array(a)
                elif isinstance(a, int):
                    arr = np.array(a, np.int64)
                elif isinstance(a, float):
                    arr = np.array(a, np.float64)
                elif isinstance(a, list):
                    arr = np.array(a, np.float64 if any(isinstance(v, float) for v in a) else np.int64)
                else:
                    arr = np.asarray(a)
                inits.append(numpy_helper.from_array(arr, name))
            names.append(name)
    outs = output_names or [f"y{k}" for k in range(len(outputs))]
    node = helper.make_node("ATen", names, outs, domain=ATEN, operator=operator, overload_name=overload)
    graph = helper.make_graph([node], "hostile", inputs,
                              [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, outputs) if o],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ATEN, 1)],
                              ir_version=9)
    return model, feeds


def f32(*shape, fill=None, seed=0):
    if fill is not None:
        return np.full(shape, fill, np.float32)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def i64(*values, shape=None):
    a = np.array(values, np.int64)
    return a.reshape(shape) if shape is not None else a


def _no_operator():
    node = helper.make_node("ATen", ["x"], ["y"], domain=ATEN, overload_name="")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F32, [2, 3])],
                              [helper.make_tensor_value_info("y", F32, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ATEN, 1)],
                             ir_version=9), {"x": f32(2, 3)}


def _from_file_in_function():
    consts = [helper.make_node("Constant", [], ["fname"],
                               value=helper.make_tensor("v", TensorProto.STRING, [], [b"/etc/passwd"])),
              helper.make_node("Constant", [], ["none"], value=helper.make_tensor("v", I64, [0], [])),
              helper.make_node("Constant", [], ["size"], value=helper.make_tensor("v", I64, [], [16]))]
    inner = helper.make_node("ATen", ["fname", "none", "size"], ["y"], domain=ATEN, operator="from_file",
                             overload_name="")
    fn = helper.make_function("local", "Reader", [], ["y"], consts + [inner],
                              [helper.make_opsetid("", 17), helper.make_opsetid(ATEN, 1)])
    graph = helper.make_graph([helper.make_node("Reader", [], ["y"], domain="local")], "g", [],
                              [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ATEN, 1),
                                                    helper.make_opsetid("local", 1)], ir_version=9)
    model.functions.append(fn)
    return model, {}


def _grid2d(mode, pad):
    return aten("grid_sampler_2d", "", [Feed(f32(1, 2, 4, 4)), Feed(f32(1, 3, 3, 2, fill=0.25)), mode, pad, False],
                [F32])


def _pool2d_backward(index, plane=(4, 4)):
    h, w = plane
    oh, ow = h // 2, w // 2
    return aten("max_pool2d_with_indices_backward", "",
                [Feed(f32(1, 1, oh, ow)), Feed(f32(1, 1, h, w)), [2, 2], [2, 2], [0, 0], [1, 1], False,
                 Feed(np.full((1, 1, oh, ow), index, np.int64))], [F32])


def _int_div(operator, overload, mode=None):
    args = [Feed(i64(INT64_MIN, 7)), Feed(i64(-1, 2))] + ([S(mode)] if mode else [])
    return aten(operator, overload, args, [I64])


#: id -> (issue finding, builder () -> (model, feeds), the op the error must name,
#:        the right result where one is defined (outputs as lists), or None: it must be an error)
MODELS = {
    # 1. reading process memory
    "segment_reduce-offsets-past-end": (
        "1", lambda: aten("segment_reduce", "", [Feed(f32(6)), S("sum"), None, None, Feed(i64(0, 2, 64)), 0, True],
                          [F32]), "segment_reduce", None),
    "segment_reduce-offsets-2**40": (
        "1/3", lambda: aten("segment_reduce", "", [Feed(f32(6)), S("sum"), None, None, Feed(i64(0, 2**40)), 0, True],
                            [F32]), "segment_reduce", None),
    "segment_reduce-lengths-past-end": (
        "1", lambda: aten("segment_reduce", "", [Feed(f32(6)), S("sum"), Feed(i64(2, 40)), None, None, 0, True],
                          [F32]), "segment_reduce", None),
    "unfold_backward-window-larger-than-grad": (
        "1", lambda: aten("unfold_backward", "", [Feed(f32(4, 2)), [5], 0, 10, 1], [F32]), "unfold_backward", None),
    "unfold_backward-sizes-past-grad": (
        "1", lambda: aten("unfold_backward", "", [Feed(f32(4, 2)), [64], 0, 2, 1], [F32]), "unfold_backward", None),
    # 2. uninitialised memory
    "grid_sampler_2d-interpolation-3": ("2", lambda: _grid2d(3, 0), "grid_sampler_2d", None),
    "grid_sampler_2d-padding-7": ("2", lambda: _grid2d(0, 7), "grid_sampler_2d", None),
    "grid_sampler_3d-interpolation-3": (
        "2", lambda: aten("grid_sampler_3d", "", [Feed(f32(1, 2, 4, 4, 4)), Feed(f32(1, 2, 2, 2, 3, fill=0.25)), 3, 0,
                                                  False], [F32]), "grid_sampler_3d", None),
    "grid_sampler-padding-7": (
        "2", lambda: aten("grid_sampler", "", [Feed(f32(1, 2, 4, 4)), Feed(f32(1, 3, 3, 2, fill=0.25)), 0, 7, False],
                          [F32]), "grid_sampler", None),
    "grid_sampler_2d_backward-interpolation-3": (
        "2", lambda: aten("grid_sampler_2d_backward", "", [Feed(f32(1, 2, 3, 3)), Feed(f32(1, 2, 4, 4)),
                                                           Feed(f32(1, 3, 3, 2, fill=0.25)), 3, 0, False,
                                                           np.array([True, True])], [F32, F32]),
        "grid_sampler_2d_backward", None),
    # 3. crashes
    "max_pool2d_with_indices_backward-index-2**33": (
        "3", lambda: _pool2d_backward(2**33), "max_pool2d_with_indices_backward", None),
    "max_pool2d_with_indices_backward-index-6-of-4": (
        "3", lambda: _pool2d_backward(6, plane=(2, 2)), "max_pool2d_with_indices_backward", None),
    "max_pool3d_with_indices_backward-index-2**33": (
        "3", lambda: aten("max_pool3d_with_indices_backward", "",
                          [Feed(f32(1, 1, 1, 2, 2)), Feed(f32(1, 1, 2, 4, 4)), [2, 2, 2], [2, 2, 2], [0, 0, 0],
                           [1, 1, 1], False, Feed(np.full((1, 1, 1, 2, 2), 2**33, np.int64))], [F32]),
        "max_pool3d_with_indices_backward", None),
    "adaptive_max_pool2d_backward-index-2**33": (
        "3", lambda: aten("adaptive_max_pool2d_backward", "",
                          [Feed(f32(1, 1, 2, 2)), Feed(f32(1, 1, 4, 4)), Feed(np.full((1, 1, 2, 2), 2**33, np.int64))],
                          [F32]), "adaptive_max_pool2d_backward", None),
    "adaptive_max_pool3d_backward-index-6-of-4": (
        "3", lambda: aten("adaptive_max_pool3d_backward", "",
                          [Feed(f32(1, 1, 1, 1, 1)), Feed(f32(1, 1, 1, 2, 2)), Feed(i64(6, shape=(1, 1, 1, 1, 1)))],
                          [F32]), "adaptive_max_pool3d_backward", None),
    "embedding_dense_backward-indices-2**40-scale_grad_by_freq": (
        "3", lambda: aten("embedding_dense_backward", "", [Feed(f32(3, 4)), Feed(i64(0, 2**40, 1)), 5, -1, True],
                          [F32]), "embedding_dense_backward", None),
    "ctc_loss-targets-out-of-range": (
        "3", lambda: aten("ctc_loss", "IntList", [Feed(np.log(np.full((5, 1, 4), 0.25, np.float32))),
                                                  Feed(i64(7, 2**40, shape=(1, 2))), [5], [2]], [F32]),
        "ctc_loss", None),
    "div-trunc-INT64_MIN-by-minus-1": (
        "3", lambda: _int_div("div", "Tensor_mode", "trunc"), "div", [[INT64_MIN, 3]]),
    "div-floor-INT64_MIN-by-minus-1": (
        "3", lambda: _int_div("div", "Tensor_mode", "floor"), "div", [[INT64_MIN, 3]]),
    "remainder-INT64_MIN-by-minus-1": ("3", lambda: _int_div("remainder", "Tensor"), "remainder", [[0, 1]]),
    "fmod-INT64_MIN-by-minus-1": ("3", lambda: _int_div("fmod", "Tensor"), "fmod", [[0, 1]]),
    "floor_divide-INT64_MIN-by-minus-1": ("3", lambda: _int_div("floor_divide", ""), "floor_divide",
                                          [[INT64_MIN, 3]]),
    # 4. an omitted first output
    "max.dim-empty-first-output": (
        "4", lambda: aten("max", "dim", [Feed(np.arange(6, dtype=np.float32).reshape(2, 3)), 1], [F32, I64],
                          output_names=["", "z"]), "max", [[2, 2]]),
    # 5. gigabytes from a few bytes
    "eye-25000": ("5", lambda: aten("eye", "", [25000], [F32]), "eye", None),
    "one_hot-minus-1-of-3e8": ("5", lambda: aten("one_hot", "", [Feed(i64(300_000_000)), -1], [I64]), "one_hot",
                               None),
    "bincount-3e8": ("5", lambda: aten("bincount", "", [Feed(i64(300_000_000))], [I64]), "bincount", None),
    "repeat_interleave-3e8": ("5", lambda: aten("repeat_interleave", "Tensor", [Feed(i64(300_000_000))], [I64]),
                              "repeat_interleave", None),
    "select_backward-sizes-6e8": (
        "5", lambda: aten("select_backward", "", [Feed(f32()), [600_000_000], 0, 0], [F32]), "select_backward", None),
    "index_select_backward-sizes-6e8": (
        "5", lambda: aten("index_select_backward", "", [Feed(f32(1)), [600_000_000], 0, Feed(i64(0))], [F32]),
        "index_select_backward", None),
    "embedding_dense_backward-num_weights-6e8": (
        "5", lambda: aten("embedding_dense_backward", "", [Feed(f32(1, 1)), Feed(i64(0)), 600_000_000, -1, False],
                          [F32]), "embedding_dense_backward", None),
    "constant_pad_nd-big-pads": (
        "5", lambda: aten("constant_pad_nd", "", [Feed(f32(1, 1)), [30000, 0, 30000, 0]], [F32]), "constant_pad_nd",
        None),
    "conv2d-padding-10000": (
        "5", lambda: aten("conv2d", "", [Feed(f32(1, 1, 1, 1)), Feed(f32(1, 1, 1, 1)), None, [1, 1], [10000, 10000]],
                          [F32]), "conv2d", None),
    "upsample_nearest2d-8192x8192": (
        "5", lambda: aten("upsample_nearest2d", "", [Feed(np.ones((1, 2, 1, 1), np.float64)), [8192, 8192]], [F64]),
        "upsample_nearest2d", None),
    "kron-25000x25000": ("5", lambda: aten("kron", "", [Feed(f32(25000)), Feed(f32(25000, seed=1))], [F32]), "kron",
                         None),
    "add-broadcast-25000x25000": (
        "5", lambda: aten("add", "Tensor", [Feed(f32(25000, 1)), Feed(f32(1, 25000, seed=1))], [F32]), "add", None),
    "pdist-30000": ("5", lambda: aten("pdist", "", [Feed(np.linspace(0, 1, 30000).reshape(30000, 1))], [F64]),
                    "pdist", None),
    "vander-N-6e7": ("5", lambda: aten("vander", "", [Feed(np.array([1.0, 2.0])), 60_000_000], [F64]), "vander",
                     None),
    "mvlgamma-p-3e8": ("5", lambda: aten("mvlgamma", "", [Feed(np.array([2.0], np.float32)), 300_000_000], [F32]),
                       "mvlgamma", None),
    # 6. hours
    "choose_qparams_optimized-n_bins-2**40": (
        "6", lambda: aten("choose_qparams_optimized", "", [Feed(f32(8)), 8, 2**40, 0.16, 8], [F32, F32]),
        "choose_qparams_optimized", None),
    "matrix_power-INT64_MIN": (
        "6", lambda: aten("matrix_power", "", [Feed(np.array([[2.0]], np.float32)), INT64_MIN], [F32]), "matrix_power",
        [[[0.0]]]),  # 2^(-2^63) is 0 in float32
    # 7. what the policy should not reach
    "zeros-sparse-layout": ("7", lambda: aten("zeros", "", [[2, 3], None, 1], [F32]), "zeros", None),
    "node-without-operator": ("7", _no_operator, "ATen", None),
    "from_file-in-a-model-local-function": ("7", _from_file_in_function, "from_file", None),
}
#: models whose path (a) must be refused by opforge's own Python check (AtenOpRefused), before ORT
PYTHON_REFUSES = {"from_file-in-a-model-local-function"}
MEMORY = ("can't allocate memory", "bad_alloc", "Cannot allocate memory", "MemoryError", "out of memory",
          "Failed to allocate", "Unable to allocate")


# ---- the child: both paths, one model ------------------------------------------------------

#: the child's exit status after a model that lifted its peak RSS past the limit
PAST_THE_RSS_LIMIT = 3


def child(model_ids: list, library=None) -> int:
    sys.path.insert(0, str(HERE))
    from aten_fuzzing.process import peak_rss
    from aten_fuzzing.sessions import Runtime

    rt = Runtime(library)
    for model_id in model_ids:
        _run_model(model_id, rt)
        peak = peak_rss()
        print(json.dumps({"model": model_id, "peak_rss": peak}), flush=True)
        if not ASAN and peak >= PEAK_RSS_LIMIT:
            return PAST_THE_RSS_LIMIT  # the next model starts in a fresh process, with its own peak
    return 0


def _run_model(model_id: str, rt) -> None:
    import warnings

    from aten_fuzzing.process import cap_memory, peak_rss
    from aten_fuzzing.sessions import outputs_equal

    limit = cap_memory()  # (this process's size now + 1.5 GiB)
    _, build, _, _ = MODELS[model_id]
    print(json.dumps({"start": model_id, "cap": limit, "rss": peak_rss()}), flush=True)
    signal.alarm(TIMEOUT)  # a hang: SIGALRM ends the process
    for path in "ab":
        model, feeds = build()
        print(json.dumps({"path": path, "started": True}), flush=True)
        out = {"path": path}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if path == "a":
                    import opforge

                    sess = opforge.ort_session(model.SerializeToString())
                else:
                    import onnxruntime as ort

                    so = ort.SessionOptions()
                    so.register_custom_ops_library(rt.library)
                    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
                runs = rt.run_twice(sess, feeds)
            out.update(outcome="result", same=outputs_equal(runs[0], runs[1]),
                       result=[np.asarray(r).tolist() if np.asarray(r).size <= 16 else f"{np.asarray(r).shape}"
                               for r in runs[0]])
        except Exception as e:  # noqa: BLE001 - reported
            out.update(outcome="error", type=type(e).__name__, message=str(e)[:2000],
                       refused_by_python=type(e).__name__ == "AtenOpRefused")
        print(json.dumps(out), flush=True)
    signal.alarm(0)


# ---- the tests -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _children() -> dict:
    """model id -> (exit status of the child while it ran the model: 0 once it finished, -N for a
    signal, None for a hang; its output lines; the child's stderr), for every model: children run
    the models in order, a new one after each that ended early."""
    from preloaded_python import run_python

    results, pending = {}, list(MODELS)
    while pending:
        args = [str(Path(__file__)), *(["--library", LIBRARY] if LIBRARY else []), *pending]
        try:
            proc = run_python(args, timeout=TIMEOUT * len(pending) + 60, cwd=ROOT, text=False)
            rc, out, err = proc.returncode, proc.stdout.decode(), proc.stderr.decode()
        except subprocess.TimeoutExpired as e:  # (the models' alarms should have ended it first)
            rc, out, err = None, (e.stdout or b"").decode(), (e.stderr or b"").decode()
        current = None
        for line in out.splitlines():
            if line.startswith("{"):
                data = json.loads(line)
                current = data.get("start", current)
                results.setdefault(current, (0, [], err))[1].append(line)
                if "peak_rss" in data:
                    pending.remove(current)
                    current = None
        if current is not None:  # the model the child was running when it ended
            results[current] = (None if rc == -signal.SIGALRM else rc, results[current][1], err)
            pending.remove(current)
        elif rc != PAST_THE_RSS_LIMIT and pending:  # ended between two models: say so for the rest
            results.update({m: (rc, [], err) for m in pending})
            break
    return {m: (rc, "\n".join(lines), err) for m, (rc, lines, err) in results.items()}


def _run_child(model_id):
    return _children()[model_id]


def _same(got, want) -> bool:
    if not isinstance(got, list) or len(got) < len(want):
        return False
    return all(np.array_equal(np.asarray(g, dtype=np.float64 if isinstance(w, float) else None), np.asarray(w))
               for g, w in zip(got[-len(want):], want))


@pytest.mark.xdist_group("aten-hostile")  # one worker runs the children
@pytest.mark.parametrize("model_id", list(MODELS), ids=[f"{v[0]}-{k}" for k, v in MODELS.items()])
def test_hostile_model_ends_in_a_clean_error(model_id):
    finding, _, op, right = MODELS[model_id]
    rc, out, err = _run_child(model_id)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    started = [d["path"] for d in lines if d.get("started")]
    where = f"path ({started[-1]})" if started else "before either path"
    tail = "\n".join(err.strip().splitlines()[-6:])
    assert rc is not None, f"{model_id}: no answer in {TIMEOUT} s ({where}); stderr:\n{tail}"
    assert rc >= 0, f"{model_id}: killed by signal {-rc} in {where}; stderr:\n{tail}"
    assert rc == 0, f"{model_id}: exit status {rc} in {where}; stderr:\n{tail}"
    peak = max([d["peak_rss"] for d in lines if "peak_rss" in d] or [0])
    if not ASAN:
        assert peak < PEAK_RSS_LIMIT, f"{model_id}: peak RSS {peak / 1e6:.0f} MB (limit {PEAK_RSS_LIMIT / 1e6:.0f} MB)"
    results = {d["path"]: d for d in lines if "outcome" in d}
    assert set(results) == {"a", "b"}, f"{model_id}: paths that finished: {sorted(results)}\n{out[-2000:]}"
    for path, r in sorted(results.items()):
        label = f"{model_id}, path ({path}: {'opforge.ort_session' if path == 'a' else 'plain onnxruntime'})"
        if r["outcome"] == "result":
            assert right is not None, f"{label}: returned {r['result']} instead of an error"
            assert r["same"], f"{label}: two runs gave different bytes (uninitialised memory): {r['result']}"
            assert _same(r["result"], right), f"{label}: returned {r['result']}, the right answer is {right}"
            continue
        text = f"{r['type']}: {r['message']}"
        assert not any(m in text for m in MEMORY), f"{label}: ran out of memory instead of refusing: {text[:600]}"
        assert r["type"] not in ("KeyError", "AttributeError", "IndexError", "TypeError"), \
            f"{label}: a Python {r['type']}, not an error of opforge or the library: {text[:600]}"
        assert f"aten::{op}" in text or (op == "ATen" and "ATen" in text and "operator" in text), \
            f"{label}: the error does not name aten::{op}: {text[:600]}"
        if path == "a" and model_id in PYTHON_REFUSES:
            assert r["refused_by_python"], f"{label}: opforge's own check did not refuse it: {text[:600]}"


def test_the_set_covers_every_finding():
    findings = {f for f, *_ in MODELS.values() for f in f.split("/")}
    assert findings == {"1", "2", "3", "4", "5", "6", "7"}
    assert len(MODELS) >= 40


if __name__ == "__main__":
    argv = sys.argv[1:]
    lib = None
    if "--library" in argv:
        k = argv.index("--library")
        lib = argv[k + 1]
        del argv[k:k + 2]
    sys.exit(child(argv, lib))
