"""The prototype tier: an op from its spec and a numpy implementation, no C++.

    SWISH = opforge.OpSpec(name="swish", namespace="my_ops", domain="com.example", ...,
                           onnx_types=("tensor(float)", "tensor(double)"))
    opforge.register_prototype(SWISH, impl=swish_numpy)   # impl(x, *, alpha) -> array(s)

gives, from the one spec and the one function:

* torch: ``torch.ops.my_ops.swish`` (a ``torch.library`` op defined from ``spec.schema``; its
  CPU kernel calls ``impl``, CUDA tensors make a round trip through host memory), with the
  spec's fake impl and autograd formula, as :func:`opforge.register_op` registers them;
* both exporters' rules and the ONNX schema, exactly as for a compiled op: the exported node
  is ``com.example::swish`` either way;
* ONNX Runtime: an onnxruntime-extensions Python op (``onnx_op``) for every element type of
  ``spec.onnx_types``, registered under the spec's own domain (ortx accepts
  ``op_type="domain::name"``; a bare name would land in ``ai.onnx.contrib``), and the ortx
  library as the ORT library of that domain, so :func:`opforge.ort_session` runs the model.

So a model using a brand-new op runs end to end in minutes, and moving the op to C++ later
(``opforge new-op`` writes the kernels; ``register_op(spec, extension=_C)`` replaces
``register_prototype``) changes neither the model code nor the exported ONNX model.

Both runtimes call ``impl`` the same way, so torch and ORT agree by construction:
tensors as numpy arrays (bfloat16 as float32: numpy has none), attributes as keyword arguments
by ONNX name, float attributes rounded to float32 (what ONNX stores), bools as ints. The spec's
fake impl runs first on shape-only (meta) tensors, so it validates every call in both runtimes
and fixes the outputs' shapes and dtypes, which ``impl``'s results must match.

The price is per call: see ``benchmarks/bench_prototype.py``.

Order: register every prototype op of a domain before creating the sessions that use it.
onnxruntime-extensions keeps a domain's Python ops in one growing array that ONNX Runtime points
into; defining another op of the domain can move it, and a session made before would then crash
when it runs or is destroyed. ``register_prototype`` refuses to do that while a session or
SessionOptions made by :func:`opforge.ort_session` points into the domain; with sessions made by
hand (``ortx_library_path()``) the order is yours to keep.

Errors in ONNX Runtime. onnxruntime-extensions 0.15 lets an exception raised by a Python op
escape its C++ kernel, which terminates the process. opforge's ops never raise there: an
error is kept, the outputs of that call are empty (the fake impl rejected the input) or NaN
(0 for integers; ``impl`` failed), and the session that :func:`opforge.ort_session` returns (a
:class:`PrototypeSession`) raises it from ``run``; a plain ``onnxruntime.InferenceSession``
gets a :class:`PrototypeKernelWarning` naming the op and the error instead.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import warnings
from typing import Any, Callable, Optional

import numpy as np
import torch

from . import spec as _spec
from .ort_kernels import ORTX_DOMAIN, ORTX_PIN, ortx_library_path, ortx_version
from .ort_kernels.session import add_session_class_hook
from .registration import OpInputError, OpRegistrationError, register_op, torch_op
from .spec import AttrArg, OpSpec, TensorArg

# The element types an onnxruntime-extensions Python op can take and return (0.15 refuses float16
# outputs, "not supported by python customops api"; numpy has no bfloat16), from spec's one dtype
# table: ONNX type string -> (PyCustomOpDef.dt_<onnx name>, numpy dtype).
_ORTX_TYPES = {_spec.ONNX_TYPE_OF[name]: ("dt_" + _spec.ONNX_TYPE_OF[name][len("tensor("):-1], np.dtype(name))
               for name in ("float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")}
_ATTR_DT = {"int": "dt_int64", "bool": "dt_int64", "float": "dt_float"}

_TORCH_OF_NUMPY = {np.dtype(name): getattr(torch, name) for name, _, _ in _spec.ELEMENT_TYPES if name != "bfloat16"}


class PrototypeKernelWarning(RuntimeWarning):
    """A prototype op failed inside a plain ``onnxruntime.InferenceSession``: its outputs for that
    call are empty (bad input) or NaN (its kernel failed). (``opforge.ort_session`` raises the error
    instead.)"""


@dataclasses.dataclass(frozen=True)
class Prototype:
    """A registered prototype op: its spec and numpy implementation."""

    spec: OpSpec
    impl: Callable[..., Any]
    #: (input shapes, dtypes, devices, attributes) -> the fake impl's ((shape, dtype), ...) or its error:
    #: a fake impl sees metadata only, so one call per signature is enough (it costs ~80 us)
    fake_cache: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


#: onnx_qualname -> Prototype
PROTOTYPES: dict[str, Prototype] = {}
#: id of an ortx Opdef of ours -> (prototype, numpy dtype of its tensors)
_ORTX_KERNELS: dict[int, tuple[Prototype, np.dtype]] = {}
_LIBRARIES: list = []  # torch.library.Library objects: their registrations live as long as they do
_STATE = threading.local()  # .errors: the errors of this thread's current PrototypeSession run (else unset)
_HOOK_LOCK = threading.Lock()
_HOOK_INSTALLED = False


def is_prototype(qualname: str) -> bool:
    """Whether ``domain::name`` (or ``namespace::name``) is a registered prototype op."""
    return qualname in PROTOTYPES or any(p.spec.torch_qualname == qualname for p in PROTOTYPES.values())


# ---- validation ------------------------------------------------------------------------------


def _check_spec(spec: OpSpec, impl: Callable) -> None:
    where = f"opforge.register_prototype({spec.torch_qualname})"
    if not callable(impl):
        raise TypeError(f"{where}: impl must be a function (numpy arrays, attributes as keywords) -> array(s); "
                        f"got {impl!r}")
    bad_attrs = [a.name for a in spec.attr_args if a.kind not in _ATTR_DT]
    if bad_attrs:
        raise OpRegistrationError(
            f"{where}: attribute(s) {bad_attrs} are lists (int[] or float[]); onnxruntime-extensions' Python ops "
            "take only int and float attributes. Give each value its own int attribute, or write the op's kernels in C++ "
            "(opforge new-op)")
    own_typed = [a.name for a in spec.tensor_args + spec.output_args if a.own_types]
    if own_typed:
        raise OpRegistrationError(
            f"{where}: input(s)/output(s) {own_typed} declare their own dtypes; a prototype's ONNX Runtime kernel "
            "takes and gives the op's float types only. Write the op's kernels in C++ (opforge new-op --schema ... "
            "--dtypes ...)")
    optional = [a.name for a in spec.tensor_args if a.optional]
    if optional:
        raise OpRegistrationError(
            f"{where}: optional tensor input(s) {optional}: onnxruntime-extensions' Python ops cannot leave an input "
            "out; make them required for the prototype, or write the op's kernels in C++ (opforge new-op)")
    unsupported = [t for t in spec.onnx_types if t not in _ORTX_TYPES]
    if unsupported:
        raise OpRegistrationError(
            f"{where}: onnx_types {unsupported} cannot be served by onnxruntime-extensions' Python ops (0.15 returns "
            f"no float16, numpy has no bfloat16); list only {sorted(_ORTX_TYPES)} in the prototype's spec. The torch "
            "op still takes float16/bfloat16 tensors (computed in float32)")
    if not spec.onnx_types:
        raise OpRegistrationError(f"{where}: spec.onnx_types is empty")


# ---- calling impl the same way from both runtimes -------------------------------------------------


_FAKE_CACHE_SIZE = 1024


def _signature(values) -> tuple:
    """What a fake impl can see of torch-order ``values``: tensors' shapes, dtypes and devices, and the
    attribute values. (A _TensorMeta stands for an ORT input.)"""
    return tuple((tuple(v.shape), v.dtype, str(v.device)) if isinstance(v, (torch.Tensor, _TensorMeta))
                 else (type(v), v) for v in values)


@dataclasses.dataclass(frozen=True)
class _TensorMeta:
    shape: tuple
    dtype: torch.dtype
    device: str = "cpu"


def _expected_outputs(proto: Prototype, values: list) -> tuple:
    """``((shape, dtype), ...)`` of the outputs, from the spec's fake impl run on shape-only (meta)
    copies of ``values`` (torch-order tensors, or _TensorMeta). The fake impl validates the call:
    its errors become :class:`OpInputError` (same words)."""
    key = _signature(values)
    hit = proto.fake_cache.get(key)
    if hit is None:
        meta = [torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, (torch.Tensor, _TensorMeta))
                else v for v in values]
        try:
            out = proto.spec.fake(*meta)
            out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            hit = tuple((tuple(o.shape), o.dtype) for o in out)
        except (ValueError, TypeError, RuntimeError, IndexError) as exc:
            # Cached without its traceback: that holds the frames of this call and, up the stack,
            # of every caller (the ORT session whose run called the kernel, the inputs), which
            # would then live as long as the cache. This call's error keeps its traceback.
            with contextlib.suppress(Exception):
                _remember(proto, key, copy.copy(exc))
            raise OpInputError(str(exc)) from exc
        _remember(proto, key, hit)
    if isinstance(hit, BaseException):
        raise OpInputError(str(hit)) from hit
    return hit


def _remember(proto: Prototype, key: tuple, hit) -> None:
    if len(proto.fake_cache) >= _FAKE_CACHE_SIZE:
        proto.fake_cache.clear()
    proto.fake_cache[key] = hit


def _attr_value(arg: AttrArg, value):
    if arg.kind == "float":
        return float(np.float32(value))  # what ONNX stores, so both runtimes compute with the same value
    if arg.kind == "bool":
        return int(bool(value))
    return int(value)


def _call_impl(proto: Prototype, arrays: list, attrs: dict) -> tuple:
    try:
        result = proto.impl(*arrays, **attrs)
    except Exception as exc:
        raise RuntimeError(f"{proto.spec.torch_qualname}: the prototype implementation "
                           f"({getattr(proto.impl, '__qualname__', proto.impl)}) raised "
                           f"{type(exc).__name__}: {exc}") from exc
    result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if len(result) != len(proto.spec.outputs):
        raise RuntimeError(f"{proto.spec.torch_qualname}: the prototype implementation returned {len(result)} "
                           f"output(s); the spec has {len(proto.spec.outputs)} ({list(proto.spec.output_names)})")
    return tuple(np.asarray(r) for r in result)


def _check_shape(proto: Prototype, index: int, got: tuple, want: tuple) -> None:
    if tuple(got) != tuple(want):
        raise RuntimeError(f"{proto.spec.torch_qualname}: the prototype implementation returned output "
                           f"{proto.spec.output_names[index]!r} of shape {list(got)}, but the spec's fake impl says "
                           f"{list(want)}; fix one of them")


def _numpy_input(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its float32 copy holds exactly its values
        t = t.float()
    return t.numpy()


def _torch_kernel(proto: Prototype):
    spec = proto.spec
    names = [a.name for a in spec.args]

    def kernel(*args, **kwargs):
        values = list(args) + [kwargs[n] for n in names[len(args):]]
        expected = _expected_outputs(proto, values)
        arrays, attrs = [], {}
        for arg, value in zip(spec.args, values):
            if isinstance(arg, TensorArg):
                arrays.append(_numpy_input(value))
            else:
                attrs[arg.onnx_name] = _attr_value(arg, value)
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
        outs = []
        for i, (r, (shape, dtype)) in enumerate(zip(_call_impl(proto, arrays, attrs), expected)):
            _check_shape(proto, i, r.shape, shape)
            if r.dtype == object:
                raise RuntimeError(f"{spec.torch_qualname}: the prototype implementation returned an object array")
            if any(np.may_share_memory(r, a) for a in arrays):
                r = r.copy()  # a custom op's output must not alias its inputs (impl returned a view of one)
            outs.append(torch.from_numpy(np.ascontiguousarray(r)).to(device=device, dtype=dtype))
        return outs[0] if len(outs) == 1 else tuple(outs)

    kernel.__name__ = f"{spec.name}_prototype_kernel"
    return kernel


# ---- the ONNX Runtime side: onnxruntime-extensions Python ops ---------------------------------------


def _fail_outputs(proto: Prototype, expected: Optional[tuple], dtype: np.dtype) -> tuple:
    """What an op that failed returns to ORT: NaN (0 for integers) of the expected shapes."""
    k_outputs = []
    for i in range(len(proto.spec.outputs)):
        shape = expected[i][0] if expected is not None else (0,)
        fill = np.nan if np.issubdtype(dtype, np.floating) else 0
        k_outputs.append(np.full(shape, fill, dtype=dtype))
    return tuple(k_outputs)


def _run_in_ort(proto: Prototype, dtype: np.dtype, feed: list, read_attributes: Callable[[], dict]) -> tuple:
    """One call of a prototype op from ONNX Runtime. Nothing may raise out of here: ortx's C++ kernel
    would terminate the process (see the module doc)."""
    spec = proto.spec
    expected = None
    try:
        attributes = read_attributes()
        inputs = iter(feed)
        values, attrs = [], {}
        for arg in spec.args:
            if isinstance(arg, TensorArg):
                a = next(inputs)
                values.append(_TensorMeta(a.shape, _TORCH_OF_NUMPY[a.dtype]))
            else:
                v = _attr_value(arg, attributes[arg.onnx_name])
                attrs[arg.onnx_name] = v
                values.append(bool(v) if arg.kind == "bool" else v)
        expected = _expected_outputs(proto, values)
        outs = []
        for i, (r, (shape, _)) in enumerate(zip(_call_impl(proto, list(feed), attrs), expected)):
            _check_shape(proto, i, r.shape, shape)
            outs.append(np.ascontiguousarray(r, dtype=dtype))
        return tuple(outs)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        errors = getattr(_STATE, "errors", None)
        if errors is not None:
            errors.append(exc)
        else:
            warnings.warn(f"{exc} -- in ONNX Runtime, where onnxruntime-extensions cannot return an error: the "
                          "outputs of this call are empty (bad input) or NaN. Create the session with "
                          "opforge.ort_session to get the error raised", PrototypeKernelWarning, stacklevel=2)
        return _fail_outputs(proto, expected, dtype)


def _install_hook() -> None:
    """Routes ortx's Python-op calls through ours: our ops hand their numpy arrays back as they are,
    without ortx's conversion to Python lists (3 ms instead of 100 ms for 1M floats,
    benchmarks/bench_prototype.py), and never raise into C++; every other ``onnx_op`` goes to
    ortx's own handler, unchanged."""
    global _HOOK_INSTALLED
    with _HOOK_LOCK:
        if _HOOK_INSTALLED:
            return
        from onnxruntime_extensions import PyCustomOpDef, _ocos

        ortx_handler = _ocos._on_pyop_invocation

        def on_invocation(k_id, feed, attributes):
            entry = _ORTX_KERNELS.get(k_id)
            if entry is None:
                return ortx_handler(k_id, feed, attributes)
            proto, dtype = entry
            outs = _run_in_ort(proto, dtype, list(feed), lambda: _ocos.Opdef._odlist[k_id].cast_attributes(attributes))
            result = [k_id]
            for o in outs:
                result += [o.shape, o]
            return tuple(result)

        PyCustomOpDef.install_hooker(on_invocation)
        _HOOK_INSTALLED = True


def _register_ortx_kernels(proto: Prototype) -> None:
    from onnxruntime_extensions import PyCustomOpDef, _ocos

    spec = proto.spec
    op_type = spec.name if spec.domain == ORTX_DOMAIN else f"{spec.domain}::{spec.name}"
    attrs = {a.onnx_name: getattr(PyCustomOpDef, _ATTR_DT[a.kind]) for a in spec.attr_args}

    def not_called(*args, **kwargs):  # our hook calls impl; ortx's handler never sees our ids
        raise AssertionError("opforge prototype op called outside opforge's hook")

    for onnx_type in spec.onnx_types:
        dt_name, np_dtype = _ORTX_TYPES[onnx_type]
        dt = getattr(PyCustomOpDef, dt_name)
        opdef = _ocos.Opdef.create(not_called, op_type=op_type, inputs=[dt] * len(spec.tensor_args),
                                   outputs=[dt] * len(spec.outputs), attrs=attrs)
        _ORTX_KERNELS[id(opdef)] = (proto, np.dtype(np_dtype))


# ---- registration ---------------------------------------------------------------------------------


def register_prototype(spec: OpSpec, impl: Optional[Callable[..., Any]] = None) -> torch._ops.OpOverload:
    """Registers ``spec`` as a prototype op implemented by ``impl`` (numpy; default
    ``spec.reference``) in torch, both exporters and ONNX Runtime, and returns the torch op
    (see the module doc). Registering the same spec again is a no-op; a spec whose torch op
    has a C++ kernel already is refused (use :func:`opforge.register_op`)."""
    from .ort_kernels import register_ort_library

    impl = impl if impl is not None else spec.reference
    if impl is None:
        raise TypeError(f"opforge.register_prototype({spec.torch_qualname}): give impl= (or a spec.reference)")
    known = PROTOTYPES.get(spec.onnx_qualname)
    if known is not None and known.spec is spec:
        return torch_op(spec)
    if spec.onnx_qualname in _spec.REGISTRY:
        raise OpRegistrationError(f"opforge.register_prototype: {spec.onnx_qualname} is registered already "
                                  "(as a compiled op, or by another spec)")
    _check_spec(spec, impl)
    if ortx_version() is None:
        raise OpRegistrationError(f"opforge.register_prototype({spec.torch_qualname}): its ONNX Runtime kernel is an "
                                  f"onnxruntime-extensions Python op; pip install {ORTX_PIN}")
    _check_ortx_table_not_in_use(spec)
    declared = _op_declared(spec)
    if declared and torch._C._dispatch_has_kernel_for_dispatch_key(spec.torch_qualname, "CPU"):
        raise OpRegistrationError(f"opforge.register_prototype: {spec.torch_qualname} has a CPU kernel already (a "
                                  "compiled one?); register it with opforge.register_op(spec, extension=_C)")
    # The domain first: a clash with another library must fail before anything is registered with torch.
    register_ort_library(spec.domain, ortx_library_path, provider="onnxruntime-extensions (prototype ops)")
    proto = Prototype(spec, impl)
    libs = []
    try:
        if not declared:
            libs.append(torch.library.Library(spec.namespace, "FRAGMENT"))  # noqa: TOR901 (kept in _LIBRARIES)
            libs[-1].define(spec.schema)
        libs.append(torch.library.Library(spec.namespace, "IMPL"))  # noqa: TOR901
        kernel = _torch_kernel(proto)
        libs[-1].impl(spec.name, kernel, "CPU")
        libs[-1].impl(spec.name, kernel, "CUDA")  # host round trip: correct, not fast
        op = register_op(spec)
    except Exception:
        for lib in reversed(libs):  # leave nothing half-registered: a corrected spec can be registered again
            lib._destroy()
        raise
    _LIBRARIES.extend(libs)
    _install_hook()
    _register_ortx_kernels(proto)
    PROTOTYPES[spec.onnx_qualname] = proto
    return op


def _check_ortx_table_not_in_use(spec: OpSpec) -> None:
    """onnxruntime-extensions 0.15 keeps the Python ops of a domain in one growing array and gives
    ONNX Runtime pointers to its elements when its library is registered. Defining another op of
    that domain can move the array; a session made before then calls freed memory when it runs or
    is destroyed (a segfault, not an error: seen when a garbage collection destroyed such a
    session). The sessions and options opforge made are known (opforge.ort_session); while one of
    them points into this domain's table, defining an op there is refused, before anything is
    registered. (Sessions made by hand with ortx_library_path() are not known: the same order
    applies to them, see the module doc.)"""
    from .ort_kernels import ortx_python_op_tables, ortx_tables_in_use

    if spec.domain not in ortx_python_op_tables():
        return  # a new table: nothing points into it yet
    in_use = ortx_tables_in_use(spec.domain)
    if in_use:
        raise OpRegistrationError(
            f"opforge.register_prototype({spec.onnx_qualname}): {in_use} ONNX Runtime session(s) or SessionOptions "
            f"made by opforge.ort_session hold the onnxruntime-extensions kernels of domain {spec.domain!r}, and "
            "defining another op of that domain moves them (onnxruntime-extensions keeps a domain's Python ops in "
            "one growing array): those sessions would crash. Register every prototype op of a domain before "
            "creating sessions, or delete those sessions (and their SessionOptions) first")


def _op_declared(spec: OpSpec) -> bool:
    try:
        torch_op(spec)
        return True
    except OpRegistrationError:
        return False


def prototype_ops(nodes) -> list[str]:
    """The ``domain::name`` of every prototype op among ``nodes`` (``"domain::name"`` strings)."""
    return sorted({n for n in nodes if n in PROTOTYPES})


_SESSION_CLASS = None


def _raising_prototype_errors(run, *args, **kwargs):
    """Calls ``run`` collecting the errors of prototype ops on this thread (ORT runs a model's nodes
    on the calling thread unless the session's execution mode is parallel), then raises the first."""
    outer = getattr(_STATE, "errors", None)
    _STATE.errors = []
    try:
        result = run(*args, **kwargs)
        errors = _STATE.errors
    finally:
        _STATE.errors = outer
    if errors:
        first = errors[0]
        raise type(first)(str(first)) from first
    return result


def session_class():
    """:class:`PrototypeSession`, an ``onnxruntime.InferenceSession`` whose ``run`` raises the errors of
    prototype ops (made on first use: importing onnxruntime is not free)."""
    global _SESSION_CLASS
    if _SESSION_CLASS is None:
        import onnxruntime

        class PrototypeSession(onnxruntime.InferenceSession):
            """An ``InferenceSession`` for models with prototype ops: an error inside one (bad input,
            its implementation failing) is raised from ``run`` (and ``run_with_ort_values``,
            ``run_with_iobinding``) -- :class:`opforge.OpInputError` for bad input, RuntimeError
            otherwise -- instead of becoming empty or NaN outputs."""

            def run(self, *args, **kwargs):
                return _raising_prototype_errors(super().run, *args, **kwargs)

            def run_with_ort_values(self, *args, **kwargs):
                return _raising_prototype_errors(super().run_with_ort_values, *args, **kwargs)

            def run_with_iobinding(self, *args, **kwargs):
                return _raising_prototype_errors(super().run_with_iobinding, *args, **kwargs)

        _SESSION_CLASS = PrototypeSession
    return _SESSION_CLASS


def _session_class_for(used_ops):
    """The session class ort_session uses for a model with ``used_ops``: :class:`PrototypeSession`
    when any is a prototype op, else None (ort_session's default)."""
    return session_class() if prototype_ops(used_ops) else None


add_session_class_hook(_session_class_for)


def __getattr__(name: str):
    if name == "PrototypeSession":
        return session_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ORTX_DOMAIN", "PROTOTYPES", "Prototype", "PrototypeKernelWarning", "is_prototype", "ortx_library_path",
           "ortx_version", "prototype_ops", "register_prototype", "session_class"]
