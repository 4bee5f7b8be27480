"""The torch side of opforge's own ops: C++ kernels (libopforge_torch.so) plus, in one module per
op, its spec, fake impl, autograd and user-facing wrappers.

Every module here is imported (so a new op's spec module needs no line in this file),
then :func:`opforge.check_library` checks that every op of ``TORCH_LIBRARY(opforge)``
has a spec: an op declared in C++ without one fails the import, naming the op.
"""

import importlib
import pkgutil

from ..registration import check_library
from ._registry import _C  # noqa: F401
from .deform_conv2d import DEFORM_CONV2D, deform_conv2d
from .ms_deform_attn import MS_DEFORM_ATTN, MSDeformAttn, MultiScaleDeformableAttnFunction, ms_deform_attn
from .my_add import MY_ADD, MyAdd, MyAddFunction, my_add
from .nms_rotated import BATCHED_NMS_ROTATED, NMS_ROTATED, batched_nms_rotated, nms_rotated
from .roi_align_rotated import (ROI_ALIGN_ROTATED, RoIAlignRotated, RoIAlignRotatedFunction,
                                roi_align_rotated)

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

check_library("opforge")


def __getattr__(name: str):
    if name == "DeformConv2d":  # made on first use: it subclasses torchvision's, which is slow to import
        from .deform_conv2d import DeformConv2d

        return DeformConv2d
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEFORM_CONV2D", "DeformConv2d", "deform_conv2d", "MY_ADD", "MyAdd", "MyAddFunction", "my_add",
           "MS_DEFORM_ATTN", "MSDeformAttn", "MultiScaleDeformableAttnFunction", "ms_deform_attn",
           "NMS_ROTATED", "BATCHED_NMS_ROTATED", "nms_rotated", "batched_nms_rotated",
           "ROI_ALIGN_ROTATED", "RoIAlignRotated", "RoIAlignRotatedFunction", "roi_align_rotated"]
