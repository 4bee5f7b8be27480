"""Step 2 of the ATen bridge: the dynamo exporter's ONNX graph for one ATen call.

:func:`translate` runs the call alone (a :class:`Call` from :mod:`.binding`) through the dynamo
exporter's own pipeline (``torch.export`` -> torch's decompositions -> torchlib), in one of the
forms of :class:`Form`, giving an opset-18 ONNX graph with functions inlined and shapes inferred.
The op itself may be replaced by a curated composition (:mod:`.compositions`) or, in the
``LOWERING`` form, by opforge's composition for older opsets (:mod:`.lowerings`). Results are
cached per call and form.

torchlib's registry (about a second to build) is loaded on first use only, and kept
(:mod:`opforge.exporter_cache`).
"""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import gc
import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable, Optional

import onnx
import torch

from ..exporter_cache import DROPPED_CHECKS, reused_exporter_setup, torchlib_registry
from . import lowerings
from .binding import DYNAMIC_DIM_HINT, Call, TensorInfo
from .compositions import CURATED
from .errors import BridgeError

_LOCK = threading.RLock()


class _CallModule(torch.nn.Module):
    """``forward(*tensors)`` makes the Call, with its constants baked in; ``fn`` replaces the
    op (a curated composition, or a lowering for older opsets)."""

    def __init__(self, call: Call, fn: Optional[Callable] = None):
        super().__init__()
        self.call = call
        # The curated compositions are written for real tensors (angle, sgn); on complex ones
        # dynamo's own translation is the one to use.
        curated = None if any(i.dtype.is_complex for i in _flat_tensors(call)) else CURATED.get(call.name)
        self.fn = fn or curated or call.op

    def forward(self, *tensors):
        it = iter(tensors)
        args = []
        for a in self.call.args:
            if isinstance(a, TensorInfo):
                args.append(next(it))
            elif isinstance(a, tuple) and a and isinstance(a[0], TensorInfo):
                args.append([next(it) for _ in a])
            else:
                args.append(list(a) if isinstance(a, tuple) else a)
        n = len(args) - len(self.call.keyword)
        return self.fn(*args[:n], **dict(zip(self.call.keyword, args[n:])))


def _flat_tensors(call: Call) -> list[TensorInfo]:
    out = []
    for a in call.args:
        if isinstance(a, TensorInfo):
            out.append(a)
        elif isinstance(a, tuple) and a and isinstance(a[0], TensorInfo):
            out.extend(a)
    return out


class Form(enum.IntEnum):
    """Which form of the op :func:`translate` hands to torchlib, tried in this order.

    Torchlib writes the newest ONNX op for an ATen op (Trilu, Einsum, NegativeLogLikelihoodLoss,
    GridSample, ...). Torch's own decompositions of the op into simpler ATen ops often need
    only older ONNX ops, which is what an opset below the newer op's needs."""

    DIRECT = 0  # the op itself: torchlib's translation (fewest nodes)
    DECOMPOSED = 1  # torch's decomposition of the op
    CORE_ATEN = 2  # everything decomposed down to core ATen
    DEEP = 3  # core ATen, then the ops core ATen keeps by their own decompositions
    LOWERING = 4  # opforge's composition for older opsets (lowerings.LOWERINGS)


def _decompose(call: Call, program, form: Form):
    from torch._decomp import core_aten_decompositions, decomposition_table

    core = core_aten_decompositions()
    if form == Form.DECOMPOSED:
        fn = core.get(call.op) or decomposition_table.get(call.op)
        if fn is None:
            raise BridgeError(f"{call.overload}: torch has no decomposition of it")
        return program.run_decompositions({call.op: fn})
    program = program.run_decompositions(dict(core))
    return _decompose_deeper(call, program) if form == Form.DEEP else program


def _decompose_deeper(call: Call, program):
    """The core-ATen ``program`` one level further (grid_sampler_2d, ...): the ops core ATen keeps,
    by their own decompositions. The whole table at once would reach prims, which the exporter
    cannot take."""
    from torch._decomp import decomposition_table

    kept = {n.target for n in program.graph.nodes if n.op == "call_function"}
    deeper = {op: decomposition_table[op] for op in kept if op in decomposition_table}
    if not deeper:
        raise BridgeError(f"{call.overload}: torch has no further decomposition of it")
    return program.run_decompositions(deeper)


def translate(call: Call, form: Form = Form.DIRECT) -> onnx.ModelProto:
    """The dynamo exporter's ONNX graph for ``call`` in ``form`` (opset 18, functions inlined,
    shapes inferred). Its inputs are the call's tensors in order; BridgeError if dynamo cannot.
    Cached per (call, form), failures too: a refusal is asked again at every lower opset."""
    result = _translate_cached(call, form)
    if isinstance(result, BridgeError):
        raise BridgeError(str(result))
    return result


@functools.lru_cache(maxsize=4096)
def _translate_cached(call: Call, form: Form):
    disk = DiskCache.from_env()
    key = disk.key(call, form) if disk else None
    if key is not None:
        found = disk.get(key)
        if found is not None:
            return found
    try:
        result = _translate(call, form)
    except BridgeError as exc:
        result = exc
    if key is not None:
        disk.put(key, result)
    return result


class DiskCache:
    """Translations kept in a directory (``OPFORGE_ATEN_CACHE_DIR``) across processes.

    A translation costs about half a second (``torch.export`` and the dynamo exporter's passes);
    the next process that exports the same call (same overload, dtypes, shapes, constants and
    form) reads it back instead. Refusals are kept too: a refusal is asked again at every lower
    opset. The key also holds the versions of torch, onnxscript and onnx and a hash of
    opforge's ATen sources, so an upgrade or an edit never reads a stale entry. Entries are
    written whole (a temporary file renamed into place), so concurrent processes can share the
    directory. Point it only at a directory you alone write to: its entries become parts of
    the models you export."""

    _SAFE_LEAVES = (type(None), bool, int, float, str, TensorInfo, torch.dtype, torch.device, torch.layout,
                    torch.memory_format)

    def __init__(self, root: Path):
        self.root = root

    @staticmethod
    def from_env() -> Optional["DiskCache"]:
        root = os.environ.get("OPFORGE_ATEN_CACHE_DIR")
        return DiskCache(Path(root)) if root else None

    def key(self, call: Call, form: Form) -> Optional[str]:
        """None for a call whose constants have no exact text form (then it is not kept)."""
        if not self._exact(call.args):
            return None
        text = "\n".join([_environment_fingerprint(), repr(call), form.name])
        return hashlib.sha256(text.encode()).hexdigest()

    def _exact(self, value) -> bool:
        if isinstance(value, tuple):
            return all(self._exact(v) for v in value)
        return isinstance(value, self._SAFE_LEAVES)

    def get(self, key: str):
        """The kept ModelProto or BridgeError, or None if there is none (or it is unreadable)."""
        with contextlib.suppress(OSError):
            if (self.root / f"{key}.onnx").is_file():
                try:
                    return onnx.load_from_string((self.root / f"{key}.onnx").read_bytes())
                except Exception:  # noqa: BLE001 - a damaged entry is a miss
                    return None
            if (self.root / f"{key}.refused").is_file():
                return BridgeError((self.root / f"{key}.refused").read_text())
        return None

    def put(self, key: str, result) -> None:
        if isinstance(result, BridgeError):
            data, suffix = str(result).encode(), ".refused"
        else:
            data, suffix = result.SerializeToString(), ".onnx"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".part-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.root / f"{key}{suffix}")
        except OSError:
            pass  # a cache that cannot be written only costs the next process the time


@functools.lru_cache(maxsize=1)
def _environment_fingerprint() -> str:
    import onnxscript

    sources = sorted(Path(__file__).parent.glob("*.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    return f"torch {torch.__version__}; onnxscript {onnxscript.__version__}; onnx {onnx.__version__}; aten {digest}"


translate.cache_info = _translate_cached.cache_info


def _translate(call: Call, form: Form) -> onnx.ModelProto:
    infos = _flat_tensors(call)
    dynamic = _dynamic_dims(call)
    # A dynamic dim's traced size is not in the graph. Try a neutral size; then the static sizes
    # of the other inputs (a dynamic dim must often match one of them, as in addr's vectors);
    # then a size above each integer argument (stft's n_fft, a kernel size: the dim must be at
    # least that long). (size, whether the dim must come out still dynamic)
    sizes = sorted({d for i in infos for d in i.shape if d not in (None, DYNAMIC_DIM_HINT)})
    above = sorted({4 * c + 1 for c in _int_constants(call.args) if c > 1} - {DYNAMIC_DIM_HINT, *sizes})
    hints = [(DYNAMIC_DIM_HINT, True)] + [(d, False) for d in sizes] + [(d, True) for d in above]
    if not any(dynamic):
        hints = hints[:1]
    fn = None
    if form == Form.LOWERING:
        if call.name not in lowerings.LOWERINGS:
            raise BridgeError(f"{call.overload}: opforge has no composition of it for older opsets")
        fn = lowerings.LOWERINGS[call.name](call)  # eagerly: it may precompute constants
    with _LOCK, _quiet_exporter(), reused_exporter_setup(), _collector_paused():
        for attempt, (hint, must_stay_dynamic) in enumerate(hints):
            try:
                proto, specialised = _exported(call, fn, form, hint, dynamic, must_stay_dynamic)
                if specialised and _nodes_of(proto) != _nodes_of(
                        _exported(call, fn, form, hint + 2, dynamic, must_stay_dynamic)[0]):
                    # the size hint is in the graph: it would be wrong for every other size
                    raise BridgeError(f"{call.overload}: a dynamic dim of its inputs is fixed in its translation; "
                                      "export it with static sizes")
                break
            except BridgeError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported with the op's name below
                if attempt == len(hints) - 1 or _no_onnx_function(exc):
                    raise BridgeError(f"{call.overload}: the dynamo exporter cannot translate it either "
                                      f"({_first_line(exc)})") from exc
    if len(proto.graph.input) != len(infos):
        raise BridgeError(f"{call.overload}: the translated graph has {len(proto.graph.input)} inputs, "
                          f"expected {len(infos)}")
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        # (measured: torchlib's fft_fft with n= on complex input declares a complex64 value)
        raise BridgeError(f"{call.overload}: the dynamo exporter's translation is not valid ONNX "
                          f"({_first_line(exc)})") from None


def _exported(call: Call, fn, form: Form, hint: int, dynamic, must_stay_dynamic: bool) -> tuple:
    """(the ONNX model of ``call`` traced with dynamic dims of size ``hint``, whether torch.export
    specialised a dynamic dim to that size)."""
    from onnxscript import ir
    from onnxscript import optimizer
    from onnxscript.ir.passes import common as passes

    if fn is None:  # the op itself: one torch.export (and one core-ATen decomposition) for every form
        program, specialised = _traced(call, hint, must_stay_dynamic)
        if form == Form.DECOMPOSED:
            program = _decompose(call, program, form)
        elif form in (Form.CORE_ATEN, Form.DEEP):
            program = _core_decomposed(call, hint, must_stay_dynamic)
            if form == Form.DEEP:
                program = _decompose_deeper(call, program)
    else:
        program, specialised = _trace(call, fn, hint, dynamic, must_stay_dynamic)
    model = _program_to_ir(program)
    passes.InlinePass()(model)
    passes.RemoveUnusedFunctionsPass()(model)
    # Folding constants (as the dynamo exporter's optimize() does) turns computed axes and
    # shapes into constants, which older opsets need as attributes.
    optimizer.fold_constants(model)
    optimizer.remove_unused_nodes(model)
    return ir.serde.serialize_model(model), specialised


def _program_to_ir(program):
    """The exporter's ONNX IR of ``program`` (``exported_program_to_ir``). A program already in the
    registry's terms (every op one torchlib translates and none CompositeImplicitAutograd, besides
    the getitems of multi-output ops and a dynamic dim's sizes and their arithmetic; nothing mutated)
    the exporter's decomposition would only retrace into the same graph: about 0.1 s, most of a
    translation of the op itself. Its other steps (type promotion, assertions dropped) then run on a
    copy, as the exporter runs them. (Measured: the 674 sample exports at opsets 11 and 17 are the
    same bytes either way; 184 of 570 programs take this path.)"""
    from torch.onnx._internal.exporter import _core, _fx_passes

    registry = torchlib_registry()
    if not _in_registry_terms(program, registry):
        return _core.exported_program_to_ir(program, registry=registry)
    program = copy.deepcopy(program)  # (the passes change the graph in place; _traced's program is kept)
    module = program.graph_module
    _fx_passes.insert_type_promotion_nodes(module)
    program._graph_module = _fx_passes.remove_assertion_nodes(module)
    return _core._exported_program_to_onnx_program(program, registry=registry).model


def _in_registry_terms(program, registry) -> bool:
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        return False
    for node in program.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        target = node.target
        if node.op == "call_function" and (target is torch.ops.aten.sym_size.int
                                           or getattr(target, "__module__", None) in ("_operator", "operator")):
            continue  # (getitem of a multi-output op, a dynamic dim's size and its arithmetic: kept as they are)
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            return False  # (a submodule, a higher-order op ...: the exporter's own way)
        if target._opname.startswith(DROPPED_CHECKS):
            continue
        if not registry.is_registered(target) or torch._C._dispatch_has_kernel_for_dispatch_key(
                target.name(), "CompositeImplicitAutograd"):
            return False  # (the retrace decomposes a CompositeImplicitAutograd op, registered or not: mH, unflatten)
    return True


def _dynamic_dims(call: Call) -> tuple:
    return tuple({d: torch.export.Dim.AUTO for d, s in enumerate(i.shape) if s is None} for i in _flat_tensors(call))


def _trace(call: Call, fn, hint: int, dynamic, must_stay_dynamic: bool) -> tuple:
    examples = tuple(i.example(hint) for i in _flat_tensors(call))
    program = torch.export.export(_CallModule(call, fn), examples, dynamic_shapes=(dynamic,), strict=False)
    return program, (_check_still_dynamic(call, program, dynamic) if must_stay_dynamic else False)


def _reused(function):
    """Keeps the last few results of ``function`` (exceptions too, raised again). The forms of one
    call are translated one after the other, mostly at one opset: they share the op's
    torch.export (measured: about a sixth of a translation) and its core-ATen decomposition
    (about a fifth). Nothing downstream changes an ExportedProgram: run_decompositions and the
    exporter return new ones."""
    @functools.lru_cache(maxsize=16)
    def kept(*args):
        try:
            return function(*args), None
        except Exception as exc:  # noqa: BLE001 - raised again to each caller
            return None, exc

    @functools.wraps(function)
    def wrapper(*args):
        result, exc = kept(*args)
        if exc is not None:
            raise exc
        return result
    wrapper.cache_clear = kept.cache_clear
    return wrapper


@_reused
def _traced(call: Call, hint: int, must_stay_dynamic: bool) -> tuple:
    return _trace(call, None, hint, _dynamic_dims(call), must_stay_dynamic)


@_reused
def _core_decomposed(call: Call, hint: int, must_stay_dynamic: bool):
    return _decompose(call, _traced(call, hint, must_stay_dynamic)[0], Form.CORE_ATEN)


def _nodes_of(proto: onnx.ModelProto) -> list:
    # the computation, without the graph inputs' (possibly static) shapes
    return [n.SerializeToString() for n in proto.graph.node] + [t.SerializeToString() for t in proto.graph.initializer]


def _int_constants(args) -> set:
    found = set()
    for a in args:
        if isinstance(a, bool):
            continue
        if isinstance(a, int):
            found.add(a)
        elif isinstance(a, tuple):
            found |= _int_constants(a)
    return found


def _check_still_dynamic(call: Call, program, dynamic) -> bool:
    # A dim that torch.export specialised to the neutral size would be baked into the graph
    # as 5: wrong at run time. (Sizes taken from other inputs, tried later, are specialised
    # because the op ties the dim to that input's static size: right.)
    # The call's tensors only: constants the module lifts (a lowering's weights) come first.
    # A SymInt whose value is a constant (take_along_dim's, chain_matmul's) may or may not be in
    # the graph: True tells the caller to compare with another size.
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    user_inputs = set(program.graph_signature.user_inputs)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    specialised = False
    for index, (node, dims) in enumerate(zip(placeholders, dynamic)):
        val = node.meta.get("val")
        for d in dims:
            if val is not None and isinstance(val.shape[d], torch.SymInt) and is_concrete_int(val.shape[d]):
                specialised = True
            elif val is not None and not isinstance(val.shape[d], torch.SymInt):
                raise BridgeError(f"{call.overload}: dim {d} of tensor input {index} is dynamic in the graph, "
                                  "but the op's translation needs it static; export it with a static size")
    return specialised


@contextlib.contextmanager
def _collector_paused():
    # A translation allocates several hundred thousand short-lived objects (fx nodes, fake
    # tensors, sympy expressions, ~5,000 Python kernels registered and removed per decomposition
    # pass): Python's collector runs a young-generation pass every 700 of them, and now and then
    # a full pass over everything the process holds (torch, onnx, onnxscript: ~0.4 s each in a
    # test worker). Measured on 90 round trips of the test suite: 13.6 s of 47.8 s were spent
    # collecting. Paused for the translation, its garbage is collected with the next pass after
    # it, so memory does not grow over many translations. (Serialised by _LOCK; a nested pause
    # leaves the collector as the outer one found it.)
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _quiet_exporter:
    # The dynamo exporter logs a warning per node about module stacks our one-op module lacks;
    # onnx_ir one per empty list attribute (max_unpool's empty padding) it must guess a type for;
    # torch.export one when a size hint of 1 specialises a dim (_translate then tries the next).
    def __enter__(self):
        self.loggers = [logging.getLogger(n) for n in ("torch.onnx._internal.exporter._core", "torch.export",
                                                       "onnx_ir", "torch._export.non_strict_utils")]
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)


def _no_onnx_function(exc: BaseException) -> bool:
    """Whether ``exc`` is torchlib finding no ONNX function for an op of the traced graph. The
    other size hints trace the same ops, so they fail alike. Measured over the 949 translations of
    the ATen tests (bridge, lowerings, coverage): no call that failed so at one hint succeeded at
    another; stopping at the first saves 78 exports (~0.3 s each), most in the FFT samples, which
    refused the same op at up to six hints."""
    try:
        from torch.onnx._internal.exporter._errors import DispatchError
    except ImportError:  # another torch: try every hint, as before
        return False
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return isinstance(exc, DispatchError)


def _first_line(exc: BaseException) -> str:
    while exc.__cause__ is not None and not str(exc).strip():
        exc = exc.__cause__
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = str(root).strip().splitlines()
    return f"{type(root).__name__}: {text[0][:200]}" if text else type(root).__name__
