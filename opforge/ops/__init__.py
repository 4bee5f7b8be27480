"""The torch side of every op: C++ kernels (opforge._C) plus fake impls, autograd
and user-facing wrappers defined next to each op's spec."""

from .deform_conv2d import DEFORM_CONV2D, DeformConv2d, deform_conv2d
from .my_add import MY_ADD, MyAdd, MyAddFunction, my_add

__all__ = ["DEFORM_CONV2D", "DeformConv2d", "deform_conv2d", "MY_ADD", "MyAdd", "MyAddFunction", "my_add"]
