"""One export call for both torch exporters, with opforge's ops wired in."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from typing import Any, Mapping, Optional, Sequence

import onnx
import torch

from .spec import DOMAIN, DOMAIN_VERSION, TORCHSCRIPT_OPSETS
from .aten import fallback as _aten
from .aten import fallback_dynamo as _aten_dynamo
from .aten.diagnosis import explain_failure as _explain_failure
from .exporter_cache import recorded_decomposition, reused_exporter_setup
from .symbolics import dynamo as _dynamo
from .symbolics import lowering
from .symbolics import onnx_schema as _onnx_schema

#: Default opsets: the dynamo exporter's own default, and the newest the TorchScript exporter knows.
DEFAULT_DYNAMO_OPSET = 18
DEFAULT_TORCHSCRIPT_OPSET = TORCHSCRIPT_OPSETS[-1]


def export(
    model: torch.nn.Module,
    args: tuple,
    f: Optional[os.PathLike | str] = None,
    *,
    dynamo: bool = True,
    opset_version: Optional[int] = None,
    standard_onnx: lowering.StandardOnnx = None,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    dynamic_shapes: Any = None,
    dynamic_axes: Optional[Mapping[str, Any]] = None,
    kwargs: Optional[dict] = None,
    aten_fallback: bool = False,
    allow_aten: Optional[Sequence[str]] = None,
    check: bool = True,
    **export_options: Any,
) -> onnx.ModelProto:
    """Exports ``model(*args)`` to ONNX with either exporter and returns the ModelProto.

    * ``dynamo=True`` (torch's default): ``torch.onnx.export(..., dynamo=True)`` with
      opforge's ``custom_translation_table``; dynamic dims via ``dynamic_shapes`` (or ``dynamic_axes``).
    * ``dynamo=False``: the TorchScript exporter (opsets 9..20) with opforge's symbolics and
      ``custom_opsets``; dynamic dims via ``dynamic_axes``.
    * ``standard_onnx``: None (auto: custom nodes, except deform_conv2d -> ``DeformConv`` from
      opset 19), False (custom nodes everywhere), True (standard ONNX wherever possible), or op
      names (e.g. ``{"my_add"}``: Mul + Add) -- see :mod:`opforge.symbolics.lowering`.
    * ``aten_fallback``: ops with no ONNX translation become ``org.pytorch.aten::ATen`` nodes
      (TorchScript: ``ONNX_ATEN_FALLBACK``; dynamo: opforge's equivalent fallback) instead of
      failing the export. Never silent: an :class:`AtenFallbackWarning` names the ops, and the
      model's ``metadata_props["opforge.aten_fallback"]`` lists them. Run such models with
      ``opforge.ort_session`` (registers ``libopforge_aten``). An op libopforge_aten refuses by
      default (it reads files, draws random numbers...: :mod:`opforge.aten.policy`) fails
      the export unless ``allow_aten`` names it; the session then needs the same ``allow_aten``.
    * ``check``: run ``onnx.checker.check_model(full_check=True)`` on the result.

    Both exporters export the model in eval mode (dropout off, batch norm's running statistics),
    as ``torch.onnx.export(..., dynamo=False)`` does; a model in training mode is switched for the
    export and back.

    Other keyword arguments go to ``torch.onnx.export`` unchanged. Writes ``f`` if given.

    When the exporter fails on ops it cannot translate, :class:`opforge.diagnose.ExportError`
    says, for each such op, whether it is an ATen op, whether ONNX has an equivalent, and which
    way applies (symbolic, custom op, ATen fallback).
    """
    standard = lowering.resolve(standard_onnx)
    if not isinstance(args, tuple):
        args = (args,)
    if dynamo:
        opset = opset_version or DEFAULT_DYNAMO_OPSET
    else:
        opset = opset_version or DEFAULT_TORCHSCRIPT_OPSET
        if opset not in TORCHSCRIPT_OPSETS:
            raise ValueError(
                f"opforge.export: the TorchScript exporter (dynamo=False) supports opsets "
                f"{TORCHSCRIPT_OPSETS[0]}..{TORCHSCRIPT_OPSETS[-1]}, got opset_version={opset}; "
                "use dynamo=True for newer opsets"
            )
        if dynamic_shapes is not None:
            raise ValueError("opforge.export: dynamic_shapes is for dynamo=True; use dynamic_axes with dynamo=False")
    decomposed: dict = {}
    try:
        with _in_eval_mode(model, dynamo), recorded_decomposition() as decomposed:
            proto = _run_exporter(model, args, dynamo=dynamo, opset=opset, standard=standard, input_names=input_names,
                                  output_names=output_names, dynamic_shapes=dynamic_shapes,
                                  dynamic_axes=dynamic_axes, kwargs=kwargs, aten_fallback=aten_fallback,
                                  export_options=export_options)
    except Exception as exc:
        explained = None if aten_fallback else _explain_failure(
            exc, model, args, dynamo=dynamo, opset=opset, kwargs=kwargs, dynamic_shapes=dynamic_shapes,
            decomposed=decomposed)
        if explained is None:
            raise
        raise explained from exc
    proto, aten_ops = _aten.prepare(proto, allow_aten)
    if aten_ops:
        onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props},
                                            "opforge.aten_fallback": ",".join(aten_ops)})
        warnings.warn(f"opforge.export: {len(aten_ops)} op(s) fell back to ATen nodes (run them with "
                      f"libopforge_aten, e.g. opforge.ort_session): {', '.join(aten_ops)}",
                      _aten.AtenFallbackWarning, stacklevel=2)
    if check:
        _onnx_schema.check_node_types(proto, where="opforge.export")  # says more than the checker's "typestr: T"
        onnx.checker.check_model(proto, full_check=True)
    if f is not None:
        onnx.save(proto, os.fspath(f))
    return proto


@contextlib.contextmanager
def _training_flags_kept(model):
    """Puts every submodule's own training flag back on exit. Restoring with ``model.train()``
    (as torch's exporter does) would set them all, so a frozen eval-mode backbone inside a training
    model, the usual detector, would come back training (Dropout on, BatchNorm statistics
    updating). The flags are set directly, not through ``train()``, which a module may override
    to do more."""
    flags = [(m, m.training) for m in model.modules()] if isinstance(model, torch.nn.Module) else []
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


@contextlib.contextmanager
def _in_eval_mode(model, dynamo: bool):
    """Both exporters export inference models: the TorchScript exporter switches the model to
    eval mode by itself (``training=TrainingMode.EVAL``), the dynamo exporter exports whatever mode
    the model is in and warns. opforge.export gives both the TorchScript exporter's behaviour, and
    afterwards every submodule has its own training flag back (_training_flags_kept)."""
    with _training_flags_kept(model):
        if dynamo and isinstance(model, torch.nn.Module) and model.training:
            model.eval()
        yield


def _keep_submodule_modes_in_torchscript_export() -> None:
    """Makes plain ``torch.onnx.export(..., dynamo=False)`` leave every submodule's training
    flag as it was, as opforge.export does (_training_flags_kept). torch's TorchScript exporter sets the
    export mode with its ``select_model_mode_for_export`` and restores it with
    ``model.train(originally_training)``, which sets every submodule: a frozen eval-mode backbone
    comes back training. The exporter looks the context manager up in its module at each export,
    so wrapping it there records each submodule's flag before and puts them back after torch's
    own restore. Installed once at ``import opforge``; a torch without that function is left as
    it is."""
    try:
        from torch.onnx._internal.torchscript_exporter import utils as ts_utils
    except ImportError:  # another torch layout: nothing to fix here
        return
    original = getattr(ts_utils, "select_model_mode_for_export", None)
    if original is None or getattr(original, "_opforge_keeps_submodule_modes", False):
        return

    @contextlib.contextmanager
    def select_model_mode_for_export(model, mode):
        with _training_flags_kept(model), original(model, mode) as selected:
            yield selected

    select_model_mode_for_export._opforge_keeps_submodule_modes = True
    select_model_mode_for_export.__wrapped__ = original
    select_model_mode_for_export.__doc__ = original.__doc__
    ts_utils.select_model_mode_for_export = select_model_mode_for_export


_keep_submodule_modes_in_torchscript_export()


@contextlib.contextmanager
def _quiet_untyped_custom_outputs(active: bool):
    """The dynamo exporter cannot type the outputs of multi-output custom nodes (ATen
    fallback) and logs it per value; _aten.prepare types them afterwards, so mute that."""
    if not active:
        yield
        return
    loggers = [logging.getLogger(n) for n in ("torch.onnx._internal.exporter._core", "onnx_ir.serde")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _run_exporter(model, args, *, dynamo, opset, standard, input_names, output_names, dynamic_shapes, dynamic_axes,
                  kwargs, aten_fallback, export_options) -> onnx.ModelProto:
    if dynamo:
        with reused_exporter_setup():  # torchlib's registry built once per process, not once per export
            return _run_dynamo_exporter(model, args, opset=opset, standard=standard, input_names=input_names,
                                        output_names=output_names, dynamic_shapes=dynamic_shapes,
                                        dynamic_axes=dynamic_axes, kwargs=kwargs, aten_fallback=aten_fallback,
                                        export_options=export_options)
    buffer = io.BytesIO()
    with lowering.standard_onnx(standard), warnings.catch_warnings():
        # The caller chose the TorchScript exporter on purpose; its deprecation notice is noise here.
        warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export")
        warnings.filterwarnings("ignore", message="The feature will be removed", category=DeprecationWarning)
        torch.onnx.export(
            model,
            args,
            buffer,
            kwargs=kwargs,
            dynamo=False,
            opset_version=opset,
            operator_export_type=(torch.onnx.OperatorExportTypes.ONNX_ATEN_FALLBACK if aten_fallback
                                  else export_options.pop("operator_export_type", torch.onnx.OperatorExportTypes.ONNX)),
            # The exporter imports custom domains at version 1 by itself; passing custom_opsets
            # would warn on every model that happens not to use an opforge op.
            custom_opsets={DOMAIN: DOMAIN_VERSION} if DOMAIN_VERSION != 1 else None,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            **export_options,
        )
    proto = onnx.load_from_string(buffer.getvalue())
    if dynamic_axes:
        _name_output_dims(proto)
    return proto


def _run_dynamo_exporter(model, args, *, opset, standard, input_names, output_names, dynamic_shapes, dynamic_axes,
                         kwargs, aten_fallback, export_options) -> onnx.ModelProto:
    table = _dynamo.translation_table(standard, opset)
    if aten_fallback:
        if isinstance(model, torch.export.ExportedProgram):
            exported = model
        else:
            if dynamic_shapes is None and dynamic_axes is not None:
                raise ValueError("opforge.export: with aten_fallback and dynamo=True, give dynamic_shapes")
            exported = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes)
        model, fallback_ops = _aten_dynamo.decompose_keeping_fallbacks(exported, table)
        table = {**table, **{op: _aten_dynamo.fallback_translation(op) for op in fallback_ops}}
        dynamic_shapes = dynamic_axes = kwargs = None  # carried by the ExportedProgram
    with _quiet_untyped_custom_outputs(aten_fallback):
        program = torch.onnx.export(
            model,
            args,
            kwargs=kwargs,
            dynamo=True,
            opset_version=opset,
            custom_translation_table=table,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            dynamic_axes=dynamic_axes,
            **export_options,
        )
        return program.model_proto  # serialised lazily: inside the quiet block


def _name_output_dims(proto: onnx.ModelProto) -> None:
    """The TorchScript exporter names each dynamic dim of a graph output that ``dynamic_axes`` does
    not name itself (``ms_attn5_dim_0``), even where it is an input's named dim (``batch``); the
    dynamo exporter keeps the input's name. Give TorchScript exports the same names: ONNX shape
    inference over the graph (it knows opforge's ops through their OpSchemas, whose shape rules keep
    dim names), and each output dim the exporter named that inference ties to a named input dim takes
    that name. Dims inference cannot tie keep the exporter's names."""
    given = {d.dim_param for v in proto.graph.input if v.type.HasField("tensor_type")
             for d in v.type.tensor_type.shape.dim if d.dim_param}
    invented = [(o.name, k) for o in proto.graph.output if o.type.HasField("tensor_type")
                for k, d in enumerate(o.type.tensor_type.shape.dim) if d.dim_param and d.dim_param not in given]
    if not given or not invented:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    # The exporter's own names, also on intermediate values (value_info), made unknown, so that
    # inference fills them in rather than carrying them along.
    for value in list(probe.graph.output) + list(probe.graph.value_info):
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in given:
                d.ClearField("dim_param")
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False)
    except Exception:  # names are a courtesy: a graph inference cannot follow keeps the exporter's
        return
    inferred_outputs = {o.name: o for o in inferred.graph.output}
    originals = {o.name: o for o in proto.graph.output}
    for name, k in invented:
        dims = inferred_outputs[name].type.tensor_type.shape.dim
        if k < len(dims) and dims[k].dim_param in given:
            originals[name].type.tensor_type.shape.dim[k].dim_param = dims[k].dim_param
