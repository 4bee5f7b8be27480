"""AOTInductor packages (.pt2) whose custom-op calls go straight to the ops' C shims.

A .pt2 calls a custom op through torch's proxy executor unless it is told that the op's library
has a C shim (``aot_inductor.custom_ops_to_c_shims`` + ``custom_op_libs``). The proxy executor is a
boxed call through the dispatcher with the arguments serialised per call; the C shim is a plain C
call into the op's kernel, about 4 us less per call (``benchmarks/bench_aoti_c_shim.py``), with
the same values and the same error text (``opforge/torch_c_shim.h``).

:func:`aoti_compile_and_package` is ``torch._inductor.aoti_compile_and_package`` with that route
turned on for every op whose loaded library (opforge's, or a ``new-op`` package's) defines a shim
for the device the program runs it on. The package then links the library by name
(``libopforge_torch.so``): the process that loads it loads the library first, as it must anyway to
register the ops (Python: ``import opforge``; C++: ``dlopen(opforge.torch_library_path())``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator, Optional

import torch

__all__ = ["aoti_compile_and_package", "aoti_c_shim_configs"]


def _op_devices(exported_program) -> dict:
    """Each custom op the program calls -> the set of devices of the tensors it is called with
    (over every call, in every graph of the program, higher-order ops' subgraphs included)."""
    devices: dict = {}
    for module in exported_program.graph_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            op = node.target
            if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
                continue
            if op.namespace in ("aten", "prims", "higher_order"):
                continue
            seen = devices.setdefault(op, set())
            torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: _add_devices(arg, seen))
    return devices


def _add_devices(node: torch.fx.Node, seen: set) -> torch.fx.Node:
    val = node.meta.get("val")
    for v in val if isinstance(val, (list, tuple)) else (val,):
        if isinstance(v, torch.Tensor):
            seen.add(v.device.type)
    return node


def _shim_libraries() -> dict:
    """(qualified op name, device) -> (library, declaration) over every loaded torch library. A
    shim name two libraries define (AOTInductor names it after the op alone, without the namespace)
    is dropped: the linker would bind either."""
    from .torch_library import loaded_torch_libraries

    found: dict = {}
    by_symbol: dict = {}
    for library in loaded_torch_libraries():
        stem = os.path.basename(library.path)
        if not (stem.startswith("lib") and stem.endswith(".so")):
            continue  # a package links it as -l<name>: only lib<name>.so can be named so
        for op, device, declaration in library.c_shims:
            symbol = f"aoti_torch_{device}_{op.split('::')[-1]}"
            by_symbol.setdefault(symbol, []).append((op, device))
            found[(op, device)] = (library, declaration)
    for symbol, users in by_symbol.items():
        if len(users) > 1:
            warnings.warn(f"opforge: {symbol} is defined by {len(users)} loaded libraries "
                          f"({', '.join(op for op, _ in users)}); those ops keep the proxy executor",
                          stacklevel=3)
            for key in users:
                found.pop(key, None)
    return found


def aoti_c_shim_configs(exported_program) -> tuple[dict, list]:
    """The inductor configs that send ``exported_program``'s custom-op calls to C shims, and the
    folders holding the libraries the package links (the linker's ``LIBRARY_PATH``). An op gets its
    shim when every call of it in the program runs on one device its library has a shim for (the
    configs name ops, not calls); the others keep the proxy executor."""
    shims = _shim_libraries()
    declarations: dict = {}
    libraries: dict = {}
    for op, devices in _op_devices(exported_program).items():
        if len(devices) != 1:
            continue  # no tensors (nothing to place) or calls on several devices
        entry = shims.get((op.name().split(".")[0], next(iter(devices))))
        if entry is None:
            continue
        library, declaration = entry
        declarations[op] = [declaration]
        libraries[os.path.basename(library.path)[3:-3]] = os.path.dirname(library.path)
    if not declarations:
        return {}, []
    configs = {"aot_inductor.custom_ops_to_c_shims": declarations,
               "aot_inductor.custom_op_libs": sorted(libraries)}
    return configs, sorted(set(libraries.values()))


@contextlib.contextmanager
def _linker_path(folders: list) -> Iterator[None]:
    """LIBRARY_PATH with ``folders`` first while the package links; put back exactly after."""
    old = os.environ.get("LIBRARY_PATH")
    if folders:
        os.environ["LIBRARY_PATH"] = os.pathsep.join([*folders, *([old] if old else [])])
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("LIBRARY_PATH", None)
        else:
            os.environ["LIBRARY_PATH"] = old


def aoti_compile_and_package(exported_program, package_path: Optional[str] = None,
                             inductor_configs: Optional[dict] = None, *, c_shims: bool = True, **kwargs) -> str:
    """``torch._inductor.aoti_compile_and_package(exported_program, package_path, inductor_configs)``
    with the C-shim route for the custom ops whose libraries define shims (``c_shims=False``: torch's
    default, the proxy executor, for every op). Configs you pass win over opforge's for the same
    op. Returns the package's path. Load the package after ``import opforge`` (C++: after
    ``dlopen(opforge.torch_library_path())``): it links the op libraries by their names."""
    configs = dict(inductor_configs or {})
    folders: list = []
    if c_shims:
        ours, folders = aoti_c_shim_configs(exported_program)
        for key, value in ours.items():
            if key.endswith("custom_ops_to_c_shims"):
                configs[key] = {**value, **configs.get(key, {})}
            else:
                configs[key] = sorted({*value, *(configs.get(key) or [])})
    with _linker_path(folders):
        return torch._inductor.aoti_compile_and_package(exported_program, package_path=package_path,
                                                        inductor_configs=configs, **kwargs)
