"""ONNX Runtime custom-op libraries, by ONNX domain.

Each custom ONNX domain is served by one ORT library (ONNX Runtime allows one per
domain and SessionOptions). opforge's own: ``opforge`` -> ``libopforge_ort.so``,
``org.pytorch.aten`` -> ``libopforge_aten.so``; onnxruntime-extensions' library serves
``ai.onnx.contrib`` (its own ops and Python ops) and the domains of opforge's prototype ops
(:func:`opforge.register_prototype`), registered once per session however many of them a
model uses. Other packages add theirs with :func:`register_ort_library`, or declare them as
an entry point (found without importing the package)::

    [project.entry-points."opforge.ort_libraries"]
    "com.example" = "my_ops._ort:library_path"     # a function returning the path

Then ``opforge.ort_session(model)`` registers exactly the libraries the model's
custom domains need, once each::

    sess = opforge.ort_session("model.onnx")
    # or by hand:
    so = onnxruntime.SessionOptions()
    so.register_custom_ops_library(opforge.ort_library_path("com.example"))
"""

from __future__ import annotations

import glob
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import weakref
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import onnx

from ..spec import DOMAIN

ENTRY_POINT_GROUP = "opforge.ort_libraries"
ATEN_DOMAIN = "org.pytorch.aten"
_LIB_NAME = "libopforge_ort.so"
_ATEN_LIB_NAME = "libopforge_aten.so"
_MMDEPLOY_LIB_NAME = "libopforge_mmdeploy.so"
#: The domains of the ONNX files mmdeploy exports (libopforge_mmdeploy.so serves them).
MMDEPLOY_DOMAINS = ("mmdeploy", "mmcv")
#: What libopforge_mmdeploy.so has in each of them (mmdeploy 1.3.1's set).
MMDEPLOY_OPS = {"mmdeploy": ("MMCVModulatedDeformConv2d", "MMCVRoIAlignRotated", "NMSMatch", "NMSRotated",
                             "grid_sampler"),
                "mmcv": ("MMCVModulatedDeformConv2d",)}

#: Domains ONNX Runtime implements itself: never a custom-op library's.
BUILTIN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "com.microsoft",
                             "com.microsoft.nchwc", "com.microsoft.experimental", "com.ms.internal.nhwc"})

#: What users must do when a model with opforge ops meets a session without our kernels.
REGISTER_HINT = "sess_options.register_custom_ops_library(opforge.ort_library_path())"

PathSource = Union[str, os.PathLike, Callable[[], Union[str, os.PathLike]]]


def _built_library(name: str) -> str:
    path = Path(__file__).with_name(name)
    if not path.is_file():
        raise FileNotFoundError(
            f"opforge: {path} is not built. Build opforge with `pip install --no-build-isolation -e .` "
            "(ORT headers: `opforge fetch-ort-headers`, or OPFORGE_ORT_INCLUDE_DIR)"
        )
    return str(path)


#: The domain of onnxruntime-extensions' own ops (and of its Python ops given a bare op_type).
ORTX_DOMAIN = "ai.onnx.contrib"
#: The domains whose ops are built into the onnxruntime-extensions library.
ORTX_DOMAINS = (ORTX_DOMAIN, "com.microsoft.extensions")
ORTX_DISTRIBUTION = "onnxruntime-extensions"
ORTX_PIN = "onnxruntime-extensions==0.15.2"


def ortx_version() -> Optional[str]:
    """The installed onnxruntime-extensions version, or None."""
    try:
        return importlib.metadata.version(ORTX_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def ortx_library_path() -> str:
    """Path of onnxruntime-extensions' ORT custom-op library, found without importing the package
    (which would import onnx and onnxruntime's Python API, and this must work without either)."""
    found = importlib.util.find_spec("onnxruntime_extensions")
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"opforge: onnxruntime-extensions is not installed (pip install {ORTX_PIN}); its "
                                f"library serves the ONNX domains {list(ORTX_DOMAINS)} and opforge's prototype ops")
    for location in found.submodule_search_locations:
        hits = sorted(glob.glob(os.path.join(location, "_extensions_pydll*.so")) +
                      glob.glob(os.path.join(location, "_extensions_pydll*.pyd")))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"opforge: onnxruntime-extensions at {list(found.submodule_search_locations)} has no "
                            f"_extensions_pydll library; reinstall it ({ORTX_PIN})")


#: domain -> (where it came from, path or zero-argument function returning the path)
_LIBRARIES: dict[str, tuple[str, PathSource]] = {
    DOMAIN: ("opforge (built-in)", lambda: _built_library(_LIB_NAME)),
    ATEN_DOMAIN: ("opforge (built-in, links libtorch)", lambda: _built_library(_ATEN_LIB_NAME)),
    **{d: ("opforge (built-in, mmdeploy's node forms)", lambda: _built_library(_MMDEPLOY_LIB_NAME))
       for d in MMDEPLOY_DOMAINS},
    **{d: (ORTX_DISTRIBUTION, ortx_library_path) for d in ORTX_DOMAINS},
}


def _is_ortx(path: str) -> bool:
    return os.path.basename(path).startswith("_extensions_pydll")


#: The SessionOptions into which opforge registered onnxruntime-extensions, and the sessions made
#: from them -> the domains whose Python-op tables they point into. ortx 0.15 keeps each domain's
#: Python ops in one growing array and hands ONNX Runtime pointers to its elements; defining
#: another op of that domain can move the array, and then these sessions call freed memory when
#: they run or are destroyed (a segfault, seen in the test suite). opforge.register_prototype
#: checks this before it defines an op (``ortx_tables_in_use``).
_ORTX_HOLDERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def ortx_python_op_tables() -> frozenset:
    """The domains that have an onnxruntime-extensions Python-op table now (ortx files an
    ``op_type`` without ``domain::`` under ai.onnx.contrib)."""
    ocos = sys.modules.get("onnxruntime_extensions._ocos")
    if ocos is None:  # not imported: no Python op defined in this process
        return frozenset()
    return frozenset(od.op_type.split("::", 1)[0] if "::" in od.op_type else ORTX_DOMAIN
                     for od in list(ocos.Opdef._odlist.values()))


def ortx_tables_in_use(domain: str) -> int:
    """How many live sessions and SessionOptions made by opforge point into ``domain``'s ortx
    Python-op table (after a collection: a session in a reference cycle is not in use)."""
    import gc

    def count():
        return sum(1 for tables in list(_ORTX_HOLDERS.values()) if domain in tables)

    if count():
        gc.collect()
    return count()


class MissingOrtLibrary(LookupError):
    """No ORT library is known for a custom ONNX domain."""


def register_ort_library(domain: str, path: PathSource, *, provider: Optional[str] = None,
                         replace: bool = False) -> None:
    """Declares that the ORT custom-op library ``path`` (a path, or a function returning
    one, called when first needed) serves the ONNX domain ``domain``. ``provider`` names
    who registered it (shown by ``opforge info``). Registering the same path again is a
    no-op; another library for a known domain is an error unless ``replace=True``."""
    if not isinstance(domain, str) or not domain or domain in BUILTIN_DOMAINS:
        raise ValueError(f"opforge.register_ort_library: {domain!r} is not a custom ONNX domain")
    known = _LIBRARIES.get(domain)
    if known is not None and not replace:
        same = not callable(path) and not callable(known[1]) and os.fspath(path) == os.fspath(known[1])
        if same or known[1] is path:
            return
        raise ValueError(
            f"opforge.register_ort_library: domain {domain!r} is already served by {known[0]} "
            f"({_describe(known[1])}); ONNX Runtime allows one custom-op library per domain. Give your ops "
            "another domain, or pass replace=True"
        )
    _LIBRARIES[domain] = (provider or "register_ort_library", path)


def _describe(source: PathSource) -> str:
    if callable(source):
        try:
            return os.fspath(source())
        except Exception as exc:  # noqa: BLE001 - shown, not raised
            return f"not available: {exc}"
    return os.fspath(source)


def _entry_points() -> dict:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_entry_point(ep: importlib.metadata.EntryPoint):
    """Loads ``module:attr`` of an entry point WITHOUT running the packages above the module
    (``my_ops/__init__.py`` imports torch and registers ops; finding a library path must not),
    falling back to a normal import where the module cannot be loaded on its own."""
    module_name, _, attr = ep.value.partition(":")
    parts = module_name.strip().split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level lookup executes nothing
        for part in parts[1:]:
            spec = importlib.machinery.PathFinder.find_spec(part, spec.submodule_search_locations)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return ep.load()
        standalone = importlib.util.spec_from_file_location(f"_opforge_entry_point_{ep.name}", spec.origin)
        module = importlib.util.module_from_spec(standalone)
        standalone.loader.exec_module(module)
        target = module
        for name in filter(None, attr.strip().split(".")):
            target = getattr(target, name)
        return target
    except Exception:  # noqa: BLE001 - e.g. relative imports: load it the ordinary way
        return ep.load()


def _resolve(domain: str) -> tuple[str, str]:
    """(provider, path) of the library of ``domain``: registered ones first, then entry points."""
    if domain not in _LIBRARIES:
        ep = _entry_points().get(domain)
        if ep is None:
            raise MissingOrtLibrary(
                f"opforge: no ONNX Runtime library is known for the ONNX domain {domain!r}. Install the package "
                f"that provides it (its library is found through the {ENTRY_POINT_GROUP!r} entry point), "
                f"import it, or call opforge.register_ort_library({domain!r}, path). Known domains: "
                f"{sorted(set(_LIBRARIES) | set(_entry_points()))}"
            )
        target = _load_entry_point(ep)
        _LIBRARIES[domain] = (f"{ep.dist.name if ep.dist else ep.value} (entry point)", target)
    provider, source = _LIBRARIES[domain]
    path = os.fspath(source() if callable(source) else source)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"opforge: the ORT library of domain {domain!r} ({provider}) is not at {path}; "
                                "is the package built?")
    return provider, path


def ort_library_path(domain: str = DOMAIN) -> str:
    """Absolute path of the ORT custom-op library serving ``domain`` (default: opforge's own)."""
    return _resolve(domain)[1]


def aten_library_path() -> str:
    """Absolute path of libopforge_aten.so, the ORT kernel for ``org.pytorch.aten::ATen``
    nodes (links libtorch; load it in processes that can load torch's libraries)."""
    return ort_library_path(ATEN_DOMAIN)


def mmdeploy_library_path() -> str:
    """Path of ``libopforge_mmdeploy.so``: ONNX Runtime kernels with the node forms of the files
    mmdeploy 1.3.1 exports (domains ``mmdeploy`` and ``mmcv``), a drop-in for mmdeploy's
    ``libmmdeploy_onnxruntime_ops.so`` in any onnxruntime >= 1.21, without torch::

        so.register_custom_ops_library(opforge.mmdeploy_library_path())

    (:func:`ort_session` registers it by itself for a model in those domains.)"""
    return ort_library_path(MMDEPLOY_DOMAINS[0])


def ort_libraries() -> dict[str, tuple[str, str]]:
    """``{domain: (provider, path or 'not available: why')}`` for every known library."""
    out = {}
    for domain in sorted(set(_LIBRARIES) | set(_entry_points())):
        try:
            out[domain] = _resolve(domain)
        except Exception as exc:  # noqa: BLE001 - listed, not raised
            out[domain] = (_LIBRARIES.get(domain, ("entry point", None))[0], f"not available: {exc}")
    return out


def cuda_companion_path(library: Union[str, os.PathLike]) -> Optional[str]:
    """The CUDA companion of an ORT library built by ``opforge.build.OrtLibrary`` in a CUDA
    build (``libfoo.so`` -> ``libfoo_cuda.so``, beside it), or None: a CPU-only build. The
    library loads it itself when the running ORT has a CUDA EP (``OPFORGE_ORT_CUDA``)."""
    path = Path(library)
    companion = path.with_name(path.stem + "_cuda.so")
    return str(companion) if companion.is_file() else None


def cuda_companion_status(library: Union[str, os.PathLike]) -> str:
    """Whether ``library``'s CUDA EP kernels can load in this process: ``"none (CPU-only
    build)"``, ``"loads: PATH"`` or ``"cannot load: WHY"`` (a missing CUDA runtime or cuBLAS)."""
    import ctypes

    companion = cuda_companion_path(library)
    if companion is None:
        return "none (CPU-only build)"
    try:
        ctypes.CDLL(companion, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as exc:
        return f"cannot load: {exc}"
    return f"loads: {companion}"


class MissingOrtKernels(RuntimeError):
    """A model uses custom-domain ops but the ORT session has no kernels for them."""


#: The earlier name, for code written against opforge 0.1.
MissingOpforgeKernels = MissingOrtKernels


class ConflictingOrtLibraries(RuntimeError):
    """Two custom-op libraries in one SessionOptions serve the same ONNX domain (ONNX Runtime
    refuses the session: "Domain already set in registry")."""


#: Other projects' libraries whose domains an opforge library also serves: file name -> opforge's.
_REPLACED_LIBRARIES = {"libmmdeploy_onnxruntime_ops.so": _MMDEPLOY_LIB_NAME}


def _mapped_replaced_libraries() -> list[str]:
    """The libraries of _REPLACED_LIBRARIES this process has loaded."""
    try:
        with open("/proc/self/maps") as maps:
            names = {os.path.basename(line.split()[-1]) for line in maps if len(line.split()) >= 6}
    except OSError:
        return []
    return sorted(n for n in names if n in _REPLACED_LIBRARIES)


def _load_model(model) -> tuple[Union[str, bytes], onnx.ModelProto]:
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString(), model
    if isinstance(model, (bytes, bytearray)):
        return bytes(model), onnx.load_from_string(bytes(model))
    path = os.fspath(model)
    return path, onnx.load(path, load_external_data=False)


def _prepare_aten(data, proto: onnx.ModelProto, allow_aten=None):
    """ATen nodes as any exporter writes them (plain ``torch.onnx.export`` with ONNX_ATEN_FALLBACK,
    ``g.at(...)`` symbolics with typed scalar attributes and no overload name) made runnable:
    overloads resolved, outputs typed (ONNX Runtime cannot infer them). The model is left as it is
    when it needs nothing. An operator outside libopforge_aten's allowed set (and ``allow_aten``)
    is refused here, before any of the model is run (:mod:`opforge.aten.policy`)."""
    from ..aten import fallback, policy

    try:
        policy.check_model(proto, allow_aten)
    except policy.MalformedAtenNode:
        return data, proto  # libopforge_aten refuses it when the session is created, as without opforge
    if isinstance(data, str) and any(i.data_location == onnx.TensorProto.EXTERNAL for i in proto.graph.initializer):
        return data, proto  # rewritten bytes would lose the path its external data is relative to
    prepared = onnx.ModelProto()
    prepared.CopyFrom(proto)
    try:
        prepared, _ = fallback.prepare(prepared, allow_aten)
    except policy.AtenOpRefused:
        raise
    except ValueError:
        if fallback.has_scalar_attrs(proto):
            raise  # only opforge can read these nodes: its error says what does not bind
        return data, proto  # libopforge_aten names what is wrong (unknown operator, ...), as without opforge
    serialized = prepared.SerializeToString()
    if serialized == (data if isinstance(data, bytes) else proto.SerializeToString()):
        return data, proto
    return serialized, prepared


def custom_ops(model: onnx.ModelProto) -> dict[str, list[str]]:
    """``{domain: ["domain::op", ...]}`` of the nodes ONNX Runtime needs a custom-op
    library for (local functions defined in the model excluded)."""
    from ..aten.policy import model_nodes

    local = {(f.domain, f.name) for f in model.functions}
    ops: dict[str, set] = {}
    for n in model_nodes(model):
        if n.domain not in BUILTIN_DOMAINS and (n.domain, n.op_type) not in local:
            ops.setdefault(n.domain, set()).add(f"{n.domain}::{n.op_type}")
    return {d: sorted(v) for d, v in sorted(ops.items())}


def _config_key(domain: str) -> str:
    return f"opforge.custom_domain.{domain}"  # set by opforge/ort_library.h: add_domain


def _has_domain(so, domain: str) -> bool:
    try:
        so.get_session_config_entry(_config_key(domain))
        return True
    except Exception:  # noqa: BLE001 - ORT raises a bare RuntimeError for a missing key
        return False


#: (domain, library path) -> the ops of that domain with a spec but no kernel in the library
_KERNEL_AUDIT: dict[tuple[str, str], list[str]] = {}


def _audit(domain: str, path: str, used: Sequence[str]) -> None:
    """Every registered spec of ``domain`` must have a kernel in its library: checked once per
    library and process. A missing kernel the model uses is an error naming it; others warn."""
    import warnings

    key = (domain, path)
    if key not in _KERNEL_AUDIT:
        _KERNEL_AUDIT[key] = check_library_kernels(domain) if domain != ATEN_DOMAIN else []
    missing = _KERNEL_AUDIT[key]
    if not missing:
        return
    lib = Path(path).name
    needed = [m for m in missing if m in used]
    if needed:
        raise MissingOrtKernels(f"opforge: {', '.join(needed)} has a spec (opforge.register_op) but {lib} has no "
                                "kernel for it: add one (OPFORGE_ORT_KERNELS in the library's sources) and rebuild")
    warnings.warn(f"opforge: {', '.join(missing)} has a spec but {lib} has no kernel for it", stacklevel=3)


def _allow_aten_in(so, allow_aten) -> None:
    """Writes ``allow_aten`` into the session config entry libopforge_aten reads when it is
    registered (merged with one the caller set); an error if the library is registered already."""
    from ..aten import policy

    allow = policy.parse_allow(allow_aten)
    if not allow:
        return
    try:
        given = so.get_session_config_entry(policy.ALLOW_CONFIG_KEY)
    except Exception:  # noqa: BLE001 - ORT raises a bare RuntimeError for a missing key
        given = ""
    merged = allow | policy.parse_allow(given)
    if merged == policy.parse_allow(given):
        return
    if _has_domain(so, ATEN_DOMAIN):
        raise ValueError("opforge.ort_session: allow_aten must be set before libopforge_aten is registered, and "
                         "these SessionOptions have it already; pass fresh options, or set the session config entry "
                         f"{policy.ALLOW_CONFIG_KEY!r} before registering the library")
    so.add_session_config_entry(policy.ALLOW_CONFIG_KEY, ",".join(sorted(merged)))


def _register_libraries(so, domains, used: Sequence[str] = (), allow_aten=None) -> list[str]:
    """Registers the library of each domain in ``so`` unless it already has one (libraries built
    on opforge mark the options); returns the domains with no known library."""
    unknown, registered = [], set()
    for domain in domains:
        if domain == ATEN_DOMAIN:
            _allow_aten_in(so, allow_aten)
        if _has_domain(so, domain):
            continue
        try:
            _, path = _resolve(domain)
        except MissingOrtLibrary:
            unknown.append(domain)
            continue
        if path in registered:  # one library serving several domains (onnxruntime-extensions)
            continue
        if not _is_ortx(path):  # ortx's kernels for prototype ops are registered with the ops themselves
            _audit(domain, path, used)
        so.register_custom_ops_library(path)
        registered.add(path)
        if _is_ortx(path):
            _ORTX_HOLDERS[so] = ortx_python_op_tables()
    return unknown


def ort_session(
    model,
    sess_options=None,
    providers: Optional[Sequence] = None,
    *,
    intra_op_num_threads: Optional[int] = None,
    register_libraries: bool = True,
    register_opforge: Optional[bool] = None,
    register_aten: Optional[bool] = None,
    allow_aten: Optional[Union[str, Sequence[str]]] = None,
):
    """An ``onnxruntime.InferenceSession`` for ``model`` (ModelProto, bytes or path) with the
    ORT library of every custom domain the model uses registered, once each (options that
    already hold a library keep it).

    With ``register_libraries=False`` (a session as a plain ORT user would make it), a model
    that needs custom kernels the session lacks fails with :class:`MissingOrtKernels` naming
    the ops and what to register, instead of ORT's bare "not a registered function/op".
    ``register_opforge`` is the older name of ``register_libraries``; ``register_aten=True``
    also registers libopforge_aten when the model has no ATen node.

    ATen nodes are prepared as :func:`opforge.export` prepares them (overloads named, outputs
    typed), so models from plain ``torch.onnx.export(..., ONNX_ATEN_FALLBACK)`` run too. A model
    with prototype ops gets a ``PrototypeSession`` (an ``InferenceSession``) whose ``run`` raises
    their errors, which onnxruntime-extensions cannot report itself.

    A model is data: libopforge_aten runs only a vetted set of ATen operators (pure tensor math;
    :mod:`opforge.aten.policy`) and a model naming another is refused here, before it
    runs. ``allow_aten={"bernoulli", ...}`` (or ``"*"``) opts a model you trust in; it becomes the
    session config entry ``opforge.aten.allow``, which plain ONNX Runtime users set themselves.
    """
    import onnxruntime as ort

    if register_opforge is not None:
        register_libraries = register_opforge
    so = sess_options if sess_options is not None else ort.SessionOptions()
    if intra_op_num_threads is not None:
        so.intra_op_num_threads = intra_op_num_threads
    data, proto = _load_model(model)
    needed = custom_ops(proto)
    from ..symbolics.onnx_schema import check_node_types

    check_node_types(proto, where="opforge.ort_session")
    if ATEN_DOMAIN in needed:
        data, proto = _prepare_aten(data, proto, allow_aten)
    domains = list(needed) if register_libraries else []
    if register_aten and ATEN_DOMAIN not in domains:
        domains.append(ATEN_DOMAIN)
    if register_aten is False and ATEN_DOMAIN in domains:
        domains.remove(ATEN_DOMAIN)
    used = [op for ops in needed.values() for op in ops]
    unknown = _register_libraries(so, domains, used, allow_aten)
    session_class = ort.InferenceSession
    prototype = sys.modules.get("opforge.prototype")  # loaded by register_prototype: no prototypes without it
    if prototype is not None and prototype.prototype_ops(used):
        session_class = prototype.session_class()  # raises prototype ops' errors (ortx cannot)
    try:
        session = session_class(data, so, providers=list(providers or ["CPUExecutionProvider"]))
        if so in _ORTX_HOLDERS:  # (ORT copies the options into the session)
            _ORTX_HOLDERS[session] = _ORTX_HOLDERS[so]
        return session
    except Exception as exc:  # ORT raises its own pybind exception types
        text = str(exc)
        if "Domain already set in registry" in text:
            others = _mapped_replaced_libraries()
            why = "".join(f"; {o} is loaded in this process: {_REPLACED_LIBRARIES[o]} (opforge) replaces it, so "
                          "register only one of the two" for o in others)
            raise ConflictingOrtLibraries(
                f"opforge.ort_session: two custom-op libraries in these SessionOptions serve the same ONNX domain "
                f"(the model uses {sorted(needed)}){why}. ONNX Runtime said: {text}") from exc
        if not needed or "not a registered function/op" not in text:
            raise
        missing = [d for d in needed if d in unknown or not _has_domain(so, d)]
        lines = []
        for domain in missing or list(needed):
            ops = ", ".join(needed[domain])
            if domain in unknown:
                lines.append(f"{ops}: no ONNX Runtime library is known for domain {domain!r}; install the package "
                             f"that provides it (found through the {ENTRY_POINT_GROUP!r} entry point) or call "
                             f"opforge.register_ort_library({domain!r}, path)")
            elif _LIBRARIES.get(domain, ("", ""))[1] is ortx_library_path:
                lines.append(f"{ops}: the session has the onnxruntime-extensions library for domain {domain!r}, but "
                             "it has no op of that name: not one of its own ops, and no Python op of that name "
                             "(opforge.register_prototype, onnxruntime_extensions.onnx_op) is defined in this "
                             "process; import the package that defines it before creating the session")
            elif domain in MMDEPLOY_DOMAINS and any(op not in MMDEPLOY_OPS[domain] for op in needed[domain]):
                other = ", ".join(op for op in needed[domain] if op not in MMDEPLOY_OPS[domain])
                lines.append(f"{other}: libopforge_mmdeploy.so serves mmdeploy 1.3.1's node forms, which in domain "
                             f"{domain!r} are {', '.join(MMDEPLOY_OPS[domain])}; {other} is not one of them")
            elif domain == DOMAIN:
                lines.append(f"{ops}: the session has no opforge kernels; register them before creating it: "
                             f"{REGISTER_HINT} (or use opforge.ort_session(model))")
            else:
                lines.append(f"{ops}: the session has no kernels for domain {domain!r}; register them: "
                             f"sess_options.register_custom_ops_library(opforge.ort_library_path({domain!r})) "
                             "(or use opforge.ort_session(model))")
        raise MissingOrtKernels("opforge: " + "\n  ".join(lines) + f"\nONNX Runtime said: {text}") from exc



def _elem_type(onnx_type: str) -> int:
    """``tensor(int64)`` -> onnx.TensorProto.INT64."""
    return _ELEM_TYPES[onnx_type]


_ELEM_TYPES = {"tensor(float)": onnx.TensorProto.FLOAT, "tensor(double)": onnx.TensorProto.DOUBLE,
               "tensor(float16)": onnx.TensorProto.FLOAT16, "tensor(bfloat16)": onnx.TensorProto.BFLOAT16,
               "tensor(int64)": onnx.TensorProto.INT64,
               "tensor(int32)": onnx.TensorProto.INT32, "tensor(int16)": onnx.TensorProto.INT16,
               "tensor(int8)": onnx.TensorProto.INT8, "tensor(uint8)": onnx.TensorProto.UINT8,
               "tensor(bool)": onnx.TensorProto.BOOL}


def check_library_kernels(domain: str, specs=None) -> list[str]:
    """The ops of ``domain`` that have a registered spec but no kernel in the domain's ORT
    library (probed by creating an ORT session with one node of each op)."""
    import onnxruntime as ort
    from onnx import helper

    from ..spec import REGISTRY

    specs = [s for s in (specs or REGISTRY.values()) if s.domain == domain]
    if not specs:
        return []
    dummy = {"int": 1, "ints": [1, 1], "float": 1.0, "floats": [1.0, 1.0], "bool": 0}
    missing = []
    for spec in specs:
        # each input typed as its declaration's first type (an index input as int64, say), so the
        # probe finds the kernel registered for that signature
        input_types = [_elem_type(spec.onnx_types_of(a)[0]) for a in spec.tensor_args]
        input_type_strings = [spec.onnx_types_of(a)[0] for a in spec.tensor_args]
        output_types = [_elem_type(spec.output_elem_type(k, input_type_strings) or spec.onnx_types[0])
                        for k in range(len(spec.output_args))]
        inputs = [a.onnx_name for a in spec.tensor_args]
        node = helper.make_node(spec.name, inputs, list(spec.output_names), domain=domain,
                                **{a.onnx_name: dummy[a.kind] for a in spec.attr_args})
        graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info(n, t, None)
                                                    for n, t in zip(inputs, input_types)],
                                  [helper.make_tensor_value_info(o, t, None)
                                   for o, t in zip(spec.output_names, output_types)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                        helper.make_opsetid(domain, spec.domain_version)])
        so = ort.SessionOptions()
        so.register_custom_ops_library(ort_library_path(domain))
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - only a missing kernel counts here
            if "not a registered function/op" in str(exc) or "Could not find an implementation" in str(exc):
                missing.append(spec.onnx_qualname)
    return missing


__all__ = [
    "ConflictingOrtLibraries",
    "ENTRY_POINT_GROUP",
    "ORTX_DOMAIN",
    "ORTX_DOMAINS",
    "MissingOpforgeKernels",
    "MissingOrtKernels",
    "MissingOrtLibrary",
    "REGISTER_HINT",
    "MMDEPLOY_DOMAINS",
    "aten_library_path",
    "check_library_kernels",
    "custom_ops",
    "mmdeploy_library_path",
    "ort_libraries",
    "ort_library_path",
    "ort_session",
    "ortx_library_path",
    "ortx_version",
    "register_ort_library",
]
