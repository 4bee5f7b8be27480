"""What the checks of :mod:`.checks` share: labels for failures, casting, tolerances and
comparison, running ONNX Runtime, the single-node model and the module that calls the op, and
which checks apply to a spec (:func:`not_applicable`)."""

from __future__ import annotations

import ctypes
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np
import torch

from ..spec import DTYPE_NAME_OF, ELEM_TYPE_OF, ONNX_TYPE_OF, AttrArg, OpSpec, TensorArg
from .samples import _DTYPE_OF_ONNX_TYPE, CHECKS, DYNAMO_OPSETS, TOLERANCES, Sample, Tolerance


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
    name = str(dtype).removeprefix("torch.")
    if name not in ONNX_TYPE_OF:
        raise ValueError(f"check_op: no ONNX element type for {dtype}")
    return ELEM_TYPE_OF[ONNX_TYPE_OF[name]]


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


def node_model(op_type: str, inputs: Sequence, outputs: Sequence, *, domain: str = "",
               opsets: Optional[dict] = None, ir_version: Optional[int] = None, **attrs):
    """A model with one node ``domain::op_type``: ``inputs`` and ``outputs`` are (name, ONNX element
    type or None) pairs (an input named "" is an omitted optional one), shapes unknown; ``opsets``
    {domain: version} (default: the standard ops at 18 and ``domain`` at 1). The one builder of
    single-node models in opforge, its tests and benchmarks."""
    from onnx import helper

    node = helper.make_node(op_type, [n for n, _ in inputs], [n for n, _ in outputs], domain=domain, **attrs)
    graph = helper.make_graph([node], op_type, [helper.make_tensor_value_info(n, t, None) for n, t in inputs if n],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    opsets = opsets or {"": 18, **({domain: 1} if domain else {})}
    extra = {} if ir_version is None else {"ir_version": ir_version}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()], **extra)


def single_node_model(spec: OpSpec, values: Sequence):
    """A model with one node of the op: inputs typed (element type only) from the tensors in
    ``values`` (torch-order arguments), attributes from the rest."""
    inputs, attrs = spec.split_args(list(values))
    graph_inputs = [(a.onnx_name, _onnx_elem_type(v.dtype)) if isinstance(v, torch.Tensor) else ("", None)
                    for a, v in zip(spec.tensor_args, inputs)]
    while graph_inputs and graph_inputs[-1][0] == "":  # trailing absent optional inputs are simply left out
        graph_inputs.pop()
    # each output's type from the spec's type variables (the op's own type: its float inputs')
    type_strings = [ONNX_TYPE_OF.get(str(v.dtype).replace("torch.", "")) if isinstance(v, torch.Tensor) else None
                    for v in inputs]
    out_types = [_onnx_elem_type(getattr(torch, DTYPE_NAME_OF[spec.output_elem_type(k, type_strings)
                                                               or "tensor(float)"]))
                 for k in range(len(spec.output_args))]
    return node_model(spec.name, graph_inputs, list(zip(spec.output_names, out_types)), domain=spec.domain,
                      opsets={"": 18, spec.domain: spec.domain_version}, ir_version=9, **attrs)


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
