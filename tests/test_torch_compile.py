"""torch.compile(fullgraph=True) of every opforge op, forward and backward, with a dynamic batch:
the fake impls (the C++ shape rules on SymInts) and the registered autograd under Dynamo and AOT
autograd, matching eager. Also one of the compat checks the torch matrix runs in other torch
versions (tests/test_torch_matrix.py)."""

import pytest
import torch

import opforge


def _deform(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 4, 7, 7, generator=g, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, generator=g, requires_grad=True)
    off = torch.randn(n, 18, 7, 7, generator=g, requires_grad=True)
    mask = torch.rand(n, 9, 7, 7, generator=g, requires_grad=True)
    return x, off, w, mask


def _msda(n):
    g = torch.Generator().manual_seed(n)
    shapes = torch.tensor([[4, 4], [2, 2]])
    starts = torch.tensor([0, 16])
    value = torch.randn(n, 20, 2, 4, generator=g, requires_grad=True)
    loc = torch.rand(n, 5, 2, 2, 3, 2, generator=g, requires_grad=True)
    attn = torch.rand(n, 5, 2, 2, 3, generator=g, requires_grad=True)
    return value, shapes, starts, loc, attn


def _roi(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(2, 3, 9, 9, generator=g, requires_grad=True)
    boxes = torch.rand(n, 5, generator=g) * torch.tensor([8, 8, 4, 4, 1.0]) + torch.tensor([0, 0, 1, 1, 0])
    rois = torch.cat([torch.randint(0, 2, (n, 1), generator=g).float(), boxes], 1)
    return x, rois


CASES = {
    "my_add": (lambda n: (torch.randn(n, 3, requires_grad=True), torch.randn(3, requires_grad=True)),
               lambda a, b: opforge.my_add(a, b)),
    "deform_conv2d": (_deform, lambda x, off, w, mask: opforge.deform_conv2d(x, off, w, padding=(1, 1), mask=mask)),
    "ms_deform_attn": (_msda, lambda v, s, st, loc, attn: opforge.ms_deform_attn(v, s, st, loc, attn)),
    "roi_align_rotated": (_roi, lambda x, rois: opforge.roi_align_rotated(x, rois, (3, 3), 0.5, 2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_fullgraph_matches_eager_forward_and_backward(name):
    make, fn = CASES[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=True)
    for n in (2, 3):  # a second size: the graph is reused with a symbolic batch, not specialised
        args = make(n)
        eager = fn(*args)
        grads = torch.autograd.grad(eager.sum(), [a for a in args if a.requires_grad])
        args_c = [a.detach().requires_grad_(a.requires_grad) for a in args]
        out = compiled(*args_c)
        torch.testing.assert_close(out, eager)
        grads_c = torch.autograd.grad(out.sum(), [a for a in args_c if a.requires_grad])
        for g, gc in zip(grads, grads_c):
            torch.testing.assert_close(gc, g)


def test_compiled_nms_rotated_matches_eager():
    g = torch.Generator().manual_seed(0)
    boxes = torch.rand(40, 5, generator=g) * torch.tensor([20, 20, 6, 6, 1.0]) + torch.tensor([0, 0, 2, 2, 0])
    scores = torch.rand(40, generator=g)
    torch._dynamo.reset()
    compiled = torch.compile(lambda b, s: opforge.nms_rotated(b, s, 0.3), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(boxes, scores), opforge.nms_rotated(boxes, scores, 0.3))
