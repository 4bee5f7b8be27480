"""onnxruntime-extensions' custom-op library: where it is, and which of its Python-op tables
the sessions opforge made point into (see ``_ORTX_HOLDERS``)."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import sys
import weakref
from typing import Optional

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
