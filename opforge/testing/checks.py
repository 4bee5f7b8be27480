"""The checks of :func:`~opforge.testing.check_op`, one function each (:data:`RUNNERS`, by the
names of :data:`~.samples.CHECKS`)."""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Sequence

import numpy as np
import torch

from ..spec import REGISTRY, OpSpec, TensorArg
from .samples import GRADCHECK_FULL_MAX_ELEMENTS, ONNX_REFERENCE_OPSET
from .support import (_as_stored, _as_tuple, _assert_close, _batch_names, _call, _cast, _custom_nodes, _double_batch,
                      _dtype_name, _float_attrs, _is_float, _numpy, _numpy_dtypes, _OpModule, _ort_run, _tolerance,
                      _where, single_node_model)


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
                for k in _differentiable_positions(spec, values):
                    values[k].requires_grad_(True)
            try:
                torch.library.opcheck(op, tuple(values), test_utils=test_utils)
            except Exception as exc:
                raise AssertionError(f"{_where('opcheck', spec, sample, i, dtype)}: torch.library.opcheck failed: "
                                     f"{type(exc).__name__}: {exc}") from exc


def _differentiable_positions(spec, values) -> list:
    """Positions of the float tensors the op has a gradient for (TensorArg.differentiable)."""
    return [k for k, (arg, v) in enumerate(zip(spec.args, values))
            if _is_float(v) and getattr(arg, "differentiable", True)]


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
        positions = _differentiable_positions(spec, values)
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

    from ..symbolics import reference as reference_module

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


RUNNERS: dict = {
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
