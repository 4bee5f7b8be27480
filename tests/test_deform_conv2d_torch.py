"""deform_conv2d on the torch side, against torchvision.ops.deform_conv2d (forward and every gradient)."""

import os
import textwrap

import pytest
import torch
import torchvision
from torch._subclasses.fake_tensor import FakeTensorMode
from torchvision.ops import deform_conv2d as tv_deform_conv2d

import opforge
from preloaded_python import run_python
from helpers import DEFORM_CONFIGS, deform_inputs


def run_both(cfg, use_mask, use_bias, dtype=torch.float64, offset_scale=2.0, requires_grad=False):
    x, w, off, mask, b = deform_inputs(**cfg, dtype=dtype, offset_scale=offset_scale)
    tensors = [x, w, off, mask, b]
    if requires_grad:
        tensors = [t.requires_grad_() for t in tensors]
    x, w, off, mask, b = tensors
    kwargs = dict(stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dil"])
    m = mask if use_mask else None
    bias = b if use_bias else None
    ours = opforge.deform_conv2d(x, off, w, bias, mask=m, **kwargs)
    ref = tv_deform_conv2d(x, off, w, bias, mask=m, **kwargs)
    return ours, ref, (x, w, off, mask, b)


@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("use_mask", [True, False], ids=["dcnv2", "dcnv1"])
@pytest.mark.parametrize("name", list(DEFORM_CONFIGS))
def test_forward_and_gradients_match_torchvision(name, use_mask, use_bias):
    cfg = DEFORM_CONFIGS[name]
    scale = 6.0 if "big-offsets" in name else 2.0  # many samples outside the image
    ours, ref, leaves = run_both(cfg, use_mask, use_bias, offset_scale=scale, requires_grad=True)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    grad_out = torch.randn_like(ref)
    wanted = [t for i, t in enumerate(leaves) if (i != 3 or use_mask) and (i != 4 or use_bias)]
    ours_grads = torch.autograd.grad(ours, wanted, grad_out)
    ref_grads = torch.autograd.grad(ref, wanted, grad_out)
    for got, exp in zip(ours_grads, ref_grads):
        torch.testing.assert_close(got, exp, rtol=1e-9, atol=1e-9)


def test_float32_forward_matches_torchvision():
    ours, ref, _ = run_both(DEFORM_CONFIGS["multi-tile-batch-5"], True, True, dtype=torch.float32)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_computes_in_float32(dtype):
    cfg = DEFORM_CONFIGS["non-square-mixed"]
    x, w, off, mask, b = (t.to(dtype).requires_grad_() for t in deform_inputs(**cfg, dtype=torch.float32))
    kwargs = dict(stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dil"])
    out = opforge.deform_conv2d(x, off, w, b, mask=mask, **kwargs)
    assert out.dtype == dtype
    f32 = [t.detach().float().requires_grad_() for t in (x, off, w, b, mask)]
    ref = tv_deform_conv2d(f32[0], f32[1], f32[2], f32[3], mask=f32[4], **kwargs)
    torch.testing.assert_close(out, ref.to(dtype))  # one rounding of the float32 result
    g = torch.randn_like(ref).to(dtype)
    ours = torch.autograd.grad(out, (x, off, w, b, mask), g)
    refs = torch.autograd.grad(ref, f32, g.float())
    for got, exp in zip(ours, refs):
        assert got.dtype == dtype
        torch.testing.assert_close(got, exp.to(dtype))


def test_empty_batch():
    cfg = dict(DEFORM_CONFIGS["basic-3x3"], n=0)
    x, w, off, mask, b = deform_inputs(**cfg, dtype=torch.float32)
    x.requires_grad_()
    out = opforge.deform_conv2d(x, off, w, b, padding=1, mask=mask)
    assert out.shape == (0, 6, 7, 7)
    out.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("use_mask", [True, False])
def test_gradcheck_float64(use_mask):
    cfg = dict(n=1, c=4, o=2, h=5, w=5, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=2, offset_groups=2)
    x, w, off, mask, b = (t.requires_grad_() for t in deform_inputs(**cfg, offset_scale=0.7))
    fn = lambda x, off, w, b, mask: opforge.deform_conv2d(x, off, w, b, padding=1, mask=mask if use_mask else None)
    assert torch.autograd.gradcheck(fn, (x, off, w, b, mask), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("use_mask", [True, False])
def test_opcheck(use_mask):
    cfg = dict(n=2, c=4, o=2, h=5, w=6, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=2)
    x, w, off, mask, b = (t.requires_grad_() for t in deform_inputs(**cfg, dtype=torch.float32))
    if not use_mask:
        mask = torch.zeros(2, 1)
    torch.library.opcheck(torch.ops.opforge.deform_conv2d.default, (x, w, off, mask, b, 1, 1, 1, 1, 1, 1, 1, 2, use_mask))


def test_module_is_a_drop_in_for_torchvision():
    torch.manual_seed(0)
    ref = torchvision.ops.DeformConv2d(4, 8, (3, 2), stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=2)
    ours = opforge.DeformConv2d(4, 8, (3, 2), stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=2)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 9, 10)
    oh, ow = ref(x, torch.zeros(2, 12, 7, 5)).shape[-2:]
    off, mask = torch.randn(2, 12, oh, ow), torch.rand(2, 6, oh, ow)
    torch.testing.assert_close(ours(x, off, mask), ref(x, off, mask))
    torch.testing.assert_close(ours(x, off), ref(x, off))
    no_bias = opforge.DeformConv2d(4, 4, 3, bias=False)
    assert no_bias.bias is None and "bias" not in no_bias.state_dict()


def test_torch_export_with_dynamic_batch_and_spatial_dims():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = torch.nn.Conv2d(4, 18, 3, padding=1)
            self.dcn = opforge.DeformConv2d(4, 6, 3, padding=1)

        def forward(self, x):
            return self.dcn(x, self.offset(x))

    model = M().eval()
    dims = {0: torch.export.Dim("n"), 2: torch.export.Dim("h", min=4), 3: torch.export.Dim("w", min=4)}
    ep = torch.export.export(model, (torch.randn(2, 4, 8, 8),), dynamic_shapes=(dims,))
    assert torch.ops.opforge.deform_conv2d.default in [n.target for n in ep.graph.nodes]
    x = torch.randn(3, 4, 11, 6)
    torch.testing.assert_close(ep.module()(x), model(x))


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_every_cpu_isa_path_matches_torchvision(isa):
    script = textwrap.dedent(
        """
        import torch, opforge
        from torchvision.ops import deform_conv2d as tv
        from helpers import deform_inputs
        for dtype, tol in ((torch.float32, 1e-4), (torch.float64, 1e-10)):
            for cfg in (dict(n=2, c=16, o=8, h=12, w=13, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=2, offset_groups=4),
                        dict(n=1, c=64, o=33, h=20, w=21, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1)):
                x, w, off, m, b = deform_inputs(**cfg, dtype=dtype)
                ours = opforge.deform_conv2d(x, off, w, b, padding=1, mask=m)
                torch.testing.assert_close(ours, tv(x, off, w, b, padding=1, mask=m), rtol=tol, atol=tol)
        print("ok")
        """
    )
    env = dict(os.environ, OPFORGE_CPU_ISA=isa, PYTHONPATH=os.path.dirname(__file__))
    out = run_python(["-c", script], env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


# ---- bad input -----------------------------------------------------------------------

BASE = dict(n=2, c=4, o=4, h=6, w=6, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1)


def bad_cases():
    x, w, off, mask, b = deform_inputs(**BASE, dtype=torch.float32)
    args = dict(input=x, weight=w, offset=off, mask=mask, bias=b, ints=[1, 1, 1, 1, 1, 1, 1, 1], use_mask=True)
    cases = {
        "offset-channels": (dict(offset=off[:, :17]), r"offset must have shape \[2, 18, 6, 6\]"),
        "mask-shape": (dict(mask=mask[:, :, :5]), r"mask must have shape \[2, 9, 6, 6\]"),
        "groups-not-dividing": (dict(ints=[1, 1, 1, 1, 1, 1, 3, 1]), r"groups \(3\) must divide input channels \(4\)"),
        "offset-groups-not-dividing": (dict(ints=[1, 1, 1, 1, 1, 1, 1, 3]), r"offset_groups \(3\) must divide input channels \(4\)"),
        "zero-stride": (dict(ints=[0, 1, 1, 1, 1, 1, 1, 1]), r"stride must be positive, got \(0, 1\)"),
        "negative-dilation": (dict(ints=[1, 1, 1, 1, 1, -1, 1, 1]), r"dilation must be positive, got \(1, -1\)"),
        "weight-channels": (dict(weight=w[:, :3]), r"weight.size\(1\) \* groups must equal input channels: 3 \* 1 != 4"),
        "bias-shape": (dict(bias=b[:3]), r"bias must have shape \[4\], got \[3\]"),  # the op's rule: [O], exactly
        "input-rank": (dict(input=x[0]), r"input must be 4-D"),
    }
    for name, (override, msg) in cases.items():
        yield name, {**args, **override}, msg


@pytest.mark.parametrize("fake", [False, True], ids=["kernel", "fake"])
@pytest.mark.parametrize("name,args,msg", list(bad_cases()), ids=[c[0] for c in bad_cases()])
def test_bad_input_errors(name, args, msg, fake):
    call = lambda a: torch.ops.opforge.deform_conv2d(a["input"], a["weight"], a["offset"], a["mask"], a["bias"],
                                                     *a["ints"], a["use_mask"])
    # the raw op raises RuntimeError like torchvision's kernel; the fake impl the same words
    # as opforge.OpInputError, which is a RuntimeError too
    if fake:
        with FakeTensorMode() as mode:
            args = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
            with pytest.raises(opforge.OpInputError, match="opforge::deform_conv2d: .*" + msg):
                call(args)
    else:
        with pytest.raises(RuntimeError, match="opforge::deform_conv2d: .*" + msg):
            call(args)


def test_dtype_errors():
    x, w, off, mask, b = deform_inputs(**BASE, dtype=torch.float32)
    with pytest.raises(opforge.OpInputError, match="opforge::deform_conv2d: offset has dtype (Double|torch.float64) but input has dtype"):
        opforge.deform_conv2d(x, off.double(), w, b, padding=1)
    with pytest.raises(opforge.OpInputError, match="opforge::deform_conv2d: input has dtype (Int|torch.int32); supported dtypes are float32, float64, float16 and bfloat16"):
        opforge.deform_conv2d(x.int(), off.int(), w.int(), b.int(), padding=1)
