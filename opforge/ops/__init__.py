"""The torch side of every op: C++ kernels (opforge._C) plus fake impls, autograd
and user-facing wrappers defined next to each op's spec."""

from .my_add import MY_ADD, MyAdd, MyAddFunction, my_add

__all__ = ["MY_ADD", "MyAdd", "MyAddFunction", "my_add"]
