"""What torch's dynamo exporter rebuilds on every call, built once per process while opforge exports.

Measured on the 2-core CI machine (torch 2.14.1): ``torch.onnx.export(..., dynamo=True)`` of a
one-op model takes about 1.3 s. About 1 s of it is building torchlib's registry
(``ONNXRegistry.from_torchlib``: the source of ~500 onnxscript functions read and parsed), again
for every export. Every ``run_decompositions`` also lists torch's CompositeImplicitAutograd ops
afresh, walking every op namespace (~0.2 s; the ATen bridge decomposes several times per
translation).

Neither changes between two exports unless ops are registered in between, so inside
:func:`reused_exporter_setup` (``opforge.export`` and the ATen bridge's translations hold it):

* ``ONNXRegistry.from_torchlib(opset)`` returns a copy of a registry built once per opset and
  per set of registered ops (loading torchvision, say, adds ops torchlib translates). A copy,
  because the exporter adds the ``custom_translation_table`` to the registry it gets.
* The registries of different opsets share one listing of torchlib's functions
  (``get_torchlib_ops``: it reads the domain of each of ~500 traced functions from its parsed
  source, ~0.8 s of the ~1 s a registry costs), listed again only when torchlib gains functions:
  a second opset's registry costs ~0.2 s.
* torch's CompositeImplicitAutograd list is kept, keyed by the op namespaces and that dispatch
  key's registration count.
* ``OperatorBase.py_impl`` takes a short path for a plain DispatchKey. Every decomposition pass
  (``_override_composite_implicit_decomp``) registers and removes ~5,800 Python kernels, one
  ``py_impl`` call each: ~10 us through torch's, ~2 us through the short path, which makes the
  same checks and the same registration; every other kind of key goes to torch's own. (It also
  skips the ``Callable[_P, _T]`` annotations torch's evaluates at each call, which an earlier
  swap of ``torch._ops.Callable`` for typing's cached one addressed: with the short path that
  swap measured nothing, 121 vs 122 ms a pass, and is gone.)
* ``_override_composite_implicit_decomp`` (entered twice by every ``run_decompositions``: each
  dynamo export, and one or two per translation of the ATen bridge) installs the same Python
  kernels for the ~510 CompositeImplicitAutograd ops as torch's does, assigned directly. Torch's
  makes twelve new ``autograd_not_implemented`` closures per op and clears the op's dispatch
  cache at each of its ~20 ``py_impl`` calls; here the closure is made once per op and process
  and the cache cleared once per op. The same kernels end up in the same places and leave the
  same way. Measured on the ONNX decompositions of the bridge's 183 ATen samples (with the short
  ``py_impl`` above in both): 48-52 s with torch's, 25-27 s with this one, the same graphs.

One patch only records: ``_prepare_exported_program_for_export`` (the exporter's decomposition)
hands its first result and registry to the innermost :func:`recorded_decomposition` of the thread, so
that a failed export is explained from the program the exporter failed on, not by exporting and
decomposing the model again.

The exported models are the same bytes (tests/test_exporter_cache.py). Where torch's internals do
not have these names, nothing is patched and the exporter runs as it always did. This module
imports nothing of opforge.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

_LOCK = threading.RLock()
_active = 0  # nesting depth of reused_exporter_setup (over all threads)
_restore: list = []  # (object, attribute, original value) of what is patched while _active
_REGISTRIES: dict = {}  # opset -> (registered op count, torchlib's registry)
_CIA_OPS: dict = {}
_ORIGINALS: dict = {}  # torch's own ONNXRegistry.from_torchlib, kept when first patched
_TORCHLIB_OPS: dict = {}  # "key": torchlib's functions as counted, "ops": onnxscript's listing of them
_RECORDING = threading.local()  # .slot: the dict of the thread's innermost recorded_decomposition
#: Prefixes of the check ops the exporter drops before translating (_fx_passes.remove_assertion_nodes).
DROPPED_CHECKS = ("_assert", "sym_constrain")


def _registered_op_count() -> int:
    return len(torch._C._dispatch_get_all_op_names())


def torchlib_registry(opset_version: int = 18):
    """torchlib's registry at ``opset_version``, as the dynamo exporter builds it; built once per
    opset and set of registered ops. Shared: read it, don't register into it (see :func:`fresh_registry`)."""
    from torch.onnx._internal.exporter import _registration

    count = _registered_op_count()
    with _LOCK:
        built_at, registry = _REGISTRIES.get(opset_version, (None, None))
        if built_at != count:  # (a stale one is dropped: one registry per opset)
            build = _ORIGINALS.get("from_torchlib", _registration.ONNXRegistry.__dict__["from_torchlib"])
            with _torchlib_listed_once(getattr(_registration, "onnxscript_apis", None)):
                registry = build.__func__(_registration.ONNXRegistry, opset_version)
            _REGISTRIES[opset_version] = (count, registry)
        return registry


@contextlib.contextmanager
def _torchlib_listed_once(apis):
    """While a registry is built: onnxscript's ``get_torchlib_ops`` (opset-independent) lists
    torchlib's functions once per process, again only when torchlib's registry has changed."""
    original = getattr(apis, "get_torchlib_ops", None)
    if original is None:
        yield
        return

    def listed_once():
        from onnxscript.function_libs.torch_lib import ops, registration  # noqa: F401 (ops registers them)

        key = tuple((name, len(f.overloads), len(f.complex)) for name, f in registration.default_registry.items())
        if _TORCHLIB_OPS.get("key") != key:
            _TORCHLIB_OPS.update(key=key, ops=tuple(original()))
        return list(_TORCHLIB_OPS["ops"])

    own = "get_torchlib_ops" in vars(apis)  # torch's lazy-module proxy has none: it forwards to onnxscript's
    apis.get_torchlib_ops = listed_once
    try:
        yield
    finally:
        if own:
            apis.get_torchlib_ops = original
        else:
            del apis.get_torchlib_ops


def built_registries() -> list:
    """The opsets whose registry this process holds (none until something is exported with dynamo
    or bridged: importing opforge builds nothing)."""
    with _LOCK:
        return sorted(_REGISTRIES)


def fresh_registry(opset_version: int = 18):
    """A copy of :func:`torchlib_registry` that may be registered into (its lists are its own)."""
    shared = torchlib_registry(opset_version)
    copy = type(shared).__new__(type(shared))
    copy.__dict__.update(shared.__dict__)
    copy.functions = {target: list(metas) for target, metas in shared.functions.items()}
    return copy


def _from_torchlib_once(cls, opset_version=18):
    from torch.onnx._internal.exporter import _registration

    if cls is not _registration.ONNXRegistry:  # a subclass: build it as torch would
        return _ORIGINALS["from_torchlib"].__func__(cls, opset_version)
    return fresh_registry(opset_version)


def _cia_ops_listed_once(original):
    def listed_once():
        key = (tuple(torch.ops._dir),
               len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")))
        with _LOCK:
            if _CIA_OPS.get("key") != key:
                _CIA_OPS.update(key=key, ops=frozenset(original()))
            return _CIA_OPS["ops"]  # (torch's callers copy it before changing it)
    return listed_once


def _py_impl_for_dispatch_keys(original):
    """``OperatorBase.py_impl`` for a plain DispatchKey, without the checks for the other kinds of
    key: each decomposition pass registers ~5,800 kernels this way, ~10 us each through torch's
    (its closure's annotations, class and enum checks), ~2 us here. The rest (modes, tensor
    subclasses, functorch transforms, the Python key, a second registration and its error) goes
    to torch's own."""
    dispatch_key = torch._C.DispatchKey

    def py_impl(self, k):
        if type(k) is not dispatch_key or k == dispatch_key.Python:
            return original(self, k)

        def register(fn):
            if k in self.py_kernels:  # torch's error for a second registration
                return original(self, k)(fn)
            self.py_kernels[k] = fn
            self._dispatch_cache.clear()
            return fn
        return register
    return py_impl


def _override_cia_directly(module):
    """torch.export's ``_override_composite_implicit_decomp(cia_ops_to_callable)``, its steps in its
    order with dict assignments (see the module docstring); on an error part-way it also puts back
    the ops done so far (torch's leaves them patched)."""
    autograd_keys = tuple(module._AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE)
    backend_keys = tuple(module._BACKEND_KEYS_TO_OVERRIDE)
    cia_key = torch._C.DispatchKey.CompositeImplicitAutograd
    not_implemented: dict = {}  # op -> its autograd_not_implemented kernel (it closes over the op alone)

    def force_dispatch_to_original(fake_tensor_mode, op, *args, **kwargs):
        original = kwargs.pop("original_callable")
        with fake_tensor_mode:
            return original(*args, **kwargs)

    @contextlib.contextmanager
    def override(cia_ops_to_callable):
        saved = {}
        try:
            for op, decomposition in cia_ops_to_callable.items():
                kernels = op.py_kernels
                saved[op] = kernels.copy()
                stub = not_implemented.get(op)
                if stub is None:
                    stub = not_implemented[op] = module.autograd_not_implemented(op, deferred_error=True)
                for key in autograd_keys:
                    if key not in kernels:
                        kernels[key] = stub
                original = module._get_decomp_for_cia(op)  # before the op's CIA kernel is replaced
                kernels.pop(cia_key, None)
                kernels[cia_key] = decomposition
                if not module._is_op_registered_to_fake_rule(op):
                    module.register_op_impl(op)(functools.partial(force_dispatch_to_original,
                                                                  original_callable=original))
                for key in backend_keys:
                    if key not in kernels:
                        kernels[key] = original
                op._dispatch_cache.clear()
            yield
        finally:
            for op, kernels in saved.items():
                op.py_kernels.clear()
                op.py_kernels.update(kernels)
                op._dispatch_cache.clear()
                module._deregister_op_impl(op)
    return override


def _patches() -> list:
    """(object, attribute, replacement) for each piece of torch's exporter this module speeds up;
    empty where torch's internals differ from these names."""
    patches = []
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        _registration = None
    build = getattr(_registration, "ONNXRegistry", None)
    build = build.__dict__.get("from_torchlib") if build is not None else None
    if isinstance(build, classmethod):
        _ORIGINALS.setdefault("from_torchlib", build)
        patches.append((_registration.ONNXRegistry, "from_torchlib", classmethod(_from_torchlib_once)))
    ops_module = getattr(torch, "_ops", None)
    base = getattr(ops_module, "OperatorBase", None)
    if base is not None and callable(base.__dict__.get("py_impl")) and hasattr(torch._C, "DispatchKey"):
        _ORIGINALS.setdefault("py_impl", base.__dict__["py_impl"])
        patches.append((base, "py_impl", _py_impl_for_dispatch_keys(_ORIGINALS["py_impl"])))
    try:
        from torch.onnx._internal.exporter import _core
    except ImportError:
        _core = None
    if callable(getattr(_core, "_prepare_exported_program_for_export", None)):
        prepare = _ORIGINALS.setdefault("prepare", _core._prepare_exported_program_for_export)
        patches.append((_core, "_prepare_exported_program_for_export", _recording(prepare)))
    try:
        from torch._export import utils as export_utils
        from torch.export import decomp_utils, exported_program
    except ImportError:
        return patches
    names = ("_override_composite_implicit_decomp", "_AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE",
             "_BACKEND_KEYS_TO_OVERRIDE", "autograd_not_implemented", "_get_decomp_for_cia",
             "_is_op_registered_to_fake_rule", "register_op_impl", "_deregister_op_impl")
    if all(hasattr(exported_program, n) for n in names):
        _ORIGINALS.setdefault("override_cia", exported_program._override_composite_implicit_decomp)
        fast = _ORIGINALS.setdefault("override_cia_directly", _override_cia_directly(exported_program))
        patches.append((exported_program, "_override_composite_implicit_decomp", fast))
    original = getattr(export_utils, "_collect_all_valid_cia_ops", None)
    if original is not None:
        listed_once = _cia_ops_listed_once(original)
        patches += [(m, "_collect_all_valid_cia_ops", listed_once) for m in (exported_program, decomp_utils)
                    if hasattr(m, "_collect_all_valid_cia_ops")]
    return patches


def _recording(prepare):
    @functools.wraps(prepare)
    def recorded(exported_program, *args, **kwargs):
        slot = getattr(_RECORDING, "slot", None)
        first = slot is not None and not slot  # (a translation may export a piece of its own)
        try:
            decomposed = prepare(exported_program, *args, **kwargs)
        except BaseException:
            if first:
                slot["failed"] = True
            raise
        if first:
            slot.update(program=decomposed, registry=kwargs.get("registry", args[0] if args else None))
        return decomposed
    return recorded


@contextlib.contextmanager
def recorded_decomposition():
    """Yields a dict that receives ``program`` (the decomposed ExportedProgram) and ``registry``
    (the ONNXRegistry it is translated with) when the dynamo exporter first decomposes a program
    in this thread inside :func:`reused_exporter_setup`, ``failed`` (True) when that decomposition
    raised; empty if the exporter failed before it."""
    outer = getattr(_RECORDING, "slot", None)
    _RECORDING.slot = slot = {}
    try:
        yield slot
    finally:
        _RECORDING.slot = outer


@contextlib.contextmanager
def reused_exporter_setup():
    """Inside: the dynamo exporter reuses its registry and torch's CompositeImplicitAutograd list
    (module docstring). Nestable and thread-safe: the first entry patches, the last exit restores."""
    global _active
    with _LOCK:
        if _active == 0:
            for obj, name, replacement in _patches():
                _restore.append((obj, name, obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)))
                setattr(obj, name, replacement)
        _active += 1
    try:
        yield
    finally:
        with _LOCK:
            _active -= 1
            if _active == 0:
                while _restore:
                    obj, name, original = _restore.pop()
                    setattr(obj, name, original)
