"""Random-input fuzzing of every opforge op through torch and ONNX Runtime.

One process runs one batch of cases of one target and prints ``CASE <target> <seed> <index>:
<description>`` (flushed) before each, so when a case crashes or hangs the process, the parent
(tests/test_fuzz.py) names the case that did it. Case k of a seed is generated from
``default_rng([seed, k])`` alone: ``--case k`` reruns exactly that case.

Each case is either *valid* (the op must succeed and agree with an independent reference:
torchvision for deform_conv2d, grid_sample for ms_deform_attn, the numpy reference
(opforge.ops.roi_align_rotated._reference) for roi_align_rotated, the greedy algorithm over a
numpy IoU (opforge.ops.nms_rotated._greedy / _iou) for nms_rotated and batched_nms_rotated, numpy
for my_add, torch itself for ATen nodes) or *invalid* (the op must fail with an error naming the
op: a Python exception in torch, an error status in ORT). Valid cases include the edges: empty
batches, empty input planes with padding, strides larger than the input, huge / infinite / NaN
offsets and sampling locations, channels_last and strided views; rois off the map, of size zero,
with angles of 1e30, adaptive grids of thousands of points; boxes that tie, repeat, have no area,
sit at 1e30. Invalid ones include hostile index tensors (ms_deform_attn's spatial_shapes and
level_start_index: sizes that are zero, negative or overflow int64, alone or summed, starts that
disagree; roi_align_rotated's batch indices of -1, N, 0.5, 1e30 or NaN, and rois asking for a
sampling grid of billions of points), which the kernels must refuse before reading memory with them.

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
TARGETS = ("deform_conv2d:torch", "deform_conv2d:ort", "ms_deform_attn:torch", "ms_deform_attn:ort",
           "roi_align_rotated:torch", "roi_align_rotated:ort", "nms_rotated:torch", "nms_rotated:ort", "my_add:torch",
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


def compare(got, want, dtype, what, tol=None):
    got, want = got.detach().double(), want.detach()
    if got.shape != want.shape:
        raise CaseFailure(f"{what}: shape {list(got.shape)}, reference {list(want.shape)}")
    keep = ~got.isnan()  # NaN offsets/masks: NaN exactly where they reach, the rest as if they were 0
    tol = tolerance(dtype) if tol is None else tol
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


# ---- roi_align_rotated -----------------------------------------------------------------------------

RAR_INVALID = ["nonfinite", "batch_index", "no_images", "negative_size", "grid_too_big", "input_rank", "rois_shape",
               "empty_map", "dtype_mismatch", "int_dtype", "output_size", "spatial_scale", "sampling_ratio"]
# what the kernels' message must say (a regex) for each invalid case ({row} / {col}: filled in by the case)
RAR_WHY = {
    "nonfinite": r"rois row {row} has a non-finite {col} \(", "negative_size": r"rois row {row} has a negative size",
    "batch_index": r"rois row {row} has batch index .*, but input has N = \d+ images: the index must be an integer",
    "no_images": r"rois row 0 has batch index .*, but input has N = 0 images",
    "grid_too_big": r"rois row {row} .* needs an adaptive sampling grid of .* points per bin; at most 65536",
    "input_rank": r"input must be 4-D", "rois_shape": r"rois must be 2-D \(K, 6\)", "empty_map": "empty feature map",
    "dtype_mismatch": "rois has dtype .* but input has dtype", "int_dtype": "input has dtype",
    "output_size": r"output_size must be in \[1, 1024\] per axis",
    "spatial_scale": "spatial_scale must be a finite positive number",
    "sampling_ratio": "sampling_ratio must be at most 256",
}
# ORT's front end refuses other dtypes before the kernel (opforge.ort_session's type check), in its words
RAR_WHY_ORT = {"dtype_mismatch": "share one element type", "int_dtype": "which it does not take"}
RAR_EDGES = ["none", "none", "none", "no_rois", "no_images", "last_image", "outside", "partly_outside", "zero_size",
             "tiny_unaligned", "huge_angle", "right_angles", "adaptive_large", "channels_last", "strided", "unit_row",
             "unit_col", "max_sampling", "max_output", "no_channels"]
# the torch front end's call forms: the op, mmcv's autograd.Function and module, opforge's wrapper
RAR_CALLS = ["op", "op", "function", "module", "wrapper"]
RAR_COLUMNS = ["batch index", "cx", "cy", "w", "h", "angle"]


def big(dtype, value):
    """value, or the largest magnitude float16 holds (65504) with its sign: "huge but finite" in every dtype."""
    return value if dtype != torch.float16 or abs(value) < 6e4 else math.copysign(6e4, value)


def rar_case(rng, front_end):
    """(description, values, invalid, why, edge, call): values are the torch op's arguments (contiguous; the
    channels_last and strided layouts are applied by the runner)."""
    dtypes = [torch.float32] * 3 + [torch.float64, torch.float16] + ([torch.bfloat16] if front_end == "torch" else [])
    dtype = pick(rng, dtypes)
    n, c = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    h, w = int(rng.integers(1, 13)), int(rng.integers(1, 13))
    k = int(rng.integers(1, 7))
    oh, ow = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    scale = pick(rng, [1.0, 1.0, 0.5, 0.25, 2.0, 0.7])
    ratio = pick(rng, [0, 0, 0, 1, 2, 3, -1])
    aligned, clockwise = bool(rng.random() < 0.6), bool(rng.random() < 0.5)
    invalid = pick(rng, RAR_INVALID) if rng.random() < 0.35 else None
    edges = [e for e in RAR_EDGES if front_end == "torch" or e not in ("channels_last", "strided")]
    edge = pick(rng, edges) if invalid is None else "none"
    if edge == "no_rois":
        k = 0
    elif edge == "no_images":
        n = k = 0
    elif edge == "last_image":
        n = max(n, 2)
    elif edge == "tiny_unaligned":
        aligned = False
    elif edge == "adaptive_large":  # adaptive grids of up to ~150 x 150 points per bin
        ratio, oh, ow, c = pick(rng, [0, -1]), int(rng.integers(1, 3)), int(rng.integers(1, 3)), 2
        k = int(rng.integers(1, 3))
    elif edge == "unit_row":
        h = 1
    elif edge == "unit_col":
        w = 1
    elif edge == "max_sampling":  # 256 x 256 = 65536 points per bin, the most allowed
        ratio, oh, ow, k, c = 256, 1, 1, int(rng.integers(1, 3)), int(rng.integers(1, 3))
    elif edge == "max_output":
        oh, ow = pick(rng, [(1024, 1), (1, 1024), (1024, 2)])
        ratio, k, c = 1, 1, 1
    elif edge == "no_channels":
        c = 0
    # rois in input-image units (the op multiplies by spatial_scale): centres on and around the map, sizes up to
    # 1.5x the map, any angle
    span_x, span_y = w / scale, h / scale
    rois = np.stack([rng.integers(0, max(n, 1), size=k).astype(np.float64),
                     rng.uniform(-1, span_x + 1, size=k), rng.uniform(-1, span_y + 1, size=k),
                     rng.uniform(0.2, 1.5 * max(span_x, span_y), size=k),
                     rng.uniform(0.2, 1.5 * max(span_x, span_y), size=k), rng.uniform(-4, 4, size=k)], axis=1)
    some = rng.random(k) < 0.5  # the rows an edge changes (at least one)
    if k:
        some[int(rng.integers(k))] = True
    if edge == "last_image":
        rois[:, 0] = n - 1
    elif edge == "outside":  # whole rois off the map, half a diagonal and more away
        reach = np.maximum(rois[:, 3], rois[:, 4]) + 4 / scale
        side = rng.integers(0, 4, size=k)
        rois[:, 1] = np.where(side == 0, -reach, np.where(side == 1, span_x + reach, rois[:, 1]))
        rois[:, 2] = np.where(side == 2, -reach, np.where(side == 3, span_y + reach, rois[:, 2]))
    elif edge == "partly_outside":  # centres near the map's edges
        rois[some, 1] = rng.choice([0.0, span_x], size=int(some.sum())) + rng.uniform(-1, 1, size=int(some.sum()))
    elif edge == "zero_size":
        rois[some, 3 + int(rng.integers(2))] = 0.0
        if rng.random() < 0.5:
            rois[some, 3:5] = 0.0
    elif edge == "tiny_unaligned":  # clamped to 1 x 1 feature pixels
        rois[some, 3:5] = rng.uniform(-5, 0.9, size=(int(some.sum()), 2)) / scale
    elif edge == "huge_angle":
        rois[some, 5] = [big(dtype, pick(rng, [1e30, -1e30, 1e20, 3e38, -3e38])) for _ in range(int(some.sum()))]
    elif edge == "right_angles":
        rois[:, 5] = rng.integers(-4, 5, size=k) * (math.pi / 2)
    elif edge == "adaptive_large":
        rois[:, 3:5] = rng.uniform(40, 150, size=(k, 2)) / scale
    elif edge == "max_sampling":
        rois[:, 3:5] = rng.uniform(0.5, 4, size=(k, 2)) / scale
    if invalid is None and ratio <= 0:  # keep adaptive grids within the reference's means: about a million points
        bins = np.ceil(np.maximum(rois[:, 3] * scale, 1) / ow) * np.ceil(np.maximum(rois[:, 4] * scale, 1) / oh)
        if float(bins.sum()) * oh * ow > 1e6:
            ratio = 2
    rshape = [k, 6]
    ishape = [n, c, h, w]
    dts = dict(input=dtype, rois=dtype)
    row = col = None
    if invalid in ("nonfinite", "batch_index", "negative_size", "grid_too_big"):
        k = max(k, 1)
        if rois.shape[0] == 0:
            rois = np.array([[0, span_x / 2, span_y / 2, 1.0, 1.0, 0.0]])
        rshape = [k, 6]
        row = int(rng.integers(k))
        rois[:row, 0] = np.clip(rois[:row, 0], 0, n - 1)
        if invalid == "nonfinite":
            j = int(rng.integers(1, 6))
            col = RAR_COLUMNS[j]
            rois[row, j] = pick(rng, [math.nan, math.inf, -math.inf])
        elif invalid == "batch_index":
            rois[row, 0] = pick(rng, [-1.0, float(n), n + 1.0, 0.5, n - 0.5, 1e30, -1e30, math.nan, math.inf])
        elif invalid == "negative_size":
            aligned = True
            rois[row, 3 + int(rng.integers(2))] = -float(rng.uniform(0.01, 5))
        else:  # an adaptive grid of more than 65536 points per bin
            ratio = pick(rng, [0, -1])
            if rng.random() < 0.5 or dtype == torch.float16:
                rois[row, 3:5] = big(dtype, 1e9)
            else:
                rois[row, 3 + int(rng.integers(2))] = 1e9
        rows_after = rois[row + 1:]  # later rows stay valid: the message names the first bad row
        rows_after[:, 1:5] = np.nan_to_num(rows_after[:, 1:5])
        rows_after[:, 3:5] = np.clip(np.abs(rows_after[:, 3:5]), 0, 100)
    elif invalid == "no_images":
        n, k, rshape = 0, max(k, 1), [max(k, 1), 6]
        rois = np.resize(rois, (k, 6)) if rois.size else np.array([[0, 1.0, 1.0, 1.0, 1.0, 0.0]] * k)
        rois[:, 0] = 0
        ishape = [0, c, h, w]
    elif invalid == "input_rank":
        ishape = pick(rng, [ishape[1:], ishape + [1], [h * w], []])
    elif invalid == "rois_shape":
        rshape = pick(rng, [[k, 5], [k, 7], [6], [1, k, 6], [k, 0], []])
    elif invalid == "empty_map":
        ishape = pick(rng, [[n, c, 0, w], [n, c, h, 0], [n, c, 0, 0]])
    elif invalid == "dtype_mismatch":
        dts[pick(rng, ["input", "rois"])] = pick(rng, [t for t in dtypes if t != dtype])
    elif invalid == "int_dtype":
        dts["input"] = dts["rois"] = pick(rng, [torch.int32, torch.int64])
    elif invalid == "output_size":
        bad = pick(rng, [0, -1, 1025, 2000, -2**31])
        oh, ow = (bad, ow) if rng.random() < 0.5 else (oh, bad)
    elif invalid == "spatial_scale":
        scale = pick(rng, [0.0, -0.0, math.nan, math.inf, -math.inf, -1.0])
    elif invalid == "sampling_ratio":
        ratio = pick(rng, [257, 1000, 2**31, 2**40, INT64_MAX])
    why = RAR_WHY.get(invalid)
    if why and row is not None:
        why = why.format(row=row, col=col)
    if front_end == "ort" and invalid in RAR_WHY_ORT:
        why = RAR_WHY_ORT[invalid]
    call = pick(rng, RAR_CALLS) if front_end == "torch" else "ort"

    x = torch.randn(ishape, dtype=torch.float64)
    r = torch.from_numpy(np.ascontiguousarray(rois, dtype=np.float64))
    if list(r.shape) != rshape:  # a shape the op refuses: the same numbers (or any) in that shape
        r = torch.rand(rshape, dtype=torch.float64)
    x = x.to(dts["input"]) if dts["input"].is_floating_point else (x * 4).to(dts["input"])
    r = r.to(dts["rois"]) if dts["rois"].is_floating_point else r.to(dts["rois"])
    values = [x, r, oh, ow, scale, ratio, aligned, clockwise]
    shown = r.double().flatten()[:24].tolist() if r.dim() == 2 and r.shape[1] == 6 and r.numel() else list(r.shape)
    desc = (f"dtype={str(dtype)[6:]} input={list(x.shape)} rois={list(r.shape)} output_size=({oh}, {ow}) "
            f"spatial_scale={scale} sampling_ratio={ratio} aligned={aligned} clockwise={clockwise} invalid={invalid} "
            f"edge={edge} call={call} rois_values={[round(v, 4) for v in shown]}"
            + (f" dtypes={ {k: str(v)[6:] for k, v in dts.items()} }" if invalid in ("dtype_mismatch", "int_dtype")
               else ""))
    return desc, values, invalid, why, edge, call


def rar_reference(values, x=None):
    """opforge.ops.roi_align_rotated._reference (numpy, float64) on the op's arguments (x: another input)."""
    from opforge.ops.roi_align_rotated import _reference

    inp, rois, oh, ow, scale, ratio, aligned, clockwise = values
    x = inp.detach() if x is None else x
    (out,) = _reference(x.double().numpy(), rois.double().numpy(), output_height=oh, output_width=ow,
                        spatial_scale=scale, sampling_ratio=ratio, aligned=aligned, clockwise=clockwise)
    return torch.from_numpy(out)


def rar_unstable_bins(values):
    """(K, oh, ow) bool: the bins whose value depends on float rounding, so that the kernels (which compute in
    float32 for every dtype but float64) and the float64 reference may rightly differ: a sampling point within
    rounding of the border of [-1, H] x [-1, W] (inside it samples the edge pixels, outside nothing), or an adaptive
    grid whose bin size is within rounding of an integer (the grid is ceil(bin size) points)."""
    inp, rois, oh, ow, scale, ratio, aligned, clockwise = values
    h, w = inp.shape[2], inp.shape[3]
    rel = 1e-9 if inp.dtype == torch.float64 else 2e-5
    scale = float(np.float32(scale))
    unstable = np.zeros((rois.shape[0], oh, ow), dtype=bool)
    for k, (_, cx, cy, rw, rh, theta) in enumerate(rois.double().numpy()):
        theta = -theta if clockwise else theta
        off = 0.5 if aligned else 0.0
        cx, cy, rw, rh = cx * scale - off, cy * scale - off, rw * scale, rh * scale
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        eps = rel * (1 + abs(cx) + abs(cy) + abs(rw) + abs(rh))
        bin_h, bin_w = rh / oh, rw / ow
        if ratio <= 0 and inp.dtype != torch.float64:  # the bin sizes as the float32 kernels compute them
            f32 = np.float32
            size32 = [f32(v) * f32(scale) for v in rois[k, 3:5].double().numpy()]
            size32 = [v if aligned else max(v, f32(1)) for v in size32]
            if math.ceil(size32[0] / f32(ow)) != math.ceil(bin_w) or math.ceil(size32[1] / f32(oh)) != math.ceil(bin_h):
                unstable[k] = True
                continue
        gh = ratio if ratio > 0 else int(math.ceil(bin_h))
        gw = ratio if ratio > 0 else int(math.ceil(bin_w))
        if gh * gw == 0:
            continue
        yy = -rh / 2 + (np.arange(oh)[:, None] * bin_h + (np.arange(gh)[None, :] + 0.5) * bin_h / gh)
        xx = -rw / 2 + (np.arange(ow)[:, None] * bin_w + (np.arange(gw)[None, :] + 0.5) * bin_w / gw)
        yy, xx = yy[:, :, None, None], xx[None, None, :, :]
        py = yy * math.cos(theta) - xx * math.sin(theta) + cy
        px = yy * math.sin(theta) + xx * math.cos(theta) + cx
        near = ((np.abs(py + 1) < eps) | (np.abs(py - h) < eps)) & (px >= -1 - eps) & (px <= w + eps)
        near |= ((np.abs(px + 1) < eps) | (np.abs(px - w) < eps)) & (py >= -1 - eps) & (py <= h + eps)
        unstable[k] = near.any(axis=(1, 3))
    return torch.from_numpy(unstable)


def rar_grid_points(values):
    """The most sampling points any bin has (ceil(bin size) per axis when adaptive)."""
    inp, rois, oh, ow, scale, ratio, aligned, clockwise = values
    if ratio > 0 or not rois.shape[0]:
        return ratio * ratio
    sizes = rois[:, 3:5].double() * float(np.float32(scale))
    sizes = sizes if aligned else sizes.clamp(min=1.0)
    return int(((sizes[:, 0] / ow).ceil() * (sizes[:, 1] / oh).ceil()).max())


def rar_layout(t, edge):
    if edge == "channels_last" and t.dim() == 4:
        return t.to(memory_format=torch.channels_last)
    if edge == "strided" and t.dim() >= 1:  # every other element of a wider tensor (the rois too)
        return torch.stack([t, t], dim=-1)[..., 0]
    return t


def run_rar_torch(values, edge, call, valid, rng):
    x = values[0]
    grad = valid and x.dtype in (torch.float32, torch.float64) and rng.random() < 0.5
    if grad:
        values = [values[0].detach().clone().requires_grad_()] + values[1:]
    inp, rois = rar_layout(values[0], edge), rar_layout(values[1], edge)
    oh, ow, scale, ratio, aligned, clockwise = values[2:]
    if call == "op":
        y = torch.ops.opforge.roi_align_rotated(inp, rois, *values[2:])
    elif call == "function":
        y = opforge.RoIAlignRotatedFunction.apply(inp, rois, (oh, ow), scale, ratio, aligned, clockwise)
    elif call == "module":
        y = opforge.RoIAlignRotated((oh, ow), scale, ratio, aligned, clockwise)(inp, rois)
    else:
        y = opforge.roi_align_rotated(inp, rois, (oh, ow), scale, ratio, aligned, clockwise)
    return y, grad, values


# ---- nms_rotated / batched_nms_rotated -------------------------------------------------------------

NMS_INVALID = ["nonfinite", "nan_score", "boxes_shape", "scores_shape", "idxs_shape", "idxs_dtype", "threshold",
               "dtype_mismatch", "int_dtype"]
NMS_WHY = {
    "nonfinite": r"boxes row {row} has a non-finite {col}", "nan_score": r"scores\[{row}\] is NaN",
    "boxes_shape": r"boxes must be 2-D \(N, 5\)", "scores_shape": r"scores must be 1-D \(N,\)",
    "idxs_shape": r"idxs must be 1-D \(N,\)", "idxs_dtype": "idxs (has dtype|must hold integer)",
    "threshold": r"iou_threshold must be in \[0, 1\]", "dtype_mismatch": "scores has dtype .* but boxes has dtype",
    "int_dtype": "boxes has dtype",
}
NMS_WHY_ORT = {"dtype_mismatch": "share one element type", "int_dtype": "which it does not take",
               "idxs_dtype": "which it does not take"}
NMS_EDGES = ["none", "none", "none", "empty", "single", "ties", "duplicates", "degenerate", "huge_angle", "huge_coords",
             "far_boxes", "threshold_0", "threshold_1", "many_classes", "right_angles", "grid_aligned", "inf_scores",
             "nested", "many_boxes", "many_blocks", "strided"]
NMS_COLUMNS = ["cx", "cy", "w", "h", "angle"]
NMS_GREEDY_MAX = 16  # boxes up to which nms_check also runs _greedy (all pairs: ~0.2 ms each)


def nms_case(rng, front_end):
    """(description, values, invalid, why, edge, call): values are the torch op's arguments (nms_rotated's, or
    batched_nms_rotated's when there are idxs)."""
    dtypes = [torch.float32] * 3 + [torch.float64, torch.float16] + ([torch.bfloat16] if front_end == "torch" else [])
    dtype = pick(rng, dtypes)
    batched = bool(rng.random() < 0.5)
    n = int(rng.integers(2, 13))
    threshold = pick(rng, [float(rng.uniform(0.05, 0.95)), 0.5, 0.3, 0.7, 0.1])
    invalid = pick(rng, [v for v in NMS_INVALID if batched or not v.startswith("idxs")]) if rng.random() < 0.3 else None
    edges = [e for e in NMS_EDGES if (batched or e != "many_classes") and (front_end == "torch" or e != "strided")]
    edge = pick(rng, edges) if invalid is None else "none"
    if edge == "empty":
        n = 0
    elif edge == "single":
        n = 1
    elif edge == "many_boxes":
        n = int(rng.integers(30, 61))
    elif edge == "many_blocks":  # past the CPU kernel's blocks of 64 visited boxes, and its tasks of 256 (threads)
        n = int(rng.integers(65, 200)) if rng.random() < 0.7 else int(rng.integers(321, 420))
    elif edge == "threshold_0":
        threshold = 0.0
    elif edge == "threshold_1":
        threshold = 1.0
    # boxes in one to three clusters, so that many overlap (many boxes: more clusters, further apart)
    centres = rng.uniform(0, 30, size=(int(rng.integers(1, 4)), 2)) if n < 30 else \
        rng.uniform(0, 80, size=(int(rng.integers(3, 9)), 2)) if n <= 60 else \
        rng.uniform(0, 40 * math.sqrt(n), size=(n // 4, 2))  # clusters of about four boxes, scattered
    boxes = np.concatenate([centres[rng.integers(len(centres), size=n)] + rng.normal(0, 1.5, size=(n, 2)),
                            rng.uniform(1, 6, size=(n, 2)), rng.uniform(-math.pi, math.pi, size=(n, 1))], axis=1)
    scores = rng.random(n)
    labels = rng.integers(0, int(rng.integers(1, 4)), size=n)
    some = rng.random(n) < 0.4
    if n:
        some[int(rng.integers(n))] = True
    if edge == "ties":
        scores = rng.choice([0.2, 0.5, 0.5, 0.9], size=n)
    elif edge == "duplicates":  # exact copies of other rows, with the same score or not
        src = rng.integers(n, size=n)
        boxes[some] = boxes[src[some]]
        if rng.random() < 0.5:
            scores[some] = scores[src[some]]
        labels[some] = labels[src[some]] if rng.random() < 0.7 else labels[some]
    elif edge == "degenerate":  # w or h zero or negative: never suppresses, never suppressed
        boxes[some, 2 + int(rng.integers(2))] = pick(rng, [0.0, -1.0, -0.0, -1e-3])
    elif edge == "huge_angle":
        boxes[some, 4] = [big(dtype, pick(rng, [1e30, -1e30, 1e20, 3e38])) for _ in range(int(some.sum()))]
    elif edge == "huge_coords":  # the whole scene scaled (IoU does not change); float64 past ~1e154 and below
        # ~1e-154, where products of coordinates leave its range (the kernels scale such pairs first)
        boxes[:, :4] *= 2000.0 if dtype == torch.float16 else \
            pick(rng, [1e29, 1e15, 3e36] + ([1e160, 1e300, 1e-170, 1e-300] if dtype == torch.float64 else []))
    elif edge == "far_boxes":  # some boxes far away, each at its own place
        far = 3e4 if dtype == torch.float16 else pick(rng, [1e30, 1e20])
        step = 2e3 if dtype == torch.float16 else far
        where = np.flatnonzero(some)
        boxes[where, int(rng.integers(2))] = far * pick(rng, [1, -1]) + step * np.arange(len(where))
    elif edge == "right_angles":
        boxes[:, 4] = rng.integers(-4, 5, size=n) * (math.pi / 2)
    elif edge == "grid_aligned":  # integer corners, axis-aligned: shared edges and touching boxes
        boxes[:, :4] = np.round(boxes[:, :4])
        boxes[:, 2:4] = np.maximum(boxes[:, 2:4], 1) * 2
        boxes[:, 4] = 0.0
    elif edge == "inf_scores":
        scores[some] = rng.choice([math.inf, -math.inf], size=int(some.sum()))
    elif edge == "nested":  # boxes inside others (same centre and angle, smaller)
        src = rng.integers(n, size=n)
        boxes[some] = boxes[src[some]]
        boxes[some, 2:4] *= rng.uniform(0.2, 1.0, size=(int(some.sum()), 1))
    elif edge == "many_classes":
        labels = rng.choice([0, 1, -1, 999, 2**40, 2**62, -2**63, INT64_MAX], size=n) if rng.random() < 0.5 else \
            rng.integers(0, 1000, size=n)
    shapes = dict(boxes=[n, 5], scores=[n], idxs=[n])
    dts = dict(boxes=dtype, scores=dtype, idxs=torch.int64)
    row = col = None
    call = pick(rng, ["op", "wrapper"] + (["wrapper_float_idxs"] if batched else [])) if front_end == "torch" else "ort"
    if call == "wrapper_float_idxs" and (invalid is not None or np.abs(labels).max(initial=0) >= 2**24):
        call = "wrapper"
    if invalid in ("nonfinite", "nan_score"):
        n = max(n, 1)
        if boxes.shape[0] == 0:
            boxes, scores, labels = np.array([[0, 0, 1.0, 1.0, 0.0]]), np.array([0.5]), np.array([0])
        shapes = dict(boxes=[n, 5], scores=[n], idxs=[n])
        row = int(rng.integers(n))
        boxes[row + 1:] = np.nan_to_num(boxes[row + 1:])  # only the row named is bad
        if invalid == "nonfinite":
            j = int(rng.integers(5))
            col = NMS_COLUMNS[j]
            boxes[row, j] = pick(rng, [math.nan, math.inf, -math.inf])
        else:
            scores[row] = math.nan
    elif invalid == "boxes_shape":
        shapes["boxes"] = pick(rng, [[n, 4], [n, 6], [n], [1, n, 5], [5 * n], []])
    elif invalid == "scores_shape":
        shapes["scores"] = pick(rng, [[n + 1], [n, 1], [1, n]] + ([[n - 1]] if n else []) + ([[]] if n != 1 else []))
    elif invalid == "idxs_shape":
        shapes["idxs"] = pick(rng, [[n + 1], [n, 1], [1, n]] + ([[n - 1]] if n else []) + ([[]] if n != 1 else []))
    elif invalid == "idxs_dtype":
        if call == "wrapper" or rng.random() < 0.5:  # float idxs reach the kernels: values no int64 holds
            dts["idxs"] = pick(rng, [torch.float32, torch.float64, torch.float16])
            labels = labels + pick(rng, [0.5, -0.25, 1e19, 2.0**63, 1e30, math.inf, -math.inf, math.nan])
        else:  # the wrapper converts these (exactly); the op and ORT take int64 and float idxs only
            dts["idxs"] = pick(rng, [torch.int32, torch.uint8, torch.bool])
    elif invalid == "threshold":
        threshold = pick(rng, [-0.5, 2.0, math.nan, math.inf, -math.inf, -1e-3, 1.5])
    elif invalid == "dtype_mismatch":
        dts[pick(rng, ["boxes", "scores"])] = pick(rng, [t for t in dtypes if t != dtype])
    elif invalid == "int_dtype":
        dts["boxes"] = dts["scores"] = pick(rng, [torch.int32, torch.int64])
    why = NMS_WHY.get(invalid)
    if why and row is not None:
        why = why.format(row=row, col=col)
    float_idxs = invalid == "idxs_dtype" and dts["idxs"].is_floating_point  # refused by the kernel, as in torch
    if front_end == "ort" and invalid in NMS_WHY_ORT and not float_idxs:
        why = NMS_WHY_ORT[invalid]

    def make(name, data):
        t = torch.from_numpy(np.asarray(data, dtype=np.float64))
        if list(t.shape) != shapes[name]:  # a shape the op refuses: the same numbers (or any) in that shape
            t = t.reshape(shapes[name]) if t.numel() == math.prod(shapes[name]) else torch.rand(shapes[name])
        if name == "idxs":
            return t.to(dts[name]) if dts[name].is_floating_point else t.to(torch.int64).to(dts[name])
        return t.to(dts[name]) if dts[name].is_floating_point else (t * 4).to(dts[name])

    values = [make("boxes", boxes), make("scores", scores)]
    if batched:
        values.append(torch.from_numpy(labels) if dts["idxs"] == torch.int64 and shapes["idxs"] == [n]
                      else make("idxs", labels))
    values.append(threshold)
    shown = values[0].double().flatten()[:20].tolist()
    desc = (f"{'batched_' if batched else ''}nms_rotated dtype={str(dtype)[6:]} boxes={list(values[0].shape)} "
            f"scores={list(values[1].shape)} " + (f"idxs={list(values[2].shape)} " if batched else "")
            + f"iou_threshold={threshold} invalid={invalid} edge={edge} call={call} "
            f"boxes_values={[float(f'{v:.4g}') for v in shown]}"
            + (f" dtypes={ {k: str(v)[6:] for k, v in dts.items()} }"
               if invalid in ("dtype_mismatch", "int_dtype", "idxs_dtype") else ""))
    return desc, values, invalid, why, edge, call


def nms_check(keep, values):
    """keep (the op's result) against the greedy algorithm with opforge.ops.nms_rotated's numpy IoU (float64, by
    another construction than the kernels'), two ways. The replay: walking the boxes by decreasing score (ties:
    lower index first), keep must hold exactly the boxes whose IoU with every box kept before them (of their
    category) is <= threshold, up to ties (|IoU - threshold| <= 1e-9, either way); boxes whose circumscribed
    circles are apart are not compared (IoU 0). And for N <= NMS_GREEDY_MAX, keep must equal _greedy's answer
    unless the replay met a tie. Returns "exact" or "tie"."""
    from opforge.ops.nms_rotated import _greedy, _iou

    boxes, scores = values[0].double().numpy(), values[1].double().numpy()
    labels = values[2].numpy() if len(values) == 4 else None
    threshold = float(np.float32(values[-1]))
    if keep.dtype != torch.int64 or keep.dim() != 1:
        raise CaseFailure(f"result has dtype {keep.dtype} and shape {list(keep.shape)}, not int64 (n,)")
    got = keep.tolist()
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    position = {i: p for p, i in enumerate(order)}
    if len(set(got)) != len(got) or any(i not in position for i in got) or \
            [position[i] for i in got] != sorted(position[i] for i in got):
        raise CaseFailure(f"kept {got}: not distinct boxes in decreasing score")
    radius = 0.5 * np.hypot(boxes[:, 2], boxes[:, 3])
    chosen, kept, tie = set(got), [], False
    for i in order:
        others = np.array(kept, dtype=np.int64)
        if labels is not None:
            others = others[labels[others] == labels[i]]
        others = others[np.hypot(boxes[others, 0] - boxes[i, 0], boxes[others, 1] - boxes[i, 1])
                        <= (radius[others] + radius[i]) * (1 + 1e-6)]
        top = max((_iou(boxes[j], boxes[i]) for j in others), default=0.0)
        tie = tie or (len(others) > 0 and abs(top - threshold) <= 1e-9)
        if i in chosen and top > threshold + 1e-9:
            raise CaseFailure(f"kept {got}: box {i} is kept though its IoU with a kept box is {top!r} > {threshold!r}")
        if i not in chosen and not top > threshold - 1e-9:
            raise CaseFailure(f"kept {got}: box {i} is dropped though its IoU with every kept box is <= {top!r} "
                              f"(threshold {threshold!r})")
        if i in chosen:
            kept.append(i)
    if len(scores) <= NMS_GREEDY_MAX:
        want = _greedy(boxes, scores, labels, values[-1]).tolist()
        if got != want and not tie:
            raise CaseFailure(f"kept {got}, opforge.ops.nms_rotated._greedy {want}")
    return "tie" if tie else "exact"


def run_nms_torch(values, edge, call):
    with ms_threads("many_queries" if values[0].dim() == 2 and values[0].shape[0] > 320 else edge):  # tasks split
        return run_nms_torch_call(values, edge, call)


def run_nms_torch_call(values, edge, call):
    if edge == "strided":
        values = [torch.stack([v, v], dim=-1)[..., 0] if isinstance(v, torch.Tensor) else v for v in values]
    if len(values) == 4:
        if call == "op":
            return torch.ops.opforge.batched_nms_rotated(*values)
        idxs = values[2].double() if call == "wrapper_float_idxs" else values[2]
        return opforge.batched_nms_rotated(values[0], values[1], idxs, values[3])
    fn = torch.ops.opforge.nms_rotated if call == "op" else opforge.nms_rotated
    return fn(*values)


# ---- targets ---------------------------------------------------------------------------------------

def check_error(exc, op, front_end):
    msg = str(exc)
    if front_end == "torch" and not isinstance(exc, (ValueError, TypeError, RuntimeError)):
        raise CaseFailure(f"expected ValueError/TypeError/RuntimeError, got {type(exc).__name__}: {msg[:300]}")
    if op not in msg:
        raise CaseFailure(f"error does not name {op}: {type(exc).__name__}: {msg[:300]}")


def check_rejection(exc, invalid, why, front_end, op, ort_names):
    """An exception from a case: a valid case has failed; an invalid one must be refused with the
    right words. In torch the message starts with ``op: ``; in ORT it holds ``ort_names`` (the
    kernel's words, or ORT's own where it refuses first, e.g. an input type). ``why``: a pattern
    the message must match, when the case says why it is invalid."""
    if invalid is None:
        raise CaseFailure(f"valid case failed: {type(exc).__name__}: {str(exc)[:400]}") from exc
    check_error(exc, op + ": " if front_end == "torch" else ort_names, front_end)
    if front_end == "torch" and not str(exc).startswith(op + ": "):
        raise CaseFailure(f"error does not start with the op: {type(exc).__name__}: {str(exc)[:300]}")
    if why and not re.search(why, str(exc)):
        raise CaseFailure(f"error does not say why ({why!r}): {type(exc).__name__}: {str(exc)[:300]}")


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


def judged_case(rng, front_end, make, op_of, run_torch, ort_names, check):
    """A case of an op whose case maker says why an invalid case must fail. ``make(rng, front_end)``:
    (description, values, invalid, why, edge, call); ``op_of(values)``: the op the values call
    ("opforge::<name>"). The values run through ``run_torch(values, edge, call, valid, rng)`` -> (result,
    grad, values) or the op's one-node model in ORT (no gradient). An exception must be an invalid
    case's refusal (check_rejection; in ORT its message must hold ``ort_names(op, invalid)``); an
    invalid case must not return; a valid case's result is judged by ``check(result, grad, values,
    edge)``, which returns the outcome."""
    desc, values, invalid, why, edge, call = make(rng, front_end)
    yield desc
    op = op_of(values)
    try:
        if front_end == "torch":
            y, grad, values = run_torch(values, edge, call, invalid is None, rng)
        else:
            y, grad = run_in_ort(find(op), values), False
    except Exception as e:  # noqa: BLE001 (any exception is judged here)
        check_rejection(e, invalid, why, front_end, op, ort_names(op, invalid))
        yield "rejected"
        return
    if invalid is not None:
        raise CaseFailure(f"invalid case ({invalid}) returned a result of shape {list(y.shape)} "
                          f"({y.detach().flatten()[:20].tolist()}) instead of an error")
    yield check(y, grad, values, edge)


def ms_deform_check(y, grad, values, edge):
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
    return f"ok {edge}" + (" +grad" if grad else "")


def case_ms_deform_attn(rng, front_end):
    # ORT: the kernels' message too, or the front end's when it refuses a dtype
    return judged_case(rng, front_end, ms_deform_case, lambda values: "opforge::ms_deform_attn", run_ms_deform_torch,
                       lambda op, invalid: op[9:] if invalid == "dtype_mismatch" else op, ms_deform_check)


def rar_check(y, grad, values, edge):
    dtype = values[0].dtype
    if y.dtype != dtype:
        raise CaseFailure(f"output has dtype {y.dtype}, inputs {dtype}")
    want = rar_reference(values)
    unstable = rar_unstable_bins(values)[:, None].expand(want.shape)  # (K, 1, oh, ow) -> (K, C, oh, ow)
    got = y.detach().double()
    if got.shape == want.shape:
        got, want = got.masked_fill(unstable, 0.0), want.masked_fill(unstable, 0.0)
    # a bin is the mean of up to 65536 points, summed in float32 (16-bit inputs too): rounding grows with them
    tol = max(tolerance(dtype), 2e-8 * rar_grid_points(values)) if dtype != torch.float64 else None
    compare(got, want, dtype, "output", tol)
    if grad:
        # the op is linear in input, so its backward is the transpose: <grad, v> = <upstream, op(v)> for any v
        # (with the reference as op). The upstream gradient is 0 on the bins rounding may decide.
        upstream = torch.randn(y.shape, dtype=torch.float64).masked_fill(unstable, 0.0)
        (y * upstream.to(dtype)).sum().backward()
        g = values[0].grad
        if g is None or g.shape != values[0].shape:
            raise CaseFailure(f"input's gradient is {None if g is None else list(g.shape)}")
        for _ in range(2 if g.numel() else 0):
            v = torch.randn(values[0].shape, dtype=torch.float64)
            lhs, rhs = float((g.double() * v).sum()), float((upstream * rar_reference(values, v)).sum())
            bound = (tol or tolerance(dtype)) * (1 + float(g.double().abs().sum()) * float(v.abs().max()))
            if abs(lhs - rhs) > bound:
                raise CaseFailure(f"grad of input: <grad, v> = {lhs:.6g}, <upstream, reference(v)> = {rhs:.6g}")
    return f"ok {edge}" + (" +grad" if grad else "") + (" (unstable bins skipped)" if unstable.any() else "")


def case_roi_align_rotated(rng, front_end):
    return judged_case(rng, front_end, rar_case, lambda values: "opforge::roi_align_rotated", run_rar_torch,
                       lambda op, invalid: op[9:] if invalid in RAR_WHY_ORT else op + ": ", rar_check)


def nms_outcome(keep, grad, values, edge):
    return f"ok {edge}" + (" (threshold ties)" if nms_check(keep, values) == "tie" else "")


def case_nms_rotated(rng, front_end):
    return judged_case(rng, front_end, nms_case,
                       lambda values: "opforge::batched_nms_rotated" if len(values) == 4 else "opforge::nms_rotated",
                       lambda values, edge, call, valid, rng: (run_nms_torch(values, edge, call), False, values),
                       lambda op, invalid: op[9:] if invalid in NMS_WHY_ORT else op + ": ", nms_outcome)


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


CASES = {"deform_conv2d": case_deform, "ms_deform_attn": case_ms_deform_attn,
         "roi_align_rotated": case_roi_align_rotated, "nms_rotated": case_nms_rotated, "my_add": case_my_add,
         "aten": case_aten}


def case_rng(seed, index):
    """The generator of case ``index`` of ``seed``: default_rng([seed, index]) alone, which seeds torch's too."""
    rng = np.random.default_rng([seed, index])
    torch.manual_seed(int(rng.integers(2**31)))
    return rng


def announce(target, seed, index, desc):
    """The CASE line, flushed before the case runs: the parent names the case that crashes or hangs."""
    print(f"CASE {target} {seed} {index}: {desc}", flush=True)


def run_case(target, seed, index):
    op, front_end = target.split(":")
    steps = CASES[op](case_rng(seed, index), front_end)
    announce(target, seed, index, next(steps))
    outcomes = list(steps)
    if len(outcomes) != 1:
        raise CaseFailure(f"case ended without an outcome: {outcomes}")
    return outcomes[0]


def command_line(doc, targets, argv, cases_help="number of cases"):
    """The fuzzers' command line (tests/fuzz_batch.py's): --target (one of ``targets``), --seed, --first,
    --cases, --case. Returns the arguments and the indices of the cases to run; torch runs on one thread."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--target", required=True, choices=targets)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first case")
    parser.add_argument("--cases", type=int, default=100, help=cases_help)
    parser.add_argument("--case", type=int, help="run only this case (reproduce a failure)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return args, [args.case] if args.case is not None else range(args.first, args.first + args.cases)


def run_batch(run_case, target, seed, indices):
    """``run_case(target, seed, index)`` (-> its outcome) for each index; a failing case prints its FAIL
    line and traceback and the batch goes on, so one batch shows every failing case. Returns the tally
    of outcomes and the number of failures."""
    tally, failures = collections.Counter(), 0
    for k in indices:
        try:
            tally[run_case(target, seed, k)] += 1
        except Exception:  # noqa: BLE001 (report and go on)
            failures += 1
            print(f"FAIL {target} {seed} {k}:\n{traceback.format_exc(limit=3)}", flush=True)
    return tally, failures


def tallied(tally):
    return ", ".join(f"{n} {what}" for what, n in sorted(tally.items()))


def main(argv=None):
    args, indices = command_line(__doc__, TARGETS, argv)
    tally, failures = run_batch(run_case, args.target, args.seed, indices)
    print("TALLY " + tallied(tally), flush=True)
    print(f"DONE {len(indices)} cases, {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
