"""Random-input fuzzing of libopforge_mmdeploy.so: mmdeploy 1.3.1's five node forms in ONNX Runtime.

The same design as tests/fuzz.py (whose helpers it shares): one process runs one batch of cases
of one target and prints ``CASE <target> <seed> <index>: <description>`` (flushed) before each,
so when a case crashes or hangs the process, the parent (tests/test_fuzz_mmdeploy.py) names the
case. Case k of a seed comes from ``default_rng([seed, k])`` alone: ``--case k`` reruns exactly it.

Each case builds one node as mmdeploy writes it (onnx.helper, domain "mmdeploy" version 1, or
"mmcv" for DCN), its graph and its feeds, and runs it in plain onnxruntime with
``opforge.mmdeploy_library_path()`` registered (or through ``opforge.ort_session``). A case is

* *valid*: the node runs and agrees with an independent reference: torch's grid_sample (in the
  kernel's compute type, with the header's rules for NaN / inf / huge grid values substituted,
  opforge/csrc/core/grid_sample.h), torchvision's deform_conv2d, the numpy roi_align_rotated
  reference, the greedy nms_rotated replay of tests/fuzz.py per (image, class), the plain-Python
  nms_match of tests/test_mmdeploy_ops.py (exact rows);
* *invalid*: a hostile attribute (wrong type: INT / FLOAT / INTS / FLOATS / STRING / empty INTS;
  zero, negative, huge, out-of-range values; missing), a malformed node (inputs missing, extra,
  omitted; two outputs; a wrong output type), hostile shapes (ranks, mismatched dims, zero-size
  maps), dtypes (mixed, integer) or values (NaN scores, non-finite boxes and rois, roi batch
  indices of -1, N, 0.5, 1e30). It must fail with an ORT error: from our kernels, the message
  names the op ("mmdeploy::NMSMatch": session creation for node and attribute faults, a run
  for shapes and values) and says why where the case knows the words; or ORT's own type/schema
  check where ORT refuses before our code.

Nothing may crash the process (a child per batch in the tests catches it) or hang (a timeout).

    python tests/fuzz_mmdeploy.py --target mmdeploy:NMSMatch --seed 0 --first 0 --cases 200
    python tests/fuzz_mmdeploy.py --target all --cases 100           # every target in turn
    python tests/fuzz_mmdeploy.py --target mmdeploy:grid_sampler --case 17   # one case again
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from typing import Callable

import numpy as np
import torch

import opforge
from fuzz import (INT64_MAX, CaseFailure, announce, big, case_rng, command_line, compare,  # tests/ is sys.path[0]
                  deform_reference, nms_check, pick, rar_case, rar_grid_points, rar_reference, rar_unstable_bins,
                  run_batch, tallied, tolerance)

OPS = ("grid_sampler", "MMCVModulatedDeformConv2d", "MMCVRoIAlignRotated", "NMSRotated", "NMSMatch")
TARGETS = tuple(f"mmdeploy:{op}" for op in OPS)

FLOATS = [torch.float32] * 3 + [torch.float64, torch.float16, torch.bfloat16]
HUGE = 2**40  # a zero-size tensor may have a dim this large: no data, so nothing may be allocated for it


def onnx_type(dtype):
    from onnx import TensorProto

    return {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE, torch.float16: TensorProto.FLOAT16,
            torch.bfloat16: TensorProto.BFLOAT16, torch.int32: TensorProto.INT32,
            torch.int64: TensorProto.INT64}[dtype]


def short(dtype):
    return str(dtype)[6:]


@dataclasses.dataclass
class Case:
    op: str
    inputs: list  # the node's inputs: (name, torch dtype); name "" is an omitted input
    outputs: list  # (name, torch dtype)
    attrs: dict  # name -> (kind, value), kind one of int, float, ints, floats, string
    feeds: dict  # graph input name -> torch tensor
    invalid: str | None = None
    why: str | None = None  # a regex the error must match (invalid cases)
    stage: str | None = None  # where an invalid case must fail: "session" or "run" (None: either)
    edge: str = "none"
    check: Callable | None = None  # check(outputs) -> outcome suffix, for valid cases
    domain: str = "mmdeploy"
    front: str = "ort"  # "ort": InferenceSession with the library; "ort_session": opforge.ort_session
    node_name: str = ""
    notes: str = ""

    @property
    def qualified(self):
        return f"mmdeploy::{self.op}"  # every kernel message's prefix (the mmcv-domain DCN's too)

    def describe(self):
        def shape(name):
            t = self.feeds.get(name)
            return "-" if t is None else f"{short(t.dtype)}{list(t.shape)}"

        ins = ", ".join(f"{n or '<omitted>'}:{shape(n) if n else ''}" for n, _ in self.inputs)
        outs = ", ".join(f"{n}:{short(d)}" for n, d in self.outputs)
        attrs = ", ".join(f"{k}={v!r}{'' if kind in ('int', 'float') else '/' + kind}"
                          for k, (kind, v) in self.attrs.items())
        return (f"{self.domain}::{self.op} inputs=({ins}) outputs=({outs}) attrs=({attrs}) invalid={self.invalid} "
                f"edge={self.edge} front={self.front}" + (f" {self.notes}" if self.notes else ""))


# ---- model, session, run ---------------------------------------------------------------------------

_ATTR_KINDS = {"int": 2, "float": 1, "ints": 7, "floats": 6, "string": 3}  # onnx.AttributeProto types


def build_model(case: Case):
    from onnx import helper

    node = helper.make_node(case.op, [n for n, _ in case.inputs], [n for n, _ in case.outputs], domain=case.domain,
                            name=case.node_name)
    for key, (kind, value) in case.attrs.items():
        node.attribute.append(helper.make_attribute(key, value, attr_type=_ATTR_KINDS[kind]))
    seen, graph_inputs = set(), []
    for name, dtype in case.inputs:
        if name and name not in seen:
            seen.add(name)
            graph_inputs.append(helper.make_tensor_value_info(name, onnx_type(dtype), None))
    graph = helper.make_graph([node], case.op, graph_inputs,
                              [helper.make_tensor_value_info(n, onnx_type(d), None) for n, d in case.outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid(case.domain, 1)],
                             ir_version=8)


def make_session(model, front):
    import onnxruntime

    if front == "ort_session":
        return opforge.ort_session(model)
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 4
    so.register_custom_ops_library(opforge.mmdeploy_library_path())
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


class Rejected(Exception):
    def __init__(self, stage, exc):
        super().__init__(str(exc))
        self.stage, self.exc = stage, exc


def run_case_in_ort(case: Case):
    from opforge.testing.support import _ort_run

    try:
        sess = make_session(build_model(case), case.front)
    except Exception as e:  # noqa: BLE001 (judged by the caller)
        raise Rejected("session", e) from e
    try:
        return _ort_run(sess, case.feeds)
    except Exception as e:  # noqa: BLE001
        raise Rejected("run", e) from e


# Where a message comes from: our kernels' messages reach Python inside one of these frames; ORT's
# own type, schema and feed checks (which refuse before any kernel is made or run) say one of those.
KERNEL_FRAMES = ("Exception during initialization", "Status Message:")
ORT_OWN = re.compile(r"Type Error|no kernel def matches|has (input|output) size \d+ not in range|"
                     r"Unexpected input data type|Invalid rank for input|Got invalid dimensions|Required inputs")


def judge_rejection(case: Case, rejected: Rejected):
    msg = str(rejected.exc)
    if case.invalid is None:
        raise CaseFailure(f"valid case failed at {rejected.stage}: {type(rejected.exc).__name__}: {msg[:600]}")
    if any(f in msg for f in KERNEL_FRAMES):
        who = "kernel"
        if case.qualified not in msg:
            raise CaseFailure(f"kernel error does not name {case.qualified}: {msg[:600]}")
    elif ORT_OWN.search(msg):
        who = "ort"
    else:
        raise CaseFailure(f"error is neither a kernel's (naming {case.qualified}) nor ORT's own check: {msg[:600]}")
    if case.why and not re.search(case.why, msg):
        raise CaseFailure(f"error does not say why ({case.why!r}) at {rejected.stage}: {msg[:600]}")
    if case.stage and rejected.stage != case.stage:
        raise CaseFailure(f"refused at {rejected.stage}, not at {case.stage}: {msg[:600]}")
    return f"rejected at {rejected.stage} ({who})"


def node_fault(rng, case: Case, names, omit_ok=True):
    """Turns case's node into a malformed one (inputs missing, extra or omitted; two outputs; a wrong
    output type). Returns the fault's name."""
    arity = len(names)
    faults = ["inputs_fewer", "inputs_more", "outputs_2", "out_type"] + (["omitted"] if omit_ok else [])
    fault = pick(rng, faults)
    op = re.escape(case.op)
    if fault == "inputs_fewer":
        keep = int(rng.integers(0, arity))
        case.inputs = case.inputs[:keep]
        case.feeds = {n: case.feeds[n] for n, _ in case.inputs}
        # (no inputs: ORT may first refuse the output's type, which it can no longer infer)
        case.why = rf"{op}: the node has {keep} input\(s\)|Required inputs|not in range|Type Error"
        case.stage = "session"
    elif fault == "inputs_more":
        extra = [(f"extra{i}", case.inputs[0][1]) for i in range(int(rng.integers(1, 3)))]
        case.inputs = case.inputs + extra
        for name, dtype in extra:
            case.feeds[name] = torch.zeros(2, dtype=dtype)
        case.why, case.stage = rf"{op}: the node has \d+ input\(s\)|has input size \d+ not in range", "session"
    elif fault == "omitted":
        k = int(rng.integers(arity))
        name = case.inputs[k][0]
        case.inputs = [("", d) if i == k else (n, d) for i, (n, d) in enumerate(case.inputs)]
        case.feeds.pop(name, None)
        case.why, case.stage = rf"input {k} \({names[k]}\) is omitted", "session"
    elif fault == "outputs_2":
        case.outputs = case.outputs + [("second", case.outputs[0][1])]
        case.why, case.stage = r"output\(s\); expected 1|has output size 2 not in range|outputs; expected 1", "session"
    else:
        dtype = case.outputs[0][1]
        case.outputs = [(case.outputs[0][0], torch.int32 if dtype != torch.int32 else torch.float32)]
        case.why, case.stage = "Type Error", "session"
    return fault


# Hostile attribute values of the wrong type for an attribute whose right kind is `kind`. The
# kernels read INT, FLOAT and INTS; a STRING, a FLOATS list or an empty INTS list is no more
# the attribute than a FLOAT is, and must be refused, not taken for "absent".
def wrong_kind(rng, kind):
    options = {"int": [("float", 1.0), ("ints", [1, 1]), ("floats", [1.0]), ("string", "1"), ("ints", [])],
               "float": [("int", 1), ("ints", [0]), ("floats", [0.5]), ("string", "0.5")],
               "pair": [("float", 1.0), ("floats", [1.0, 1.0]), ("string", "1"), ("ints", []), ("ints", [1, 1, 1])]}
    return pick(rng, options[kind])


# ---- grid_sampler ------------------------------------------------------------------------------------

GS_INVALID = ["interp_range", "padding_range", "align_range", "attr_type", "node", "input_rank", "grid_rank",
              "grid_last", "batch_mismatch", "empty_map", "dtype_mismatch", "int_dtype"]
GS_EDGES = ["none"] * 4 + ["absent_attrs", "empty_batch", "no_channels", "empty_out", "empty_map_no_out", "unit_map",
                           "grid_points", "nan_grid", "inf_grid", "huge_grid", "neg_zero", "denormal",
                           "nonfinite_input", "big_output", "many_channels", "huge_empty"]
GS_MODES = ["bilinear", "nearest", "bicubic"]
GS_PADDINGS = ["zeros", "border", "reflection"]


def grid_sampler_case(rng):
    dtype = pick(rng, FLOATS)
    interp, padding, align = int(rng.integers(3)), int(rng.integers(3)), int(rng.integers(2))
    n, c = int(rng.integers(1, 3)), int(rng.integers(1, 5))
    h, w = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    ho, wo = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    invalid = pick(rng, GS_INVALID) if rng.random() < 0.35 else None
    edge = pick(rng, GS_EDGES) if invalid is None else "none"
    if edge == "empty_batch":
        n = 0
    elif edge == "no_channels":
        c = 0
    elif edge == "empty_out":
        ho, wo = pick(rng, [(0, wo), (ho, 0), (0, 0)])
    elif edge == "empty_map_no_out":
        h, w, ho = pick(rng, [0, h]), pick(rng, [0, w]), 0
        h = 0 if h and w else h
    elif edge == "unit_map":
        h, w = pick(rng, [(1, w), (h, 1), (1, 1)])
    elif edge == "big_output":  # several pixel blocks (1024 / 2048 / 256 per mode) and a partial one
        ho, wo, c = int(rng.integers(30, 70)), int(rng.integers(30, 70)), int(rng.integers(1, 3))
    elif edge == "many_channels":  # channel blocks and the 4-channel unroll's remainder
        c, n = int(rng.integers(5, 18)), 1
    ishape, gshape = [n, c, h, w], [n, ho, wo, 2]
    if edge == "huge_empty":
        ishape, gshape = pick(rng, [([HUGE, c, 0, w], [HUGE, 0, wo, 2]), ([n, HUGE, 0, w], [n, 0, wo, 2]),
                                    ([n, HUGE, h, 0], [n, ho, 0, 2]), ([0, c, h, w], [0, HUGE, wo, 2]),
                                    ([n, 0, h, w], [n, HUGE, 0, 2]), ([HUGE, 0, 0, 0], [HUGE, 0, 0, 2])])
    dts = {"input": dtype, "grid": dtype}
    attrs = {"interpolation_mode": ("int", interp), "padding_mode": ("int", padding), "align_corners": ("int", align)}
    if edge == "absent_attrs" or (invalid is None and rng.random() < 0.1):
        for key in list(attrs):
            if rng.random() < 0.6:
                del attrs[key]
        interp, padding, align = (attrs.get(k, ("int", 0))[1] for k in ("interpolation_mode", "padding_mode",
                                                                          "align_corners"))
    why = stage = None
    op = "mmdeploy::grid_sampler: "
    if invalid == "interp_range":
        attrs["interpolation_mode"] = ("int", pick(rng, [3, -1, 2**40, -2**63, INT64_MAX]))
        why, stage = op + r"attribute interpolation_mode must be 0 \(bilinear\), 1 \(nearest\) or 2", "session"
    elif invalid == "padding_range":
        attrs["padding_mode"] = ("int", pick(rng, [3, -1, 7, 2**62]))
        why, stage = op + "attribute padding_mode must be 0 \\(zeros\\)", "session"
    elif invalid == "align_range":
        attrs["align_corners"] = ("int", pick(rng, [2, -1, 2**33]))
        why, stage = op + "attribute align_corners must be 0 or 1", "session"
    elif invalid == "attr_type":
        key = pick(rng, list(attrs) or ["interpolation_mode"])
        attrs[key] = wrong_kind(rng, "int")
        why, stage = op + f"attribute '{key}' must be an int", "session"
    elif invalid == "input_rank":
        ishape = pick(rng, [ishape[:3], ishape + [1], [h * w], []])
        why, stage = op + r"input must be 4-D \(N, C, H, W\)", "run"
    elif invalid == "grid_rank":
        gshape = pick(rng, [gshape[:3], gshape + [1], [ho * wo * 2], [n, ho * wo, 2]])
        why, stage = op + r"grid must be 4-D \(N, Ho, Wo, 2\)", "run"
    elif invalid == "grid_last":
        gshape[3] = pick(rng, [0, 1, 3, 4])
        why, stage = op + "grid's last dimension must be 2", "run"
    elif invalid == "batch_mismatch":
        gshape[0] = pick(rng, [n + 1, 0] if n else [1, 2])
        why, stage = op + "grid has .* images .* the batch sizes must match", "run"
    elif invalid == "empty_map":
        ishape[2:] = pick(rng, [[0, w], [h, 0], [0, 0]])
        why, stage = op + "input has an empty feature map", "run"
    elif invalid == "dtype_mismatch":
        dts[pick(rng, ["input", "grid"])] = pick(rng, [t for t in FLOATS if t != dtype])
        why, stage = "no kernel def matches", "session"
    elif invalid == "int_dtype":
        dts["input"] = dts["grid"] = pick(rng, [torch.int32, torch.int64])
        why, stage = "Type Error", "session"

    # input values: normal; grid values: (x, y) in [-1.3, 1.3] (some points outside the map)
    x = torch.from_numpy(rng.standard_normal(ishape)) if math.prod(ishape) else torch.zeros(ishape, dtype=torch.float64)
    g = torch.from_numpy(rng.uniform(-1.3, 1.3, size=gshape)) if math.prod(gshape) else \
        torch.zeros(gshape, dtype=torch.float64)
    if edge == "grid_points" and g.numel():  # pixel centres and the half-way lines between them: nearest's ties
        sizes = torch.tensor([w, h], dtype=torch.float64)
        pix = torch.from_numpy(rng.integers(-3, 2 * max(h, w) + 3, size=gshape)).double() / 2 - 0.5
        g = (2 * pix / (sizes - 1).clamp(min=1) - 1) if align else ((2 * pix + 1) / sizes - 1)
    elif edge in ("nan_grid", "inf_grid", "huge_grid") and g.numel():
        flat = g.view(-1)
        values = {"nan_grid": [math.nan], "inf_grid": [math.inf, -math.inf],
                  "huge_grid": [1e30, -1e30, 3e38, -3e38, 1e7, -1e7, 3e9]}[edge]
        for _ in range(int(rng.integers(1, 4))):
            flat[int(rng.integers(flat.numel()))] = pick(rng, values)
        if rng.random() < 0.5:  # both coordinates of a point
            g.view(-1, 2)[int(rng.integers(flat.numel() // 2))] = pick(rng, values)
    elif edge == "neg_zero" and g.numel():
        g.view(-1)[:: 2] = -0.0
    elif edge == "denormal" and g.numel():
        tiny = {torch.float64: 1e-310, torch.float16: 3e-8}.get(dtype, 1e-40)
        g.view(-1)[:: 3] = tiny * pick(rng, [1, -1])
        if x.numel():
            x.view(-1)[:: 2] = tiny
    elif edge == "nonfinite_input" and x.numel():
        for _ in range(int(rng.integers(1, 3))):
            x.view(-1)[int(rng.integers(x.numel()))] = pick(rng, [math.nan, math.inf, -math.inf])

    def cast(t, dt):
        return t.to(dt) if dt.is_floating_point else (t * 4).to(dt)

    feeds = {"input": cast(x, dts["input"]), "grid": cast(g, dts["grid"])}
    case = Case("grid_sampler", [("input", dts["input"]), ("grid", dts["grid"])], [("output", dts["input"])], attrs,
                feeds, invalid, why, stage, edge)
    if invalid == "node":
        case.invalid = "node:" + node_fault(rng, case, ["input", "grid"])
    case.check = lambda outs: grid_sampler_check(case, outs, interp, padding, align)
    return case


def grid_sampler_reference(x, g, interp, padding, align):
    """torch's grid_sample in the kernel's compute type (float64 for float64, else float32 on the widened
    values), with opforge/csrc/core/grid_sample.h's rules where torch's result is undefined or differs:
    a point with a NaN / +-inf / huge (|pixel| > 1e6) coordinate is 0 under zeros padding; under border,
    NaN and -inf clamp to the first pixel, +inf (and huge) to the last; under reflection NaN and +-inf
    go to pixel 0 and huge values are not compared (torch's float32 reflection loses them). Returns the
    reference and a (N, 1, Ho, Wo) mask of the points compared."""
    import torch.nn.functional as F

    a = torch.float64 if x.dtype == torch.float64 else torch.float32
    x, g = x.to(a), g.to(a).clone()
    sizes = torch.tensor([x.shape[3], x.shape[2]], dtype=a)  # (W, H) for (x, y)
    pixel = (g + 1) * ((sizes - 1) / 2) if align else (g + 1) * (sizes / 2) - 0.5  # (with align, 1 pixel: always 0)
    finite = pixel.isfinite()
    huge = finite & (pixel.abs() > 1e6)
    special = (~finite | huge).any(-1)  # (N, Ho, Wo)
    compared = torch.ones_like(special)
    zero = torch.zeros_like(special)
    if padding == 0:
        zero = special
        g[special] = 0.0
    elif padding == 1:
        # (by the pixel coordinate: a finite grid value of 3e38 overflows to inf there)
        g = torch.where(pixel.isnan() | (pixel == -math.inf), torch.tensor(-3.0, dtype=a), g)
        g = torch.where(pixel == math.inf, torch.tensor(3.0, dtype=a), g)
        g = torch.where(huge, g.clamp(-3.0, 3.0), g)
    else:
        h, w = x.shape[2], x.shape[3]
        first = [torch.tensor(-1.0 if align else -1.0 + 1.0 / s, dtype=torch.float64).to(a) for s in (w, h)]
        for axis in (0, 1):
            gi = g[..., axis]
            gi[~finite[..., axis]] = first[axis]
        compared = ~huge.any(-1)
        g[huge] = 0.0
    out = F.grid_sample(x, g, mode=GS_MODES[interp], padding_mode=GS_PADDINGS[padding], align_corners=bool(align))
    out = out.masked_fill(zero[:, None], 0.0)
    return out, compared[:, None]


def grid_sampler_check(case, outs, interp, padding, align):
    (y,) = outs
    x, g = case.feeds["input"], case.feeds["grid"]
    want_shape = [x.shape[0], x.shape[1], g.shape[1], g.shape[2]]
    if list(y.shape) != want_shape or y.dtype != x.dtype:
        raise CaseFailure(f"output {short(y.dtype)}{list(y.shape)}, expected {short(x.dtype)}{want_shape}")
    if not y.numel():
        return "empty"
    want, compared = grid_sampler_reference(x, g, interp, padding, align)
    got = y.to(want.dtype)
    keep = compared.expand(want.shape).clone()
    if case.edge == "nonfinite_input":  # the header: a masked tap on a non-finite value may give NaN (torch: 0)
        keep &= got.isfinite() & want.isfinite()
    bad_nan = keep & (got.isnan() != want.isnan())
    if bad_nan.any():
        idx = bad_nan.nonzero()[0].tolist()
        raise CaseFailure(f"output{idx} is {got[tuple(idx)].item()!r}, reference {want[tuple(idx)].item()!r}")
    keep &= ~want.isnan()
    tol = {torch.float32: 1e-5, torch.float64: 1e-9}.get(x.dtype, tolerance(x.dtype))
    finite = keep & want.isfinite()
    scale = 1.0 + (float(want[finite].abs().max()) if finite.any() else 0.0)
    diff = (got - want).abs()
    bad = keep & ~(diff <= tol * scale) & ~((got == want) & want.isinf())
    if bad.any():
        idx = bad.nonzero()[0].tolist()
        raise CaseFailure(f"{int(bad.sum())} elements differ from torch's grid_sample; output{idx} = "
                          f"{got[tuple(idx)].item()!r}, reference {want[tuple(idx)].item()!r} (tol {tol * scale:.3g})")
    return "ok" + ("" if bool(compared.all()) else " (huge reflected points skipped)")


# ---- MMCVModulatedDeformConv2d -------------------------------------------------------------------------

DCN_INVALID = ["stride_zero", "stride_negative", "pad_negative", "pad_overflow", "dil_zero", "dil_overflow",
               "groups_zero", "deform_groups_zero", "groups_huge", "deform_groups_huge", "pair_type", "int_type",
               "node", "groups_mismatch", "offset_channels", "offset_spatial", "mask_shape", "bias_length", "bias_0d",
               "weight_rank", "input_rank", "empty_kernel", "kernel_too_big", "dtype_mismatch", "int_dtype"]
DCN_EDGES = ["none"] * 4 + ["empty_batch", "empty_plane", "no_channels", "huge_stride", "huge_offsets", "inf_offsets",
                            "nan_offsets", "nan_mask", "zero_mask", "neg_zero", "big_kernel", "denormal"]
DCN_WHY = {
    "stride_zero": "stride must be positive", "stride_negative": "stride must be positive",
    "pad_negative": "padding must be non-negative", "dil_zero": "dilation must be positive",
    "groups_zero": "groups must be positive", "deform_groups_zero": "deform_groups must be positive",
    "groups_mismatch": r"weight.size\(1\) \* groups must equal input channels|groups \(\d+\) (exceeds|must divide)",
    "offset_channels": r"offset.shape\[1\] is not valid", "mask_shape": "mask", "bias_length": "bias must have shape",
    "bias_0d": "bias must have shape", "input_rank": "input must be 4-D", "weight_rank": "weight must be 4-D",
    "dtype_mismatch": "no kernel def matches", "int_dtype": "Type Error",
}
DCN_SESSION = {"stride_zero", "stride_negative", "pad_negative", "dil_zero",
               "groups_zero", "deform_groups_zero", "pair_type", "int_type", "dtype_mismatch", "int_dtype"}


def dcn_case(rng):
    dtype = pick(rng, FLOATS)
    groups, dg = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    c = groups * dg * int(rng.integers(1, 3))
    o = groups * int(rng.integers(1, 3))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    n, h, w = int(rng.integers(1, 3)), int(rng.integers(1, 8)), int(rng.integers(1, 8))
    invalid = pick(rng, DCN_INVALID) if rng.random() < 0.35 else None
    edge = pick(rng, DCN_EDGES) if invalid is None else "none"
    # how each attribute is written: INTS [h, w], INTS [v], INT v, or absent (mmcv's default)
    forms = {k: pick(rng, ["ints2", "ints2", "ints1", "int", "absent"]) for k in ("stride", "padding", "dilation")}
    default = {"stride": 1, "padding": 0, "dilation": 1}
    pair = {}
    for k, form in forms.items():
        lo, hi = (0, 3) if k == "padding" else (1, 3)
        a, b = int(rng.integers(lo, hi)), int(rng.integers(lo, hi))
        pair[k] = [default[k]] * 2 if form == "absent" else [a, a] if form in ("ints1", "int") else [a, b]
    group_forms = {k: pick(rng, ["int", "int", "absent"]) for k in ("groups", "deform_groups")}
    if group_forms["groups"] == "absent":
        groups, o = 1, int(rng.integers(1, 4))
    if group_forms["deform_groups"] == "absent":
        dg = 1
    c = groups * dg * int(rng.integers(1, 3))
    with_bias = rng.random() < 0.7
    domain = "mmcv" if rng.random() < 0.25 else "mmdeploy"
    stride, pad, dil = pair["stride"], pair["padding"], pair["dilation"]
    if edge == "empty_batch":
        n = 0
    elif edge == "empty_plane":
        h, w = pick(rng, [(0, w), (h, 0), (0, 0)])
        pad = [kh * dil[0], kw * dil[1]]
        forms["padding"] = "ints2"
    elif edge == "no_channels":
        c, groups, dg = 0, 1, 1
        group_forms = {"groups": "int", "deform_groups": "int"}
    elif edge == "huge_stride":
        stride = [pick(rng, [2**40, INT64_MAX]), 1]
        forms["stride"] = "ints2"
    elif edge == "big_kernel":
        kh, kw = int(rng.integers(3, 6)), int(rng.integers(3, 6))
    h = max(h, dil[0] * (kh - 1) + 1 - 2 * pad[0]) if edge != "empty_plane" else h
    w = max(w, dil[1] * (kw - 1) + 1 - 2 * pad[1]) if edge != "empty_plane" else w

    def out(size, p, d, k, s):
        return (size + 2 * p - (d * (k - 1) + 1)) // s + 1

    oh, ow = out(h, pad[0], dil[0], kh, stride[0]), out(w, pad[1], dil[1], kw, stride[1])
    shapes = {"input": [n, c, h, w], "offset": [n, 2 * dg * kh * kw, oh, ow], "mask": [n, dg * kh * kw, oh, ow],
              "weight": [o, c // groups if c else 0, kh, kw], "bias": [o]}
    dts = {k: dtype for k in shapes}
    attr_values = {"stride": stride, "padding": pad, "dilation": dil, "groups": groups, "deform_groups": dg}
    why = DCN_WHY.get(invalid)
    stage = "session" if invalid in DCN_SESSION else "run" if invalid else None
    i2 = int(rng.integers(2))
    if invalid == "stride_zero":
        stride[i2] = 0
    elif invalid == "stride_negative":
        stride[i2] = -int(rng.integers(1, 2**62))
    elif invalid == "pad_negative":
        pad[i2] = pick(rng, [-1, -2**62])
    elif invalid == "pad_overflow":
        pad[i2] = pick(rng, [INT64_MAX, 2**62, INT64_MAX // 2 + 1])
        stage = None  # at creation or at the run (the padded size overflows)
    elif invalid == "dil_zero":
        dil[i2] = pick(rng, [0, -1])
    elif invalid == "dil_overflow":
        dil[i2] = pick(rng, [2**62, INT64_MAX])
        shapes["weight"][2 + i2] = max(shapes["weight"][2 + i2], 3)
        stage = None  # the attribute alone (with a 1-wide kernel) is fine: refused at creation or at the run
    elif invalid == "groups_zero":
        groups = pick(rng, [0, -1, -2**63])
    elif invalid == "deform_groups_zero":
        dg = pick(rng, [0, -2])
    elif invalid == "groups_huge":
        groups = pick(rng, [2**62, INT64_MAX, c + 1])
    elif invalid == "deform_groups_huge":
        dg = pick(rng, [2**62 + 1, INT64_MAX, c + 1])
    elif invalid == "groups_mismatch":
        groups += 1
    elif invalid == "offset_channels":
        shapes["offset"][1] += pick(rng, [1, -1, 2 * kh * kw])
    elif invalid == "offset_spatial":
        shapes["offset"][2 + i2] += pick(rng, [1, -1]) if shapes["offset"][2 + i2] else 1
    elif invalid == "mask_shape":
        shapes["mask"] = pick(rng, [[n, dg * kh * kw + 1, oh, ow], [n, dg * kh * kw, oh + 1, ow], [n, dg * kh * kw],
                                    [0], [n, dg * kh * kw, oh, ow, 1]])
    elif invalid == "bias_length":
        with_bias, shapes["bias"] = True, [o + pick(rng, [1, -1] if o > 1 else [1])]
    elif invalid == "bias_0d":
        with_bias, shapes["bias"] = True, pick(rng, [[], [o, 1]])
    elif invalid == "weight_rank":
        shapes["weight"] = pick(rng, [shapes["weight"][:3], shapes["weight"] + [1]])
    elif invalid == "input_rank":
        shapes["input"] = pick(rng, [shapes["input"][:3], shapes["input"] + [1]])
    elif invalid == "empty_kernel":
        shapes["weight"][2 + i2] = 0
    elif invalid == "kernel_too_big":
        pad = [0, 0]
        shapes["weight"][2] = h + stride[0] + 1
        shapes["offset"][1] = 2 * dg * shapes["weight"][2] * kw
        shapes["mask"][1] = dg * shapes["weight"][2] * kw
    elif invalid == "dtype_mismatch":
        dts[pick(rng, ["offset", "mask", "weight"] + (["bias"] if with_bias else []))] = pick(
            rng, [t for t in FLOATS if t != dtype])
    elif invalid == "int_dtype":
        dts = dict.fromkeys(dts, pick(rng, [torch.int32, torch.int64]))
    shapes = {k: [max(d, 0) for d in s] for k, s in shapes.items()}
    attr_values.update(stride=stride, padding=pad, dilation=dil, groups=groups, deform_groups=dg)

    attrs = {}
    for k in ("stride", "padding", "dilation"):
        v = attr_values[k]
        form = forms[k]
        if form in ("ints1", "int", "absent") and v[0] != v[1]:
            form = "ints2"
        if form == "absent" and v[0] != default[k]:
            form = "ints2"
        if form == "ints2":
            attrs[k] = ("ints", list(v))
        elif form == "ints1":
            attrs[k] = ("ints", [v[0]])
        elif form == "int":
            attrs[k] = ("int", v[0])
    for k in ("groups", "deform_groups"):
        if group_forms[k] == "int" or attr_values[k] != 1:
            attrs[k] = ("int", attr_values[k])
    op = "mmdeploy::MMCVModulatedDeformConv2d: "
    if invalid == "pair_type":
        key = pick(rng, ["stride", "padding", "dilation"])
        kind, value = wrong_kind(rng, "pair")
        attrs[key] = (kind, value)
        why = op + f"attribute '{key}' must be an int or a list of"
    elif invalid == "int_type":
        key = pick(rng, ["groups", "deform_groups"])
        attrs[key] = wrong_kind(rng, "int")
        why = op + f"attribute '{key}' must be an int"
    if why and not why.startswith(op) and invalid not in ("dtype_mismatch", "int_dtype"):
        why = op + ".*(" + why + ")"

    def make(name, shape):
        if not math.prod(shape):
            t = torch.zeros(shape, dtype=torch.float64)
        elif name == "mask":
            t = torch.from_numpy(rng.random(shape))
        else:
            t = torch.from_numpy(rng.standard_normal(shape)) * (2 if name == "offset" else 1)
        flat = t.view(-1)
        if flat.numel():
            if name == "offset" and edge == "huge_offsets":
                flat[::3] = pick(rng, [1e30, -1e30, 3e9, big(dtype, 1e30)])
            elif name == "offset" and edge == "inf_offsets":
                flat[::4] = pick(rng, [math.inf, -math.inf])
            elif name == "offset" and edge == "nan_offsets":
                flat[int(rng.integers(flat.numel()))] = math.nan
            elif name == "offset" and edge == "neg_zero":
                flat[::2] = -0.0
            elif name == "mask" and edge == "nan_mask":
                flat[int(rng.integers(flat.numel()))] = math.nan
            elif name == "mask" and edge == "zero_mask":
                flat[::2] = pick(rng, [0.0, -0.0])
            elif name == "input" and edge == "denormal":
                flat[::2] = {torch.float64: 1e-310, torch.float16: 3e-8}.get(dtype, 1e-40)
        dt = dts[name]
        return t.to(dt) if dt.is_floating_point else (t * 4).to(dt)

    names = ["input", "offset", "mask", "weight"] + (["bias"] if with_bias else [])
    feeds = {k: make(k, shapes[k]) for k in names}
    case = Case("MMCVModulatedDeformConv2d", [(k, dts[k]) for k in names], [("output", dts["input"])], attrs,
                dict(feeds), invalid, why, stage, edge, domain=domain)
    if invalid == "node":
        fault = node_fault(rng, case, names, omit_ok=True)
        case.invalid = "node:" + fault
        if fault == "inputs_fewer":  # 4 inputs is the form without bias: valid unless fewer
            if len(case.inputs) >= 4:
                case.inputs = case.inputs[:3]
                case.feeds = {k: case.feeds[k] for k, _ in case.inputs}
            case.why = r"MMCVModulatedDeformConv2d: the node has \d input\(s\); expected 4 or 5|not in range|Type Error"
        elif fault == "inputs_more":
            case.why = r"MMCVModulatedDeformConv2d: the node has \d input\(s\); expected 4 or 5|not in range"
            if len(case.inputs) < 6:  # 5 inputs is the form with bias
                case.inputs.append(("extra9", dtype))
                case.feeds["extra9"] = torch.zeros(2, dtype=dtype)
        elif fault == "outputs_2":
            case.why = r"MMCVModulatedDeformConv2d: the node has 2 outputs|not in range"
    values = [feeds["input"], feeds["weight"], feeds["offset"], feeds["mask"],
              feeds["bias"] if with_bias else torch.zeros(o, dtype=dtype), stride[0], stride[1], pad[0], pad[1],
              dil[0], dil[1], groups, dg, True]
    case.check = lambda outs: dcn_check(case, outs, values, edge)
    case.notes = f"(stride={stride} padding={pad} dilation={dil} groups={groups} deform_groups={dg})"
    return case


def dcn_check(case, outs, values, edge):
    (y,) = outs
    x = values[0]
    if y.dtype != x.dtype:
        raise CaseFailure(f"output dtype {y.dtype}, input {x.dtype}")
    want = deform_reference(values, edge)
    if want is None:  # torchvision keeps strides in int: the shape at least
        off = values[2]
        if list(y.shape) != [x.shape[0], values[1].shape[0], off.shape[2], off.shape[3]]:
            raise CaseFailure(f"output shape {list(y.shape)}")
        return "ok (shape only)"
    if edge not in ("nan_offsets", "nan_mask"):  # no NaN input: NaN only where the reference has it
        if list(y.shape) == list(want.shape) and (y.isnan() & ~want.isnan()).any():
            raise CaseFailure(f"output has {int((y.isnan() & ~want.isnan()).sum())} NaN the reference has not")
    compare(y, want, x.dtype, "output")
    return "ok"


# ---- MMCVRoIAlignRotated ---------------------------------------------------------------------------------

RAR_SESSION = {"output_size", "spatial_scale", "sampling_ratio", "dtype_mismatch", "int_dtype"}
RAR_NODE = ["attr_missing", "attr_type", "flag_range", "node"]


def roi_align_rotated_case(rng):
    desc, values, invalid, why, edge, _ = rar_case(rng, "ort")  # tests/fuzz.py's values: the op is the same kernel
    x, rois, oh, ow, scale, ratio, aligned, clockwise = values
    if invalid is None and x.dtype == torch.float16 and rng.random() < 0.5:  # the ORT kernels take bfloat16 too
        x, rois = x.to(torch.bfloat16), rois.to(torch.bfloat16)
        values = [x, rois] + values[2:]
    attrs = {"output_height": ("int", oh), "output_width": ("int", ow), "spatial_scale": ("float", scale),
             "sampling_ratio": ("int", ratio), "aligned": ("int", int(aligned)), "clockwise": ("int", int(clockwise))}
    stage = ("session" if invalid in RAR_SESSION else "run") if invalid else None
    if invalid in ("dtype_mismatch",):
        why = "no kernel def matches"
    elif invalid == "int_dtype":
        why = "Type Error"
    op = "mmdeploy::MMCVRoIAlignRotated: "
    if invalid is None and rng.random() < 0.15:
        invalid = pick(rng, RAR_NODE)
        stage = "session"
        key = pick(rng, list(attrs))
        if invalid == "attr_missing":
            del attrs[key]
            why = op + f"the node needs the (int|float) attribute '{key}'"
        elif invalid == "attr_type":
            kind = "float" if key == "spatial_scale" else "int"
            attrs[key] = wrong_kind(rng, kind)
            why = op + f"the node needs the {kind} attribute '{key}'"
        elif invalid == "flag_range":
            key = pick(rng, ["aligned", "clockwise"])
            attrs[key] = ("int", pick(rng, [2, -1, 2**40]))
            why = op + f"attribute {key} must be 0 or 1"
    case = Case("MMCVRoIAlignRotated", [("input", x.dtype), ("rois", rois.dtype)], [("output", x.dtype)], attrs,
                {"input": x, "rois": rois}, invalid, why, stage, edge, notes=desc.split(" invalid=")[0])
    if invalid == "node":
        case.invalid = "node:" + node_fault(rng, case, ["input", "rois"])
    case.check = lambda outs: rar_check(outs, values)
    return case


def rar_check(outs, values):
    (y,) = outs
    dtype = values[0].dtype
    if y.dtype != dtype:
        raise CaseFailure(f"output has dtype {y.dtype}, inputs {dtype}")
    want = rar_reference(values)
    unstable = rar_unstable_bins(values)[:, None].expand(want.shape)
    got = y.double()
    if got.shape == want.shape:
        got, want = got.masked_fill(unstable, 0.0), want.masked_fill(unstable, 0.0)
        if (got.isnan() & ~want.isnan()).any():
            raise CaseFailure("output has NaN where the reference has none")
    tol = max(tolerance(dtype), 2e-8 * rar_grid_points(values)) if dtype != torch.float64 else None
    compare(got, want, dtype, "output", tol)
    return "ok" + (" (unstable bins skipped)" if unstable.any() else "")


# ---- NMSRotated / NMSMatch ---------------------------------------------------------------------------------

NMS_INVALID = ["nonfinite_box", "boxes_shape", "scores_shape", "iou_range", "score_nan", "attr_missing", "attr_type",
               "node", "dtype_mismatch", "int_dtype"]
NMS_MATCH_INVALID = ["nonfinite_box", "nan_score", "boxes_shape", "scores_shape", "iou_range", "score_nan",
                     "threshold_count", "node", "dtype_mismatch", "threshold_dtype", "int_dtype"]
NMS_EDGES = ["none"] * 4 + ["empty", "no_images", "no_classes", "single", "ties", "duplicates", "degenerate",
                            "huge_coords", "tiny_coords", "far_boxes", "inf_scores", "neg_zero", "iou_0", "iou_1",
                            "score_extreme", "hidden_bad", "many_boxes", "huge_empty"]
ROTATED_COLUMNS = ["cx", "cy", "w", "h", "angle"]
AXIS_COLUMNS = ["x1", "y1", "x2", "y2"]


def detections(rng, n, c, b, rotated, edge, dtype):
    """Boxes (N, B, 5 or 4) in clusters (so that many overlap) and scores (N, C, B), float64."""
    centres = rng.uniform(0, 30, size=(n, int(rng.integers(1, 4)), 2))
    pick_c = rng.integers(centres.shape[1], size=(n, b))
    ctr = np.take_along_axis(centres, pick_c[..., None], axis=1) + rng.normal(0, 1.5, size=(n, b, 2)) \
        if b else np.zeros((n, 0, 2))
    size = rng.uniform(1, 6, size=(n, b, 2))
    if rotated:
        boxes = np.concatenate([ctr, size, rng.uniform(-math.pi, math.pi, size=(n, b, 1))], axis=-1)
    else:
        boxes = np.concatenate([ctr - size / 2, ctr + size / 2], axis=-1)
    scores = rng.random((n, c, b))
    some = rng.random((n, b)) < 0.4
    span = slice(2, 4) if rotated else slice(0, 4)
    if edge == "ties":
        scores = rng.choice([0.2, 0.5, 0.5, 0.9], size=(n, c, b))
    elif edge == "duplicates" and b:
        src = rng.integers(b, size=b)
        boxes[:, some.any(0)] = boxes[:, src[some.any(0)]]
        if rng.random() < 0.5:
            scores[:, :, some.any(0)] = scores[:, :, src[some.any(0)]]
    elif edge == "degenerate":  # no area (rotated: w or h zero or negative; axis-aligned: x2 <= x1 or y2 <= y1)
        if rotated:
            boxes[some, 2 + int(rng.integers(2))] = pick(rng, [0.0, -1.0, -0.0, -1e-3])
        else:
            j = int(rng.integers(2))
            boxes[some, 2 + j] = boxes[some, j] - pick(rng, [0.0, 1.0, 1e-3])
    elif edge == "huge_coords":  # the scene scaled up
        factor = 1000.0 if dtype == torch.float16 else pick(rng, [1e29, 1e15, 1e18])  # float16: below 65504
        boxes[..., span] *= factor
        if rotated:
            boxes[..., :2] *= factor
    elif edge == "tiny_coords":  # the scene scaled down, to denormals in float32
        boxes[..., :4] *= 1e-6 if dtype in (torch.float16, torch.bfloat16) else pick(rng, [1e-38, 1e-30, 1e-20])
    elif edge == "far_boxes":
        far = 2e4 if dtype == torch.float16 else pick(rng, [1e30, 1e20])
        step = 2e3 if dtype == torch.float16 else far  # float16: the farthest below 65504
        idx = np.flatnonzero(some.any(0))
        for k, i in enumerate(idx):
            if rotated:
                boxes[:, i, 0] += far + step * k
            else:
                boxes[:, i, [0, 2]] += far + step * k
    elif edge == "inf_scores":
        mask = rng.random((n, c, b)) < 0.3
        scores[mask] = rng.choice([math.inf, -math.inf], size=int(mask.sum()))
    elif edge == "neg_zero":
        scores[rng.random((n, c, b)) < 0.5] = pick(rng, [0.0, -0.0])
    return boxes, scores


def nms_common(rng, rotated):
    """The parts NMSRotated and NMSMatch share: dtype, sizes, edge, invalid kind, boxes, scores."""
    dtype = pick(rng, FLOATS)
    n, c, b = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(0, 16))
    kinds = NMS_INVALID if rotated else NMS_MATCH_INVALID
    invalid = pick(rng, kinds) if rng.random() < 0.35 else None
    edge = pick(rng, NMS_EDGES) if invalid is None else "none"
    if edge == "empty":
        b = 0
    elif edge == "no_images":
        n = 0
    elif edge == "no_classes":
        c = 0
    elif edge == "single":
        b = 1
    elif edge == "many_boxes":
        b, c = int(rng.integers(40, 90)), 1
    if invalid in ("nonfinite_box", "nan_score"):
        n, c, b = max(n, 1), max(c, 1), max(b, 1)
    boxes, scores = detections(rng, n, c, b, rotated, edge, dtype)
    return dtype, n, c, b, invalid, edge, boxes, scores


def nms_rows(case, outs, width):
    """The node's output rows (numpy; int64 (K, width), each (image, class) in range, in that order, none
    from no scores), the boxes and scores fed, and the scores' N and C."""
    (rows,) = outs
    boxes, scores = case.feeds["boxes"], case.feeds["scores"]
    n, c = scores.shape[0], scores.shape[1]
    if rows.dtype != torch.int64 or rows.dim() != 2 or rows.shape[1] != width:
        raise CaseFailure(f"output {rows.dtype} {list(rows.shape)}, expected int64 (K, {width})")
    r = rows.numpy()
    if len(r) and ((r[:, 0] < 0).any() or (r[:, 0] >= n).any() or (r[:, 1] < 0).any() or (r[:, 1] >= c).any()):
        raise CaseFailure(f"rows with (image, class) outside ({n}, {c}): {r[:8].tolist()}")
    pairs = r[:, 0] * max(c, 1) + r[:, 1] if len(r) else np.zeros(0, np.int64)
    if (np.diff(pairs) < 0).any():
        raise CaseFailure(f"rows are not in (image, class) order: {r[:20].tolist()}")
    if not scores.numel() and len(r):
        raise CaseFailure(f"rows {r[:8].tolist()} from no scores")
    return r, boxes, scores, n, c


def nms_rotated_case(rng):
    dtype, n, c, b, invalid, edge, boxes, scores = nms_common(rng, rotated=True)
    iou = pick(rng, [float(rng.uniform(0.05, 0.95)), 0.5, 0.3, 0.1])
    score_thr = pick(rng, [float(rng.uniform(0, 0.8)), 0.0, 0.5, -1.0])
    if edge == "iou_0":
        iou = pick(rng, [0.0, -0.0])
    elif edge == "iou_1":
        iou = 1.0
    elif edge == "score_extreme":
        score_thr = pick(rng, [-math.inf, math.inf, 1e30, -1e30, 3e38])
    elif edge == "hidden_bad" and b:  # non-finite boxes whose scores are not above the threshold: never read
        score_thr = pick(rng, [0.125, 0.25, 0.5])  # exact in every dtype: a score equal to it is not above it
        i = int(rng.integers(b))
        boxes[:, i, int(rng.integers(5))] = pick(rng, [math.nan, math.inf, -math.inf])
        scores[:, :, i] = pick(rng, [score_thr, -1.0, math.nan, -math.inf, 0.0])
    elif edge == "huge_empty":
        n, c, b = pick(rng, [(HUGE, 1, 0), (1, HUGE, 0), (HUGE, 2**10, 0)])
    bshape, sshape = [n, b, 5], [n, c, b]
    attrs = {"iou_threshold": ("float", iou), "score_threshold": ("float", score_thr)}
    dts = {"boxes": dtype, "scores": dtype}
    why = stage = None
    op = "mmdeploy::NMSRotated: "
    if invalid == "nonfinite_box":  # box i of image img, above the threshold in class cls; every other box finite
        score_thr = min(score_thr, 0.5)
        attrs["score_threshold"] = ("float", score_thr)
        img, i, j = int(rng.integers(n)), int(rng.integers(b)), int(rng.integers(5))
        boxes[img, i, j] = pick(rng, [math.nan, math.inf, -math.inf])
        scores[img, int(rng.integers(c)), i] = 0.9
        why, stage = op + rf"boxes\[{img}, {i}\] has a non-finite {ROTATED_COLUMNS[j]}", "run"
    elif invalid == "boxes_shape":
        bshape = pick(rng, [[n, b, 4], [n, b, 6], [n, b], [n * b, 5], [1, n, b, 5]])
        why, stage = op + r"boxes must be 3-D \(N, B, 5\)", "run"
    elif invalid == "scores_shape":
        sshape = pick(rng, [[n + 1, c, b], [n, c, b + 1], [n, c], [n, b, c, 1], [c, b]])
        if sshape == [c, b] and n == c:
            sshape = [n, c, b + 1]
        why, stage = op + r"scores must be 3-D \(N, C, B\)", "run"
    elif invalid == "iou_range":
        attrs["iou_threshold"] = ("float", pick(rng, [-0.5, 1.5, math.nan, math.inf, -math.inf, -1e-3, 1.0001]))
        why, stage = op + r"iou_threshold must be in \[0, 1\]", "session"
    elif invalid == "score_nan":
        attrs["score_threshold"] = ("float", math.nan)
        why, stage = op + "score_threshold is NaN", "session"
    elif invalid == "attr_missing":
        key = pick(rng, list(attrs))
        del attrs[key]
        why, stage = op + f"the node needs the float attribute '{key}'", "session"
    elif invalid == "attr_type":
        key = pick(rng, list(attrs))
        attrs[key] = wrong_kind(rng, "float")
        why, stage = op + f"the node needs the float attribute '{key}'", "session"
    elif invalid == "dtype_mismatch":
        dts[pick(rng, ["boxes", "scores"])] = pick(rng, [t for t in FLOATS if t != dtype])
        why, stage = "no kernel def matches", "session"
    elif invalid == "int_dtype":
        dts = dict.fromkeys(dts, pick(rng, [torch.int32, torch.int64]))
        why, stage = "Type Error", "session"
    feeds = {"boxes": tensor(boxes, bshape, dts["boxes"]), "scores": tensor(scores, sshape, dts["scores"])}
    case = Case("NMSRotated", [("boxes", dts["boxes"]), ("scores", dts["scores"])], [("indices", torch.int64)],
                attrs, feeds, invalid, why, stage, edge)
    if invalid == "node":
        case.invalid = "node:" + node_fault(rng, case, ["boxes", "scores"])
    case.check = lambda outs: nms_rotated_check(case, outs, iou, score_thr)
    return case


def tensor(data, shape, dtype):
    """data (float64 numpy) as a torch tensor of shape and dtype (a shape data does not have: the same
    numbers reshaped, or zeros)."""
    t = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float64))
    if list(t.shape) != list(shape):
        t = t.reshape(shape) if t.numel() == math.prod(shape) else torch.rand(shape, dtype=torch.float64) \
            if math.prod(shape) < 10**7 else torch.zeros(shape, dtype=torch.float64)
    return t.to(dtype) if dtype.is_floating_point else (t * 4).nan_to_num(0, 0, 0).to(dtype)


def nms_rotated_check(case, outs, iou, score_thr):
    r, boxes, scores, n, c = nms_rows(case, outs, 3)
    if not scores.numel():
        return "empty"
    thr = float(np.float32(score_thr))
    b64, s64 = boxes.double(), scores.double()
    # IoU does not change with scale, but the numpy reference's polygon code loses tiny scenes (|x| < 1e-3):
    # scale them up by a power of two (exact), per image
    for img in range(n):
        extent = float(b64[img, :, :4].abs().max()) if b64.shape[1] else 0.0
        if 0 < extent < 1e-3:
            b64[img, :, :4] *= 2.0 ** -math.floor(math.log2(extent))
    how = "exact"
    for img in range(n):
        for cls in range(c):
            picked = np.nonzero((s64[img, cls] > thr).numpy())[0]
            got = r[(r[:, 0] == img) & (r[:, 1] == cls), 2]
            position = {int(i): k for k, i in enumerate(picked)}
            if any(int(i) not in position for i in got):
                raise CaseFailure(f"pair ({img}, {cls}) keeps {got.tolist()}: not all score above {thr}")
            if not len(picked):
                continue
            keep = torch.tensor([position[int(i)] for i in got], dtype=torch.int64)
            try:
                result = nms_check(keep, [b64[img, picked], s64[img, cls, picked], iou])
            except CaseFailure as e:
                raise CaseFailure(f"pair ({img}, {cls}), candidates {picked.tolist()}: {e}") from e
            how = "tie" if result == "tie" else how
    return "ok" + (" (threshold ties)" if how == "tie" else "")


def nms_match_case(rng):
    from test_mmdeploy_ops import nms_match_reference  # noqa: F401 (imported early: its import is slow)

    dtype, n, c, b, invalid, edge, boxes, scores = nms_common(rng, rotated=False)
    tdtype = pick(rng, [torch.float32, dtype])
    iou = pick(rng, [float(rng.uniform(0.05, 0.95)), 0.5, 0.3, 0.1])
    score_thr = pick(rng, [float(rng.uniform(0, 0.8)), 0.0, 0.5, -1.0])
    tshape = pick(rng, [[1], [1], [1], [], [1, 1]])  # mmdeploy writes [1]; one value in any shape is taken
    if edge == "iou_0":
        iou = pick(rng, [0.0, -0.0])
    elif edge == "iou_1":
        iou = 1.0
    elif edge == "score_extreme":
        score_thr = pick(rng, [-math.inf, math.inf, 1e30, -1e30])
    elif edge == "hidden_bad":  # NMSMatch reads every box: nothing is hidden. Denormal thresholds instead
        iou = pick(rng, [1e-40, 5e-324])
    elif edge == "huge_empty":
        n, c, b = pick(rng, [(HUGE, 1, 0), (1, HUGE, 0), (HUGE, 2**10, 0)])
    bshape, sshape = [n, b, 4], [n, c, b]
    dts = {"boxes": dtype, "scores": dtype, "iou_threshold": tdtype, "score_threshold": tdtype}
    why = stage = None
    op = "mmdeploy::NMSMatch: "
    if invalid == "nonfinite_box":
        img, i, j = int(rng.integers(n)), int(rng.integers(b)), int(rng.integers(4))
        boxes[img, i, j] = pick(rng, [math.nan, math.inf, -math.inf])
        boxes[:img] = np.nan_to_num(boxes[:img])
        boxes[img, :i] = np.nan_to_num(boxes[img, :i])
        boxes[img + 1:] = np.nan_to_num(boxes[img + 1:])
        why, stage = op + rf"boxes\[{img}, {i}\] has a non-finite {AXIS_COLUMNS[j]}", "run"
    elif invalid == "nan_score":
        img, cls, i = int(rng.integers(n)), int(rng.integers(c)), int(rng.integers(b))
        scores[img, cls, i] = math.nan
        why, stage = op + rf"scores\[{img}, {cls}, {i}\] is NaN", "run"
    elif invalid == "boxes_shape":
        bshape = pick(rng, [[n, b, 5], [n, b, 3], [n, b], [n * b, 4], [1, n, b, 4]])
        why, stage = op + r"boxes must be 3-D \(N, B, 4\)", "run"
    elif invalid == "scores_shape":
        sshape = pick(rng, [[n + 1, c, b], [n, c, b + 1], [n, c], [n, b, c, 1]])
        why, stage = op + r"scores must be 3-D \(N, C, B\)", "run"
    elif invalid == "iou_range":
        iou = pick(rng, [-0.5, 1.5, math.nan, math.inf, -math.inf, -1e-3, 1.01])  # out of range in 16 bits too
        why, stage = op + r"iou_threshold must be in \[0, 1\]", "run"
    elif invalid == "score_nan":
        score_thr = math.nan
        why, stage = op + "score_threshold is NaN", "run"
    elif invalid == "threshold_count":
        tshape = pick(rng, [[2], [0], [1, 2], [3, 1]])
        why, stage = op + r"(iou|score)_threshold must hold one value", "run"
    elif invalid == "dtype_mismatch":
        dts[pick(rng, ["boxes", "scores"])] = pick(rng, [t for t in FLOATS if t != dtype])
        why, stage = "no kernel def matches", "session"
    elif invalid == "threshold_dtype":  # thresholds of a third type (neither float32 nor the boxes')
        other = [t for t in FLOATS if t not in (dtype, torch.float32)]
        dts["iou_threshold"] = dts["score_threshold"] = pick(rng, other + [torch.int64])
        why, stage = "no kernel def matches|Type Error", "session"
    elif invalid == "int_dtype":
        dts = dict.fromkeys(dts, pick(rng, [torch.int32, torch.int64]))
        why, stage = "Type Error", "session"
    thresholds = {"iou_threshold": iou, "score_threshold": score_thr}
    feeds = {"boxes": tensor(boxes, bshape, dts["boxes"]), "scores": tensor(scores, sshape, dts["scores"])}
    for k, v in thresholds.items():
        count = math.prod(tshape)
        t = torch.full(tshape, v, dtype=torch.float64) if count == 1 else \
            torch.from_numpy(np.resize(np.array([v, 0.5, 0.25]), count).reshape(tshape))
        feeds[k] = t.to(dts[k]) if dts[k].is_floating_point else t.nan_to_num(0, 0, 0).to(dts[k])
    names = ["boxes", "scores", "iou_threshold", "score_threshold"]
    case = Case("NMSMatch", [(k, dts[k]) for k in names], [("indices", torch.int64)], {}, feeds, invalid, why,
                stage, edge, notes=f"thresholds=({iou}, {score_thr}) {short(tdtype)}{tshape}")
    if invalid is None and rng.random() < 0.05:  # an attribute the node form does not have: ignored, as ORT does
        case.attrs["iou_threshold"] = ("float", 0.5)
    if invalid == "node":
        case.invalid = "node:" + node_fault(rng, case, names)
    if invalid is None and dts["iou_threshold"] == torch.float16:  # a float16 threshold may round above 1
        if float(feeds["iou_threshold"].double()) > 1.0:
            feeds["iou_threshold"] = torch.ones_like(feeds["iou_threshold"])
    case.check = lambda outs: nms_match_check(case, outs)
    return case


def nms_match_check(case, outs):
    from test_mmdeploy_ops import nms_match_reference

    r, boxes, scores, _, _ = nms_rows(case, outs, 4)
    if not scores.numel():
        return "empty"
    iou = float(case.feeds["iou_threshold"].double().reshape(-1)[0])
    score = float(case.feeds["score_threshold"].double().reshape(-1)[0])
    try:
        want = nms_match_reference(boxes, scores, iou, score)
    except ZeroDivisionError:  # the reference's float division (C's gives inf / NaN): no reference
        return "ok (no reference: a zero IoU denominator)"
    if r.shape != want.shape or not np.array_equal(r, want):
        diff = [row for row in r.tolist() if row not in want.tolist()][:5]
        missing = [row for row in want.tolist() if row not in r.tolist()][:5]
        raise CaseFailure(f"{len(r)} rows, reference {len(want)}: extra {diff}, missing {missing}")
    return "ok" if len(r) else "ok (no rows)"


# ---- the runner ----------------------------------------------------------------------------------------------

CASES = {"grid_sampler": grid_sampler_case, "MMCVModulatedDeformConv2d": dcn_case,
         "MMCVRoIAlignRotated": roi_align_rotated_case, "NMSRotated": nms_rotated_case, "NMSMatch": nms_match_case}


def run_case(target, seed, index):
    op = target.split(":", 1)[1]
    rng = case_rng(seed, index)
    case = CASES[op](rng)
    if rng.random() < 0.2:
        case.front = "ort_session"
    if rng.random() < 0.3:
        case.node_name = f"{op}_{index}"
    announce(target, seed, index, case.describe())
    try:
        outs = run_case_in_ort(case)
    except Rejected as r:
        return "invalid: " + judge_rejection(case, r)
    if case.invalid is not None:
        shapes = [list(o.shape) for o in outs]
        raise CaseFailure(f"invalid case ({case.invalid}) returned outputs of shapes {shapes} instead of an error")
    return f"valid: {case.check(outs)} [{case.edge}]"


def main(argv=None):
    args, indices = command_line(__doc__, TARGETS + ("all",), argv, "number of cases (per target)")
    targets = TARGETS if args.target == "all" else (args.target,)
    failures = 0
    for target in targets:
        tally, failed = run_batch(run_case, target, args.seed, indices)
        valid = sum(v for what, v in tally.items() if what.startswith("valid"))
        print(f"TALLY {target}: " + tallied(tally), flush=True)
        print(f"SPLIT {target}: {valid} valid, {sum(tally.values()) - valid} invalid, {failed} failed", flush=True)
        failures += failed
    print(f"DONE {len(indices) * len(targets)} cases, {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
