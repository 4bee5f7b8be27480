"""Which ORT custom-op library serves which ONNX domain, and where it is: opforge's own
libraries, onnxruntime-extensions', those registered with :func:`register_ort_library`, and
those packages declare as entry points (found without importing the package)."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import Callable, Optional, Union

from ..spec import ATEN_DOMAIN, DOMAIN
from .ortx import ORTX_DISTRIBUTION, ORTX_DOMAINS, ortx_library_path

ENTRY_POINT_GROUP = "opforge.ort_libraries"
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
PathSource = Union[str, os.PathLike, Callable[[], Union[str, os.PathLike]]]


def _built_library(name: str) -> str:
    path = Path(__file__).with_name(name)
    if not path.is_file():
        raise FileNotFoundError(
            f"opforge: {path} is not built. Build opforge with `pip install --no-build-isolation -e .` "
            "(ORT headers: `opforge fetch-ort-headers`, or OPFORGE_ORT_INCLUDE_DIR)"
        )
    return str(path)


def _aten_library() -> str:
    """libopforge_aten.so built for the running torch (it links libtorch's C++ API): the packaged
    one, or ``opforge build-aten``'s for this torch; refused with what to do otherwise."""
    from .aten_cache import aten_library_for_this_torch

    return aten_library_for_this_torch(Path(_built_library(_ATEN_LIB_NAME)))


#: domain -> (where it came from, path or zero-argument function returning the path)
_LIBRARIES: dict[str, tuple[str, PathSource]] = {
    DOMAIN: ("opforge (built-in)", lambda: _built_library(_LIB_NAME)),
    ATEN_DOMAIN: ("opforge (built-in, links libtorch)", _aten_library),
    **{d: ("opforge (built-in, mmdeploy's node forms)", lambda: _built_library(_MMDEPLOY_LIB_NAME))
       for d in MMDEPLOY_DOMAINS},
    **{d: (ORTX_DISTRIBUTION, ortx_library_path) for d in ORTX_DOMAINS},
}


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
