"""``ort_session``: an ONNX Runtime session with the library of every custom domain a model
uses registered once each, the ATen nodes prepared, and ORT's terse errors (a missing kernel,
two libraries for one domain) turned into ones that say what to do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

import onnx

from ..spec import DOMAIN, ELEM_TYPE_OF
from .libraries import (ATEN_DOMAIN, BUILTIN_DOMAINS, ENTRY_POINT_GROUP, MMDEPLOY_OPS, MMDEPLOY_DOMAINS, _LIBRARIES,
                        _MMDEPLOY_LIB_NAME, MissingOrtLibrary, _resolve, ort_library_path)
from .ortx import _ORTX_HOLDERS, _is_ortx, ortx_library_path, ortx_python_op_tables

#: What users must do when a model with opforge ops meets a session without our kernels.
REGISTER_HINT = "sess_options.register_custom_ops_library(opforge.ort_library_path())"


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


#: Functions (ops the model uses -> a session class, or None) that pick the class of the sessions
#: ort_session makes. opforge.prototype adds one when it is imported: models with prototype ops
#: get a session that raises their errors (onnxruntime-extensions cannot). The session code thus
#: does not know of prototypes, and prototype.py imports this module, not the other way round.
_SESSION_CLASS_HOOKS: list = []


def add_session_class_hook(choose) -> None:
    """Adds ``choose(used_ops) -> session class or None`` to those :func:`ort_session` asks."""
    if choose not in _SESSION_CLASS_HOOKS:
        _SESSION_CLASS_HOOKS.append(choose)


def _load_model(model, external_data_dir=None) -> tuple[Union[str, bytes], onnx.ModelProto]:
    """(what ONNX Runtime is given, the model). External data is read only from inside one folder
    (opforge.model_files): a path's own folder; for bytes or a ModelProto, which have none, the
    caller's ``external_data_dir``, whose files are then read into the bytes ORT gets (never the
    process's current directory, which ORT would use)."""
    from ..model_files import ExternalDataError, external_data_files, external_tensors, inline_external_data

    if isinstance(model, (onnx.ModelProto, bytes, bytearray)):
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load_from_string(bytes(model))
        external = external_tensors(proto)
        if not external:
            return (proto.SerializeToString() if isinstance(model, onnx.ModelProto) else bytes(model)), proto
        if external_data_dir is None:
            location = next((e.value for e in external[0].external_data if e.key == "location"), "")
            raise ExternalDataError(
                f"opforge.ort_session: tensor {external[0].name!r} keeps its data in an external file "
                f"({location!r}), and a model given as bytes or a ModelProto has no folder to find it in. Pass "
                "external_data_dir=<the folder that holds it> (files are read only from inside it), or the "
                "model's path")
        inlined = inline_external_data(proto, external_data_dir)
        try:
            return inlined.SerializeToString(), inlined
        except ValueError as exc:  # protobuf's 2 GB limit
            raise ExternalDataError(f"opforge.ort_session: with its external data read in, the model is too large "
                                    f"for one protobuf message ({exc}); pass the model's path instead") from None
    path = os.fspath(model)
    proto = onnx.load(path, load_external_data=False)
    folder = os.path.dirname(os.path.abspath(path))
    if external_data_dir is not None and os.path.realpath(external_data_dir) != os.path.realpath(folder):
        raise ValueError(f"opforge.ort_session: external_data_dir={os.fspath(external_data_dir)!r} is for a model "
                         f"given as bytes or a ModelProto; {path!r} reads its external data from its own folder")
    external_data_files(proto, folder)  # ORT reads them from there: checked first
    return path, proto


def _prepare_aten(data, proto: onnx.ModelProto, allow_aten=None):
    """ATen nodes as any exporter writes them (plain ``torch.onnx.export`` with ONNX_ATEN_FALLBACK,
    ``g.at(...)`` symbolics with typed scalar attributes and no overload name) made runnable:
    overloads resolved, outputs typed (ONNX Runtime cannot infer them). The model is left as it is
    when it needs nothing. An operator outside libopforge_aten's allowed set (and ``allow_aten``)
    is refused here, before any of the model is run (:mod:`opforge.aten.policy`)."""
    from ..aten import fallback, nodes, policy

    try:
        policy.check_model(proto, allow_aten)
    except policy.MalformedAtenNode:
        return data, proto  # libopforge_aten refuses it when the session is created, as without opforge
    if fallback.is_prepared(proto):
        return data, proto  # opforge.export prepared it (the policy check above still ran)
    if isinstance(data, str) and any(i.data_location == onnx.TensorProto.EXTERNAL for i in proto.graph.initializer):
        return data, proto  # rewritten bytes would lose the path its external data is relative to
    prepared = onnx.ModelProto()
    prepared.CopyFrom(proto)
    try:
        prepared, _ = fallback.prepare(prepared, allow_aten)
    except policy.AtenOpRefused:
        raise
    except ValueError:
        if nodes.has_scalar_attrs(proto):
            raise  # only opforge can read these nodes: its error says what does not bind
        return data, proto  # libopforge_aten names what is wrong (unknown operator, ...), as without opforge
    return prepared.SerializeToString(), prepared


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
    external_data_dir: Optional[Union[str, os.PathLike]] = None,
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

    External data is read only from inside one folder, and every path is checked before anything
    is read (:mod:`opforge.model_files`: no absolute paths, no ``..``, no symlinks out, regular files
    only). A model given by path reads it from the path's folder. Bytes and a ModelProto have no
    folder: their external data is refused unless ``external_data_dir`` names the folder.
    """
    import onnxruntime as ort

    if register_opforge is not None:
        register_libraries = register_opforge
    so = sess_options if sess_options is not None else ort.SessionOptions()
    if intra_op_num_threads is not None:
        so.intra_op_num_threads = intra_op_num_threads
    data, proto = _load_model(model, external_data_dir)
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
    for choose in _SESSION_CLASS_HOOKS:  # opforge.prototype's: a session that raises prototype ops' errors
        session_class = choose(used) or session_class
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
    return ELEM_TYPE_OF[onnx_type]



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
