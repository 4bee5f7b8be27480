"""The torch kernels' multi-threaded paths, on purpose: every built-in op, forward and gradients,
at 2 and 3 intra-op threads (3: an uneven split on this 2-core machine) gives the 1-thread result,
and agrees with an independent reference. The rest of the suite runs each xdist worker on its
share of the cores (tests/conftest.py), so this module is where the splits are exercised; the
ORT kernels' threads are set per session in their own tests (intra_op_num_threads)."""

import pytest
import torch
from torchvision.ops import deform_conv2d as tv_deform_conv2d

import opforge
from helpers import deform_inputs
from test_ms_deform_attn import grid_sample_reference, random_inputs

THREADS = (2, 3)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _forward_and_grads(fn, inputs):
    inputs = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*inputs)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    wrt = [t for t in inputs if t.requires_grad]
    return (out.detach(), *torch.autograd.grad(out, wrt, grad_out))


def _assert_same_at_every_thread_count(threads, fn, inputs, reference):
    threads(1)
    single = _forward_and_grads(fn, inputs)
    for count in THREADS:
        threads(count)
        assert torch.get_num_threads() == count
        several = _forward_and_grads(fn, inputs)
        for k, (a, b) in enumerate(zip(single, several)):
            # Work items write disjoint outputs; only a GEMM's own threads may reorder a sum.
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=lambda m: f"{count} threads, result {k}: {m}")
    expected = _forward_and_grads(reference, inputs)
    for k, (a, e) in enumerate(zip(several, expected)):
        torch.testing.assert_close(a, e, rtol=1e-7, atol=1e-7, msg=lambda m: f"against the reference, result {k}: {m}")


def test_my_add(threads):
    # kMyAddGrain is 32768 elements: 3 x 70000 splits into several tasks.
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 70000, generator=g, dtype=torch.float64), torch.randn(70000, generator=g, dtype=torch.float64)
    _assert_same_at_every_thread_count(threads, opforge.my_add, (a, b), lambda a, b: 2 * a + b)


@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no-mask"])
def test_deform_conv2d(threads, masked):
    # 2 images of 24 x 20 outputs: several output tiles per image (forward, im2col, coordinate
    # gradients) and 8 input channels (col2im) to split.
    x, weight, offset, mask, bias = deform_inputs(n=2, c=8, o=6, h=24, w=40, kh=3, kw=3, stride=(1, 2), pad=(1, 1),
                                                  dil=(1, 1), groups=2, offset_groups=2)
    kwargs = dict(stride=(1, 2), padding=(1, 1))
    if masked:
        ours = lambda x, o, w, b, m: opforge.deform_conv2d(x, o, w, b, mask=m, **kwargs)  # noqa: E731
        ref = lambda x, o, w, b, m: tv_deform_conv2d(x, o, w, b, mask=m, **kwargs)  # noqa: E731
        inputs = (x, offset, weight, bias, mask)
    else:
        ours = lambda x, o, w, b: opforge.deform_conv2d(x, o, w, b, **kwargs)  # noqa: E731
        ref = lambda x, o, w, b: tv_deform_conv2d(x, o, w, b, **kwargs)  # noqa: E731
        inputs = (x, offset, weight, bias)
    _assert_same_at_every_thread_count(threads, ours, inputs, ref)


def test_ms_deform_attn(threads):
    # 2 x 300 queries: the forward's grain (about 32k multiply-adds a task) gives several tasks;
    # the backward splits over batch x heads.
    inputs = random_inputs(n=2, lq=300, m=2, d=8, sizes=((12, 10), (6, 5), (3, 3)), p=2)
    _assert_same_at_every_thread_count(threads, opforge.ms_deform_attn, inputs, grid_sample_reference)
