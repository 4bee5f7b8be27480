"""Round-trip checks for one op: torch op, both ONNX exporters, ONNX Runtime, ``onnx.reference``.

Give the op's spec and a few sample argument lists; :func:`check_op` runs every check that
applies and raises :class:`AssertionError` naming the check, the sample, the dtype (and the
exporter and opset) with the largest difference it found::

    from opforge.testing import Sample, BadSample, check_op, op_tests

    SAMPLES = [
        Sample(torch.randn(4, 3), 0.5, name="2d"),                # torch-order arguments:
        Sample(torch.randn(2, 5, 7), 1.5, batch=(), rtol=1e-4),   # tensors and attribute values
    ]
    BAD = [BadSample(torch.randn(3), -1.0, match=r"swish.*alpha")]  # must be rejected by torch AND ORT

    check_op(SWISH, SAMPLES, bad_samples=BAD)                      # everything that applies
    check_op(SWISH, SAMPLES, checks=["reference", "export_dynamo"])  # just these

    # in a test module: one pytest test per check (ids = check names), inapplicable ones skipped
    test_swish = op_tests(SWISH, SAMPLES, bad_samples=BAD)

The checks (:data:`CHECKS`):

``opcheck``
    ``torch.library.opcheck`` (schema, fake impl, autograd registration, AOT dispatch) on
    each sample in float32 and float64.
``gradcheck``
    ``torch.autograd.gradcheck`` and ``gradgradcheck`` in float64 (differentiable ops only;
    ``gradgrad=False`` leaves out the second order, for ops whose backward has no autograd).
    Samples with more than :data:`GRADCHECK_FULL_MAX_ELEMENTS` input elements use gradcheck's
    fast mode (a random projection of the Jacobian).
``reference``
    The torch op against the spec's numpy ``reference``, for every dtype. Attributes reach
    the reference as they would from ONNX: keyed by ONNX name, bools as ints, floats rounded
    to float32. numpy has no bfloat16, so bfloat16 is compared with the reference computed in
    float32 on the bfloat16-rounded inputs.
``export_torchscript`` / ``export_dynamo``
    A module calling the op (the sample's attribute values fixed, its tensors as inputs) is
    exported with ``opforge.export`` at each opset; the graph must hold the custom node, and
    ONNX Runtime (``opforge.ort_session``) must match torch, for every dtype. The batch dim
    (``Sample.batch``) is exported dynamic and ORT is run again at twice the batch.
``onnx_reference``
    ``onnx.reference`` (with the spec's reference) against ORT on the dynamo export (opset 18).
``float_attrs``
    For each float attribute: the torch op gives bit-identical results for a value that float32
    cannot represent and for its float32 rounding. ONNX stores float attributes as float32, so
    a kernel computing with the double would not match its own exported model.
``bad_inputs``
    Each :class:`BadSample` must raise in torch and in ORT (a single-node model of the op),
    both messages matching ``BadSample.match``. (A crash instead takes the test process down.)

Default tolerances (``rtol`` = ``atol``): float64 1e-10, float32 1e-5, float16 1e-2,
bfloat16 2e-2; a sample's ``rtol``/``atol`` override them (a number for every dtype, or a
``{dtype: tol}`` dict).

An inapplicable check (no backward, no reference, no float attribute, no bad samples, no
opsets) is left out when ``checks=None``, is a ``ValueError`` when asked for by name, and is a
pytest skip (saying why) in :func:`op_tests`.
"""

from __future__ import annotations

import ctypes
import inspect
import re
import warnings
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .registration import torch_op
from .spec import DTYPE_NAME_OF, ONNX_TYPE_OF, REGISTRY, AttrArg, OpSpec, TensorArg

CHECKS = ("opcheck", "gradcheck", "reference", "export_torchscript", "export_dynamo", "onnx_reference",
          "float_attrs", "bad_inputs")

#: Default dynamo-exporter opsets.
DYNAMO_OPSETS = (18, 20)
#: The opset of the dynamo export that ``onnx_reference`` evaluates.
ONNX_REFERENCE_OPSET = 18

#: gradcheck compares the full Jacobian up to this many input elements (summed over a
#: sample's floating tensors), a random projection of it (fast mode) above.
GRADCHECK_FULL_MAX_ELEMENTS = 2000

#: Default rtol (and atol) per dtype. 16-bit types: about one rounding of the output plus a
#: little for kernels that round intermediates (bfloat16 has 3 fewer mantissa bits than float16).
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}

_DTYPE_OF_ONNX_TYPE = {"tensor(float)": torch.float32, "tensor(double)": torch.float64,
                       "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}

Tolerance = Union[None, float, Mapping[torch.dtype, float]]


class Sample:
    """One valid call of the op: its torch-order arguments (tensors and attribute values).

    ``batch``: names of the tensor arguments whose dim 0 is a shared batch dim, exported as
    dynamic (ORT is then also run at twice the batch). Default: the first tensor argument
    and every other tensor argument of exactly its shape; ``()`` exports static shapes only.
    ``rtol``/``atol``: a number for every dtype or ``{dtype: tol}``, replacing the defaults.
    """

    def __init__(self, *args: Any, batch: Optional[Sequence[str]] = None, rtol: Tolerance = None,
                 atol: Tolerance = None, name: Optional[str] = None):
        self.args = args
        self.batch = None if batch is None else tuple(batch)
        self.rtol, self.atol, self.name = rtol, atol, name

    def __repr__(self) -> str:
        return f"Sample({self.name or '...'})"


class BadSample:
    """A call the op must reject: torch must raise, and ORT must fail on the same inputs, each
    with a message matching the regex ``match`` (e.g. ``r"my_add.*broadcast"``)."""

    def __init__(self, *args: Any, match: str, name: Optional[str] = None):
        self.args = args
        self.match = match
        self.name = name

    def __repr__(self) -> str:
        return f"BadSample({self.name or '...'}, match={self.match!r})"


# ---- small helpers -------------------------------------------------------------------------


def _label(sample, index: int) -> str:
    return repr(sample.name) if sample.name else f"#{index}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _where(check: str, spec: OpSpec, sample=None, index: int = 0, dtype: Optional[torch.dtype] = None,
           extra: str = "") -> str:
    """The prefix of every failure message: which check, op, sample, dtype (and exporter/opset)."""
    parts = [f"check_op[{check}] {spec.torch_qualname}"]
    if sample is not None:
        parts.append(f"sample {_label(sample, index)}")
    if dtype is not None:
        parts.append(_dtype_name(dtype))
    if extra:
        parts.append(extra)
    return ", ".join(parts)


def _tolerance(value: Tolerance, dtype: torch.dtype) -> float:
    if value is None:
        return TOLERANCES.get(dtype, 0.0)
    if isinstance(value, Mapping):
        return value.get(dtype, TOLERANCES.get(dtype, 0.0))
    return float(value)


def _is_float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _cast(values: Sequence, dtype: torch.dtype, spec: Optional[OpSpec] = None) -> list:
    """Floating tensors to ``dtype`` (fresh leaves), except inputs of ``spec`` that declare their own
    dtypes (``TensorArg(dtypes=...)``); other tensors and attribute values unchanged."""
    own = {i for i, a in enumerate(spec.args) if isinstance(a, TensorArg) and a.own_types} if spec else set()
    return [v.detach().to(dtype).clone() if _is_float(v) and i not in own else
            (v.detach().clone() if isinstance(v, torch.Tensor) else v) for i, v in enumerate(values)]


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _call(op, values: Sequence) -> tuple:
    with torch.no_grad():
        return tuple(o.detach() for o in _as_tuple(op(*values)))


def _assert_close(got: Sequence, want: Sequence, *, rtol: float, atol: float, where: str, what: str) -> None:
    """Elementwise ``|got - want| <= atol + rtol*|want|`` (NaN matching NaN), with a message giving
    the count of mismatches and the largest difference and where it is."""
    if len(got) != len(want):
        raise AssertionError(f"{where}: {what}: {len(got)} outputs, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = torch.as_tensor(g).detach().cpu(), torch.as_tensor(w).detach().cpu()
        if tuple(g.shape) != tuple(w.shape):
            raise AssertionError(f"{where}: {what}: output {i} has shape {list(g.shape)}, expected {list(w.shape)}")
        if g.numel() == 0:
            continue
        if not (g.is_floating_point() or w.is_floating_point()):
            if not torch.equal(g, w.to(g.dtype)):
                n_bad = int((g != w.to(g.dtype)).sum())
                raise AssertionError(f"{where}: {what}: output {i}: {n_bad}/{g.numel()} elements differ (exact "
                                     "comparison of non-floating outputs)")
            continue
        g64, w64 = g.to(torch.float64), w.to(torch.float64)
        both_nan = torch.isnan(g64) & torch.isnan(w64)
        same_inf = torch.isinf(w64) & (g64 == w64)
        diff = torch.where(both_nan | same_inf, torch.zeros_like(g64), (g64 - w64).abs())
        diff = torch.nan_to_num(diff, nan=float("inf"))  # NaN on one side only
        bad = diff > atol + rtol * w64.abs().nan_to_num(nan=0.0, posinf=0.0)
        if bool(bad.any()):
            worst = int(torch.argmax(torch.where(bad, diff, torch.full_like(diff, -1.0))))
            index = tuple(int(k) for k in np.unravel_index(worst, tuple(g.shape))) if g.dim() else ()
            raise AssertionError(
                f"{where}: {what}: output {i} differs in {int(bad.sum())}/{g.numel()} elements "
                f"(rtol={rtol:g}, atol={atol:g}); max abs diff {float(diff.max()):.6g}, e.g. at index {list(index)}: "
                f"got {float(g64.reshape(-1)[worst])!r}, expected {float(w64.reshape(-1)[worst])!r}"
            )


def _numpy(t: torch.Tensor) -> np.ndarray:
    # numpy has no bfloat16: the float32 copy holds exactly the bfloat16-rounded values.
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _check_samples(spec: OpSpec, samples: Sequence, kind: str) -> None:
    for i, s in enumerate(samples):
        if len(s.args) != len(spec.args):
            raise ValueError(f"check_op {spec.torch_qualname}: {kind} {_label(s, i)} has {len(s.args)} arguments, "
                             f"the op takes {len(spec.args)} ({', '.join(a.name for a in spec.args)})")
        if kind == "bad sample":
            continue  # deliberately wrong arguments: only the count must fit the op
        for arg, value in zip(spec.args, s.args):
            if isinstance(arg, TensorArg) and not (isinstance(value, torch.Tensor) or (value is None and arg.optional)):
                raise ValueError(f"check_op {spec.torch_qualname}: {kind} {_label(s, i)}: argument {arg.name!r} "
                                 f"must be a tensor, got {type(value).__name__}")
            if isinstance(arg, AttrArg) and isinstance(value, torch.Tensor):
                raise ValueError(f"check_op {spec.torch_qualname}: {kind} {_label(s, i)}: attribute {arg.name!r} "
                                 "must be a Python value, got a tensor")
        _batch_names(spec, s, i)


def _batch_names(spec: OpSpec, sample: Sample, index: int) -> tuple:
    """The tensor arguments whose dim 0 is exported dynamic (validated)."""
    tensors = {a.name: v for a, v in zip(spec.args, sample.args) if isinstance(a, TensorArg) and v is not None}
    if sample.batch is None:
        if not tensors:
            return ()
        first_name, first = next(iter(tensors.items()))
        if first.dim() == 0:
            return ()
        return tuple(n for n, t in tensors.items() if n == first_name or t.shape == first.shape)
    sizes = set()
    for name in sample.batch:
        if name not in tensors:
            raise ValueError(f"check_op {spec.torch_qualname}: sample {_label(sample, index)}: batch names {name!r}, "
                             f"which is not one of its tensor arguments {list(tensors)}")
        if tensors[name].dim() == 0:
            raise ValueError(f"check_op {spec.torch_qualname}: sample {_label(sample, index)}: batch argument "
                             f"{name!r} is 0-d")
        sizes.add(tensors[name].shape[0])
    if len(sizes) > 1:
        raise ValueError(f"check_op {spec.torch_qualname}: sample {_label(sample, index)}: the batch arguments "
                         f"{list(sample.batch)} differ in dim 0 ({sorted(sizes)})")
    return sample.batch


def _double_batch(spec: OpSpec, values: list, batch: Sequence[str]) -> list:
    """``values`` with every batch tensor concatenated with a perturbed copy along dim 0.

    The copy is the tensor flipped along dim 0 and scaled elementwise by a factor in
    [0.5, 1]: new values, yet signs kept and magnitudes only shrunk, so inputs restricted
    to a range around 0 (a mask in [0, 1], positive scales) stay valid.
    """
    gen = torch.Generator().manual_seed(1234)
    out = list(values)
    for i, arg in enumerate(spec.args):
        if arg.name in batch:
            t = values[i]
            copy = t.flip(0)
            if t.is_floating_point():
                scale = torch.rand(t.shape, generator=gen, dtype=torch.float64) * 0.5 + 0.5
                copy = (copy.double() * scale).to(t.dtype)
            out[i] = torch.cat([t, copy], dim=0)
    return out


# ---- ONNX and ONNX Runtime helpers ----------------------------------------------------------


def _onnx_elem_type(dtype: torch.dtype) -> int:
    from onnx import TensorProto

    table = {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE, torch.float16: TensorProto.FLOAT16,
             torch.bfloat16: TensorProto.BFLOAT16, torch.int64: TensorProto.INT64, torch.int32: TensorProto.INT32,
             torch.int16: TensorProto.INT16, torch.int8: TensorProto.INT8, torch.uint8: TensorProto.UINT8,
             torch.bool: TensorProto.BOOL}
    if dtype not in table:
        raise ValueError(f"check_op: no ONNX element type for {dtype}")
    return table[dtype]


def _ort_run(session, feeds: Mapping[str, torch.Tensor]) -> list:
    """Runs an ORT session on torch tensors and returns torch tensors. bfloat16 has no numpy
    dtype in ORT's Python API, so inputs go in as OrtValues over raw 16-bit buffers and
    bfloat16 outputs are copied out of ORT's buffer byte for byte."""
    import onnxruntime as ort

    ort_feeds = {}
    for name, t in feeds.items():
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().view(np.uint16)
            ort_feeds[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, _onnx_elem_type(t.dtype))
        else:
            ort_feeds[name] = ort.OrtValue.ortvalue_from_numpy(t.numpy())
    outputs = []
    for value in session.run_with_ort_values(None, ort_feeds):
        if value.data_type() == "tensor(bfloat16)":
            out = torch.empty(tuple(value.shape()), dtype=torch.bfloat16)
            if out.numel():
                ctypes.memmove(out.data_ptr(), value.data_ptr(), out.numel() * out.element_size())
            outputs.append(out)
        else:
            outputs.append(torch.from_numpy(np.array(value.numpy(), copy=True)))
    return outputs


def _custom_nodes(proto, spec: OpSpec) -> int:
    nodes = list(proto.graph.node) + [n for f in proto.functions for n in f.node]
    return sum(1 for n in nodes if (n.domain, n.op_type) == (spec.domain, spec.name))


def single_node_model(spec: OpSpec, values: Sequence):
    """A model with one node of the op: inputs typed (element type only) from the tensors in
    ``values`` (torch-order arguments), attributes from the rest."""
    from onnx import TensorProto, helper

    inputs, attrs = spec.split_args(list(values))
    names = [a.onnx_name if v is not None else "" for a, v in zip(spec.tensor_args, inputs)]
    while names and names[-1] == "":  # trailing absent optional inputs are simply left out
        names.pop()
    graph_inputs = [helper.make_tensor_value_info(a.onnx_name, _onnx_elem_type(v.dtype), None)
                    for a, v in zip(spec.tensor_args, inputs) if isinstance(v, torch.Tensor)]
    # each output's type from the spec's type variables (the op's own type: its float inputs')
    type_strings = [ONNX_TYPE_OF.get(str(v.dtype).replace("torch.", "")) if isinstance(v, torch.Tensor) else None
                    for v in inputs]
    out_types = [_onnx_elem_type(getattr(torch, DTYPE_NAME_OF[spec.output_elem_type(k, type_strings)
                                                               or "tensor(float)"]))
                 for k in range(len(spec.output_args))]
    node = helper.make_node(spec.name, names, list(spec.output_names), domain=spec.domain, **attrs)
    graph = helper.make_graph([node], spec.name, graph_inputs,
                              [helper.make_tensor_value_info(o, t, None) for o, t in zip(spec.output_names, out_types)])
    return helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid(spec.domain, spec.domain_version)])


class _OpModule(torch.nn.Module):
    """Calls the op with the sample's attribute values (and absent optional tensors) fixed;
    the sample's tensors are the forward inputs, in argument order."""

    def __init__(self, op, values: Sequence, tensor_positions: Sequence[int]):
        super().__init__()
        self.op = op
        self.values = list(values)
        self.tensor_positions = list(tensor_positions)

    def forward(self, *tensors):
        values = list(self.values)
        for position, tensor in zip(self.tensor_positions, tensors):
            values[position] = tensor
        return self.op(*values)


# ---- applicability -------------------------------------------------------------------------


def _float_attrs(spec: OpSpec) -> list:
    return [i for i, a in enumerate(spec.args) if isinstance(a, AttrArg) and a.kind in ("float", "floats")]


def _as_stored(kind: str, value):
    """An attribute value as ONNX stores it: float32 for float and float[] attributes."""
    if kind == "float":
        return float(np.float32(value))
    if kind == "floats":
        return [float(np.float32(v)) for v in value]
    return value


def _numpy_dtypes(dtypes: Sequence[torch.dtype]) -> list:
    return [d for d in dtypes if d != torch.bfloat16]


def not_applicable(spec: OpSpec, check: str, *, samples: Sequence = (), bad_samples: Sequence = (),
                   dtypes: Optional[Sequence[torch.dtype]] = None, torchscript_opsets: Optional[Iterable[int]] = None,
                   dynamo_opsets: Optional[Iterable[int]] = None, **_ignored) -> Optional[str]:
    """Why ``check`` does not apply to ``spec`` with these options, or None if it does."""
    if check not in CHECKS:
        raise ValueError(f"check_op: unknown check {check!r}; the checks are {', '.join(CHECKS)}")
    if check == "bad_inputs":
        return None if bad_samples else "no bad samples given"
    if not samples:
        return "no samples given"
    if check == "gradcheck" and not spec.differentiable:
        return f"{spec.torch_qualname} is not differentiable (its spec has no backward)"
    if check in ("reference", "onnx_reference") and spec.reference is None:
        return f"{spec.torch_qualname} has no numpy reference (spec.reference is None)"
    if check == "onnx_reference" and not _numpy_dtypes(_resolve_dtypes(spec, dtypes)):
        return "no dtype numpy (hence onnx.reference) supports: bfloat16 only"
    if check == "export_torchscript" and not _torchscript_opsets(spec, torchscript_opsets):
        return f"no TorchScript opsets ({spec.torch_qualname} has torchscript_opsets={spec.torchscript_opsets})"
    if check == "export_dynamo" and not _dynamo_opsets(dynamo_opsets):
        return "no dynamo opsets given"
    if check == "float_attrs" and not _float_attrs(spec):
        return f"{spec.torch_qualname} has no float attribute"
    return None


def _resolve_dtypes(spec: OpSpec, dtypes: Optional[Sequence[torch.dtype]]) -> list:
    if dtypes is not None:
        return list(dtypes)
    return [_DTYPE_OF_ONNX_TYPE[t] for t in spec.onnx_types if t in _DTYPE_OF_ONNX_TYPE]


def _torchscript_opsets(spec: OpSpec, opsets: Optional[Iterable[int]]) -> list:
    if opsets is not None:
        return list(opsets)
    available = list(spec.torchscript_opsets)
    return sorted({available[0], available[-1]}) if available else []


def _dynamo_opsets(opsets: Optional[Iterable[int]]) -> list:
    return list(DYNAMO_OPSETS if opsets is None else opsets)


# ---- the checks ----------------------------------------------------------------------------


def _check_opcheck(spec, op, samples, dtypes, **_):
    # opcheck's float32 and float64 runs cover the fake impl and autograd registration;
    # the 16-bit types add nothing there that the value checks do not.
    run_dtypes = [d for d in dtypes if d in (torch.float32, torch.float64)] or list(dtypes[:1])
    test_utils = list(inspect.signature(torch.library.opcheck).parameters["test_utils"].default)
    if not spec.differentiable:
        test_utils = [t for t in test_utils if t != "test_autograd_registration"]
    for i, sample in enumerate(samples):
        for dtype in run_dtypes:
            values = _cast(sample.args, dtype, spec)
            if spec.differentiable:
                for v in values:
                    if _is_float(v):
                        v.requires_grad_(True)
            try:
                torch.library.opcheck(op, tuple(values), test_utils=test_utils)
            except Exception as exc:
                raise AssertionError(f"{_where('opcheck', spec, sample, i, dtype)}: torch.library.opcheck failed: "
                                     f"{type(exc).__name__}: {exc}") from exc


def _not_differentiable_backward(exc: BaseException) -> bool:
    """Whether a gradgradcheck failure means the backward itself has no autograd."""
    text = str(exc)
    return (isinstance(exc, NotImplementedError) or "does not require grad" in text
            or "don't support automatic differentiation" in text
            or "not implemented" in text.lower() or "autograd kernel was not registered" in text)


def _says_no_double_backward(exc: BaseException) -> bool:
    """Whether a gradgradcheck failure is the op saying it has no double backward: the clear error
    that the autograd kernel of a C++ backward op raises (opforge's ops, ``opforge new-op --backward
    cpp``), whatever its other words, in the exception or its cause."""
    seen: set = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if "double backward" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _check_gradcheck(spec, op, samples, gradgrad=True, **_):
    for i, sample in enumerate(samples):
        values = _cast(sample.args, torch.float64, spec)
        positions = [k for k, v in enumerate(values) if _is_float(v)]
        inputs = tuple(values[k].requires_grad_(True) for k in positions)
        if not inputs:
            continue

        def fn(*tensors, values=values, positions=positions):
            call = list(values)
            for k, t in zip(positions, tensors):
                call[k] = t
            return op(*call)

        # Full gradcheck costs two forward calls per input element: past a size, check a
        # random projection of the Jacobian instead (gradcheck's fast mode).
        fast = sum(t.numel() for t in inputs) > GRADCHECK_FULL_MAX_ELEMENTS
        where = _where("gradcheck", spec, sample, i, torch.float64, "fast mode" if fast else "")
        try:
            torch.autograd.gradcheck(fn, inputs, fast_mode=fast)
        except Exception as exc:
            raise AssertionError(f"{where}: torch.autograd.gradcheck failed: {type(exc).__name__}: {exc}") from exc
        if not gradgrad:
            continue
        try:
            with warnings.catch_warnings():
                # A backward op without autograd warns before failing; the failure says it.
                warnings.filterwarnings("ignore", message=".*autograd kernel was not registered.*")
                torch.autograd.gradgradcheck(fn, inputs, fast_mode=fast)
        except Exception as exc:
            if _says_no_double_backward(exc):
                raise AssertionError(
                    f"{where}: gradgradcheck: {spec.torch_qualname} has no double backward, as its backward says "
                    f"({type(exc).__name__}: {exc}). Pass gradgrad=False (check_op / op_tests) to check its first-order "
                    "gradients only, or give its backward op an autograd formula"
                ) from exc
            if _not_differentiable_backward(exc):
                raise AssertionError(
                    f"{where}: gradgradcheck: the op's backward is not itself differentiable ({type(exc).__name__}: "
                    f"{exc}). Give the backward an autograd formula, or pass gradgrad=False to skip second order"
                ) from exc
            raise AssertionError(f"{where}: torch.autograd.gradgradcheck failed: {type(exc).__name__}: {exc}") from exc


def reference_kwargs(spec: OpSpec, values: Sequence) -> tuple:
    """(numpy inputs, attribute kwargs) for ``spec.reference``, as ONNX would hand them over:
    attributes by ONNX name, bools as ints, floats rounded to float32 (ONNX stores float32)."""
    tensors, attrs = spec.split_args(list(values))
    kinds = {a.onnx_name: a.kind for a in spec.attr_args}
    attrs = {k: _as_stored(kinds[k], v) for k, v in attrs.items()}
    return [None if t is None else _numpy(t) for t in tensors], attrs


def _check_reference(spec, op, samples, dtypes, **_):
    for i, sample in enumerate(samples):
        for dtype in dtypes:
            values = _cast(sample.args, dtype, spec)
            where = _where("reference", spec, sample, i, dtype)
            got = _call(op, values)
            inputs, attrs = reference_kwargs(spec, values)
            try:
                want = _as_tuple(spec.reference(*inputs, **attrs))
            except Exception as exc:
                raise AssertionError(f"{where}: spec.reference raised {type(exc).__name__}: {exc}") from exc
            what = "torch op vs spec.reference" + (" (computed in float32)" if dtype == torch.bfloat16 else "")
            _assert_close(got, [torch.from_numpy(np.asarray(w)) for w in want], rtol=_tolerance(sample.rtol, dtype),
                          atol=_tolerance(sample.atol, dtype), where=where, what=what)


def _export(spec, op, values, batch, *, dynamo: bool, opset: int):
    """Exports the op on ``values``; returns (proto, ONNX input names, their argument positions)."""
    import opforge

    positions = [k for k, (a, v) in enumerate(zip(spec.args, values)) if isinstance(a, TensorArg) and v is not None]
    names = [spec.args[k].onnx_name for k in positions]
    dynamic = {}
    if batch:
        batch_onnx = {a.onnx_name for a in spec.args if a.name in batch}
        if dynamo:
            dim = torch.export.Dim("batch")
            # One entry for forward's single *tensors parameter, holding one spec per tensor.
            dynamic["dynamic_shapes"] = (tuple({0: dim} if n in batch_onnx else None for n in names),)
        else:
            dynamic["dynamic_axes"] = {n: {0: "batch"} for n in names if n in batch_onnx}
    model = _OpModule(op, values, positions).eval()
    extra = {"verbose": False} if dynamo else {}
    with warnings.catch_warnings():
        # Inputs sharing the one batch Dim make the exporter note that it keeps one name for them.
        warnings.filterwarnings("ignore", message=".*will not be used, since it shares the same shape constraints")
        proto = opforge.export(model, tuple(values[k] for k in positions), dynamo=dynamo, opset_version=opset,
                               standard_onnx=False, input_names=names, output_names=list(spec.output_names), **dynamic,
                               **extra)
    return proto, names, positions


def _feeds(session, names, positions, values) -> dict:
    """ORT feeds from the op's argument ``values`` (inputs the exporter dropped left out)."""
    graph_inputs = {i.name for i in session.get_inputs()}
    return {n: values[k] for n, k in zip(names, positions) if n in graph_inputs}


def _check_export(spec, op, samples, dtypes, *, dynamo: bool, opsets, check: str, **_):
    import opforge

    exporter = "dynamo" if dynamo else "TorchScript"
    registered = spec.onnx_qualname in REGISTRY
    for i, sample in enumerate(samples):
        batch = _batch_names(spec, sample, i)
        for dtype in dtypes:
            rtol, atol = _tolerance(sample.rtol, dtype), _tolerance(sample.atol, dtype)
            values = _cast(sample.args, dtype, spec)
            expected = _call(op, values)
            for opset in opsets:
                where = _where(check, spec, sample, i, dtype, f"{exporter} exporter, opset {opset}")
                try:
                    proto, names, positions = _export(spec, op, values, batch, dynamo=dynamo, opset=opset)
                except Exception as exc:
                    hint = "" if registered else " (the spec is not registered: call opforge.register_op(spec))"
                    raise AssertionError(f"{where}: the {exporter} exporter could not export the op at dtype "
                                         f"{_dtype_name(dtype)}{hint}: {type(exc).__name__}: {exc}") from exc
                if not _custom_nodes(proto, spec):
                    found = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in proto.graph.node})
                    raise AssertionError(f"{where}: the exported graph has no {spec.onnx_qualname} node; "
                                         f"it has {found}")
                try:
                    session = opforge.ort_session(proto)
                    got = _ort_run(session, _feeds(session, names, positions, values))
                except Exception as exc:
                    raise AssertionError(f"{where}: ONNX Runtime failed on the exported model: "
                                         f"{type(exc).__name__}: {exc}") from exc
                _assert_close(got, expected, rtol=rtol, atol=atol, where=where, what="ONNX Runtime vs torch")
                if not batch:
                    continue
                # The batch dim was exported dynamic: the model must also be right at another size.
                doubled = _double_batch(spec, values, batch)
                try:
                    got = _ort_run(session, _feeds(session, names, positions, doubled))
                except Exception as exc:
                    raise AssertionError(f"{where}: ONNX Runtime failed at twice the batch size (dynamic dim 0 of "
                                         f"{list(batch)}): {type(exc).__name__}: {exc}") from exc
                _assert_close(got, _call(op, doubled), rtol=rtol, atol=atol, where=where,
                              what=f"ONNX Runtime vs torch at twice the batch (dim 0 of {list(batch)} dynamic)")


def _check_onnx_reference(spec, op, samples, dtypes, **_):
    import opforge
    from onnx.reference import ReferenceEvaluator

    from .symbolics import reference as reference_module

    # This spec's reference (which may not be the registered object), plus every other registered op's.
    new_ops = [reference_module.reference_op(s) for s in REGISTRY.values() if s.onnx_qualname != spec.onnx_qualname]
    new_ops.append(reference_module.reference_op(spec))
    for i, sample in enumerate(samples):
        for dtype in _numpy_dtypes(dtypes):
            where = _where("onnx_reference", spec, sample, i, dtype, f"dynamo exporter, opset {ONNX_REFERENCE_OPSET}")
            values = _cast(sample.args, dtype, spec)
            try:
                proto, names, positions = _export(spec, op, values, (), dynamo=True, opset=ONNX_REFERENCE_OPSET)
                session = opforge.ort_session(proto)
                feeds = _feeds(session, names, positions, values)
                got_ort = _ort_run(session, feeds)
            except Exception as exc:
                raise AssertionError(f"{where}: export or ONNX Runtime failed: {type(exc).__name__}: {exc}") from exc
            try:
                got_ref = ReferenceEvaluator(proto, new_ops=new_ops).run(None, {n: _numpy(t) for n, t in feeds.items()})
            except Exception as exc:
                raise AssertionError(f"{where}: onnx.reference failed: {type(exc).__name__}: {exc}") from exc
            _assert_close(got_ort, [torch.from_numpy(np.asarray(r)) for r in got_ref],
                          rtol=_tolerance(sample.rtol, dtype), atol=_tolerance(sample.atol, dtype), where=where,
                          what="ONNX Runtime vs onnx.reference")


def _not_float32(value: float) -> float:
    """``value``, or a value next to it, that float32 cannot represent exactly."""
    value = float(value)
    if float(np.float32(value)) != value:
        return value
    return value + max(abs(value), 1.0) * 1e-9


def _check_float_attrs(spec, op, samples, dtypes, **_):
    for k in _float_attrs(spec):
        name = spec.args[k].name
        for i, sample in enumerate(samples):
            for dtype in dtypes:
                values = _cast(sample.args, dtype, spec)
                kind = spec.args[k].kind
                v = [_not_float32(x) for x in values[k]] if kind == "floats" else _not_float32(values[k])
                v32 = _as_stored(kind, v)
                where = _where("float_attrs", spec, sample, i, dtype, f"attribute {name!r}")
                with_double = _call(op, values[:k] + [v] + values[k + 1:])
                with_float = _call(op, values[:k] + [v32] + values[k + 1:])
                try:
                    _assert_close(with_double, with_float, rtol=0.0, atol=0.0, where=where,
                                  what=f"{name}={v!r} vs its float32 value {v32!r}")
                except AssertionError as exc:
                    raise AssertionError(
                        f"{exc}. The kernel computes with the double value of {name!r}, but ONNX stores float "
                        "attributes as float32, so the exported model cannot match torch: convert it to float "
                        "first (e.g. take a C++ float)") from None


def _check_bad_inputs(spec, op, bad_samples, **_):
    import onnxruntime

    import opforge

    for i, bad in enumerate(bad_samples):
        where = _where("bad_inputs", spec, bad, i)
        pattern = re.compile(bad.match)
        try:
            op(*bad.args)
        except Exception as exc:
            if not pattern.search(str(exc)):
                raise AssertionError(f"{where}: torch raised {type(exc).__name__}, but its message does not match "
                                     f"{bad.match!r}: {exc}") from exc
        else:
            raise AssertionError(f"{where}: torch accepted the bad sample (expected an error matching {bad.match!r})")

        try:
            model = single_node_model(spec, bad.args)
        except Exception as exc:
            raise AssertionError(f"{where}: cannot build a single-node ONNX model of these arguments for ONNX Runtime: "
                                 f"{type(exc).__name__}: {exc}") from exc
        inputs = spec.split_args(list(bad.args))[0]
        feeds = {a.onnx_name: v for a, v in zip(spec.tensor_args, inputs) if isinstance(v, torch.Tensor)}
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 4  # the error is expected: keep ORT from logging it to stderr as well
        stage = "creating the session"
        try:
            session = opforge.ort_session(model, options)
            stage = "running the session"
            _ort_run(session, feeds)
        except Exception as exc:
            if not pattern.search(str(exc)):
                raise AssertionError(f"{where}: ONNX Runtime failed {stage} ({type(exc).__name__}), but its message "
                                     f"does not match {bad.match!r}: {exc}") from exc
        else:
            raise AssertionError(f"{where}: ONNX Runtime accepted the bad sample (single-node model; expected an "
                                 f"error matching {bad.match!r})")


_RUNNERS: dict = {
    "opcheck": _check_opcheck,
    "gradcheck": _check_gradcheck,
    "reference": _check_reference,
    "export_torchscript": lambda spec, op, samples, dtypes, torchscript_opsets, **kw: _check_export(
        spec, op, samples, dtypes, dynamo=False, opsets=torchscript_opsets, check="export_torchscript"),
    "export_dynamo": lambda spec, op, samples, dtypes, dynamo_opsets, **kw: _check_export(
        spec, op, samples, dtypes, dynamo=True, opsets=dynamo_opsets, check="export_dynamo"),
    "onnx_reference": _check_onnx_reference,
    "float_attrs": _check_float_attrs,
    "bad_inputs": _check_bad_inputs,
}


def check_op(spec: OpSpec, samples: Iterable[Sample], *, bad_samples: Iterable[BadSample] = (),
             checks: Optional[Iterable[str]] = None, dtypes: Optional[Sequence[torch.dtype]] = None,
             torchscript_opsets: Optional[Iterable[int]] = None, dynamo_opsets: Optional[Iterable[int]] = None,
             gradgrad: bool = True) -> None:
    """Runs the round-trip ``checks`` (default: every one that applies) of the op ``spec``.

    ``samples``: valid calls (:class:`Sample`); ``bad_samples``: calls that must be rejected
    (:class:`BadSample`). ``dtypes``: floating dtypes the samples are cast to (default: those of
    ``spec.onnx_types``). ``torchscript_opsets``: default the first and last of
    ``spec.torchscript_opsets``; ``dynamo_opsets``: default (18, 20). ``gradgrad=False`` leaves
    out ``gradgradcheck`` (for ops whose backward is not differentiable).

    Raises AssertionError (naming check, sample, dtype, exporter/opset) on the first failure,
    and ValueError for a check asked for by name that does not apply.
    """
    samples, bad_samples = list(samples), list(bad_samples)
    _check_samples(spec, samples, "sample")
    _check_samples(spec, bad_samples, "bad sample")
    options = dict(samples=samples, bad_samples=bad_samples, dtypes=dtypes, torchscript_opsets=torchscript_opsets,
                   dynamo_opsets=dynamo_opsets)
    if checks is None:
        selected = [c for c in CHECKS if not_applicable(spec, c, **options) is None]
    else:
        selected = [checks] if isinstance(checks, str) else list(checks)
        for check in selected:
            reason = not_applicable(spec, check, **options)
            if reason is not None:
                raise ValueError(f"check_op: check {check!r} does not apply to {spec.torch_qualname}: {reason}")
    op = torch_op(spec)
    resolved = dict(dtypes=_resolve_dtypes(spec, dtypes),
                    torchscript_opsets=_torchscript_opsets(spec, torchscript_opsets),
                    dynamo_opsets=_dynamo_opsets(dynamo_opsets), gradgrad=gradgrad)
    for check in selected:
        _RUNNERS[check](spec, op, samples=samples, bad_samples=bad_samples, **resolved)


def op_tests(spec: OpSpec, samples: Iterable[Sample], *, bad_samples: Iterable[BadSample] = (),
             **check_op_kwargs) -> Callable:
    """A pytest test function parametrised over :data:`CHECKS` (ids = check names) running
    :func:`check_op` one check at a time; a check that does not apply is skipped, saying why::

        test_swish = op_tests(SWISH, SAMPLES, bad_samples=BAD, gradgrad=False)
    """
    import pytest

    samples, bad_samples = list(samples), list(bad_samples)
    if "checks" in check_op_kwargs:
        raise TypeError("op_tests: runs every check as its own test; select with pytest -k instead of checks=")
    inspect.signature(check_op).bind(spec, samples, **check_op_kwargs)  # a misspelt option fails here, not per test
    _check_samples(spec, samples, "sample")
    _check_samples(spec, bad_samples, "bad sample")

    @pytest.mark.parametrize("check", CHECKS)
    def test(check):
        reason = not_applicable(spec, check, samples=samples, bad_samples=bad_samples, **check_op_kwargs)
        if reason is not None:
            pytest.skip(f"{check}: {reason}")
        check_op(spec, samples, bad_samples=bad_samples, checks=[check], **check_op_kwargs)

    test.__name__ = f"test_{spec.name}"
    test.__doc__ = f"check_op round trips of {spec.torch_qualname}"
    return test


__all__ = ["BadSample", "CHECKS", "Sample", "TOLERANCES", "check_op", "not_applicable", "op_tests", "single_node_model"]
