"""opforge.testing: the generic round-trip checker, run on opforge's own ops, and shown able to fail."""

import dataclasses

import numpy as np
import pytest
import torch

from opforge.ops import DEFORM_CONV2D, MY_ADD
from opforge.spec import AttrArg, OpSpec, TensorArg
from opforge.testing import CHECKS, BadSample, Sample, check_op, not_applicable, op_tests

from helpers import deform_inputs

# ---- opforge's own ops ---------------------------------------------------------------------

MY_ADD_SAMPLES = [
    Sample(torch.randn(2, 3, 4), torch.randn(3, 4), name="broadcast-b"),
    # dim 0 of a broadcasts against b's: the batch is both (by default it would be a alone)
    Sample(torch.randn(3, 1, 4), torch.randn(3, 5, 1), batch=("a", "b"), name="broadcast-both"),
    Sample(torch.randn(2, 3), torch.randn(2, 3), name="same-shape"),  # batch by default: a and b (same shape)
]
MY_ADD_BAD = [
    BadSample(torch.randn(2, 3), torch.randn(4), match=r"my_add: shapes of [aA] \[2, 3\] and [bB] \[4\] are not broadcastable",
              name="not-broadcastable"),
    # torch names the dtypes; ORT rejects the model at load (type constraint of the node): both name the op.
    BadSample(torch.randn(3), torch.randn(3, dtype=torch.float64), match=r"my_add", name="mixed-dtypes"),
]

test_my_add = op_tests(MY_ADD, MY_ADD_SAMPLES, bad_samples=MY_ADD_BAD)


def _deform_sample(name, *, use_mask, stride, pad, dil, groups, offset_groups, **shape):
    x, weight, offset, mask, bias = deform_inputs(stride=stride, pad=pad, dil=dil, groups=groups,
                                                  offset_groups=offset_groups, offset_scale=0.7, **shape)
    if not use_mask:
        mask = torch.zeros(x.shape[0], 1, dtype=x.dtype)  # torchvision's placeholder: never read
    return Sample(x, weight, offset, mask, bias, *stride, *pad, *dil, groups, offset_groups, use_mask,
                  batch=("input", "offset", "mask"), name=name)


DEFORM_SAMPLES = [
    _deform_sample("dcnv2-groups", use_mask=True, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=2, offset_groups=2,
                   n=2, c=4, o=2, h=3, w=3, kh=2, kw=2),
    _deform_sample("dcnv1-stride-pad-dilation", use_mask=False, stride=(2, 1), pad=(0, 1), dil=(1, 2), groups=1,
                   offset_groups=1, n=2, c=2, o=2, h=5, w=4, kh=2, kw=2),
]


def _with_offset(sample, offset):
    args = list(sample.args)
    args[2] = offset
    return args


DEFORM_BAD = [
    BadSample(*_with_offset(DEFORM_SAMPLES[0], DEFORM_SAMPLES[0].args[2][:, :, :-1]),
              match=r"deform_conv2d: .*offset must have shape \[2, 16, 2, 2\]", name="offset-shape"),
    BadSample(*DEFORM_SAMPLES[0].args[:11], 3, *DEFORM_SAMPLES[0].args[12:],  # groups=3 does not divide 4 channels
              match=r"deform_conv2d: groups \(3\) must divide input channels", name="groups"),
]

# The backward op (_deform_conv2d_backward) has no autograd formula: first order only.
test_deform_conv2d = op_tests(DEFORM_CONV2D, DEFORM_SAMPLES, bad_samples=DEFORM_BAD, gradgrad=False)


# ---- an op with a float attribute (torch side only, defined here in Python) -----------------

_NS = "opforge_check_op_test"


def _scale_spec(name, compute, fake=None, grad_factor=None):
    """torch op ``<ns>::<name>(Tensor x, float alpha) = compute(x, alpha)`` and its (unregistered) spec:
    enough for the torch-side checks (opcheck, gradcheck, reference, float_attrs)."""
    def impl(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return compute(x, alpha)

    op = torch.library.custom_op(f"{_NS}::{name}", impl, mutates_args=())
    fake = fake or (lambda x, alpha: torch.empty_like(x))
    op.register_fake(fake)

    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[1]

    def backward(ctx, grad):
        factor = grad_factor(ctx.alpha) if grad_factor else float(np.float32(ctx.alpha))
        return grad * factor, None

    op.register_autograd(backward, setup_context=setup_context)
    return OpSpec(
        name=name, namespace=_NS, schema=f"{name}(Tensor x, float alpha) -> Tensor",
        args=(TensorArg("x", "X"), AttrArg("alpha", kind="float")), outputs=("Y",), doc="x * alpha",
        fake=fake, setup_context=setup_context, backward=backward,
        reference=lambda x, *, alpha: ((x.astype(np.float64) * alpha).astype(x.dtype),),
    )


def _x_times_float32(x, alpha):
    return x * float(np.float32(alpha))  # what an exported model computes: ONNX stores alpha as float32


SCALE = _scale_spec("scale", _x_times_float32)
SCALE_SAMPLES = [Sample(torch.randn(3, 4), 0.1, name="tenth"), Sample(torch.randn(5), 2.0, name="two")]
CHECKABLE_IN_TORCH = ["opcheck", "gradcheck", "reference", "float_attrs"]


def test_float_attribute_op_passes_the_torch_side_checks():
    check_op(SCALE, SCALE_SAMPLES, checks=CHECKABLE_IN_TORCH, dtypes=[torch.float32, torch.float64])


def test_float_attrs_catches_a_kernel_computing_with_the_double():
    spec = _scale_spec("scale_double", lambda x, alpha: (x.double() * alpha).to(x.dtype))
    with pytest.raises(AssertionError, match=r"check_op\[float_attrs\] opforge_check_op_test::scale_double, "
                                             r"sample 'tenth', float64, attribute 'alpha'.*ONNX stores float attributes as float32"):
        check_op(spec, SCALE_SAMPLES, checks=["float_attrs"], dtypes=[torch.float64])


def test_gradcheck_catches_a_wrong_backward():
    spec = _scale_spec("scale_bad_grad", _x_times_float32, grad_factor=lambda alpha: 2 * alpha)
    with pytest.raises(AssertionError, match=r"check_op\[gradcheck\] .*scale_bad_grad, sample 'tenth', float64: "
                                             r"torch.autograd.gradcheck failed"):
        check_op(spec, SCALE_SAMPLES, checks=["gradcheck"])


def test_opcheck_catches_a_wrong_fake_impl():
    spec = _scale_spec("scale_bad_fake", _x_times_float32, fake=lambda x, alpha: x.new_empty(x.shape[1:]))
    with pytest.raises(AssertionError, match=r"check_op\[opcheck\] .*scale_bad_fake, sample 'tenth', float32: "
                                             r"torch.library.opcheck failed"):
        check_op(spec, SCALE_SAMPLES, checks=["opcheck"])


# ---- the checker fails where it should --------------------------------------------------------


def test_reference_check_catches_a_wrong_reference():
    wrong = dataclasses.replace(MY_ADD, reference=lambda a, b: (a + b,))  # the op computes 2a + b
    with pytest.raises(AssertionError, match=r"check_op\[reference\] opforge::my_add, sample 'broadcast-b', float32: "
                                             r"torch op vs spec.reference: output 0 differs .*max abs diff"):
        check_op(wrong, MY_ADD_SAMPLES, checks=["reference"])


def test_reference_check_compares_bfloat16_in_float32():
    wrong = dataclasses.replace(MY_ADD, reference=lambda a, b: ((2 * a + b) * 1.05,))  # 5% off: beyond bf16 tolerance
    with pytest.raises(AssertionError, match=r"bfloat16: torch op vs spec.reference \(computed in float32\)"):
        check_op(wrong, MY_ADD_SAMPLES, checks=["reference"], dtypes=[torch.bfloat16])


def test_bad_sample_whose_message_does_not_match():
    bad = BadSample(torch.randn(2, 3), torch.randn(4), match="no such words", name="unmatched")
    with pytest.raises(AssertionError, match=r"check_op\[bad_inputs\] opforge::my_add, sample 'unmatched': torch raised "
                                             r"RuntimeError, but its message does not match 'no such words'"):
        check_op(MY_ADD, [], bad_samples=[bad])


def test_bad_sample_matching_torch_but_not_ort():
    # torch's message names the arguments a and b, ORT's their ONNX names A and B.
    bad = BadSample(torch.randn(2, 3), torch.randn(4), match=r"shapes of a \[2, 3\]")
    with pytest.raises(AssertionError, match=r"sample #0: ONNX Runtime failed running the session \(InvalidArgument\), "
                                             r"but its message does not match"):
        check_op(MY_ADD, [], bad_samples=[bad])


def test_bad_sample_that_is_accepted():
    with pytest.raises(AssertionError, match=r"torch accepted the bad sample"):
        check_op(MY_ADD, [], bad_samples=[BadSample(torch.randn(2, 3), torch.randn(3), match="my_add")])


def test_gradgradcheck_of_a_backward_without_autograd_says_what_to_do():
    tiny = _deform_sample("tiny", use_mask=True, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1, offset_groups=1,
                          n=1, c=1, o=1, h=2, w=2, kh=1, kw=1)
    with pytest.raises(AssertionError, match=r"check_op\[gradcheck\] opforge::deform_conv2d, sample 'tiny', float64: "
                                             r"gradgradcheck: the op's backward is not itself differentiable.*gradgrad=False"):
        check_op(DEFORM_CONV2D, [tiny], checks=["gradcheck"])
    check_op(DEFORM_CONV2D, [tiny], checks=["gradcheck"], gradgrad=False)


# ---- inapplicable checks are reported, never silently passed ---------------------------------


def test_explicit_inapplicable_check_is_a_value_error():
    with pytest.raises(ValueError, match=r"check 'float_attrs' does not apply to opforge::my_add: .*no float attribute"):
        check_op(MY_ADD, MY_ADD_SAMPLES, checks=["float_attrs"])
    with pytest.raises(ValueError, match=r"check 'bad_inputs' does not apply .*no bad samples"):
        check_op(MY_ADD, MY_ADD_SAMPLES, checks=["bad_inputs"])
    no_backward = dataclasses.replace(MY_ADD, setup_context=None, backward=None)
    with pytest.raises(ValueError, match=r"check 'gradcheck' does not apply .*not differentiable"):
        check_op(no_backward, MY_ADD_SAMPLES, checks=["gradcheck"])
    no_reference = dataclasses.replace(MY_ADD, reference=None)
    for check in ("reference", "onnx_reference"):
        with pytest.raises(ValueError, match=rf"check '{check}' does not apply .*spec.reference is None"):
            check_op(no_reference, MY_ADD_SAMPLES, checks=[check])
    with pytest.raises(ValueError, match=r"unknown check 'grad_check'"):
        check_op(MY_ADD, MY_ADD_SAMPLES, checks=["grad_check"])


def test_what_applies_to_the_builtin_ops():
    applies = {spec.name: [c for c in CHECKS if not_applicable(spec, c, samples=[None], bad_samples=[None]) is None]
               for spec in (MY_ADD, DEFORM_CONV2D)}
    assert applies == {name: [c for c in CHECKS if c != "float_attrs"] for name in ("my_add", "deform_conv2d")}
    assert not_applicable(SCALE, "float_attrs", samples=[None]) is None


def test_op_tests_skips_an_inapplicable_check_saying_why():
    test = op_tests(MY_ADD, MY_ADD_SAMPLES)
    assert [m.args for m in test.pytestmark if m.name == "parametrize"] == [("check", CHECKS)]
    with pytest.raises(pytest.skip.Exception, match=r"float_attrs: opforge::my_add has no float attribute"):
        test("float_attrs")
    with pytest.raises(pytest.skip.Exception, match=r"bad_inputs: no bad samples given"):
        test("bad_inputs")
    with pytest.raises(TypeError):
        op_tests(MY_ADD, MY_ADD_SAMPLES, grad_grad=False)  # misspelt option: an error at once, not per test


def test_samples_are_validated():
    with pytest.raises(ValueError, match=r"sample 'short' has 1 arguments, the op takes 2 \(a, b\)"):
        check_op(MY_ADD, [Sample(torch.randn(2), name="short")], checks=["reference"])
    with pytest.raises(ValueError, match=r"batch names 'c', which is not one of its tensor arguments \['a', 'b'\]"):
        check_op(MY_ADD, [Sample(torch.randn(2), torch.randn(2), batch=("c",))], checks=["export_torchscript"])
    with pytest.raises(ValueError, match=r"the batch arguments \['a', 'b'\] differ in dim 0 \(\[2, 3\]\)"):
        check_op(MY_ADD, [Sample(torch.randn(2, 3), torch.randn(3, 3), batch=("a", "b"))], checks=["export_torchscript"])
