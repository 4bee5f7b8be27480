"""opforge.DeformConv2d / opforge.deform_conv2d as drop-ins for torchvision's, and
opforge.patch_torchvision() (torchvision's own functional, module and op on opforge's
kernels). Every behaviour is checked on both APIs (the ``api`` fixture):

* forward over a grid (batch 0, 1, 33; contiguous or not; offset groups; stride,
  padding, dilation; mask and bias on or off) against a pure-PyTorch reference
  written here, and the gradients of every input against that reference;
* gradcheck for every input, with non-contiguous and channels_last masks;
* TorchScript (module and functional), torch.fx, feature extraction, FX quantization;
* torch.library.opcheck at several batch sizes;
* which inputs are accepted: the same as torchvision (a differential test), with
  RuntimeError-compatible errors carrying torchvision's phrases.
"""

import io
import os
import pickle

import pytest
import torch
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import opforge
from preloaded_python import run_python

ORIGINAL_TV_FUNCTIONAL = torchvision.ops.deform_conv2d


@pytest.fixture(params=["opforge", "patched-torchvision"])
def api(request):
    """(functional, module class) of the API under test; patched mode patches for the test."""
    if request.param == "opforge":
        yield opforge.deform_conv2d, opforge.DeformConv2d
        return
    with opforge.patch_torchvision():
        yield torchvision.ops.deform_conv2d, torchvision.ops.DeformConv2d
    assert torchvision.ops.deform_conv2d is ORIGINAL_TV_FUNCTIONAL


# ---- an independent reference: bilinear sampling with gathers, then a grouped matmul ----------

def reference_deform_conv2d(input, offset, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                            mask=None):
    """Deformable convolution written from its definition, differentiable by torch's autograd."""
    n, c, h, w = input.shape
    o, c_per_group, kh, kw = weight.shape
    groups = c // c_per_group
    oh, ow = offset.shape[-2:]
    offset_groups = offset.shape[1] // (2 * kh * kw)
    channels_per_offset_group = c // offset_groups
    base_y = (torch.arange(oh, dtype=input.dtype) * stride[0] - padding[0]).view(oh, 1)
    base_x = (torch.arange(ow, dtype=input.dtype) * stride[1] - padding[1]).view(1, ow)
    columns = []  # per input channel group: [n, cpg, kh*kw, oh*ow]
    for g in range(offset_groups):
        image = input[:, g * channels_per_offset_group:(g + 1) * channels_per_offset_group]
        image = image.reshape(n, channels_per_offset_group, h * w)
        taps = []
        for k in range(kh * kw):
            i, j = divmod(k, kw)
            y = base_y + i * dilation[0] + offset[:, 2 * (g * kh * kw + k)]
            x = base_x + j * dilation[1] + offset[:, 2 * (g * kh * kw + k) + 1]
            y0, x0 = torch.floor(y).detach(), torch.floor(x).detach()
            sample = 0
            for cy in (y0, y0 + 1):
                for cx in (x0, x0 + 1):
                    weight_yx = (1 - (y - cy).abs()) * (1 - (x - cx).abs())
                    inside = (cy >= 0) & (cy < h) & (cx >= 0) & (cx < w)
                    index = (cy.clamp(0, h - 1) * w + cx.clamp(0, w - 1)).long().view(n, 1, oh * ow)
                    values = image.gather(2, index.expand(-1, image.shape[1], -1))
                    values = values.view(n, channels_per_offset_group, oh, ow)
                    sample = sample + values * (weight_yx * inside).unsqueeze(1)
            if mask is not None:
                sample = sample * mask[:, g * kh * kw + k].unsqueeze(1)
            taps.append(sample)
        columns.append(torch.stack(taps, 2))  # [n, cpg, kh*kw, oh, ow]
    columns = torch.cat(columns, 1).view(n, groups, c_per_group * kh * kw, oh * ow)
    grouped_weight = weight.view(groups, o // groups, c_per_group * kh * kw)
    out = torch.einsum("gok,ngkp->ngop", grouped_weight, columns).reshape(n, o, oh, ow)
    if bias is not None:
        out = out + bias.view(1, o, 1, 1)
    return out


def make_inputs(n, c, o, h, w, kh, kw, stride, pad, dil, groups, offset_groups, contiguous=True, seed=0,
                dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    oh = (h + 2 * pad[0] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * pad[1] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1

    def tensor(*shape, scale=1.0, rand=False):
        if not contiguous:  # a strided view: every other column of a tensor twice as wide
            shape = (*shape[:-1], 2 * shape[-1])
        t = (torch.rand if rand else torch.randn)(*shape, generator=g, dtype=dtype) * scale
        return t if contiguous else t[..., ::2]

    x = tensor(n, c, h, w)
    weight = tensor(o, c // groups, kh, kw)
    offset = tensor(n, 2 * offset_groups * kh * kw, oh, ow, scale=1.5)
    mask = tensor(n, offset_groups * kh * kw, oh, ow, rand=True)
    bias = torch.randn(o, generator=g, dtype=dtype)
    return x, offset, weight, bias, mask


GRID = {
    "3x3-pad1": dict(c=4, o=4, h=6, w=5, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
    "offset-groups-2-groups-2": dict(c=4, o=6, h=5, w=6, kh=3, kw=2, stride=(1, 1), pad=(1, 0), dil=(1, 1), groups=2,
                                     offset_groups=2),
    "stride-2-dilation-2": dict(c=3, o=2, h=9, w=8, kh=2, kw=3, stride=(2, 1), pad=(2, 1), dil=(2, 2), groups=1,
                                offset_groups=3),
    "stride-pad-mixed": dict(c=2, o=3, h=7, w=7, kh=3, kw=3, stride=(2, 3), pad=(0, 2), dil=(1, 2), groups=1,
                             offset_groups=1),
}


@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("use_mask", [True, False], ids=["mask", "no-mask"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("batch", [0, 1, 33])
@pytest.mark.parametrize("config", list(GRID))
def test_forward_and_gradients_match_the_reference(api, config, batch, contiguous, use_mask, use_bias):
    functional, _ = api
    cfg = GRID[config]
    x, offset, weight, bias, mask = (t.requires_grad_() for t in make_inputs(batch, **cfg, contiguous=contiguous))
    kwargs = dict(bias=bias if use_bias else None, stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dil"],
                  mask=mask if use_mask else None)
    out = functional(x, offset, weight, **kwargs)
    expected = reference_deform_conv2d(x, offset, weight, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9)
    names = ["input", "offset", "weight"] + ["bias"] * use_bias + ["mask"] * use_mask
    inputs = [x, offset, weight] + [bias] * use_bias + [mask] * use_mask
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
    want = torch.autograd.grad(expected, inputs, grad_out, allow_unused=True)
    for name, g, r in zip(names, got, want):
        if r is None:  # batch 0: no path from these inputs to the empty output
            r = torch.zeros_like(g) if g is not None else None
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-8, msg=lambda m: f"grad of {name}: {m}")


def _layouts(t, layout):
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "strided":
        return torch.cat([t, t], -1)[..., ::2]
    return t


@pytest.mark.parametrize("layout", ["contiguous", "strided", "channels_last"])
@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no-mask"])
def test_gradcheck_every_input(api, layout, masked):
    functional, _ = api
    cfg = dict(c=4, o=2, h=4, w=5, kh=2, kw=3, stride=(1, 2), pad=(1, 1), dil=(1, 1), groups=2, offset_groups=2)
    x, offset, weight, bias, mask = make_inputs(2, **cfg)
    # every input in the layout (the mask too: its channels_last gradient once was wrong)
    x, offset, weight, mask = (_layouts(t, layout).detach().requires_grad_() for t in (x, offset, weight, mask))
    offset = (offset * 0.5).detach().requires_grad_()
    bias.requires_grad_()
    if masked:
        fn = lambda x, o, w, b, m: functional(x, o, w, b, stride=(1, 2), padding=1, mask=m)  # noqa: E731
        args = (x, offset, weight, bias, mask)
    else:
        fn = lambda x, o, w, b: functional(x, o, w, b, stride=(1, 2), padding=1)  # noqa: E731
        args = (x, offset, weight, bias)
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("batch", [0, 1, 2, 5])
@pytest.mark.parametrize("use_mask", [True, False], ids=["mask", "no-mask"])
def test_opcheck_at_several_batch_sizes(api, batch, use_mask):
    cfg = dict(c=4, o=2, h=5, w=6, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=2)
    x, offset, weight, bias, mask = (t.float().requires_grad_() for t in make_inputs(batch, **cfg))
    if not use_mask:
        mask = torch.zeros(batch, 1)
    op = torch.ops.opforge.deform_conv2d if api[0] is opforge.deform_conv2d else torch.ops.torchvision.deform_conv2d
    torch.library.opcheck(op.default, (x, weight, offset, mask, bias, 1, 1, 1, 1, 1, 1, 1, 2, use_mask))


# ---- TorchScript --------------------------------------------------------------------------

def test_script_the_module(api):
    _, module_class = api
    torch.manual_seed(0)
    layer = module_class(8, 8, 3, padding=1)
    scripted = torch.jit.script(layer)
    x, offset, mask = torch.randn(2, 8, 6, 7), torch.randn(2, 18, 6, 7), torch.rand(2, 9, 6, 7)
    torch.testing.assert_close(scripted(x, offset, mask), layer(x, offset, mask), rtol=0, atol=0)
    torch.testing.assert_close(scripted(x, offset), layer(x, offset), rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.jit.load(buffer)(x, offset, mask), layer(x, offset, mask), rtol=0, atol=0)


def test_script_the_functional_and_a_function_that_calls_it(api):
    functional, _ = api
    scripted = torch.jit.script(functional)
    x, offset, weight, bias, mask = make_inputs(2, **GRID["stride-2-dilation-2"])
    expected = reference_deform_conv2d(x, offset, weight, bias, stride=(2, 1), padding=(2, 1), dilation=(2, 2),
                                       mask=mask)
    torch.testing.assert_close(scripted(x, offset, weight, bias, (2, 1), (2, 1), (2, 2), mask), expected)
    torch.testing.assert_close(scripted(x, offset, weight, bias, stride=[2, 1], padding=(2, 1), dilation=2,
                                        mask=mask), expected)

    def caller(x: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return functional(x, offset, weight, stride=(2, 1), padding=(2, 1), dilation=2).relu()

    torch.testing.assert_close(torch.jit.script(caller)(x, offset, weight),
                               reference_deform_conv2d(x, offset, weight, stride=(2, 1), padding=(2, 1),
                                                       dilation=(2, 2)).relu())
    with pytest.raises(Exception, match=r"(?s)deform_conv2d.*offset.shape\[1\] is not valid|shape of the offset"):
        scripted(x, offset[:, :5], weight, bias, (2, 1), (2, 1), (2, 2), mask)


# ---- torch.fx, feature extraction, FX quantization -----------------------------------------

class DCNBlock(torch.nn.Module):
    """The DCNv2 pattern: a conv predicts offsets and mask, a deformable conv uses them."""

    def __init__(self, module_class, channels=4):
        super().__init__()
        self.offset_conv = torch.nn.Conv2d(channels, 27, 3, padding=1)
        self.deform = module_class(channels, channels, 3, padding=1)
        self.head = torch.nn.Conv2d(channels, 2, 1)

    def forward(self, x):
        offset, mask = self.offset_conv(x).split([18, 9], 1)
        return self.head(self.deform(x, offset, mask.sigmoid()).relu())


class FunctionalBlock(torch.nn.Module):
    def __init__(self, functional):
        super().__init__()
        self.functional = functional
        self.weight = torch.nn.Parameter(torch.randn(4, 4, 3, 3))

    def forward(self, x, offset):
        return self.functional(x, offset, self.weight, padding=1) * 2


def test_symbolic_trace_records_one_call(api):
    functional, module_class = api
    x = torch.randn(2, 4, 6, 6)
    for model, args in ((DCNBlock(module_class), (x,)), (FunctionalBlock(functional), (x, torch.randn(2, 18, 6, 6)))):
        traced = torch.fx.symbolic_trace(model)
        calls = [n for n in traced.graph.nodes if n.op == "call_function" and "deform_conv2d" in str(n.target)]
        assert len(calls) == 1, traced.graph
        torch.testing.assert_close(traced(*args), model(*args), rtol=0, atol=0)


def test_feature_extraction_keeps_the_module_as_a_leaf(api):
    _, module_class = api
    model = DCNBlock(module_class).eval()
    train_nodes, eval_nodes = get_graph_node_names(model)
    assert train_nodes == eval_nodes and "deform" in eval_nodes
    assert not any(name.startswith("deform.") for name in eval_nodes), eval_nodes  # not traced into
    x = torch.randn(1, 4, 6, 6)
    features = create_feature_extractor(model, return_nodes={"deform": "deform", "head": "out"})(x)
    torch.testing.assert_close(features["out"], model(x))
    offset, mask = model.offset_conv(x).split([18, 9], 1)
    torch.testing.assert_close(features["deform"], model.deform(x, offset, mask.sigmoid()))


def test_feature_extraction_counts_one_node_per_input_plus_the_op(api):
    # torchvision's own check for its ops: a wrapper that just calls the module traces to the
    # placeholders and a single leaf call
    _, module_class = api

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = module_class(4, 4, 3, padding=1)

        def forward(self, x, offset, mask):
            return self.layer(x, offset, mask)

    train_nodes, eval_nodes = get_graph_node_names(Wrapper())
    assert len(train_nodes) == len(eval_nodes) == 1 + 3, eval_nodes


def test_fx_post_training_quantization_runs(api):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    _, module_class = api
    torch.manual_seed(0)
    model = DCNBlock(module_class).eval()
    x = torch.randn(2, 4, 8, 8)
    prepared = prepare_fx(model, get_default_qconfig_mapping("x86"), example_inputs=(x,))
    for _ in range(4):
        prepared(torch.randn(2, 4, 8, 8))
    quantized = convert_fx(prepared)
    modules = [type(m).__module__ for m in quantized.modules()]
    assert any(name.startswith("torch.ao.nn.quantized") for name in modules), modules  # the convs are int8 now
    got, expected = quantized(x), model(x)
    assert got.shape == expected.shape  # int8 convs around a float deform conv: close, not equal
    assert torch.linalg.vector_norm(got - expected) < 0.15 * torch.linalg.vector_norm(expected)


# ---- which inputs are accepted: the same as torchvision ---------------------------------------

def _valid(**overrides):
    cfg = dict(c=4, o=6, h=7, w=6, kh=3, kw=2, stride=(1, 2), pad=(1, 0), dil=(1, 1), groups=2, offset_groups=2)
    cfg.update(overrides)
    n = cfg.pop("n", 2)
    x, offset, weight, bias, mask = make_inputs(n, **cfg)
    return dict(input=x, offset=offset, weight=weight, bias=bias, stride=cfg["stride"], padding=cfg["pad"],
                dilation=cfg["dil"], mask=mask)


def _with(args, **changes):
    return {**args, **changes}


def _cases():
    a = _valid()
    x, off, w, b, m = a["input"], a["offset"], a["weight"], a["bias"], a["mask"]
    f32 = _valid()
    f32 = {k: v.float() if torch.is_tensor(v) else v for k, v in f32.items()}
    return {
        "valid": a, "no-mask": _with(a, mask=None), "no-bias": _with(a, bias=None), "batch-0": _valid(n=0),
        "empty-plane-with-padding": _valid(h=0, kh=1, pad=(2, 0)), "float32": f32,
        "float16": {k: v.half() if torch.is_tensor(v) else v for k, v in f32.items()},
        "bias-1xO": _with(a, bias=b[None]), "bias-Ox1": _with(a, bias=b[:, None]),
        "bias-0d-for-one-output": (lambda v: _with(v, bias=v["bias"][0]))(_valid(o=1, groups=1)),
        "bias-float32-input-float64": _with(a, bias=b.float()),
        "bias-float64-input-float32": _with(f32, bias=b),
        "stride-int": _with(_valid(stride=(2, 2)), stride=2), "stride-list": _with(a, stride=[1, 2]),
        "offset-channels-not-a-multiple": _with(a, offset=off[:, :5]),
        "offset-channels-one-extra": _with(a, offset=torch.cat([off, off[:, :1]], 1)),
        "mask-channels": _with(a, mask=m[:, :2]), "offset-batch": _with(a, offset=off[:1]),
        "mask-batch": _with(a, mask=m[:1]), "offset-spatial": _with(a, offset=off[..., :-1]),
        "mask-spatial": _with(a, mask=m[..., :-1, :]), "input-3d": _with(a, input=x[0]),
        "input-5d": _with(a, input=x[None]), "weight-3d": _with(a, weight=w[0]), "offset-3d": _with(a, offset=off[0]),
        "mask-3d": _with(a, mask=m[0]), "mask-1d-empty": _with(a, mask=torch.zeros(0, dtype=torch.float64)),
        "weight-channels": _with(a, weight=torch.randn(6, 3, 3, 2, dtype=torch.float64)),
        "out-channels-not-divisible-by-groups": _with(a, weight=w[:5], bias=b[:5]),
        "negative-stride": _with(a, stride=(1, -1)), "negative-padding": _with(a, padding=(-1, 0)),
        "zero-dilation": _with(a, dilation=(1, 0)), "kernel-larger-than-input": _valid(h=2, kh=3, pad=(0, 0)),
        "bias-wrong-size": _with(a, bias=b[:5]), "offset-float32": _with(a, offset=off.float()),
        "weight-float32": _with(a, weight=w.float()), "mask-float32": _with(a, mask=m.float()),
        "int64-everything": {k: v.long() if torch.is_tensor(v) else v for k, v in a.items()},
        "offset-groups-over-channels": _valid(c=2, groups=1, offset_groups=4),
        "offset-groups-not-dividing-channels": _valid(c=6, groups=1, offset_groups=4),
        "stride-three-values": _with(a, stride=(1, 2, 3)), "stride-floats": _with(a, stride=(1.5, 2)),
    }


CASES = _cases()


def _outcome(fn, args):
    try:
        return "accepted", fn(**args)
    except Exception as e:  # noqa: BLE001 - the type is compared below
        return "rejected", e


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["opforge", "patched-torchvision"])
def test_accepts_and_rejects_what_torchvision_does(mode, case):
    args = CASES[case]
    theirs, theirs_result = _outcome(ORIGINAL_TV_FUNCTIONAL, args)
    if mode == "opforge":
        ours, ours_result = _outcome(opforge.deform_conv2d, args)
    else:
        with opforge.patch_torchvision():
            ours, ours_result = _outcome(torchvision.ops.deform_conv2d, args)
    assert ours == theirs, (ours_result, theirs_result)
    if ours == "accepted":
        assert ours_result.dtype == theirs_result.dtype and ours_result.shape == theirs_result.shape
        # float16: opforge accumulates in float32, torchvision in float16
        tol = dict(rtol=1e-2, atol=5e-2) if ours_result.dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours_result, theirs_result, **tol)
    else:  # one class for code written against torchvision (RuntimeError) or Python (ValueError / TypeError)
        assert isinstance(ours_result, opforge.OpInputError), repr(ours_result)
        assert isinstance(ours_result, (RuntimeError, ValueError, TypeError))
        assert "opforge::deform_conv2d" in str(ours_result)


def test_the_two_deliberate_differences_from_torchvision():
    # 1. bfloat16: torchvision has no bfloat16 kernel; opforge computes it in float32
    a = {k: v.bfloat16() if torch.is_tensor(v) else v for k, v in _valid().items()}
    with pytest.raises(RuntimeError, match="not implemented for 'BFloat16'"):
        ORIGINAL_TV_FUNCTIONAL(**a)
    expected = reference_deform_conv2d(**{k: v.double() if torch.is_tensor(v) else v for k, v in a.items()})
    torch.testing.assert_close(opforge.deform_conv2d(**a).double(), expected, rtol=2e-2, atol=5e-2)
    # 2. no input channels: torchvision's functional divides by zero inferring the groups (its op
    #    returns the bias); opforge returns the bias, as the op does
    a = _valid(c=0, groups=1, offset_groups=1)
    with pytest.raises(ZeroDivisionError):
        ORIGINAL_TV_FUNCTIONAL(**a)
    torch.testing.assert_close(opforge.deform_conv2d(**a), a["bias"].view(1, -1, 1, 1).expand(2, 6, 7, 3))


def test_wrong_sizes_raise_runtime_errors_with_torchvision_phrases(api):
    _, module_class = api
    layer = module_class(4, 4, 3, padding=1)
    x, offset, mask = torch.randn(2, 4, 5, 5), torch.randn(2, 18, 5, 5), torch.rand(2, 9, 5, 5)
    with pytest.raises(RuntimeError, match="the shape of the offset tensor at dimension 1 is not valid"):
        layer(x, offset[:, :2])
    with pytest.raises(RuntimeError, match=r"mask.shape\[1\] is not valid"):
        layer(x, offset, mask[:, :2])
    with pytest.raises(RuntimeError, match="invalid batch size of offset"):
        layer(x, offset[:1])
    with pytest.raises(ValueError, match="opforge::deform_conv2d"):  # and ValueError, for Python code
        layer(x, offset, mask[:, :2])


def test_shapes_are_checked_before_dtypes_as_torchvision_does(api):
    """torchvision's own TestDeformConv.test_wrong_sizes: a float64 input through a float32 layer
    with a wrong-sized offset or mask gets the shape error, not a dtype one."""
    functional, module_class = api
    layer = module_class(6, 2, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 1), groups=2)  # float32
    x = torch.rand(10, 6, 5, 4, dtype=torch.float64)
    offset = torch.rand(10, 2 * 2 * 3 * 2, 2, 3, dtype=torch.float64)
    mask = torch.rand(10, 2 * 3 * 2, 2, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="the shape of the offset"):
        layer(x, offset[:, :2])
    with pytest.raises(RuntimeError, match=r"mask.shape\[1\] is not valid"):
        layer(x, offset, mask[:, :2])
    with pytest.raises(RuntimeError, match=r"mask.shape\[1\] is not valid"):
        functional(x, offset, layer.weight, layer.bias, stride=(2, 1), padding=(1, 0), dilation=(2, 1), mask=mask[:, :2])
    # the raw ops (torchvision's is opforge's kernel while patched)
    raw = (x, layer.weight, offset, mask[:, :2], layer.bias, 2, 1, 1, 0, 2, 1, 2, 2, True)
    for op in (torch.ops.opforge.deform_conv2d, torch.ops.torchvision.deform_conv2d):
        with pytest.raises(RuntimeError, match=r"mask.shape\[1\] is not valid"):
            op(*raw)
    # the fake impl (torch.compile, opcheck's fake-tensor and AOT variants of that test) agrees
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) if torch.is_tensor(t) else t for t in raw]
        with pytest.raises(RuntimeError, match=r"mask.shape\[1\] is not valid"):
            torch.ops.opforge.deform_conv2d(*fake)
    # with the shapes right, the dtypes are still checked
    with pytest.raises(RuntimeError, match="weight has dtype Float but input has dtype Double"):
        torch.ops.opforge.deform_conv2d(x, layer.weight, offset, mask, layer.bias.double(), 2, 1, 1, 0, 2, 1, 2, 2, True)


def test_the_raw_op_raises_runtime_error_like_torchvision():
    x, offset, weight, bias, mask = make_inputs(2, **GRID["3x3-pad1"])
    args = (x, weight, offset[:, :5], mask, bias, 1, 1, 1, 1, 1, 1, 1, 1, True)
    with pytest.raises(RuntimeError, match=r"opforge::deform_conv2d: offset.shape\[1\] is not valid"):
        torch.ops.opforge.deform_conv2d(*args)
    with pytest.raises(RuntimeError, match=r"offset.shape\[1\] is not valid"):
        torch.ops.torchvision.deform_conv2d(*args)


# ---- the patch itself -------------------------------------------------------------------------

def _kernel_events(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        fn()
    return {e.name for e in profile.events() if "deform_conv2d" in e.name}


def test_patch_routes_the_op_module_and_functional_and_undo_restores_them():
    x, offset, weight, bias, mask = (t.requires_grad_() for t in make_inputs(2, **GRID["3x3-pad1"]))
    layer = torchvision.ops.DeformConv2d(4, 4, 3, padding=1).double()  # made before patching

    def run():
        out = torchvision.ops.deform_conv2d(x, offset, weight, bias, padding=1, mask=mask) + layer(x, offset)
        out.sum().backward()
        return out

    before = run()
    assert not any(name.startswith("opforge::") for name in _kernel_events(run))
    patch = opforge.patch_torchvision()
    try:
        assert opforge.patch_torchvision() is patch and patch.active
        assert torchvision.ops.deform_conv2d is opforge.deform_conv2d
        assert torchvision.ops.deform_conv.deform_conv2d is opforge.deform_conv2d
        assert {"opforge::deform_conv2d", "opforge::_deform_conv2d_backward"} <= _kernel_events(run)
        # a function imported before patching still calls torchvision's op, whose kernel is opforge's
        events = _kernel_events(lambda: ORIGINAL_TV_FUNCTIONAL(x, offset, weight, padding=1).sum().backward())
        assert {"torchvision::deform_conv2d", "opforge::deform_conv2d"} <= events
        torch.testing.assert_close(run(), before)
    finally:
        opforge.unpatch_torchvision()
    assert not patch.active and torchvision.ops.deform_conv2d is ORIGINAL_TV_FUNCTIONAL
    assert not any(name.startswith("opforge::") for name in _kernel_events(run))
    with pytest.raises(RuntimeError, match=r"deform_conv2d_kernel.cpp"):  # torchvision's own message again
        torch.ops.torchvision.deform_conv2d(x, weight, offset[:, :5], mask, bias, 1, 1, 1, 1, 1, 1, 1, 1, True)


def test_patched_op_keeps_torchvision_acceptance_rules_for_the_raw_op():
    x, offset, weight, bias, mask = (t.requires_grad_() for t in make_inputs(2, **GRID["3x3-pad1"]))
    ints = (1, 1, 1, 1, 1, 1, 1, 1)
    # bias of another dtype and shape: promoted like torchvision's out + bias.view(1, O, 1, 1)
    odd_bias = bias.detach().float().reshape(1, 4).requires_grad_()
    expected = torch.ops.torchvision.deform_conv2d(x, weight, offset, mask, odd_bias, *ints, True)
    expected_grads = torch.autograd.grad(expected.sum(), (x, odd_bias))
    with opforge.patch_torchvision():
        got = torch.ops.torchvision.deform_conv2d(x, weight, offset, mask, odd_bias, *ints, True)
        got_grads = torch.autograd.grad(got.sum(), (x, odd_bias))
        assert got.dtype == expected.dtype == torch.float64
        torch.testing.assert_close(got, expected)
        for g, e in zip(got_grads, expected_grads):
            assert g.shape == e.shape and g.dtype == e.dtype
            torch.testing.assert_close(g, e)
        # the mask's batch is checked even without use_mask, as torchvision does
        with pytest.raises(RuntimeError, match="invalid batch size of mask"):
            torch.ops.torchvision.deform_conv2d(x, weight, offset, torch.zeros(3, 1, dtype=torch.float64), bias,
                                                *ints, False)
    with pytest.raises(RuntimeError, match="invalid batch size of mask"):
        torch.ops.torchvision.deform_conv2d(x, weight, offset, torch.zeros(3, 1, dtype=torch.float64), bias,
                                            *ints, False)


def test_opforge_module_is_torchvisions_for_isinstance_and_pickles():
    layer = opforge.DeformConv2d(4, 6, (3, 2), stride=2, padding=(1, 0), groups=2, bias=False)
    assert isinstance(layer, torchvision.ops.DeformConv2d)
    reference = torchvision.ops.DeformConv2d(4, 6, (3, 2), stride=2, padding=(1, 0), groups=2, bias=False)
    assert repr(layer) == repr(reference)
    clone = pickle.loads(pickle.dumps(layer))
    assert type(clone) is type(layer)
    torch.testing.assert_close(clone.weight, layer.weight)


def test_import_opforge_does_not_import_torchvision():
    code = "import sys, opforge; assert 'torchvision' not in sys.modules; opforge.DeformConv2d; print('ok')"
    out = run_python(["-c", code], cwd=os.path.dirname(__file__))  # torch preloaded, torchvision not
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
