"""Torch op libraries built on opforge's stable-ABI glue (``opforge/torch_op.h``): loading them,
and running the shape rules they carry.

A library (``opforge.build.TorchLibrary``: opforge's own ``libopforge_torch.so``, or a ``new-op``
package's) is a plain shared object, no Python module: built once on LibTorch's stable ABI, it
loads in every torch from 2.10 on, in Python (:func:`load_torch_library`) and in a C++ program
(``dlopen``; :func:`opforge.torch_library_path`). Loading it runs its registrations. It also exports
two C entry points (``opforge/torch_library.h``): its shape rules, which :class:`opforge.ShapeRule`
runs for the fake impls, and what became of its CUDA part.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

import torch

__all__ = ["TorchLibrary", "load_torch_library", "loaded_torch_libraries"]


class _RuleDim(ctypes.Structure):
    _fields_ = [("value", ctypes.c_int64), ("symbolic", ctypes.c_int32)]


class _RuleArg(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("count", ctypes.c_int64), ("dims", ctypes.POINTER(_RuleDim)),
                ("integer", ctypes.c_int64), ("real", ctypes.c_double),
                ("reals", ctypes.POINTER(ctypes.c_double))]


_DIM_P = ctypes.POINTER(_RuleDim)
_ARITH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, _DIM_P, _DIM_P, _DIM_P)
_COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, _DIM_P, _DIM_P, ctypes.POINTER(ctypes.c_int))
_IS_ONE = ctypes.CFUNCTYPE(ctypes.c_int, _DIM_P, ctypes.POINTER(ctypes.c_int))
_FORMAT = ctypes.CFUNCTYPE(ctypes.c_int, _DIM_P, ctypes.c_void_p, ctypes.c_size_t)


class _RuleHost(ctypes.Structure):
    _fields_ = [("arith", _ARITH), ("compare", _COMPARE), ("is_one", _IS_ONE), ("format", _FORMAT)]


_KIND_SHAPE, _KIND_ABSENT, _KIND_INT, _KIND_FLOAT, _KIND_BOOL, _KIND_INTS, _KIND_FLOATS = range(7)
_MAX_OUT = 4096  # entries of the flattened output shapes a rule may give
_MESSAGE = 4096


def _is_number(x) -> bool:
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    return isinstance(x, int) or (isinstance(x, torch.SymInt) and is_concrete_int(x))


def _size_oblivious_is_one(x) -> bool:
    """Whether symbolic size ``x`` is 1, size-obliviously (a size is not 1 unless known to be), as
    c10::SymInt's guard_size_oblivious answered it when the rule ran on SymInts."""
    import torch.fx.experimental.symbolic_shapes as symbolic

    for name in ("guard_size_oblivious", "guard_or_false"):
        fn = getattr(symbolic, name, None)
        if fn is not None:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return bool(fn(x == 1))
    return bool(x == 1)


class _RuleCall:
    """One run of a rule: the SymInts behind the handles, and the first exception a callback raised."""

    _ARITH_OPS = {ord("+"): lambda a, b: a + b, ord("-"): lambda a, b: a - b, ord("*"): lambda a, b: a * b,
                  ord("/"): lambda a, b: a // b, ord("%"): lambda a, b: a % b}
    _COMPARE_OPS = {b"==": lambda a, b: a == b, b"!=": lambda a, b: a != b, b"<": lambda a, b: a < b,
                    b"<=": lambda a, b: a <= b, b">": lambda a, b: a > b, b">=": lambda a, b: a >= b}

    def __init__(self):
        self.values: list = []
        self.error: Optional[BaseException] = None
        self.host = _RuleHost(_ARITH(self._arith), _COMPARE(self._compare), _IS_ONE(self._is_one),
                              _FORMAT(self._format))

    def dim(self, x) -> _RuleDim:
        if _is_number(x):
            return _RuleDim(int(x), 0)
        self.values.append(x)
        return _RuleDim(len(self.values) - 1, 1)

    def value(self, d) -> object:
        return self.values[d.value] if d.symbolic else d.value

    def _guarded(self, fn):
        try:
            return fn()
        except BaseException as exc:  # noqa: BLE001 - kept and re-raised once the rule returns
            if self.error is None:
                self.error = exc
            return 1

    def _arith(self, op, a, b, out):
        def run():
            result = self.dim(self._ARITH_OPS[op](self.value(a.contents), self.value(b.contents)))
            out.contents.value, out.contents.symbolic = result.value, result.symbolic
            return 0
        return self._guarded(run)

    def _compare(self, op, a, b, out):
        def run():
            out.contents.value = int(bool(self._COMPARE_OPS[op](self.value(a.contents), self.value(b.contents))))
            return 0
        return self._guarded(run)

    def _is_one(self, a, out):
        def run():
            out.contents.value = int(_size_oblivious_is_one(self.value(a.contents)))
            return 0
        return self._guarded(run)

    def _format(self, a, buf, cap):
        def run():
            text = str(self.value(a.contents)).encode()[: max(int(cap) - 1, 0)]
            ctypes.memmove(buf, text + b"\0", len(text) + 1)
            return 0
        return self._guarded(run)


class TorchLibrary:
    """A loaded torch op library: ``path``; ``WITH_CUDA``, whether its CUDA kernels are registered
    (its CUDA part loaded); ``cuda_part``, ``(state, reason)`` with state ``"not built"``,
    ``"loaded"`` or ``"failed"`` (reason: why it could not load); ``c_shims``, its AOTInductor C
    shims as ``(op, device, declaration)`` (:func:`opforge.aoti_compile_and_package`)."""

    def __init__(self, path: str):
        self.path = os.path.realpath(path)
        self.__file__ = self.path
        torch.ops.load_library(self.path)  # runs the registrations (once per process)
        self._cdll = ctypes.CDLL(self.path)  # the same loaded object: its entry points
        self._rule = getattr(self._cdll, "opforge_shape_rule_v1", None)
        if self._rule is not None:
            self._rule.restype = ctypes.c_int
            self._rule.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(_RuleArg), ctypes.c_int,
                                   ctypes.POINTER(_RuleHost), ctypes.POINTER(_RuleDim), ctypes.c_int64,
                                   ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_size_t]
        info = getattr(self._cdll, "opforge_torch_library_info_v1", None)
        state, reason = 0, ""
        if info is not None:
            info.restype, info.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]
            buf = ctypes.create_string_buffer(_MESSAGE)
            state, reason = info(buf, _MESSAGE), buf.value.decode(errors="replace")
        self.cuda_part = ({0: "not built", 1: "loaded", 2: "failed"}.get(state, "failed"), reason)
        self.WITH_CUDA = int(state == 1)
        self.c_shims = self._read_c_shims()

    def _read_c_shims(self) -> list:
        """The AOTInductor C shims the library defines (opforge/torch_c_shim.h), as
        ``(qualified op name, device, C declaration)``; [] for a library without the entry point."""
        listing = getattr(self._cdll, "opforge_aoti_c_shims_v1", None)
        if listing is None:
            return []
        listing.restype, listing.argtypes = ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]
        size = listing(None, 0) + 1
        buf = ctypes.create_string_buffer(size)
        listing(buf, size)
        return [tuple(line.split("\t")) for line in buf.value.decode().splitlines() if line.count("\t") == 2]

    def __repr__(self) -> str:
        return f"TorchLibrary({self.path!r}, cuda_part={self.cuda_part[0]!r})"

    def _budget_entry(self):
        entry = getattr(self._cdll, "opforge_budget_v1", None)
        if entry is not None:
            entry.restype = ctypes.c_int
            entry.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p,
                              ctypes.c_size_t]
        return entry

    def budgets(self) -> dict:
        """The library's budgets (``opforge/torch_budget.h``): ``{name: (value, default)}``; {} for a
        library without them."""
        entry = self._budget_entry()
        if entry is None:
            return {}
        buf = ctypes.create_string_buffer(_MESSAGE)
        entry(None, 0, None, buf, _MESSAGE)
        out = {}
        for line in buf.value.decode().splitlines():
            name, value, default = line.split("\t")
            out[name] = (int(value), int(default))
        return out

    def set_budget(self, name: str, value: Optional[int]) -> int:
        """Sets the library's budget ``name`` to ``value`` (a positive int; None: its default), for
        the whole process; returns the value it had. ValueError for an unknown name or a bad value."""
        entry = self._budget_entry()
        if entry is None:
            raise ValueError(f"opforge: {self.path} has no budgets")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0
                                  or value >= 2 ** 63):
            raise ValueError(f"opforge: budget {name!r} must be a positive integer below 2**63, got {value!r}")
        buf = ctypes.create_string_buffer(_MESSAGE)
        old = ctypes.c_int64(0)
        if entry(name.encode(), 0, ctypes.byref(old), buf, _MESSAGE) != 0:
            raise ValueError(buf.value.decode(errors="replace"))
        entry(name.encode(), -1 if value is None else value, None, buf, _MESSAGE)
        return old.value

    def shape_rule_signature(self, qualname: str) -> Optional[str]:
        """The signature of shape rule ``qualname`` ("(SymInt[] x, int k)"), or None when this
        library has no such rule."""
        if self._rule is None:
            return None
        buf = ctypes.create_string_buffer(_MESSAGE)
        count = ctypes.c_int64(0)
        if self._rule(qualname.encode(), 0, None, 0, None, None, 0, ctypes.byref(count), buf, _MESSAGE) != 0:
            return None
        return buf.value.decode()

    def run_shape_rule(self, qualname: str, kinds: list, values: list) -> list:
        """Runs shape rule ``qualname`` on ``values`` (a tensor's shape as a list of ints / SymInts, or
        None; ints, floats, bools, int lists), their ``kinds`` from the signature. Returns the outputs'
        shapes flattened ([rank0, *dims0, ...]); a refusal raises ValueError with the rule's message."""
        call = _RuleCall()
        keep = []
        args = (_RuleArg * max(len(values), 1))()
        for i, (kind, value) in enumerate(zip(kinds, values)):
            arg = args[i]
            if kind in ("shape", "optional_shape", "ints"):
                if value is None:
                    if kind != "optional_shape":
                        raise ValueError(f"{qualname}: argument {i} must be given")
                    arg.kind = _KIND_ABSENT
                    continue
                dims = (_RuleDim * max(len(value), 1))(*[call.dim(d) if kind != "ints" else _RuleDim(int(d), 0)
                                                         for d in value])
                keep.append(dims)
                arg.kind, arg.count, arg.dims = (_KIND_INTS if kind == "ints" else _KIND_SHAPE), len(value), dims
            elif kind == "floats":
                reals = (ctypes.c_double * max(len(value), 1))(*[float(v) for v in value])
                keep.append(reals)
                arg.kind, arg.count, arg.reals = _KIND_FLOATS, len(value), reals
            elif kind == "bool":
                arg.kind, arg.integer = _KIND_BOOL, int(bool(value))
            elif kind == "float":
                arg.kind, arg.real = _KIND_FLOAT, float(value)
            else:
                arg.kind, arg.integer = _KIND_INT, int(value)
        out = (_RuleDim * _MAX_OUT)()
        count = ctypes.c_int64(0)
        message = ctypes.create_string_buffer(_MESSAGE)
        code = self._rule(qualname.encode(), 1, args, len(values), ctypes.byref(call.host), out, _MAX_OUT,
                          ctypes.byref(count), message, _MESSAGE)
        if code == 2 or call.error is not None:
            raise call.error
        if code == 1:
            raise ValueError(message.value.decode(errors="replace"))
        if code != 0:
            raise RuntimeError(f"{qualname}: {message.value.decode(errors='replace')}")
        return [call.value(out[k]) for k in range(count.value)]


_LOADED: dict = {}
_LOCK = threading.Lock()


def load_torch_library(path: os.PathLike) -> TorchLibrary:
    """Loads the torch op library at ``path`` (once per process; again returns the same object):
    its ops are then in ``torch.ops``, its shape rules available to :class:`opforge.ShapeRule`. Use
    the result as ``opforge.register_op(spec, extension=library)``."""
    real = os.path.realpath(os.fspath(path))
    with _LOCK:
        if real not in _LOADED:
            if not os.path.isfile(real):
                raise FileNotFoundError(f"opforge.load_torch_library: no library at {real}")
            _LOADED[real] = TorchLibrary(real)
        return _LOADED[real]


def loaded_torch_libraries() -> list:
    """The libraries :func:`load_torch_library` loaded, in loading order."""
    return list(_LOADED.values())
