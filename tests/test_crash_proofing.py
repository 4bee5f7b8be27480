"""Regression tests for issue #10 (crash-proofing), one per finding. Items 1 and 11 (omitted
inputs, missing attributes, wrong arity: session-creation errors naming op and argument) are in
test_ort_node_checks.py; item 10 (options already holding the library) in test_op_api.py. The
random cases are in test_fuzz.py.

Every case runs through torch and through ONNX Runtime (libopforge_ort) where the op exists
there: both front ends share one validation (core::deform_conv2d_check), so both must answer
alike."""

import math

import numpy as np
import onnx
import pytest
import torch
import torchvision
from onnx import TensorProto, numpy_helper

import opforge
from opforge.spec import find
from opforge.testing import single_node_model

from helpers import aten_model, run_in_ort

DEFORM = find("deform_conv2d")
INT64_MAX = 2**63 - 1
FRONT_ENDS = ["torch", "ort"]


def run_deform(front_end, input, weight, offset, mask, bias, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1,
               offset_groups=1, use_mask=False):
    values = [input, weight, offset, mask, bias, *stride, *pad, *dil, groups, offset_groups, use_mask]
    if front_end == "torch":
        return torch.ops.opforge.deform_conv2d(*values)
    return run_in_ort(DEFORM, values)


def expect_error(front_end, match, *args, **kwargs):
    """torch: RuntimeError (as torchvision's kernel); ORT: an error status (session creation or run).
    Both name the op."""
    exc = RuntimeError if front_end == "torch" else Exception
    with pytest.raises(exc, match=r"opforge::deform_conv2d: .*" + match):
        run_deform(front_end, *args, **kwargs)


z = torch.zeros


# ---- 2. empty input plane with padding: the output is the bias -----------------------------------

@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("c,h,w", [(2, 0, 3), (2, 3, 0), (2, 0, 0), (0, 4, 4)])
def test_empty_input_plane_with_padding_gives_the_bias(front_end, c, h, w):
    weight = torch.randn(3, c, 3, 3, dtype=torch.float64)
    bias = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    oh, ow = h + 4 - 3 + 1, w + 4 - 3 + 1
    offset = torch.randn(2, 18, oh, ow, dtype=torch.float64)
    x = z(2, c, h, w, dtype=torch.float64)
    y = run_deform(front_end, x, weight, offset, z(1, 1, dtype=torch.float64), bias, pad=(2, 2))
    assert y.shape == (2, 3, oh, ow)
    torch.testing.assert_close(y, bias.view(1, 3, 1, 1).expand(2, 3, oh, ow))
    if c > 0:  # torchvision's Python wrapper divides by weight.size(1)
        torch.testing.assert_close(y, torchvision.ops.deform_conv2d(x, offset, weight, bias, padding=2))


@pytest.mark.parametrize("use_mask", [False, True])
def test_empty_input_plane_backward_is_zero_except_bias(use_mask):
    x = z(1, 2, 0, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    offset = torch.randn(1, 18, 2, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(1, 9, 2, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = opforge.deform_conv2d(x, offset, weight, bias, padding=2, mask=mask if use_mask else None)
    (y * torch.arange(y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    assert weight.grad.abs().sum() == 0 and offset.grad.abs().sum() == 0 and x.grad.shape == x.shape
    if use_mask:
        assert mask.grad.abs().sum() == 0
    torch.testing.assert_close(bias.grad, torch.arange(y.numel(), dtype=y.dtype).view_as(y).sum((0, 2, 3)))


# ---- 3, 4. overflow-checked shape rules, bounded group counts ------------------------------------

@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_offset_groups_that_wrap_2_offset_groups_kh_kw_are_rejected(front_end):
    # C = 0 divides anything; 2 * (2^62 + 1) * 1 * 1 wraps to 2 = the offset channels given
    expect_error(front_end, r"offset_groups \(4611686018427387905\) exceeds the input channels \(0\)",
                 z(1, 0, 4, 4), z(1, 0, 1, 1), z(1, 2, 4, 4), z(1, 1), z(1), offset_groups=2**62 + 1)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_padding_that_overflows_is_rejected_not_an_all_bias_output(front_end):
    expect_error(front_end, r"padding \(9223372036854775807\).* overflows int64",
                 z(1, 2, 4, 4), z(3, 2, 1, 1), z(1, 2, 4, 4), z(1, 1), z(3), pad=(INT64_MAX, 0))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_dilation_that_overflows_the_kernel_extent_is_rejected(front_end):
    expect_error(front_end, r"dilation \(4611686018427387904\).* overflows int64",
                 z(1, 2, 4, 4), z(3, 2, 3, 1), z(1, 6, 4, 4), z(1, 1), z(3), dil=(2**62, 1))


def test_weight_channels_times_groups_that_wrap_are_rejected():
    # 4 * (2^62 + 1) wraps to 4 = C; the weight holds no elements, so nothing else objects
    # (torch only: numpy refuses to create such an array, so it cannot be fed to ORT)
    expect_error("torch", r"weight.size\(1\) \* groups must equal input channels: 4611686018427387905 \* 4",
                 z(1, 4, 2, 2), z(0, 2**62 + 1, 1, 1), z(1, 2, 2, 2), z(1, 1), z(0), groups=4)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_huge_group_count_with_no_channels_fails_fast_instead_of_looping(front_end):
    # was: every check passes (0 % g == 0) and the kernel loops 2^62 times
    expect_error(front_end, r"groups \(4611686018427387904\) exceeds the input channels \(0\)",
                 z(1, 0, 4, 4), z(0, 0, 1, 1), z(1, 2, 4, 4), z(1, 1), z(0), groups=2**62)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_output_element_count_that_overflows_is_rejected(front_end):
    # N * O * oh * ow = 2^31 * 2^31 * (2^41 + 1) with every tensor empty: the allocation size would wrap
    expect_error(front_end, r"has more elements than int64 can count",
                 z(2**31, 0, 1, 1), z(2**31, 0, 1, 1), z(0, 2, 1, 1), z(1, 1), z(0), pad=(2**40, 0))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_input_plane_beyond_32_bit_sample_indices_is_rejected(front_end):
    # 12: tap corner indices are int32; a plane of 2^31 pixels or more would wrap them
    expect_error(front_end, r"input plane H x W = 65536 x 32768 exceeds the kernel's limit of 2147483647 pixels",
                 z(0, 1, 65536, 32768), z(1, 1, 1, 1), z(0, 2, 65536, 32768), z(1, 1), z(1))


# ---- 5. ORT: a 0-d bias is an error, not "no bias" read as O values -------------------------------

@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_zero_dim_bias_is_rejected(front_end):
    expect_error(front_end, r"bias must have shape \[3\], got \[\]",
                 z(1, 2, 4, 4), z(3, 2, 1, 1), z(1, 2, 4, 4), z(1, 1), torch.tensor(1.0))


# ---- 6. the ATen kernel never writes into ORT's inputs; enum arguments are range-checked ----------

@pytest.mark.parametrize("operator,overload,argument", [
    ("add_", "Tensor", "self"),     # in place: would change the caller's array / the initializer
    ("lgamma_", "", "self"),
    ("zero_", "", "self"),
    ("add", "out", "out"),          # out= overload: writes into an input buffer
    ("lgamma", "out", "out"),
])
def test_mutating_aten_overloads_are_refused_at_session_creation(operator, overload, argument):
    name = f"aten::{operator}" + (f".{overload}" if overload else "")
    with pytest.raises(Exception, match=rf"ATen op {name} writes into its argument '{argument}'.*read-only"):
        opforge.ort_session(aten_model(operator, overload, [("x", TensorProto.FLOAT)]))


def test_functional_aten_ops_leave_inputs_and_initializers_unchanged():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    weight = numpy_helper.from_array(np.full((2, 3), 2, np.float32), "w")
    sess = opforge.ort_session(aten_model("add", "Tensor", [("x", TensorProto.FLOAT)], initializers=[weight]))
    before = x.copy()
    for _ in range(3):  # an initializer changed by a run would change the next run's answer
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], before + 2)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("operator,overload,consts,match", [
    ("to", "dtype", [np.array(99, np.int64)], r"argument 1 'dtype' \(ScalarType\): 99 is not a valid ScalarType"),
    ("to", "dtype", [np.array(-1, np.int64)], r"argument 1 'dtype' \(ScalarType\): -1 is not a valid ScalarType"),
    ("contiguous", "", [np.array(42, np.int64)], r"'memory_format' \(MemoryFormat\): 42 is not a valid MemoryFormat"),
])
def test_enum_arguments_are_range_checked(operator, overload, consts, match):
    sess = opforge.ort_session(aten_model(operator, overload, [("x", TensorProto.FLOAT)], consts=consts))
    with pytest.raises(Exception, match=rf"INVALID_ARGUMENT.*{match}"):
        sess.run(None, {"x": np.ones((2, 2), np.float32)})


def test_valid_enum_argument_still_works():
    sess = opforge.ort_session(aten_model("to", "dtype", [("x", TensorProto.FLOAT)], consts=[np.array(6, np.int64)]))
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones((2, 2), np.float32)})[0], np.ones((2, 2), np.float32))


# ---- 7. the fake impl and ONNX shape inference follow the kernel's rule --------------------------

def random_deform_config(rng):
    """Shapes and attributes around the edges (kernels wider than the input, strides above the
    span, mismatched offset/mask/bias, group counts that do not divide) for fake-vs-real."""
    c = int(rng.choice([0, 1, 2, 3, 4, 6]))
    groups = int(rng.choice([1, 1, 2, 3])) if c else 1
    offset_groups = int(rng.choice([1, 1, 2, 3])) if c else 1
    kh, kw = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    h, w = int(rng.integers(0, 7)), int(rng.integers(0, 7))
    stride = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    pad = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    dil = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    o = int(rng.choice([1, 2, 3, 6]))
    cg = c // groups if c % groups == 0 else int(rng.integers(0, 3))

    def out(size, p, d, k, s):  # truncating, like the C++; may be <= 0 (then expected invalid)
        return int((size + 2 * p - (d * (k - 1) + 1)) / s) + 1
    oh, ow = max(out(h, pad[0], dil[0], kh, stride[0]), 0), max(out(w, pad[1], dil[1], kw, stride[1]), 0)
    off_c = 2 * offset_groups * kh * kw + int(rng.choice([0, 0, 0, 0, 1]))
    use_mask = bool(rng.integers(0, 2))
    n = int(rng.integers(0, 3))
    shapes = dict(input=(n, c, h, w), weight=(o, cg, kh, kw), offset=(n, off_c, oh, ow),
                  mask=(n, offset_groups * kh * kw, oh, ow) if use_mask else (1, 1),
                  bias=(o,) if rng.random() > 0.05 else ())
    attrs = (*stride, *pad, *dil, groups, offset_groups, use_mask)
    return shapes, attrs


def outcome(fn):
    try:
        return ("ok", tuple(fn().shape))
    except (ValueError, TypeError, RuntimeError) as e:
        # the kernel raises RuntimeError, the fake impl OpInputError (a RuntimeError): same class for callers
        return ("RuntimeError" if isinstance(e, RuntimeError) else type(e).__name__, str(e).split("\n")[0])


def test_fake_impl_matches_the_kernel_over_random_configurations():
    from torch._subclasses.fake_tensor import FakeTensorMode

    rng = np.random.default_rng(7)
    valid = 0
    for _ in range(300):
        shapes, attrs = random_deform_config(rng)
        real_args = [torch.randn(s) for s in shapes.values()]
        real = outcome(lambda: torch.ops.opforge.deform_conv2d(*real_args, *attrs))
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(t) for t in real_args]
            fake = outcome(lambda: torch.ops.opforge.deform_conv2d(*fake_args, *attrs))
        assert fake == real, (shapes, attrs)
        valid += real[0] == "ok"
    assert 60 < valid < 240, valid  # the generator really covers both sides


def test_onnx_shape_inference_matches_the_kernel():
    rng = np.random.default_rng(11)
    for _ in range(100):
        shapes, attrs = random_deform_config(rng)
        values = [torch.randn(s) for s in shapes.values()] + list(attrs)
        real = outcome(lambda: torch.ops.opforge.deform_conv2d(*values))
        model = single_node_model(DEFORM, values)
        for name, shape in zip(("input", "weight", "offset", "mask", "bias"), shapes.values()):
            vi = next(i for i in model.graph.input if i.name == name)
            vi.type.tensor_type.shape.Clear()
            for d in shape:
                vi.type.tensor_type.shape.dim.add().dim_value = d
        inferred = onnx.shape_inference.infer_shapes(model).graph.output[0].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inferred.shape.dim]
        if real[0] == "ok":
            assert tuple(dims) == real[1], (shapes, attrs)
        else:
            assert not inferred.HasField("shape") or None in dims, (shapes, attrs, dims)


def test_kernel_wider_than_the_padded_input_compiles_fullgraph_like_eager():
    # 3x3 input, 6x6 kernel, padding 1, stride 2: (3 + 2 - 6) / 2 truncates to 0 -> one output
    x, w, off = torch.randn(1, 1, 3, 3), torch.randn(1, 1, 6, 6), torch.randn(1, 72, 1, 1)
    fn = lambda x, o, w: opforge.deform_conv2d(x, o, w, padding=1, stride=2)  # noqa: E731
    eager = fn(x, off, w)
    torch.testing.assert_close(eager, torchvision.ops.deform_conv2d(x, off, w, padding=1, stride=2))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, fullgraph=True, backend="eager")(x, off, w), eager)


def test_fake_impls_reject_mixed_devices_like_the_kernels():
    with pytest.raises(ValueError, match=r"opforge::my_add: b is on meta but a is on cpu"):
        torch.ops.opforge.my_add(torch.ones(2), torch.ones(2, device="meta"))
    x, w, off, m, b = (torch.zeros(1, 2, 4, 4), torch.zeros(3, 2, 1, 1), torch.zeros(1, 2, 4, 4), torch.zeros(1, 1),
                       torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match=r"opforge::deform_conv2d: bias is on meta but input is on cpu"):
        torch.ops.opforge.deform_conv2d(x, w, off, m, b, 1, 1, 0, 0, 1, 1, 1, 1, False)


# ---- 8. gradients for dense non-contiguous (channels_last) arguments ------------------------------

@pytest.mark.parametrize("which", ["mask", "input", "offset", "all"])
def test_channels_last_arguments_get_correct_gradients(which):
    g = torch.Generator().manual_seed(3)
    args = dict(input=torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64),
                offset=torch.randn(2, 18, 4, 4, generator=g, dtype=torch.float64),
                weight=torch.randn(5, 4, 3, 3, generator=g, dtype=torch.float64),
                mask=torch.rand(2, 9, 4, 4, generator=g, dtype=torch.float64))
    ours = {k: (v.to(memory_format=torch.channels_last) if which in (k, "all") and v.dim() == 4 else v.clone())
            .requires_grad_() for k, v in args.items()}
    ref = {k: v.clone().requires_grad_() for k, v in args.items()}
    weights = torch.randn(2, 5, 4, 4, generator=g, dtype=torch.float64)
    (opforge.deform_conv2d(**ours) * weights).sum().backward()
    (torchvision.ops.deform_conv2d(**ref) * weights).sum().backward()
    for k in args:
        torch.testing.assert_close(ours[k].grad, ref[k].grad, msg=lambda m: f"grad of {k}: {m}")


# ---- 9. NaN offsets and masks: NaN in, NaN out (documented in the README) -------------------------

def nan_case(where):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 5, 5, generator=g, dtype=torch.float64)
    w = torch.randn(3, 2, 3, 3, generator=g, dtype=torch.float64)
    off = torch.randn(1, 18, 3, 3, generator=g, dtype=torch.float64)
    mask = torch.rand(1, 9, 3, 3, generator=g, dtype=torch.float64)
    if where == "offset_y":
        off[0, 2 * 4, 1, 2] = math.nan     # tap 4's dy at output pixel (1, 2)
    elif where == "offset_x":
        off[0, 2 * 4 + 1, 1, 2] = math.nan
    else:
        mask[0, 4, 1, 2] = math.nan
    return x, w, off, mask


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("where", ["offset_y", "offset_x", "mask"])
def test_nan_offset_or_mask_makes_exactly_that_output_pixel_nan(front_end, where):
    x, w, off, mask = nan_case(where)
    y = run_deform(front_end, x, w, off, mask, torch.zeros(3, dtype=torch.float64), use_mask=True)
    # torchvision's forward also yields NaN there where it survives the case at all (it casts
    # floor(NaN) to int, undefined behaviour: a NaN offset can crash it), so the reference for
    # the other pixels is torchvision with the NaN replaced: they do not depend on it.
    assert y.isnan().nonzero().tolist() == [[0, o, 1, 2] for o in range(3)]
    expected = torchvision.ops.deform_conv2d(x, off.nan_to_num(0.0), w, mask=mask.nan_to_num(0.5))
    keep = ~y.isnan()
    torch.testing.assert_close(y[keep], expected[keep])


@pytest.mark.parametrize("where", ["offset_y", "offset_x", "mask"])
def test_nan_gradients_stay_where_the_nan_is(where):
    """torchvision's backward is undefined for NaN offsets (it casts NaN to int; a NaN x offset
    crashes it), so this is opforge's rule: a NaN sampling point makes its own grad_offset pair and
    grad_mask NaN and adds nothing to grad_input; a NaN mask value makes its grad_offset pair and the
    grad_input at its in-image corners NaN. grad_weight is NaN through the NaN column entry. Every
    other gradient equals the one for the same point moved outside the image (offset +inf)."""
    x, w, off, mask = nan_case(where)
    ours = [t.clone().requires_grad_() for t in (x, w, off, mask)]
    opforge.deform_conv2d(ours[0], ours[2], ours[1], mask=ours[3]).sum().backward()
    gx, gw, goff, gmask = (t.grad for t in ours)
    assert goff.isnan().nonzero().tolist() == [[0, 8, 1, 2], [0, 9, 1, 2]]
    if where == "mask":
        assert gmask.isnan().sum() == 0
        assert gx.isnan().sum() > 0 and gx.isnan().sum() <= 2 * 4  # the point's corners, each channel
    else:
        assert gmask.isnan().nonzero().tolist() == [[0, 4, 1, 2]]
        assert gx.isnan().sum() == 0
    assert gw.isnan().any()
    # elsewhere: as if the point were outside the image
    off_out, mask_out = off.clone(), mask.clone()
    off_out[0, 8:10, 1, 2] = math.inf
    if where == "mask":
        mask_out[0, 4, 1, 2] = 0.0
    ref = [t.clone().requires_grad_() for t in (x, w, off_out, mask_out)]
    opforge.deform_conv2d(ref[0], ref[2], ref[1], mask=ref[3]).sum().backward()
    keep = ~goff.isnan()
    torch.testing.assert_close(goff[keep], ref[2].grad[keep])
    keep = ~gmask.isnan()
    keep[0, 4, 1, 2] = False
    torch.testing.assert_close(gmask[keep], ref[3].grad[keep])
    if where != "mask":
        torch.testing.assert_close(gx, ref[0].grad)
