"""``opforge.patch_torchvision()``: torchvision's deformable convolution on opforge's
kernels, with no change to the model code.

What it routes, while active:

* the ``torchvision::deform_conv2d`` and ``torchvision::_deform_conv2d_backward``
  CPU kernels (and CUDA ones when opforge is built with CUDA): every caller of the
  op (``torch.ops.torchvision.deform_conv2d``, torchvision's functional and module,
  a TorchScript model that calls the op, compiled graphs) runs opforge's kernel.
  torchvision's own autograd, fake and autocast registrations stay, so gradients,
  ``torch.compile`` and ``torch.export`` work as before;
* the name ``deform_conv2d`` in ``torchvision.ops`` and ``torchvision.ops.deform_conv``:
  ``torchvision.ops.DeformConv2d.forward`` looks it up there, so the module (same
  class, existing instances included) runs opforge's functional, which scripts
  with int or pair arguments, is one node in torch.fx graphs and raises
  :class:`opforge.OpInputError`.

The kernels keep torchvision's acceptance rules on top of opforge's op (a bias of
any shape with O elements and any dtype, promoted as torchvision's ``out + bias``;
the mask's batch and dtype checked even when ``use_mask`` is false), and argument
errors are :class:`opforge.OpInputError`, a RuntimeError like torchvision's.

``patch_torchvision()`` returns the active patch (calling it again returns the same
one); ``undo()``, :func:`unpatch_torchvision` or leaving a ``with`` block restores
torchvision's kernels and functions.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

from .ops import _registry
from .ops.deform_conv2d import _compatible_bias, _shape_rule, deform_conv2d
from .registration import OpInputError, as_input_error

_OP = "opforge::deform_conv2d"


def _check_unused_mask_shape(input: torch.Tensor, mask: torch.Tensor) -> None:
    # torchvision's kernel reads the mask's batch size and dtype whether or not use_mask is set
    if mask.dim() == 0 or mask.shape[0] != input.shape[0]:
        raise OpInputError(f"{_OP}: invalid batch size of mask: mask has shape {list(mask.shape)}, input has batch "
                           f"{input.shape[0]} (checked even when use_mask is false, as torchvision does)")


def _check_unused_mask_dtype(input: torch.Tensor, mask: torch.Tensor) -> None:
    if mask.dtype != input.dtype:
        raise OpInputError(f"{_OP}: mask has dtype {mask.dtype} but input has dtype {input.dtype}; all must match "
                           "(checked even when use_mask is false, as torchvision does)")


def _forward_kernel(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                    groups, offset_groups, use_mask):
    """torchvision::deform_conv2d's CPU/CUDA kernel while patched (below torchvision's autograd)."""
    try:
        if input.dim() != 4 or weight.dim() != 4:  # the op's own check, before weight.shape[0] is read
            raise OpInputError(f"{_OP}: input and weight must be 4-D, got shapes {list(input.shape)} and "
                               f"{list(weight.shape)}")
        if not use_mask:  # shapes first (the op's own), then dtypes: torchvision's order
            _check_unused_mask_shape(input, mask)
            # (the bias is checked by torchvision's looser rule in _compatible_bias)
            _shape_rule(input.shape, weight.shape, offset.shape, mask.shape, [weight.shape[0]], stride_h, stride_w,
                        pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups, False)
            _check_unused_mask_dtype(input, mask)
        bias_for_op, bias_after = _compatible_bias(bias, input, weight.shape[0])
        out = torch.ops.opforge.deform_conv2d(input, weight, offset, mask, bias_for_op, stride_h, stride_w, pad_h,
                                              pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask)
    except (RuntimeError, ValueError, TypeError) as e:  # the kernels' errors about our arguments
        raise as_input_error("opforge::deform_conv2d", e) from None
    return out if bias_after is None else out + bias_after


def _backward_kernel(grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                     dilation_w, groups, offset_groups, use_mask):
    """torchvision::_deform_conv2d_backward's kernel while patched: opforge's backward,
    with the bias gradient in the bias's own shape and dtype."""
    try:
        bias_for_op, bias_after = _compatible_bias(bias, input, weight.shape[0])
        grads = torch.ops.opforge._deform_conv2d_backward(
            grad.to(input.dtype), input, weight, offset, mask, bias_for_op, stride_h, stride_w, pad_h, pad_w,
            dilation_h, dilation_w, groups, offset_groups, use_mask)
    except (RuntimeError, ValueError, TypeError) as e:  # the kernels' errors about our arguments
        raise as_input_error("opforge::deform_conv2d", e) from None
    grad_input, grad_weight, grad_offset, grad_mask, grad_bias = grads
    if bias_after is not None:  # the output was promoted to the bias's dtype: sum the gradient there
        grad_bias = grad.sum((0, 2, 3)).to(bias.dtype)
    if not use_mask:
        grad_mask = torch.zeros_like(mask)
    return grad_input, grad_weight, grad_offset, grad_mask, grad_bias.reshape(bias.shape)


class TorchvisionPatch:
    """An active :func:`patch_torchvision`; ``undo()`` (or leaving ``with``) reverts it."""

    def __init__(self, library: torch.library.Library, names: dict):
        self._library: Optional[torch.library.Library] = library
        self._names = names  # (module, attribute) -> torchvision's original

    @property
    def active(self) -> bool:
        return self._library is not None

    def undo(self) -> None:
        global _active
        if self._library is None:
            return
        self._library._destroy()  # drops opforge's kernels: torchvision's are dispatched again
        self._library = None
        for (module, name), original in self._names.items():
            setattr(module, name, original)
        if _active is self:
            _active = None

    def __enter__(self) -> "TorchvisionPatch":
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __repr__(self) -> str:
        return f"<opforge.TorchvisionPatch {'active' if self.active else 'undone'}>"


_active: Optional[TorchvisionPatch] = None


def patch_torchvision() -> TorchvisionPatch:
    """Route torchvision's deform_conv2d (kernels, functional, module) to opforge's;
    opt-in and reversible. See the module docstring for exactly what changes."""
    global _active
    if _active is not None:
        return _active
    try:
        import torchvision.ops
        import torchvision.ops.deform_conv as deform_conv_module
    except ImportError as e:
        raise ImportError(f"opforge.patch_torchvision: torchvision is not importable ({e}); install it "
                          "(pip install torchvision) or use opforge.DeformConv2d / opforge.deform_conv2d directly") from e
    keys = ["CPU"] + (["CUDA"] if getattr(_registry._C, "WITH_CUDA", 0) else [])
    library = torch.library.Library("torchvision", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        for key in keys:
            library.impl("deform_conv2d", _forward_kernel, key)
            library.impl("_deform_conv2d_backward", _backward_kernel, key)
    names = {(module, "deform_conv2d"): module.deform_conv2d for module in (torchvision.ops, deform_conv_module)}
    for module, name in names:
        setattr(module, name, deform_conv2d)
    _active = TorchvisionPatch(library, names)
    return _active


def unpatch_torchvision() -> None:
    """Undo :func:`patch_torchvision` (nothing happens if it is not active)."""
    if _active is not None:
        _active.undo()


__all__ = ["TorchvisionPatch", "patch_torchvision", "unpatch_torchvision"]
