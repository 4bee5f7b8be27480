"""Every public op wrapper and module of opforge compiles with ``torch.jit.script`` (detectron2's own
rotated-NMS test scripts a module that calls nms_rotated, and TorchScript models still ship), gives
eager torch's values, survives ``torch.jit.save`` / ``load``, and a bad input raises the kernel's
error naming the op. torch.compile(fullgraph=True) is tests/test_torch_compile.py's."""

import io

import pytest
import torch

import opforge

# torch 2.14 deprecates TorchScript (torch.jit.script / save / load warn on each call); scripting is what
# these tests exercise, so those warnings are expected here and not counted.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")


#: What a scripted call raises: the kernel's RuntimeError as is, an exception raised by the wrapper's
#: own TorchScript code as torch.jit.Error (with the message).
SCRIPT_ERRORS = (RuntimeError, torch.jit.Error)


def _script_round_trip(fn_or_module):
    """Scripted, saved and loaded back: what a TorchScript deployment runs."""
    scripted = torch.jit.script(fn_or_module)
    if isinstance(scripted, torch.jit.ScriptModule):
        buffer = io.BytesIO()
        torch.jit.save(scripted, buffer)
        buffer.seek(0)
        return torch.jit.load(buffer)
    return scripted


class MyAddUser(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return opforge.my_add(a, b) * 2


class MsDeformAttnUser(torch.nn.Module):
    def forward(self, value: torch.Tensor, shapes: torch.Tensor, starts: torch.Tensor, locations: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
        return opforge.ms_deform_attn(value, shapes, starts, locations, weights, 64)


class DeformConvUser(torch.nn.Module):
    def forward(self, x: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return opforge.deform_conv2d(x, offset, weight, padding=1)


def _msda_inputs(n=2, heads=2, dim=4, queries=5, points=2):
    g = torch.Generator().manual_seed(1)
    shapes = torch.tensor([[6, 8], [3, 4]])
    starts = torch.tensor([0, 48])
    value = torch.randn(n, 60, heads, dim, generator=g)
    locations = torch.rand(n, queries, heads, 2, points, 2, generator=g)
    weights = torch.rand(n, queries, heads, 2, points, generator=g)
    return value, shapes, starts, locations, weights


def test_my_add_scripted():
    a, b = torch.randn(3, 4), torch.randn(4)
    for scripted in (_script_round_trip(opforge.my_add), _script_round_trip(MyAddUser())):
        want = opforge.my_add(a, b) * (2 if isinstance(scripted, torch.jit.ScriptModule) else 1)
        torch.testing.assert_close(scripted(a, b), want)
    torch.testing.assert_close(_script_round_trip(opforge.MyAdd())(a, b), 2 * a + b)
    with pytest.raises(SCRIPT_ERRORS, match="opforge::my_add: a and b must have the same dtype"):
        _script_round_trip(MyAddUser())(a.double(), b)
    # gradients flow through the scripted call as through the eager one
    a.requires_grad_()
    _script_round_trip(MyAddUser())(a, b).sum().backward()
    torch.testing.assert_close(a.grad, torch.full_like(a, 4.0))


def test_ms_deform_attn_scripted():
    inputs = _msda_inputs()
    want = opforge.ms_deform_attn(*inputs)
    torch.testing.assert_close(_script_round_trip(opforge.ms_deform_attn)(*inputs), want)
    torch.testing.assert_close(_script_round_trip(MsDeformAttnUser())(*inputs), want)
    value, shapes, starts, locations, weights = inputs
    with pytest.raises(SCRIPT_ERRORS, match="opforge::ms_deform_attn: "):
        _script_round_trip(MsDeformAttnUser())(value, shapes, starts, locations[..., :1], weights)


@pytest.mark.parametrize("coords", [2, 4])
def test_msdeformattn_module_scripted(coords):
    torch.manual_seed(0)
    module = opforge.MSDeformAttn(d_model=8, n_levels=2, n_heads=2, n_points=2).eval()
    torch.nn.init.normal_(module.sampling_offsets.weight, std=0.1)  # not the all-zero initialisation
    shapes, starts = torch.tensor([[6, 8], [3, 4]]), torch.tensor([0, 48])
    query, flatten = torch.randn(2, 5, 8), torch.randn(2, 60, 8)
    reference = torch.rand(2, 5, 2, coords)
    scripted = _script_round_trip(module)
    torch.testing.assert_close(scripted(query, reference, flatten, shapes, starts),
                               module(query, reference, flatten, shapes, starts))
    padding = torch.zeros(2, 60, dtype=torch.bool)
    padding[:, -5:] = True
    torch.testing.assert_close(scripted(query, reference, flatten, shapes, starts, padding),
                               module(query, reference, flatten, shapes, starts, padding))
    with pytest.raises(SCRIPT_ERRORS, match="must end in 2 \\(points\\) or 4 \\(boxes\\)"):
        scripted(query, torch.rand(2, 5, 2, 3), flatten, shapes, starts)


def test_deform_conv2d_scripted():
    g = torch.Generator().manual_seed(2)
    x, offset, weight = torch.randn(2, 3, 6, 6, generator=g), torch.randn(2, 18, 6, 6, generator=g), \
        torch.randn(4, 3, 3, 3, generator=g)
    want = opforge.deform_conv2d(x, offset, weight, padding=1)
    torch.testing.assert_close(_script_round_trip(DeformConvUser())(x, offset, weight), want)
    module = opforge.DeformConv2d(3, 4, 3, padding=1)
    torch.testing.assert_close(_script_round_trip(module)(x, offset), module(x, offset))
    with pytest.raises(SCRIPT_ERRORS, match="opforge::deform_conv2d: the shape of the offset tensor"):
        _script_round_trip(DeformConvUser())(x, offset[:, :5], weight)
