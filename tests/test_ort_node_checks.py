"""Malformed nodes fail when ONNX Runtime creates the session, with an error naming the op and
the argument, never a crash: an omitted ("") input (the lite custom-op API would dereference
it before the kernel runs), a wrong number of inputs or outputs, a missing attribute."""

import pytest
from onnx import TensorProto

import opforge
from opforge.testing import node_model

DEFORM_ATTRS = dict(stride_h=1, stride_w=1, pad_h=0, pad_w=0, dilation_h=1, dilation_w=1, groups=1, offset_groups=1,
                    use_mask=1)
DEFORM_INPUTS = ["input", "weight", "offset", "mask", "bias"]


def _model(op, inputs, outputs=("Y",), **attrs):
    return node_model(op, [(n, TensorProto.FLOAT) for n in inputs], [(o, TensorProto.FLOAT) for o in outputs],
                      domain="opforge", **attrs)


@pytest.mark.parametrize("position", [0, 1])
def test_my_add_omitted_input(position):
    inputs = ["A", "B"]
    name = inputs[position]
    inputs[position] = ""
    with pytest.raises(Exception, match=rf'opforge::my_add: input {position} \({name}\) is omitted \(""\), but it is required'):
        opforge.ort_session(_model("my_add", inputs))


def test_my_add_wrong_arity():
    with pytest.raises(Exception, match=r"opforge::my_add: the node has 1 input\(s\); expected 2 \(A, B\)"):
        opforge.ort_session(_model("my_add", ["A"]))
    # ORT itself validates the counts it knows from the kernel definition (naming the op) before our check
    with pytest.raises(Exception, match=r"opforge::my_add(:1\) has output size 2|: the node has 2 output\(s\))"):
        opforge.ort_session(_model("my_add", ["A", "B"], outputs=("Y", "Z")))


@pytest.mark.parametrize("position", range(5), ids=DEFORM_INPUTS)
def test_deform_conv2d_omitted_input(position):
    inputs = list(DEFORM_INPUTS)
    inputs[position] = ""
    with pytest.raises(Exception, match=rf"opforge::deform_conv2d: input {position} \({DEFORM_INPUTS[position]}\) is omitted"):
        opforge.ort_session(_model("deform_conv2d", inputs, **{**DEFORM_ATTRS, "use_mask": 0}))


@pytest.mark.parametrize("missing", sorted(DEFORM_ATTRS))
def test_deform_conv2d_missing_attribute(missing):
    attrs = {k: v for k, v in DEFORM_ATTRS.items() if k != missing}
    with pytest.raises(Exception, match=rf"opforge::deform_conv2d: the node needs the int attribute '{missing}'"):
        opforge.ort_session(_model("deform_conv2d", DEFORM_INPUTS, **attrs))


def test_well_formed_nodes_still_create_sessions_and_compute():
    """The checks refuse only malformed nodes: well-formed ones make sessions that give the op's values."""
    import numpy as np
    import torch
    import torchvision

    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)
    (y,) = opforge.ort_session(_model("my_add", ["A", "B"])).run(None, {"A": a, "B": b})
    np.testing.assert_array_equal(y, 2 * a + b)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 2, 5, 5, generator=g), torch.randn(3, 2, 3, 3, generator=g)
    offset, mask, bias = torch.randn(1, 18, 3, 3, generator=g), torch.rand(1, 9, 3, 3, generator=g), torch.randn(3)
    feeds = dict(zip(DEFORM_INPUTS, (t.numpy() for t in (x, w, offset, mask, bias))))
    (y,) = opforge.ort_session(_model("deform_conv2d", DEFORM_INPUTS, **DEFORM_ATTRS)).run(None, feeds)
    want = torchvision.ops.deform_conv2d(x, offset, w, bias, mask=mask)
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-4, atol=1e-4)
