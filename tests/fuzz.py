"""Random-input fuzzing of every opforge op through torch and ONNX Runtime.

One process runs one batch of cases of one target and prints ``CASE <target> <seed> <index>:
<description>`` (flushed) before each, so when a case crashes or hangs the process, the parent
(tests/test_fuzz.py) names the case that did it. Case k of a seed is generated from
``default_rng([seed, k])`` alone: ``--case k`` reruns exactly that case.

Each case is either *valid* (the op must succeed and agree with an independent reference:
torchvision for deform_conv2d, grid_sample for ms_deform_attn, numpy for my_add, torch itself for
ATen nodes) or *invalid* (the op must fail with an error naming the op: a Python exception in
torch, an error status in ORT). Valid cases include the edges: empty batches, empty input planes
with padding, strides larger than the input, huge / infinite / NaN offsets and sampling locations,
channels_last and strided views. Invalid ones include hostile index tensors (ms_deform_attn's
spatial_shapes and level_start_index: sizes that are zero, negative or overflow int64, alone or
summed, starts that disagree), which the kernels must refuse before reading memory with them.

    python tests/fuzz.py --target deform_conv2d:torch --seed 0 --first 0 --cases 100
    python tests/fuzz.py --target deform_conv2d:ort --seed 0 --case 17      # one case, verbose
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import re
import sys
import traceback

import numpy as np
import torch

import opforge
from opforge.spec import find

from helpers import aten_model, run_in_ort  # tests/ is this script's sys.path[0]

INT64_MAX = 2**63 - 1
TARGETS = ("deform_conv2d:torch", "deform_conv2d:ort", "ms_deform_attn:torch", "ms_deform_attn:ort", "my_add:torch",
           "my_add:ort", "aten:ort")


class CaseFailure(AssertionError):
    pass


def pick(rng, options):
    return options[int(rng.integers(len(options)))]


# ---- deform_conv2d ---------------------------------------------------------------------------------

DEFORM_INVALID = [
    "stride_zero", "stride_negative", "pad_negative", "pad_overflow", "dil_zero", "dil_overflow", "groups_mismatch",
    "groups_huge", "offset_groups_huge", "offset_channels", "offset_spatial", "mask_shape", "bias_0d",
    "bias_length", "weight_rank", "input_rank", "dtype_mismatch", "int_dtype", "empty_kernel", "kernel_too_big",
]
DEFORM_EDGES = ["none", "none", "none", "empty_batch", "empty_plane", "no_channels", "huge_stride",
                "huge_offsets", "inf_offsets", "nan_offsets", "nan_mask", "channels_last", "strided"]


def deform_case(rng, front_end):
    """(description, values, expect_valid, edge): values are the torch op's arguments."""
    dtypes = [torch.float32] * 3 + [torch.float64, torch.float16] + ([torch.bfloat16] if front_end == "torch" else [])
    dtype = pick(rng, dtypes)
    groups = int(rng.integers(1, 3))
    offset_groups = int(rng.integers(1, 3))
    c = groups * offset_groups * int(rng.integers(1, 3))
    o = groups * int(rng.integers(1, 3))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    n = int(rng.integers(1, 3))
    h, w = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    stride = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    pad = [int(rng.integers(0, 3)), int(rng.integers(0, 3))]
    dil = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    use_mask = bool(rng.integers(0, 2))
    invalid = pick(rng, DEFORM_INVALID) if rng.random() < 0.35 else None
    edge = pick(rng, DEFORM_EDGES) if invalid is None else "none"
    if edge == "empty_batch":
        n = 0
    elif edge == "empty_plane":
        h, w = pick(rng, [(0, w), (h, 0), (0, 0)])
        pad = [kh * dil[0], kw * dil[1]]  # the output stays non-empty
    elif edge == "no_channels":
        c, groups, offset_groups = 0, 1, 1
    elif edge == "huge_stride":
        stride = [pick(rng, [2**40, INT64_MAX]), 1]
    # padded extent must cover the kernel for a non-empty output (truncating rule)
    h = max(h, dil[0] * (kh - 1) + 1 - 2 * pad[0]) if edge != "empty_plane" else h
    w = max(w, dil[1] * (kw - 1) + 1 - 2 * pad[1]) if edge != "empty_plane" else w

    def out(size, p, d, k, s):
        return int((size + 2 * p - (d * (k - 1) + 1)) / s) + 1

    oh, ow = out(h, pad[0], dil[0], kh, stride[0]), out(w, pad[1], dil[1], kw, stride[1])
    shapes = dict(input=[n, c, h, w], weight=[o, c // groups if c else 0, kh, kw],
                  offset=[n, 2 * offset_groups * kh * kw, oh, ow], mask=[n, offset_groups * kh * kw, oh, ow],
                  bias=[o])
    if not use_mask:
        shapes["mask"] = pick(rng, [[0], [n, 1], [1]])
    other_dtype = {}
    if invalid == "stride_zero":
        stride[int(rng.integers(2))] = 0
    elif invalid == "stride_negative":
        stride[int(rng.integers(2))] = -int(rng.integers(1, 2**62))
    elif invalid == "pad_negative":
        pad[int(rng.integers(2))] = -1
    elif invalid == "pad_overflow":
        pad[int(rng.integers(2))] = pick(rng, [INT64_MAX, 2**62, INT64_MAX // 2 + 1])
    elif invalid == "dil_zero":
        dil[int(rng.integers(2))] = 0
    elif invalid == "dil_overflow":
        dil[0], shapes["weight"][2] = 2**62, max(kh, 3)
    elif invalid == "groups_mismatch":  # weight.size(1) * groups != C (weight.size(1) >= 1 here)
        groups += 1
    elif invalid == "groups_huge":
        groups = pick(rng, [2**62, INT64_MAX, c + 1])
    elif invalid == "offset_groups_huge":
        offset_groups = pick(rng, [2**62 + 1, INT64_MAX, c + 1])
    elif invalid == "offset_channels":
        shapes["offset"][1] += pick(rng, [1, -1, 2 * kh * kw])
    elif invalid == "offset_spatial":
        shapes["offset"][2 + int(rng.integers(2))] += pick(rng, [1, -1])
    elif invalid == "mask_shape":
        use_mask = True
        shapes["mask"] = pick(rng, [[n, offset_groups * kh * kw + 1, oh, ow], [n, offset_groups * kh * kw, oh + 1, ow],
                                    [n, offset_groups * kh * kw], [0]])
    elif invalid == "bias_0d":
        shapes["bias"] = []
    elif invalid == "bias_length":
        shapes["bias"] = [o + 1]
    elif invalid == "weight_rank":
        shapes["weight"] = shapes["weight"][:3]
    elif invalid == "input_rank":
        shapes["input"] = shapes["input"] + [1]
    elif invalid == "dtype_mismatch":
        other_dtype[pick(rng, ["weight", "offset", "bias"] + (["mask"] if use_mask else []))] = (
            torch.float64 if dtype != torch.float64 else torch.float32)
    elif invalid == "int_dtype":
        dtype = pick(rng, [torch.int32, torch.int64])
    elif invalid == "empty_kernel":
        shapes["weight"][2 + int(rng.integers(2))] = 0
    elif invalid == "kernel_too_big":
        pad = [0, 0]
        shapes["weight"][2] = h + stride[0] + 1
        shapes["offset"][1] = 2 * offset_groups * shapes["weight"][2] * kw
        shapes["mask"] = [n, offset_groups * shapes["weight"][2] * kw, oh, ow] if use_mask else shapes["mask"]
    if any(d < 0 for s in shapes.values() for d in s):
        shapes = {k: [max(d, 0) for d in s] for k, s in shapes.items()}

    def make(name, shape):
        dt = other_dtype.get(name, dtype)
        if name == "mask" and use_mask:
            t = torch.rand(shape, dtype=torch.float64)
        elif name == "offset":
            t = torch.randn(shape, dtype=torch.float64) * 2
        else:
            t = torch.randn(shape, dtype=torch.float64)
        if name == "offset" and t.numel():
            if edge == "huge_offsets":
                t.view(-1)[::3] = pick(rng, [1e30, -1e30, 3e9])
            elif edge == "inf_offsets":
                t.view(-1)[::4] = pick(rng, [math.inf, -math.inf])
            elif edge == "nan_offsets":
                t.view(-1)[int(rng.integers(t.numel()))] = math.nan
        if name == "mask" and use_mask and edge == "nan_mask" and t.numel():
            t.view(-1)[int(rng.integers(t.numel()))] = math.nan
        t = t.to(dt) if dt.is_floating_point else (t * 4).to(dt)
        if edge == "channels_last" and t.dim() == 4:
            t = t.to(memory_format=torch.channels_last)
        elif edge == "strided" and t.dim() == 4 and front_end == "torch":
            t = torch.cat([t, t], dim=-1)[..., ::2]
        return t

    tensors = [make(k, s) for k, s in shapes.items()]
    values = tensors + [*stride, *pad, *dil, groups, offset_groups, use_mask]
    desc = (f"dtype={str(dtype)[6:]} shapes={list(shapes.values())} stride={stride} pad={pad} dil={dil} "
            f"groups={groups} offset_groups={offset_groups} use_mask={use_mask} invalid={invalid} edge={edge}"
            + (f" other_dtype={other_dtype}" if other_dtype else ""))
    return desc, values, invalid is None, edge


@torch.no_grad()
def deform_reference(values, edge):
    """torchvision, in float64 (None: no independent reference for this case)."""
    import torchvision

    x, w, off, m, b, sh, sw, ph, pw, dh, dw, groups, og, use_mask = values
    if x.shape[1] == 0:  # no channels: the bias (torchvision's wrapper divides by weight.size(1))
        return b.double().view(1, -1, 1, 1).expand(x.shape[0], -1, *off.shape[2:])
    if edge == "huge_stride":  # torchvision's kernels keep strides in int
        return None

    def f(t):  # NaN -> 0: compare() skips the NaN outputs, and no other output depends on a NaN input
        return t.double().nan_to_num(0.0, posinf=math.inf, neginf=-math.inf)

    return torchvision.ops.deform_conv2d(f(x), f(off), f(w), f(b), stride=(sh, sw), padding=(ph, pw),
                                         dilation=(dh, dw), mask=f(m) if use_mask else None)


def tolerance(dtype):
    return {torch.float16: 2e-2, torch.bfloat16: 1e-1, torch.float32: 1e-4}.get(dtype, 1e-9)


def compare(got, want, dtype, what):
    got, want = got.detach().double(), want.detach()
    if got.shape != want.shape:
        raise CaseFailure(f"{what}: shape {list(got.shape)}, reference {list(want.shape)}")
    keep = ~got.isnan()  # NaN offsets/masks: NaN exactly where they reach, the rest as if they were 0
    tol = tolerance(dtype)
    scale = 1.0 + float(want[keep].abs().max()) if keep.any() else 1.0
    diff = (got[keep] - want[keep]).abs()
    bad = diff > tol * scale
    if bad.any():
        raise CaseFailure(f"{what}: {int(bad.sum())} elements differ, max |diff| {float(diff.max()):.3g} (tol {tol * scale:.3g})")


def run_deform_torch(values, edge, rng):
    x = values[0]
    grad = (x.dtype in (torch.float32, torch.float64) and edge not in ("nan_offsets", "nan_mask", "huge_stride")
            and rng.random() < 0.5)
    if grad:  # every tensor argument differentiable (the mask only when it is used)
        use_mask = values[13]
        values = [v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and (i != 3 or use_mask) else v
                  for i, v in enumerate(values)]
    y = torch.ops.opforge.deform_conv2d(*values)
    return y, grad, values


# ---- ms_deform_attn --------------------------------------------------------------------------------

MS_INVALID = [
    "shape_zero", "shape_negative", "shape_huge", "sum_overflow", "sum_mismatch", "start_wrong", "starts_length",
    "starts_rank", "shapes_rank", "shapes_cols", "no_levels", "n_mismatch", "m_mismatch", "l_mismatch", "attn_dims",
    "loc_last_dim", "value_rank", "loc_rank", "attn_rank", "dtype_mismatch", "int_dtype", "index_dtype", "im2col_step",
]
MS_INVALID_TORCH = ["huge_expanded"]  # expanded (stride-0) tensors of 2**40+ elements: nothing ORT can be fed
# what the kernels' message must say (a regex) for each invalid case
MS_WHY = {
    "shape_zero": "sizes must be positive", "shape_negative": "sizes must be positive", "shape_huge": "overflow|sum to",
    "sum_overflow": "overflow", "sum_mismatch": "sum to", "start_wrong": r"level_start_index\[\d+\] is",
    "starts_length": "level_start_index has", "starts_rank": "level_start_index must be 1-D",
    "shapes_rank": "spatial_shapes must be 2-D", "shapes_cols": r"spatial_shapes must be \(L, 2\)",
    "no_levels": "needs at least one level", "n_mismatch": "sampling_locations has N", "m_mismatch": "sampling_locations has M",
    "l_mismatch": "sampling_locations has L", "attn_dims": "attention_weights has (N|Lq|M|L|P) =",
    "loc_last_dim": "must end in a dim of size 2", "value_rank": "value must be 4-D",
    "loc_rank": "sampling_locations must be 6-D", "attn_rank": "attention_weights must be 5-D",
    "dtype_mismatch": "must share one dtype", "int_dtype": "value has dtype", "index_dtype": "must be int64",
    "im2col_step": "im2col_step must be positive",
}
# ORT's front end refuses other dtypes before the kernel: opforge.ort_session's type check (a type the schema does
# not take) or ORT's own kernel matching (inputs of one type variable disagree), in their words
MS_WHY_ORT = {"dtype_mismatch": "", "int_dtype": "which it does not take", "index_dtype": "which it does not take"}
MS_EDGES = ["none", "none", "none", "empty_batch", "no_queries", "no_points", "no_heads", "no_channels",
            "wide_channels", "unit_levels", "wide_level", "many_points", "grid_points", "huge_locations",
            "inf_locations", "nan_locations", "nan_weights", "strided", "many_queries"]
# the torch front end's call forms: the op, mmcv's autograd.Function, opforge's wrapper (errors as OpInputError)
MS_CALLS = ["op", "op", "function", "wrapper"]


def wrap64(v):
    """v in int64 arithmetic (two's complement wrap-around): what an unchecked kernel would compute."""
    return (v + 2**63) % 2**64 - 2**63


def ms_deform_case(rng, front_end):
    """(description, values, invalid, why, edge, call): values are the torch op's arguments (contiguous;
    the strided edge is applied by the torch runner), why what the error must say when invalid is set,
    call the torch front end's call form."""
    dtypes = [torch.float32] * 3 + [torch.float64, torch.float16] + ([torch.bfloat16] if front_end == "torch" else [])
    dtype = pick(rng, dtypes)
    levels = int(rng.integers(1, 5))
    rows = [[int(rng.integers(1, 7)), int(rng.integers(1, 7))] for _ in range(levels)]
    n, lq = int(rng.integers(1, 3)), int(rng.integers(1, 6))
    m, d, p = int(rng.integers(1, 4)), int(rng.integers(1, 10)), int(rng.integers(1, 5))
    step = pick(rng, [64, 64, 1, 2, INT64_MAX])
    kinds = MS_INVALID + (MS_INVALID_TORCH if front_end == "torch" else [])
    invalid = pick(rng, kinds) if rng.random() < 0.35 else None
    edges = [e for e in MS_EDGES if front_end == "torch" or e != "strided"]
    edge = pick(rng, edges) if invalid is None else "none"
    if edge == "empty_batch":
        n = 0
    elif edge == "no_queries":
        lq = 0
    elif edge == "no_points":
        p = 0
    elif edge == "no_heads":
        m = 0
    elif edge == "no_channels":
        d = 0
    elif edge == "wide_channels":  # past the kernels' vector widths and 8-lane partial sums, with remainders
        d = int(rng.integers(15, 41))
    elif edge == "unit_levels":
        rows = [pick(rng, [[1, w], [h, 1], [1, 1]]) for h, w in rows]
    elif edge == "wide_level":
        rows[int(rng.integers(levels))] = pick(rng, [[1, int(rng.integers(30, 65))], [int(rng.integers(30, 65)), 1],
                                                     [int(rng.integers(8, 17)), int(rng.integers(8, 17))]])
    elif edge == "many_points":  # M*L*P > 64 points per query: past any batching of points in the kernels
        levels, m, p = 4, 4, int(rng.integers(5, 9))
        rows = [[int(rng.integers(1, 7)), int(rng.integers(1, 7))] for _ in range(levels)]
    elif edge == "many_queries":  # small parallel grains: the work is split between threads (ms_threads)
        levels, m, p, d, lq = 4, 4, 4, int(rng.integers(16, 33)), int(rng.integers(100, 301))
        rows = [[int(rng.integers(1, 7)), int(rng.integers(1, 7))] for _ in range(levels)]
    sizes = [h * w for h, w in rows]
    s = sum(sizes)
    starts = [sum(sizes[:k]) for k in range(levels)]
    loc_levels = levels
    shapes = dict(value=[n, s, m, d], spatial_shapes=[levels, 2], level_start_index=[levels],
                  sampling_locations=[n, lq, m, levels, p, 2], attention_weights=[n, lq, m, levels, p])
    dts = dict(value=dtype, sampling_locations=dtype, attention_weights=dtype, spatial_shapes=torch.int64,
               level_start_index=torch.int64)
    why = MS_WHY.get(invalid)
    expanded = {}  # name -> shape the tensor is expanded to (huge_expanded)
    if invalid in ("shape_zero", "shape_negative", "shape_huge"):  # level_start_index agrees, in int64 arithmetic
        k = int(rng.integers(levels))
        h, w = rows[k]
        rows[k] = {"shape_zero": lambda: pick(rng, [[0, w], [h, 0], [0, 0]]),
                   "shape_negative": lambda: pick(rng, [[-h, -w], [-h, w], [h, -w], [-2**62, -4], [-2**63, -1]]),
                   "shape_huge": lambda: pick(rng, [[2**62, w], [h, 2**62], [2**62, 2**62], [INT64_MAX, 1],
                                                    [2**32, 2**32], [2**31, 2**33 + 1], [1, 2**62]])}[invalid]()
        starts = [wrap64(sum(a * b for a, b in rows[:j])) for j in range(levels)]
    elif invalid == "sum_overflow":  # extra levels whose sizes (or their sum) wrap around to what value has
        extra = pick(rng, [[[2**31, 2**31]] * 4, [[2**32, 2**32]], [[2**62, 2], [2**62, 2]], [[INT64_MAX, 1], [1, 1]]])
        k = int(rng.integers(levels + 1))
        rows = rows[:k] + extra + rows[k:]
        levels = loc_levels = len(rows)
        starts = [wrap64(sum(a * b for a, b in rows[:j])) for j in range(levels)]
        s = wrap64(sum(a * b for a, b in rows))
        if s < 0 or s > 10**4:  # the extras do not wrap to a small S: the sum check refuses it instead
            s, why = sum(sizes), "overflow|sum to"
        shapes.update(value=[n, s, m, d], spatial_shapes=[levels, 2], level_start_index=[levels],
                      sampling_locations=[n, lq, m, levels, p, 2], attention_weights=[n, lq, m, levels, p])
    elif invalid == "sum_mismatch":
        shapes["value"][1] = pick(rng, [s + 1, s - 1, 0, 2 * s])
    elif invalid == "start_wrong":
        k = int(rng.integers(levels))
        if levels > 1 and rng.random() < 0.3:
            starts = starts[::-1]  # the levels stored in the other order
        else:
            starts[k] = pick(rng, [starts[k] + 1, starts[k] - 1, -1, s, 10**12, INT64_MAX, -2**63])
    elif invalid == "starts_length":
        starts = pick(rng, [starts + [s], starts[:-1], starts + starts])
        shapes["level_start_index"] = [len(starts)]
    elif invalid == "starts_rank":
        shapes["level_start_index"] = pick(rng, [[levels, 1], [1, levels], [] if levels == 1 else [levels, 1]])
    elif invalid == "shapes_rank":
        shapes["spatial_shapes"] = pick(rng, [[2 * levels], [1, levels, 2], [levels, 2, 1]])
    elif invalid == "shapes_cols":
        rows = [r + [1] for r in rows] if rng.random() < 0.5 else [r[:1] for r in rows]
        shapes["spatial_shapes"] = [levels, len(rows[0])]
    elif invalid == "no_levels":
        rows, starts, levels, loc_levels = [], [], 0, 0
        shapes.update(value=[n, 0, m, d], spatial_shapes=[0, 2], level_start_index=[0],
                      sampling_locations=[n, lq, m, 0, p, 2], attention_weights=[n, lq, m, 0, p])
    elif invalid == "n_mismatch":
        if rng.random() < 0.5:
            shapes["value"][0] = n + 1
        else:
            shapes["sampling_locations"][0] = shapes["attention_weights"][0] = pick(rng, [n + 1, 0])
    elif invalid == "m_mismatch":
        shapes["value"][2] = pick(rng, [m + 1, m - 1])
    elif invalid == "l_mismatch":
        loc_levels = pick(rng, [levels + 1, levels - 1])
        shapes["sampling_locations"][3] = shapes["attention_weights"][3] = loc_levels
    elif invalid == "attn_dims":
        k = int(rng.integers(5))
        shapes["attention_weights"][k] += pick(rng, [1, -1]) if shapes["attention_weights"][k] > 0 else 1
    elif invalid == "loc_last_dim":
        shapes["sampling_locations"][5] = pick(rng, [0, 1, 3, 4])
    elif invalid in ("value_rank", "loc_rank", "attn_rank"):
        name = {"value_rank": "value", "loc_rank": "sampling_locations", "attn_rank": "attention_weights"}[invalid]
        shapes[name] = pick(rng, [shapes[name][:-1], shapes[name] + [1], shapes[name][1:], []])
    elif invalid == "dtype_mismatch":
        dts[pick(rng, ["sampling_locations", "attention_weights"])] = pick(rng, [t for t in dtypes if t != dtype])
    elif invalid == "int_dtype":
        int_dtype = pick(rng, [torch.int32, torch.int64])
        dts.update(value=int_dtype, sampling_locations=int_dtype, attention_weights=int_dtype)
    elif invalid == "index_dtype":
        dts[pick(rng, ["spatial_shapes", "level_start_index"])] = pick(rng, [torch.int32, torch.float32, torch.float64,
                                                                            torch.uint8])
    elif invalid == "im2col_step":
        step = pick(rng, [0, -1, -64, -2**63])
    elif invalid == "huge_expanded":  # the checks come before any copy or allocation of that size
        variant = int(rng.integers(4))
        if variant == 0:  # S = 2**40 rows, the levels sum to far fewer
            expanded["value"], why = [n, 2**40, m, d], "sum to"
        elif variant == 1:  # 2**61 elements: a byte count overflows int64
            n = m = d = 1
            expanded["value"] = [1, 2**61, 1, 1]
            shapes.update(sampling_locations=[1, lq, 1, levels, p, 2], attention_weights=[1, lq, 1, levels, p])
            why = "more elements than int64 can count"
        elif variant == 2:  # 2**40 queries (an output of 2**40 * M*D elements) and a bad level
            expanded["sampling_locations"] = [n, 2**40, m, levels, p, 2]
            expanded["attention_weights"] = [n, 2**40, m, levels, p]
            rows[0] = [0, rows[0][1]]
            why = "sizes must be positive"
        else:  # 2**59 queries of one point: the output's byte count overflows int64
            n = m = d = p = 1
            rows, starts, levels, loc_levels = rows[:1], [0], 1, 1
            shapes.update(value=[1, sizes[0], 1, 1], spatial_shapes=[1, 2], level_start_index=[1])
            expanded["sampling_locations"] = [1, 2**59, 1, 1, 1, 2]
            expanded["attention_weights"] = [1, 2**59, 1, 1, 1]
            why = "more elements than int64 can count"
    if front_end == "ort" and invalid in MS_WHY_ORT:
        why = MS_WHY_ORT[invalid]
    call = pick(rng, MS_CALLS) if front_end == "torch" else "ort"

    # sampling locations: pixel coordinates x = loc_x * W - 0.5 a random integer in [-2, W] plus a fraction in
    # [0.05, 0.95] (so some points fall outside the map or half on it, and none sits on a pixel line, where the
    # gradient of bilinear sampling jumps); y likewise
    loc_shape = shapes["sampling_locations"]
    scale = np.ones((loc_levels, 1, 2))
    for k, row in enumerate(rows[:loc_levels]):
        if len(row) == 2 and all(0 < v <= 64 for v in row):
            scale[k, 0] = [row[1], row[0]]  # (W, H)
    if len(loc_shape) == 6 and loc_shape[3] == scale.shape[0] and loc_shape[5] == 2:
        if edge == "grid_points":  # pixel centres and the lines between them, where the corners change
            loc = np.floor(rng.random(loc_shape) * (2 * scale + 3) - 1) / (2 * scale)
        else:
            cells = np.floor(rng.random(loc_shape) * (scale + 3)) - 2
            loc = (cells + rng.uniform(0.05, 0.95, loc_shape) + 0.5) / scale
    else:  # a shape the op refuses: any values
        loc = rng.random(loc_shape) * 1.4 - 0.2
    loc = torch.from_numpy(np.asarray(loc, dtype=np.float64))
    if loc.numel():
        flat = loc.view(-1)
        if edge == "huge_locations":
            flat[int(rng.integers(3))::3] = pick(rng, [1e30, -1e30, 3e9, -3e9, 3e38, -3e38])
        elif edge == "inf_locations":
            flat[int(rng.integers(4))::4] = pick(rng, [math.inf, -math.inf])
        elif edge == "nan_locations":  # one coordinate of some points, or both
            for _ in range(int(rng.integers(1, 4))):
                flat[int(rng.integers(flat.numel()))] = math.nan
            if rng.random() < 0.5:
                loc.view(-1, 2)[int(rng.integers(flat.numel() // 2))] = math.nan
    attn = torch.rand(shapes["attention_weights"], dtype=torch.float64) * 1.5 - 0.25
    if edge == "nan_weights" and attn.numel():
        attn.view(-1)[int(rng.integers(attn.numel()))] = math.nan

    def index(name, data):
        t = torch.tensor(data, dtype=torch.int64)
        if t.numel() != math.prod(shapes[name]):  # rank cases: the same numbers in another shape (or a stand-in)
            t = torch.arange(math.prod(shapes[name]), dtype=torch.int64)
        t = t.reshape(shapes[name])
        return t.to(dts[name]) if dts[name] != torch.int64 else t

    def make(name, t):
        if name in expanded:
            return torch.zeros([1] * len(expanded[name]), dtype=dts[name]).expand(expanded[name])
        if list(t.shape) != shapes[name]:
            t = torch.rand(shapes[name], dtype=torch.float64)
        return t.to(dts[name]) if dts[name].is_floating_point else (t * 4).to(dts[name])

    values = [make("value", torch.randn(shapes["value"], dtype=torch.float64)),
              index("spatial_shapes", rows), index("level_start_index", starts),
              make("sampling_locations", loc), make("attention_weights", attn), step]
    index_values = [str(t.tolist()) if t.numel() <= 24 else f"{t.flatten()[:24].tolist()}..." for t in values[1:3]]
    desc = (f"dtype={str(dtype)[6:]} value={list(values[0].shape)} spatial_shapes={index_values[0]} "
            f"level_start_index={index_values[1]} (shapes {list(values[1].shape)}, {list(values[2].shape)}) "
            f"sampling_locations={list(values[3].shape)} attention_weights={list(values[4].shape)} im2col_step={step} "
            f"invalid={invalid} edge={edge} call={call}"
            + (f" dtypes={ {k: str(v)[6:] for k, v in dts.items() if v != dtype and v != torch.int64} }"
               if invalid in ("dtype_mismatch", "int_dtype", "index_dtype") else ""))
    return desc, values, invalid, why, edge, call


def ms_deform_reference(values, upstream=None):
    """grid_sample (tests/test_ms_deform_attn.py's reference) in float64, with the op's contract for a
    non-finite location: the point contributes nothing (its weight zeroed, its location made harmless),
    so it has no gradients either. Returns the output and, given upstream (the output's gradient), the
    gradients of value, sampling_locations and attention_weights."""
    from test_ms_deform_attn import grid_sample_reference

    value, shapes, starts, loc, attn = (t.detach() for t in values[:5])
    bad = ~loc.isfinite().all(-1)
    args = [value.double(), loc.double().masked_fill(bad[..., None], 0.5), attn.double().masked_fill(bad, 0.0)]
    with torch.set_grad_enabled(upstream is not None):
        args = [a.requires_grad_(upstream is not None) for a in args]
        out = grid_sample_reference(args[0], shapes, starts, args[1], args[2])
        if upstream is None:
            return out, None
        out.backward(upstream)
    grads = [a.grad if a.grad is not None else torch.zeros_like(a) for a in args]
    grads[2] = grads[2].masked_fill(bad, 0.0)  # what it samples (nothing) does not depend on its weight
    return out.detach(), grads


def ms_strided(t):
    """The same values in a non-contiguous view."""
    return torch.stack([t, t], dim=-1)[..., 0] if t.dim() else t


@contextlib.contextmanager
def ms_threads(edge):
    """Two intra-op threads for the many_queries edge (main() sets one), so the CPU kernels split the
    queries (forward) and the (image, head) pairs (backward) between threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2 if edge == "many_queries" else threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_ms_deform_torch(values, edge, call, valid, rng):
    dtype = values[0].dtype
    grad = (valid and dtype in (torch.float32, torch.float64) and rng.random() < 0.5
            and edge not in ("nan_weights", "grid_points"))  # NaN gradients; kinks of bilinear sampling
    if grad:  # value, sampling_locations and attention_weights differentiable
        values = [v.detach().clone().requires_grad_() if i in (0, 3, 4) else v for i, v in enumerate(values)]
    layout = ms_strided if edge == "strided" else (lambda t: t)
    args = [layout(v) if isinstance(v, torch.Tensor) else v for v in values]
    fn = {"op": torch.ops.opforge.ms_deform_attn, "function": opforge.MultiScaleDeformableAttnFunction.apply,
          "wrapper": lambda *a: opforge.ms_deform_attn(*a[:5], im2col_step=a[5])}[call]
    with ms_threads(edge):
        y = fn(*args)
    return y, grad, values


# ---- targets ---------------------------------------------------------------------------------------

def check_error(exc, op, front_end):
    msg = str(exc)
    if front_end == "torch" and not isinstance(exc, (ValueError, TypeError, RuntimeError)):
        raise CaseFailure(f"expected ValueError/TypeError/RuntimeError, got {type(exc).__name__}: {msg[:300]}")
    if op not in msg:
        raise CaseFailure(f"error does not name {op}: {type(exc).__name__}: {msg[:300]}")


def case_deform(rng, front_end):
    desc, values, valid, edge = deform_case(rng, front_end)
    yield desc
    try:
        if front_end == "torch":
            y, grad, values = run_deform_torch(values, edge, rng)
        else:
            y, grad = run_in_ort(find("deform_conv2d"), values), False
    except Exception as e:  # noqa: BLE001 (any exception is judged below)
        if valid:
            raise CaseFailure(f"valid case failed: {type(e).__name__}: {str(e)[:400]}") from e
        check_error(e, "deform_conv2d" if front_end == "ort" else "opforge::deform_conv2d", front_end)
        yield "rejected"
        return
    if not valid:
        raise CaseFailure(f"invalid case returned a result of shape {list(y.shape)} instead of an error")
    want = deform_reference(values, edge)
    if want is not None:
        compare(y.detach(), want, values[0].dtype, "output")
    if grad:
        import torchvision

        weights = torch.randn(y.shape, dtype=y.dtype)
        (y * weights).sum().backward()
        ref = [v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) else v for v in values]
        if ref[0].shape[1] > 0:
            x, w, off, m, b = ref[:5]
            (torchvision.ops.deform_conv2d(x, off, w, b, stride=values[5:7], padding=values[7:9],
                                           dilation=values[9:11], mask=m if values[13] else None) * weights).sum().backward()
            for name, i in (("input", 0), ("weight", 1), ("offset", 2), ("bias", 4)) + ((("mask", 3),) if values[13] else ()):
                compare(values[i].grad, ref[i].grad.double(), values[0].dtype, f"grad of {name}")
    yield f"ok {edge}" + (" +grad" if grad else "") + ("" if want is not None else " (no reference)")


def case_ms_deform_attn(rng, front_end):
    desc, values, invalid, why, edge, call = ms_deform_case(rng, front_end)
    yield desc
    try:
        if front_end == "torch":
            y, grad, values = run_ms_deform_torch(values, edge, call, invalid is None, rng)
        else:
            y, grad = run_in_ort(find("ms_deform_attn"), values), False
    except Exception as e:  # noqa: BLE001 (any exception is judged below)
        if invalid is None:
            raise CaseFailure(f"valid case failed: {type(e).__name__}: {str(e)[:400]}") from e
        # torch: the kernels' own message, which starts with the op; ORT: theirs too, or the front end's when
        # it refuses a dtype
        check_error(e, "opforge::ms_deform_attn: " if front_end == "torch" else
                    "ms_deform_attn" if invalid == "dtype_mismatch" else "opforge::ms_deform_attn", front_end)
        if front_end == "torch" and not str(e).startswith("opforge::ms_deform_attn: "):
            raise CaseFailure(f"error does not start with the op: {type(e).__name__}: {str(e)[:300]}")
        if why and not re.search(why, str(e)):
            raise CaseFailure(f"error does not say why ({why!r}): {type(e).__name__}: {str(e)[:300]}")
        yield "rejected"
        return
    if invalid is not None:
        raise CaseFailure(f"invalid case ({invalid}) returned a result of shape {list(y.shape)} instead of an error")
    dtype = values[0].dtype
    if y.dtype != dtype:
        raise CaseFailure(f"output has dtype {y.dtype}, inputs {dtype}")
    upstream = torch.randn(y.shape, dtype=torch.float64) if grad else None
    want, want_grads = ms_deform_reference(values, upstream)
    compare(y.detach(), want, dtype, "output")
    if not torch.equal(y.detach().isnan(), want.isnan()):  # NaN weights: NaN exactly where they reach
        raise CaseFailure(f"output: NaN at {int(y.isnan().sum())} elements, reference at {int(want.isnan().sum())}")
    if grad:
        with ms_threads(edge):
            (y * upstream.to(dtype)).sum().backward()
        for name, i, ref in zip(("value", "sampling_locations", "attention_weights"), (0, 3, 4), want_grads):
            if values[i].grad is None:
                raise CaseFailure(f"no gradient of {name}")
            compare(values[i].grad, ref, dtype, f"grad of {name}")
    yield f"ok {edge}" + (" +grad" if grad else "")


def case_my_add(rng, front_end):
    dtypes = [torch.float32, torch.float64, torch.float16] + ([torch.bfloat16] if front_end == "torch" else [])
    dtype = pick(rng, dtypes)
    rank = int(rng.integers(0, 4))
    a_shape = [int(rng.integers(0, 4)) for _ in range(rank)]
    b_shape = [pick(rng, [d, 1]) for d in a_shape][int(rng.integers(0, rank + 1)):]
    invalid = pick(rng, ["shape", "dtype_mismatch", "int_dtype"]) if rng.random() < 0.3 else None
    b_dtype = dtype
    if invalid == "shape":
        if not a_shape or all(d in (0, 1) for d in a_shape):
            a_shape = a_shape + [2]
            b_shape = [3]
        else:
            i = next(k for k, d in enumerate(a_shape) if d not in (0, 1))
            b_shape = [d + 1 if k == i else d for k, d in enumerate(a_shape)]
    elif invalid == "dtype_mismatch":
        b_dtype = torch.float64 if dtype != torch.float64 else torch.float32
    elif invalid == "int_dtype":
        dtype = b_dtype = torch.int32
    a = (torch.randn(a_shape, dtype=torch.float64) * 10).to(dtype)
    b = (torch.randn(b_shape, dtype=torch.float64) * 10).to(b_dtype)
    layout = pick(rng, ["plain", "plain", "transposed", "expanded"]) if front_end == "torch" else "plain"
    if layout == "transposed" and a.dim() >= 2:
        a = a.transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "expanded" and b.dim() >= 1 and b.shape[-1] == 1:
        b = b.expand(*b.shape[:-1], 3) if invalid is None and (not a_shape or a_shape[-1] in (1, 3)) else b
    yield f"dtype={str(dtype)[6:]}/{str(b_dtype)[6:]} a={list(a.shape)} b={list(b.shape)} layout={layout} invalid={invalid}"
    try:
        y = torch.ops.opforge.my_add(a, b) if front_end == "torch" else run_in_ort(find("my_add"), [a, b])
    except Exception as e:  # noqa: BLE001
        try:
            torch.broadcast_shapes(a.shape, b.shape)
            broadcastable = True
        except RuntimeError:
            broadcastable = False
        if invalid is None and broadcastable:
            raise CaseFailure(f"valid case failed: {type(e).__name__}: {str(e)[:400]}") from e
        check_error(e, "my_add" if front_end == "ort" else "opforge::my_add", front_end)
        yield "rejected"
        return
    if invalid is not None:
        raise CaseFailure(f"invalid case returned a result of shape {list(y.shape)} instead of an error")
    want = torch.from_numpy(np.asarray(2 * a.double().numpy() + b.double().numpy()))
    compare(y, want, dtype, "output")
    yield f"ok {layout}"


ATEN_CASES = [
    # (operator, overload, input builders) -- args: python values turned into constant inputs
    ("cumsum", "", lambda rng: [int(rng.integers(-4, 4))]),
    ("flip", "", lambda rng: [[int(rng.integers(-4, 4)) for _ in range(int(rng.integers(0, 3)))]]),
    ("narrow", "", lambda rng: [int(rng.integers(-3, 3)), int(rng.integers(-4, 5)), int(rng.integers(-1, 5))]),
    ("to", "dtype", lambda rng: [int(rng.integers(-3, 50))]),
    ("contiguous", "", lambda rng: [int(rng.integers(-2, 6))]),
    ("topk", "", lambda rng: [int(rng.integers(-1, 6))]),
    ("index_select", "", lambda rng: [int(rng.integers(-3, 3)), np.array(rng.integers(-3, 6, size=int(rng.integers(0, 4))), np.int64)]),
    ("add_", "Tensor", lambda rng: [None]),
    ("lgamma", "out", lambda rng: []),
    ("sum", "dim_IntList", lambda rng: [[int(rng.integers(-4, 4))], int(rng.integers(0, 2))]),
]


def call_like_the_node(op, x, args):
    """The op with the node's inputs bound to the schema's arguments in order, as the ATen
    kernel binds them (keyword-only arguments included)."""
    positional, keywords = [], {}
    values = [x] + [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
    for arg, value in zip(op._schema.arguments, values):
        if arg.kwarg_only:
            keywords[arg.name] = value
        else:
            positional.append(value)
    return op(*positional, **keywords)


def case_aten(rng, front_end):
    from onnx import TensorProto

    operator, overload, make_args = ATEN_CASES[int(rng.integers(len(ATEN_CASES)))]
    x = torch.randn([int(rng.integers(0, 5)) for _ in range(int(rng.integers(0, 4)))])
    args = make_args(rng)
    yield f"aten::{operator}{'.' + overload if overload else ''} x={list(x.shape)} args={[a.tolist() if isinstance(a, np.ndarray) else a for a in args]}"
    if args == [None]:  # in-place op: the second tensor is x again
        args = [x.numpy()]
    consts = [np.asarray(a, dtype=np.int64) if not isinstance(a, np.ndarray) else a for a in args]
    out_type = TensorProto.DOUBLE if operator == "to" and args and args[0] == 7 else TensorProto.FLOAT
    model = aten_model(operator, overload, [("x", TensorProto.FLOAT)], consts=consts, out_types=(out_type,))
    x_before = x.clone()
    op = getattr(getattr(torch.ops.aten, operator), overload or "default")
    try:
        sess = opforge.ort_session(model)
        got = torch.from_numpy(sess.run(None, {"x": x.numpy()})[0])
    except Exception as e:  # noqa: BLE001
        check_error(e, "ATen op aten::", front_end)
        if any(s in str(e) for s in ("writes into its argument", "is not a valid", "declares ONNX type", "cannot hold")):
            yield "refused"  # by the kernel, on purpose
            return
        try:  # any other error must be torch's own
            call_like_the_node(op, x, args)
        except Exception:  # noqa: BLE001
            yield "rejected"
            return
        raise CaseFailure(f"ORT failed where torch succeeds: {str(e)[:400]}") from e
    if not torch.equal(x, x_before):
        raise CaseFailure("the ATen node changed its input array")
    want = call_like_the_node(op, x, args)
    want = want[0] if isinstance(want, tuple) else want
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want.contiguous()):
        raise CaseFailure(f"ORT gave {list(got.shape)} {got.flatten()[:6].tolist()}, torch {list(want.shape)} "
                          f"{want.flatten()[:6].tolist()}")
    yield "ok"


CASES = {"deform_conv2d": case_deform, "ms_deform_attn": case_ms_deform_attn, "my_add": case_my_add,
         "aten": case_aten}


def run_case(target, seed, index, verbose=False):
    op, front_end = target.split(":")
    rng = np.random.default_rng([seed, index])
    torch.manual_seed(int(rng.integers(2**31)))
    steps = CASES[op](rng, front_end)
    desc = next(steps)
    print(f"CASE {target} {seed} {index}: {desc}", flush=True)
    outcomes = list(steps)
    if len(outcomes) != 1:
        raise CaseFailure(f"case ended without an outcome: {outcomes}")
    return outcomes[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, choices=TARGETS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first case")
    parser.add_argument("--cases", type=int, default=100, help="number of cases")
    parser.add_argument("--case", type=int, help="run only this case (reproduce a failure)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    indices = [args.case] if args.case is not None else range(args.first, args.first + args.cases)
    failures, tally = 0, collections.Counter()
    for k in indices:
        try:
            tally[run_case(args.target, args.seed, k)] += 1
        except Exception:  # noqa: BLE001 (report and go on: one batch shows every failing case)
            failures += 1
            print(f"FAIL {args.target} {args.seed} {k}:\n{traceback.format_exc(limit=3)}", flush=True)
    print("TALLY " + ", ".join(f"{n} {what}" for what, n in sorted(tally.items())), flush=True)
    print(f"DONE {len(indices)} cases, {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
