"""Sessions and judging: ``Runtime`` (sessions through path (a) ``opforge.ort_session`` and (b)
plain onnxruntime, each run twice under malloc perturbation with its inputs in guarded buffers),
``CaseFailure``, whether an error is clean (``judge_error``), results compared between the runs
and with torch, and the output types a node declares (``output_types``)."""

from __future__ import annotations

import contextlib
import ctypes
import re
import warnings

import numpy as np
import torch

from .baselines import TRIALS, Baseline
from .hostile import ENUM_KINDS, ENUM_RANGE
from .models import ATEN_DOMAIN, ONNX_OF, onnx_type_of
from .schemas import Schema


class CaseFailure(AssertionError):
    def __init__(self, cls, detail):
        super().__init__(f"{cls}: {detail}")
        self.cls, self.detail = cls, detail


class Runtime:
    """Sessions through path (a) and (b) with the chosen library; runs under malloc perturbation."""

    def __init__(self, library=None):
        import onnxruntime as ort

        import opforge

        self.ort, self.opforge = ort, opforge
        self.library = library or opforge.aten_library_path()
        if library:
            opforge.register_ort_library(ATEN_DOMAIN, library, replace=True)
        self.libc = ctypes.CDLL("libc.so.6")

    def options(self):
        so = self.ort.SessionOptions()
        so.enable_cpu_mem_arena = False  # every buffer from malloc, so perturbation reaches it
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 4
        so.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # no constant folding
        return so

    def session(self, path, model, optimize=False):
        so = self.options()
        if optimize:
            so.graph_optimization_level = self.ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if path == "a":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    return self.opforge.ort_session(model.SerializeToString(), so)
                except Exception as e:
                    e.opforge_warnings = [str(w.message) for w in caught]
                    raise
        so.register_custom_ops_library(self.library)
        return self.ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    @contextlib.contextmanager
    def perturbed(self, byte):
        self.libc.mallopt(-3, 1 << 30) or self.libc.mallopt(-3, 1 << 25)  # M_MMAP_THRESHOLD
        self.libc.mallopt(-6, byte)  # M_PERTURB
        try:
            yield
        finally:
            self.libc.mallopt(-6, 0)
            self.libc.mallopt(-3, 128 * 1024)

    def run_twice(self, sess, feeds):
        """The session's outputs of two runs, each under its own malloc perturbation byte and with
        the inputs in guarded buffers: GUARD bytes of that byte before and after each input, so a
        read past an input's end differs between the runs, and a write there or into the input
        itself is seen (CaseFailure "input-changed")."""
        outs = []
        for byte in (0x55, 0xAA):
            guarded = {k: guarded_copy(v, byte) for k, v in feeds.items()}
            with self.perturbed(byte):
                outs.append(sess.run(None, {k: view for k, (view, _) in guarded.items()}))
            for k, (view, buf) in guarded.items():
                if not (np.array_equal(view, feeds[k], equal_nan=True) or view.tobytes() == feeds[k].tobytes()):
                    raise CaseFailure("input-changed", f"the node wrote into its input {k}")
                if not (np.all(buf[:GUARD] == byte) and np.all(buf[GUARD + view.nbytes:] == byte)):
                    raise CaseFailure("input-changed", f"the node wrote past the bounds of its input {k}")
        return outs


GUARD = 4096  # bytes of guard before and after each input


def guarded_copy(arr, byte):
    """(a copy of arr inside a buffer whose GUARD bytes around it are ``byte``, that buffer)."""
    arr = np.array(arr, order="C", copy=True)  # (np.ascontiguousarray makes a 0-d array 1-d)
    if arr.dtype == object or arr.dtype.kind in "US":
        return arr, np.full(2 * GUARD, byte, np.uint8)
    buf = np.full(2 * GUARD + arr.nbytes, byte, np.uint8)
    view = buf[GUARD:GUARD + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    view[...] = arr
    return view, buf


MEMORY_PATTERNS = re.compile(r"can't allocate memory|bad_alloc|Cannot allocate memory|MemoryError|out of memory|"
                             r"[Ff]ailed to allocate|std::length_error|Unable to allocate", re.I)


def names_op(text, op) -> bool:
    return f"aten::{op}" in text or "ATen op" in text or "org.pytorch.aten::ATen" in text


def judge_error(exc, op, path, python_refused=False):
    """None when the exception is a clean error, else raises CaseFailure."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or MEMORY_PATTERNS.search(text):
        raise CaseFailure("memory", _short(text))
    if python_refused and path == "a":
        from opforge.aten.policy import AtenOpRefused

        if not isinstance(exc, AtenOpRefused):
            raise CaseFailure("python-policy", f"ort_session did not refuse it itself: {_short(text)}")
    if isinstance(exc, (KeyError, AttributeError, IndexError, TypeError, AssertionError, RecursionError)):
        raise CaseFailure("python-error", _short(text))
    if not names_op(text, op):
        if path == "a" and (any("could not infer output types" in w for w in getattr(exc, "opforge_warnings", ()))
                            or re.search(r"type inference failed|Invalid tensor data type 0", text)):
            return "untyped"  # opforge left an output untyped (a non-tensor return, a failed meta run): ORT refused
        raise CaseFailure("unnamed-error", _short(text))
    return "rejected"


def _short(text, n=300):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


def outputs_equal(a, b) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            return False
    return True


def diff_detail(a, b) -> str:
    for k, (x, y) in enumerate(zip(a, b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        xb = np.frombuffer(x.tobytes(), np.uint8)
        yb = np.frombuffer(y.tobytes(), np.uint8)
        if not np.array_equal(xb, yb):
            where = np.nonzero(xb != yb)[0]
            return (f"output {k} ({x.dtype}{list(x.shape)}): {where.size} of {xb.size} bytes differ between runs, "
                    f"first at byte {where[0]}: {xb[where[0]:where[0] + 8].tolist()} vs "
                    f"{yb[where[0]:where[0] + 8].tolist()}")
    return f"{len(a)} vs {len(b)} outputs"


def equal_to_torch(got, want) -> str | None:
    """None if ORT's outputs equal torch's, else what differs."""
    if len(got) > len(want):
        return f"{len(got)} outputs, torch {len(want)}"
    for k, (x, w) in enumerate(zip(got, want)):
        number = not isinstance(w, torch.Tensor)  # a number return (TorchScript int/float/bool): any dtype holding it
        if not number:
            if w.is_complex() or w.layout != torch.strided or w.dtype not in ONNX_OF:
                continue
            w = w.detach().contiguous().numpy()
        else:
            w = np.asarray(w)
        x = np.asarray(x)
        if x.shape != w.shape and not (number and x.size == 1):
            return f"output {k}: shape {list(x.shape)}, torch {list(w.shape)}"
        if x.dtype != w.dtype and not number:
            return f"output {k}: dtype {x.dtype}, torch {w.dtype}"
        x, w = x.reshape(w.shape), w
        if x.dtype.kind == "f":
            if not np.array_equal(x, w.astype(x.dtype), equal_nan=True):
                return f"output {k}: {x.reshape(-1)[:6].tolist()} vs torch {w.reshape(-1)[:6].tolist()}"
        elif not np.array_equal(x, w.astype(x.dtype)):
            return f"output {k}: {x.reshape(-1)[:6].tolist()} vs torch {w.reshape(-1)[:6].tolist()}"
    return None


# the kernel's own refusals of calls torch runs: results ORT cannot hold, TorchScript-only overloads
# (aten::add.int...: not in the c10 dispatcher), ops that return nothing
OUTPUT_REFUSALS = ("cannot hold", "not a tensor or number", "declares ONNX type", "is not a valid",
                   "no such operator", "outputs but the op returned 0", "is refused")
#: ops whose result depends on how they are called, not only on the inputs (the kernel runs in InferenceMode)
NO_TORCH_COMPARISON = {"is_inference"}


def output_types(s: Schema, values, b: Baseline):
    """ONNX types of the node's outputs for this call: torch's baseline result, or a meta run where
    the call changes dtypes, or the schema's return types."""
    same = b.result is not None and all(
        (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype) or
        (not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor))
        for x, y in zip(values, b.values)) and all(
        k not in ENUM_KINDS or x == y for k, x, y in zip(s.kinds, values, b.values))
    if same:
        return [onnx_type_of(r) for r in b.result] or [1]
    enums_ok = all(k not in ENUM_KINDS or v is None or 0 <= v < ENUM_RANGE[k] for k, v in zip(s.kinds, values))
    if enums_ok and (any(isinstance(v, torch.Tensor) for v in values) or any(a.name == "device" for a in s.args)):
        # in the trial server: torch itself crashes on out-of-range enums (clone(memory_format=-1),
        # view(dtype=-1)) and on some meta calls (fractional_max_pool2d_backward(output_size=[]))
        types = TRIALS.meta_types(s, values)
        if types:
            return types
    if b.result is not None:
        return [onnx_type_of(r) for r in b.result] or [1]
    types = []
    for r in s.op._schema.returns:
        kind = str(r.real_type)
        types.append({"int": 7, "float": 11, "bool": 9, "SymInt": 7}.get(kind, 1))
    return types or [1]
