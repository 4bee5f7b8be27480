"""The public op API: ``opforge.register_op(spec)`` does for any op what ``import opforge``
does for the built-in ones, and ``opforge.check_library(namespace)`` checks that a torch
library and its specs match.

    _C = opforge.load_torch_library(LIB_PATH)      # runs STABLE_TORCH_LIBRARY(my_ops, m) { m.def(...); }
    SWISH = opforge.OpSpec(name="swish", namespace="my_ops", domain="com.example", ...)
    swish_op = opforge.register_op(SWISH, extension=_C)
    opforge.check_library("my_ops")

What ``register_op`` derives from the spec, in one place each:

* torch: checks the C++ schema against ``spec.schema``, registers the fake impl and
  the autograd formula, and checks the CUDA kernel (a CUDA build without one is an
  error naming the op; a CPU-only build gets a CUDA stub that says how to rebuild);
* ONNX: the ``OpSchema`` of the custom domain (checker, shape inference, onnxscript);
* TorchScript exporter: a symbolic for every opset in ``spec.torchscript_opsets``;
* dynamo exporter, ``onnx.reference`` and the standard-ONNX policy read the registry
  (:func:`opforge.translation_table`, :mod:`opforge.symbolics.reference`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Iterable, Optional

import torch

from . import spec as _spec
from .spec import OpSpec

# torch.library.Library objects must stay alive for their registrations to stay.
_LIBRARIES: list = []


class OpRegistrationError(RuntimeError):
    """A spec and the compiled op it describes do not match (the message names the missing piece)."""


class OpInputError(RuntimeError, ValueError, TypeError):
    """Bad input to an opforge op; the message names the op and the argument.

    It is a RuntimeError, what torch's and torchvision's kernels raise (so
    ``opforge.deform_conv2d`` is a drop-in where code catches torchvision's
    errors), and also a ValueError and a TypeError, what Python code expects for
    a bad value or type: an ``except`` written for any of the three catches it."""


def as_input_error(op: str, error: Exception) -> Exception:
    """A kernel's error about the op's arguments (its message starts with ``op``, e.g.
    ``opforge::deform_conv2d``) as an :class:`OpInputError` with the same words and traceback;
    any other error unchanged."""
    text = str(error)
    if isinstance(error, OpInputError) or not text.startswith(op):
        return error
    return OpInputError(text).with_traceback(error.__traceback__)


def torch_op(spec: OpSpec) -> torch._ops.OpOverload:
    """``torch.ops.<namespace>.<name>.default`` of ``spec``, or an error saying what to load."""
    try:
        return getattr(getattr(torch.ops, spec.namespace), spec.name).default
    except (AttributeError, RuntimeError):
        raise OpRegistrationError(
            f"opforge: {spec.torch_qualname} has a spec but no C++ declaration: load the torch library "
            f"whose STABLE_TORCH_LIBRARY({spec.namespace}, m) declares m.def(\"{spec.schema}\") before register_op "
            f"(opforge.load_torch_library(path) in the package)"
        ) from None


def _built_with_cuda(extension: Optional[ModuleType]) -> Optional[bool]:
    if extension is None:
        return None
    flag = getattr(extension, "WITH_CUDA", None)
    return None if flag is None else bool(flag)


def _check_cuda(qualname: str, with_cuda: Optional[bool]) -> None:
    """A CUDA build must have a CUDA kernel for every op; a CPU-only build gets a stub that
    explains, instead of the dispatcher's generic 'could not run ... CUDA backend'."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA"):
        return
    if torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CompositeImplicitAutograd"):
        return  # runs on every backend (e.g. a shape helper with no tensor arguments)
    if with_cuda:
        raise OpRegistrationError(
            f"opforge: no CUDA kernel for {qualname}: the extension was built with CUDA but registers no "
            f"STABLE_TORCH_LIBRARY_IMPL(<namespace>, CUDA, m) kernel for it; add one (or build with OPFORGE_CUDA=0)"
        )
    namespace, name = qualname.split("::")
    what = "this build has no CUDA kernels" if with_cuda is False else "no CUDA kernel is registered for it"

    def cuda_not_built(*args, **kwargs):
        raise NotImplementedError(
            f"{qualname}: got CUDA tensors, but {what} (built with OPFORGE_CUDA=0, or without nvcc / a CUDA "
            "torch). Rebuild with CUDA_HOME set and OPFORGE_CUDA=1: pip install --no-build-isolation -e ."
        )

    lib = torch.library.Library(namespace, "IMPL")  # noqa: TOR901 (kept alive in _LIBRARIES)
    lib.impl(name, cuda_not_built, "CUDA")
    _LIBRARIES.append(lib)


def _check_args(spec: OpSpec, op: torch._ops.OpOverload) -> None:
    """spec.args must be the schema's arguments, in order: tensors as TensorArg, the rest as AttrArg
    (every exporter rule and both runtimes' calls are built from spec.args)."""
    from .spec import TensorArg

    declared = [(a.name, isinstance(a.type, torch.TensorType) or (
        isinstance(a.type, torch.OptionalType) and isinstance(a.type.getElementType(), torch.TensorType)))
        for a in op._schema.arguments]
    given = [(a.name, isinstance(a, TensorArg)) for a in spec.args]
    if declared != given:
        def show(args):
            return ", ".join(f"{n} ({'tensor' if t else 'attribute'})" for n, t in args)
        raise OpRegistrationError(f"opforge: {spec.torch_qualname}: spec.args [{show(given)}] do not match the "
                                  f"schema's arguments [{show(declared)}]; list every schema argument in order, "
                                  "tensors as TensorArg and the others as AttrArg")


def register_op(spec: OpSpec, *, extension: Optional[ModuleType] = None) -> torch._ops.OpOverload:
    """Registers ``spec`` everywhere (see the module doc) and returns the torch op.

    ``extension``: the loaded torch library that declares the op (:func:`opforge.load_torch_library`); its
    ``WITH_CUDA`` flag (whether its CUDA part loaded: opforge.TorchLibrary) decides whether a
    missing CUDA kernel is an error. Registering the same spec again is a no-op.
    """
    from .symbolics import onnx_schema, torchscript

    if _spec.REGISTRY.get(spec.onnx_qualname) is spec:
        return torch_op(spec)
    op = torch_op(spec)
    declared = str(op._schema)
    expected = f"{spec.namespace}::{spec.schema}"
    if declared != expected:
        raise OpRegistrationError(
            f"opforge: C++ schema of {spec.torch_qualname} is {declared!r} but the spec says {expected!r}; "
            "rebuild the extension (pip install --no-build-isolation -e .) or fix the spec"
        )
    _check_args(spec, op)
    _spec.add(spec)  # first: a name clash must fail before anything is registered with torch
    try:
        torch.library.register_fake(spec.torch_qualname)(spec.fake)
        if spec.differentiable:
            torch.library.register_autograd(spec.torch_qualname, spec.backward, setup_context=spec.setup_context)
        with_cuda = _built_with_cuda(extension)
        for qualname in (spec.torch_qualname, *(f"{spec.namespace}::{h}" for h in spec.helper_ops)):
            _check_cuda(qualname, with_cuda)
        onnx_schema.register(spec)
        torchscript.register(spec)
    except Exception:
        del _spec.REGISTRY[spec.onnx_qualname]
        raise
    return op


def autograd_function(spec: OpSpec, name: str, doc: str, *, module: Optional[str] = None) -> type:
    """The classic ``torch.autograd.Function`` of a registered op, ``Name.apply(*args)`` in the op's
    schema order (the flow of TorchScript-era code): ``forward`` calls the op, ``setup_context`` and
    ``backward`` are the spec's, ``symbolic`` is the spec's TorchScript rule. Built from the spec, so
    it restates none of it. ``module``: the ``__module__`` it reports (the defining module)."""
    from .symbolics import torchscript

    op = torch_op(spec)
    rule = torchscript.symbolic(spec)

    def forward(*args):
        return op(*args)

    def setup_context(ctx, inputs, output):
        spec.setup_context(ctx, inputs, output)

    def backward(ctx, *grads):
        return spec.backward(ctx, *grads)

    def symbolic(g, *args):
        return rule(g, *args)

    body = {"__doc__": doc, "__module__": module or __name__, "forward": staticmethod(forward),
            "setup_context": staticmethod(setup_context), "backward": staticmethod(backward),
            "symbolic": staticmethod(symbolic)}
    return type(name, (torch.autograd.Function,), body)


def library_ops(namespace: str) -> list[str]:
    """Every op declared in the torch library ``namespace`` (``["ns::a", "ns::b"]``)."""
    prefix = f"{namespace}::"
    return sorted({n.split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)})


def check_library(namespace: str, specs: Optional[Iterable[OpSpec]] = None) -> None:
    """Every op of ``TORCH_LIBRARY(namespace)`` must have a registered spec (or be a spec's
    helper op), else :class:`OpRegistrationError` names the op: an op without a spec has
    no fake impl, no autograd and no export rules, which otherwise only shows much later."""
    specs = list(specs) if specs is not None else [s for s in _spec.REGISTRY.values() if s.namespace == namespace]
    covered = {s.torch_qualname for s in specs} | {f"{s.namespace}::{h}" for s in specs for h in s.helper_ops}
    missing = [op for op in library_ops(namespace) if op not in covered]
    if missing:
        raise OpRegistrationError(
            f"opforge: {', '.join(missing)} declared in C++ (TORCH_LIBRARY({namespace})) but no spec is registered: "
            "write an OpSpec for it and call opforge.register_op(spec) (list an op used only by another one, "
            "such as its backward, in that spec's helper_ops)"
        )


def check_same_device(op: str, **tensors: Optional[torch.Tensor]) -> None:
    """For fake impls: the check every opforge kernel makes (opforge/torch_op.h),
    same words, so torch.compile rejects mixed devices as eager does. Raises
    :class:`OpInputError` (a ValueError, as the kernel raises, and a RuntimeError).
    Pass the tensors by argument name; None is skipped."""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first = (name, t)
        elif t.device != first[1].device:
            raise OpInputError(f"{op}: {name} is on {t.device} but {first[0]} is on {first[1].device}; "
                               "all tensors must be on one device")


def spec_of(torch_qualname: str) -> Optional[OpSpec]:
    """The registered spec of a torch op (``"ns::name"`` or an alias), or None."""
    for s in _spec.REGISTRY.values():
        if torch_qualname == s.torch_qualname or torch_qualname in s.torch_aliases:
            return s
    return None


__all__ = ["OpInputError", "OpRegistrationError", "check_library", "check_same_device", "library_ops", "register_op", "spec_of",
           "torch_op"]
