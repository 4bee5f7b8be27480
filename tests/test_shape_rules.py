"""The built-in ops' shape rules: one C++ rule per op (core::<op>_output_shapes), run by the kernels
with int64 dims and by the fake impl and ONNX shape inference through opforge.ShapeRule with
SymInt dims. These tests hold the three to each other: the same refusals with the same words, the
same output shapes, symbolic sizes under torch.export, and named dims kept by ONNX inference."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge
from opforge.ops.deform_conv2d import DEFORM_CONV2D
from opforge.ops.ms_deform_attn import MS_DEFORM_ATTN
from opforge.ops.my_add import MY_ADD
from opforge.ops.roi_align_rotated import ROI_ALIGN_ROTATED


def _dcn_args(n=2, c=4, h=8, w=8, o=6, k=3, groups=1, offset_groups=1, stride=1, pad=1, dil=1, use_mask=True,
              offset_shape=None, mask_shape=None, bias_shape=None, weight_shape=None):
    oh = (h + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    ow = (w + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    x = torch.randn(n, c, h, w)
    weight = torch.randn(*(weight_shape or (o, c // groups, k, k)))
    offset = torch.randn(*(offset_shape or (n, 2 * offset_groups * k * k, oh, ow)))
    mask = torch.rand(*(mask_shape or (n, offset_groups * k * k, oh, ow)))
    bias = torch.randn(*(bias_shape or (o,)))
    return [x, weight, offset, mask, bias, stride, stride, pad, pad, dil, dil, groups, offset_groups, use_mask]


def _msda_args(n=2, m=2, d=4, lq=5, levels=((4, 4), (2, 2)), p=3, loc_shape=None, attn_shape=None, step=64):
    spatial = torch.tensor(levels, dtype=torch.int64)
    sizes = spatial.prod(1)
    start = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
    value = torch.randn(n, int(sizes.sum()), m, d)
    loc = torch.rand(*(loc_shape or (n, lq, m, len(levels), p, 2)))
    attn = torch.rand(*(attn_shape or (n, lq, m, len(levels), p)))
    return [value, spatial, start, loc, attn, step]


def _roi_args(n=2, c=3, h=10, w=12, k=4, oh=3, ow=2, rois_shape=None, sampling_ratio=2):
    rois = torch.zeros(*(rois_shape or (k, 6)))
    if rois.dim() == 2 and rois.shape[1] == 6:
        rois[:, 1:5] = torch.tensor([5.0, 5.0, 4.0, 3.0])
    return [torch.randn(n, c, h, w), rois, oh, ow, 1.0, sampling_ratio, True, False]


# (op, arguments, the refusal's words) -- each refused by the C++ rule, so the kernel and the fake
# impl must refuse it alike.
REFUSED = [
    ("my_add", [torch.randn(2, 3), torch.randn(4)], r"shapes of a \[2, 3\] and b \[4\] are not broadcastable"),
    ("my_add", [torch.randn([1] * 17), torch.randn(1)], "at most 16 dimensions are supported, got a: 17 and b: 1"),
    ("deform_conv2d", _dcn_args(groups=3), r"groups \(3\) must divide input channels \(4\)"),
    ("deform_conv2d", _dcn_args(offset_shape=(2, 18, 7, 8)), "offset output dims do not match"),
    ("deform_conv2d", _dcn_args(mask_shape=(2, 8, 8, 8)), r"mask.shape\[1\] is not valid"),
    ("deform_conv2d", _dcn_args(bias_shape=(5,)), r"bias must have shape \[6\], got \[5\]"),
    ("deform_conv2d", _dcn_args(h=1, w=1, pad=0, offset_shape=(2, 18, 1, 1), mask_shape=(2, 9, 1, 1)),
     "output would be empty"),
    ("deform_conv2d", _dcn_args()[:5] + [0, 0, 1, 1, 1, 1, 1, 1, True], "stride must be positive"),
    ("ms_deform_attn", _msda_args(loc_shape=(3, 5, 2, 2, 3, 2)), "sampling_locations has N = 3"),
    ("ms_deform_attn", _msda_args(attn_shape=(2, 5, 2, 2, 4)), "attention_weights has P = 4"),
    ("ms_deform_attn", _msda_args(step=0), "im2col_step must be positive"),
    ("roi_align_rotated", _roi_args(rois_shape=(4, 5)), r"rois must be 2-D \(K, 6\)"),
    ("roi_align_rotated", _roi_args(oh=0), r"output_size must be in \[1, 1024\]"),
    ("roi_align_rotated", _roi_args(h=0), "empty feature map"),
]


def _op(name):
    return getattr(torch.ops.opforge, name).default


@pytest.mark.parametrize("name,args,words", REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)])
def test_kernel_and_fake_refuse_alike(name, args, words):
    with pytest.raises((RuntimeError, ValueError), match=words) as real:  # each kernel's own type
        _op(name)(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with pytest.raises(opforge.OpInputError, match=words) as fake:
            _op(name)(*fake_args)
    assert str(fake.value) == str(real.value).split("\nException raised from")[0]


ACCEPTED = [
    ("my_add", [torch.randn(4, 1, 3), torch.randn(5, 1)]),
    ("deform_conv2d", _dcn_args(stride=2, pad=0, dil=2, groups=2, offset_groups=2, use_mask=False)),
    ("deform_conv2d", _dcn_args(h=9, w=7, k=3, pad=2)),
    ("ms_deform_attn", _msda_args()),
    ("roi_align_rotated", _roi_args()),
]


@pytest.mark.parametrize("name,args", ACCEPTED, ids=[f"{a[0]}-{i}" for i, a in enumerate(ACCEPTED)])
def test_fake_sizes_as_the_kernel(name, args):
    real = _op(name)(*args)
    with FakeTensorMode() as mode:
        fake = _op(name)(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert fake.shape == real.shape and fake.dtype == real.dtype


def test_export_sizes_are_symbolic_through_the_cpp_rule():
    class Model(torch.nn.Module):
        def forward(self, x, offset, weight, bias, mask):
            return torch.ops.opforge.deform_conv2d(x, weight, offset, mask, bias, 2, 2, 1, 1, 1, 1, 1, 1, True)

    x, weight, offset, mask, bias = _dcn_args(n=2, h=16, w=12, stride=2)[:5]
    n, h, w = torch.export.Dim("n"), torch.export.Dim("h", min=4), torch.export.Dim("w", min=4)
    oh, ow = torch.export.Dim("oh", min=2), torch.export.Dim("ow", min=2)
    ep = torch.export.export(Model(), (x, offset, weight, bias, mask),
                             dynamic_shapes=({0: n, 2: h, 3: w}, {0: n, 2: oh, 3: ow}, None, None,
                                             {0: n, 2: oh, 3: ow}))
    out = [node for node in ep.graph.nodes if node.op == "output"][0].args[0][0].meta["val"]
    # N and the output's H and W are the C++ rule's expressions of the inputs' symbols; O is a number
    assert out.shape[1] == 6 and all(isinstance(out.shape[i], torch.SymInt) for i in (0, 2, 3))
    assert ep.module()(x, offset, weight, bias, mask).shape == (2, 6, 8, 6)
    small = _dcn_args(n=3, h=8, w=10, stride=2)
    assert ep.module()(small[0], small[2], small[1], small[4], small[3]).shape == (3, 6, 4, 5)


def _infer(spec, inputs, attrs):
    """ONNX shape inference of one opforge node: the output's dims (int, name or None)."""
    node = helper.make_node(spec.name, [name for name, _ in inputs], ["y"], domain=spec.domain, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(name, elem, shape)
                                            for name, (elem, shape) in inputs], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid(spec.domain, 1)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    (out,) = inferred.graph.output or [v for v in inferred.graph.value_info if v.name == "y"]
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
            for d in out.type.tensor_type.shape.dim]


F, I64 = TensorProto.FLOAT, TensorProto.INT64


def test_onnx_inference_keeps_named_dims_through_the_rule():
    dcn = DEFORM_CONV2D
    ints = dict(stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, groups=1, offset_groups=1)
    # stride 1, pad 1, 3x3: out H = H, out W = W, and the rule's arithmetic says so
    assert _infer(dcn, [("x", (F, ["N", 4, "H", "W"])), ("w", (F, [6, 4, 3, 3])), ("off", (F, ["N", 18, "H", "W"])),
                        ("m", (F, ["N", 9, "H", "W"])), ("b", (F, [6]))], dict(ints, use_mask=1)) == ["N", 6, "H", "W"]
    stride2 = dict(ints, stride_h=2, stride_w=2, use_mask=1)
    assert _infer(dcn, [("x", (F, ["N", 4, 16, 8])), ("w", (F, [6, 4, 3, 3])), ("off", (F, ["N", 18, 8, 4])),
                        ("m", (F, ["N", 9, 8, 4])), ("b", (F, [6]))], stride2) == ["N", 6, 8, 4]
    # stride 2 over a named H: the output size is an expression of H, and offset's own name for it
    # (OH) cannot be proven equal to it, so the rule cannot check the node: no shape rather than a
    # guessed one (onnx's inference then leaves the output's shape unknown)
    assert _infer(dcn, [("x", (F, ["N", 4, "H", 8])), ("w", (F, [6, 4, 3, 3])), ("off", (F, ["N", 18, "OH", 4])),
                        ("m", (F, ["N", 9, "OH", 4])), ("b", (F, [6]))], stride2) == []
    msda = MS_DEFORM_ATTN
    assert _infer(msda, [("v", (F, ["N", "S", 8, 32])), ("ss", (I64, ["L", 2])), ("ls", (I64, ["L"])),
                         ("loc", (F, ["N", "Q", 8, "L", 4, 2])), ("aw", (F, ["N", "Q", 8, "L", 4]))],
                  dict(im2col_step=64)) == ["N", "Q", 256]
    assert _infer(MY_ADD, [("A", (F, ["N", 1, 3])), ("B", (F, [5, 1]))], {}) == ["N", 5, 3]
    roi = ROI_ALIGN_ROTATED
    assert _infer(roi, [("x", (F, ["N", 16, "H", "W"])), ("r", (F, ["K", 6]))],
                  dict(output_height=7, output_width=5, spatial_scale=0.25, sampling_ratio=2, aligned=1,
                       clockwise=0)) == ["K", 16, 7, 5]


def test_onnx_inference_of_an_invalid_node_gives_no_shape():
    # channels 4 with groups 3: the rule refuses the node, so inference leaves the output unknown
    # (the checker and ORT say why) rather than inventing a shape
    dcn = DEFORM_CONV2D
    ints = dict(stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, groups=3, offset_groups=1)
    assert dcn.onnx_output_shapes([[2, 4, 8, 8], [6, 1, 3, 3], [2, 18, 8, 8], [2, 9, 8, 8], [6]],
                                  dict(ints, use_mask=1)) is None


def test_autograd_functions_are_built_from_the_spec():
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(opforge.MyAddFunction.apply, (a, b))
    y = opforge.MyAddFunction.apply(a, b)
    torch.testing.assert_close(y, 2 * a + b)
    assert opforge.MyAddFunction.__module__ == "opforge.ops.my_add"
    assert issubclass(opforge.MultiScaleDeformableAttnFunction, torch.autograd.Function)
    args = _msda_args()
    torch.testing.assert_close(opforge.MultiScaleDeformableAttnFunction.apply(*args), torch.ops.opforge.ms_deform_attn(*args))


def test_onnx_inference_takes_differently_named_dims_as_equal_where_the_rule_needs_them_equal():
    # The TorchScript exporter names each traced value's dynamic dims its own way: here
    # sampling_locations' N, L and last dim carry names of their own. The rule needs N equal to
    # value's N, L equal to the 2 levels and the last dim equal to 2: taken so (ORT checks at run
    # time), the output keeps value's N, the queries' name and M*D, as a valid node has them.
    shapes = [["n", "s", 4, 8], [2, 2], [2], ["n2", "q", 4, "l", 2, "xy"], ["n", "q2", 4, 2, 2]]
    (out,) = MS_DEFORM_ATTN.onnx_output_shapes(shapes, {"im2col_step": 64})
    assert out[0] == "n" and out[1] in ("q", "q2") and out[2] == 32
    # a dim the rule compares with a floor division of another (deform_conv2d's output size at
    # stride 2) cannot be taken equal: no shape
    ints = dict(stride_h=2, stride_w=2, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, groups=1, offset_groups=1)
    assert DEFORM_CONV2D.onnx_output_shapes([["N", 4, "H", 8], [6, 4, 3, 3], ["N", 18, "OH", 4], ["N", 9, "OH", 4],
                                             [6]], dict(ints, use_mask=1)) is None
    # broadcasting a named dim against a missing one keeps the name (not specialised to 1)
    assert MY_ADD.onnx_output_shapes([["batch", 3, 8, 8], [3, 1, 1]], {}) == [["batch", 3, 8, 8]]


def test_dynamo_export_with_a_dynamic_batch_of_one_stays_dynamic(tmp_path):
    # my_add's rule broadcasts size-obliviously, as torch does: exported at batch 1 with the batch
    # dynamic (the dynamo exporter traces size-obliviously), the model runs at batch 4. A rule that
    # compared the batch with 1 plainly would have specialised it to 1.
    class Model(torch.nn.Module):
        def forward(self, x, y):
            return opforge.my_add(x, y)

    x, y = torch.randn(1, 3, 4, 4), torch.randn(3, 1, 1)
    proto = opforge.export(Model(), (x, y), tmp_path / "m.onnx", dynamo=True, input_names=["x", "y"],
                           dynamic_shapes=({0: torch.export.Dim("batch")}, None))
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # named, not 1
    x4 = torch.randn(4, 3, 4, 4)
    (got,) = opforge.ort_session(proto).run(None, {"x": x4.numpy(), "y": y.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), 2 * x4 + y)
