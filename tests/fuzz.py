"""Random-input fuzzing of every opforge op through torch and ONNX Runtime.

One process runs one batch of cases of one target and prints ``CASE <target> <seed> <index>:
<description>`` (flushed) before each, so when a case crashes or hangs the process, the parent
(tests/test_fuzz.py) names the case that did it. Case k of a seed is generated from
``default_rng([seed, k])`` alone: ``--case k`` reruns exactly that case.

Each case is either *valid* (the op must succeed and agree with an independent reference:
torchvision for deform_conv2d, numpy for my_add, torch itself for ATen nodes) or *invalid* (the op
must fail with an error naming the op: a Python exception in torch, an error status in ORT).
Valid cases include the edges: empty batches, empty input planes with padding, strides larger
than the input, huge / infinite / NaN offsets, channels_last and strided views.

    python tests/fuzz.py --target deform_conv2d:torch --seed 0 --first 0 --cases 100
    python tests/fuzz.py --target deform_conv2d:ort --seed 0 --case 17      # one case, verbose
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import traceback

import numpy as np
import torch

import opforge
from opforge.spec import find

from helpers import aten_model, run_in_ort  # tests/ is this script's sys.path[0]

INT64_MAX = 2**63 - 1
TARGETS = ("deform_conv2d:torch", "deform_conv2d:ort", "my_add:torch", "my_add:ort", "aten:ort")


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


CASES = {"deform_conv2d": case_deform, "my_add": case_my_add, "aten": case_aten}


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
