"""Which ATen operators a model may run through libopforge_aten: default-deny.

A model file is data. An ``org.pytorch.aten::ATen`` node names any operator of libtorch's
dispatcher, and libopforge_aten would call it with the model's arguments: a five-line model
with ``ATen(operator="from_file", filename="/etc/passwd")`` would read the machine's files.
So libopforge_aten runs only a vetted set: the public, functional ATen operators that compute
on the tensors they are given (what opforge's exporters emit, and pure tensor math), listed in
``aten/csrc/aten_policy.inc``, which the C++ library compiles in and this module
reads. Everything else is refused when the session is created, with an error naming the op, why,
and how to allow it.

The list is generated from the rules below (:func:`decide`) over torch's dispatcher and
committed; ``tests/test_aten_policy.py`` fails when torch's operators and the committed list
part ways, so a torch upgrade is reviewed, not silently trusted. Regenerate with
``python -m opforge.aten.policy --write``.

The criteria (issue #43). An operator runs by default only if a model export can put it there
(a forward, public, functional operator: what opforge's exporters emit as a fallback, what
torch's ATen-fallback export and ``g.at(...)`` symbolics write) and every argument it takes is
safe to take from a model file: either it is elementwise / reduction / shape math, whose memory
libopforge_aten bounds while it runs, or its index, offset, size, count, enum and flag
arguments are each checked (by ATen, or by libopforge_aten before the call: see
``csrc/aten_guards.h``), with ``tests/aten_fuzz.py`` feeding every allowed overload a node can
express hostile values for every argument. So the following are refused, first rule that
matches (each with the reason the error gives):

* ``from_file``: reads the file the model names;
* ops that draw from the global random-number generator (a ``Generator`` argument, or torch's
  ``nondeterministic_seeded`` tag: dropout, rand, the RNNs...);
* ``empty`` and its family: uninitialised memory, whatever the process held there before;
* ``as_strided*``, ``set``, ``resize*``, ``unsafe_*``: storage or strides set by hand (unchecked
  aliasing);
* fbgemm / mkldnn / cuDNN / MIOpen / MPS kernels: backend-specific, some read packed weights
  from raw bytes;
* sparse, nested and quantized tensor constructors (unchecked indices; ORT cannot hold them);
* ``pin_memory`` (a CUDA driver resource), ``combinations`` (output grows as n^r, r from the model);
* backward kernels (``*_backward*``, ``*_jvp``): they take a forward pass's saved indices, sizes
  and windows and trust them (max_pool2d_with_indices_backward with index 2^33 crashed the
  process), and no exporter puts one in a forward model;
* quantization internals (``choose_qparams*``, observers, ``q_*`` accessors) and internal kernels
  of other ops (``slow_conv*``, ``thnn_conv*``, SyncBatchNorm's ``batch_norm_stats``...), reached
  in torch only after the public op's checks;
* ops with an ``unsafe`` flag (``segment_reduce``: its offsets are then read unchecked);
* private (``_``-prefixed) operators, but for the few opforge's exporters emit;
* every overload that writes into an argument (in-place, ``out=``) is refused by the library
  whatever the list says: ORT's inputs are read-only.

A trusted model opts in explicitly: ``opforge.ort_session(model, allow_aten={"bernoulli"})``,
or for plain ONNX Runtime ``sess_options.add_session_config_entry("opforge.aten.allow",
"bernoulli,normal")`` before ``register_custom_ops_library``. ``"*"`` allows every operator
(the pre-0.3 behaviour). What an allowed operator is given is checked at run time, before it
runs (enums, loop counts, the data of arguments a kernel trusts), and what it allocates counts
against the node's memory budget; ``opforge.aten.max_elements`` raises that bound for a trusted
model (see docs/aten.md, "ATen trust model").
"""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path
from typing import Iterable, Optional

from ..spec import ATEN_DOMAIN

#: The list libopforge_aten compiles in (X-macros, one op per line).
POLICY_FILE = Path(__file__).resolve().parent / "csrc" / "aten_policy.inc"
#: Integer arguments that must lie in a range (enums, loop counts), which the library checks too.
ARG_RANGES_FILE = POLICY_FILE.with_name("aten_arg_ranges.inc")
#: Session config keys libopforge_aten reads when it is registered (csrc/aten_op.cc).
ALLOW_CONFIG_KEY = "opforge.aten.allow"
MAX_ELEMENTS_CONFIG_KEY = "opforge.aten.max_elements"

#: Private operators opforge's exporters emit (the coverage table counts them).
PRIVATE_ALLOWED = ("__lshift__", "__rshift__", "_upsample_bicubic2d_aa", "_upsample_bilinear2d_aa")

_FILES = "reads the file the model names"
_RNG = "draws from the process-wide random-number generator"
_UNINITIALISED = "returns uninitialised memory (whatever the process held there before)"
_STORAGE = "sets storage or strides by hand (unchecked aliasing)"
_BACKEND = "a backend-specific kernel (fbgemm, mkldnn, cuDNN, MIOpen, MPS); some read packed weights from raw bytes"
_LAYOUT = "makes sparse, nested or quantized tensors (unchecked indices; ONNX Runtime cannot hold them)"
_PINNED = "allocates page-locked host memory (a CUDA driver resource)"
_GROWTH = "its output grows as n^r with r taken from the model"
_BACKWARD = ("a backward kernel: it takes another op's saved results (indices, sizes, windows) and trusts them, "
             "and no exporter puts one in a forward model")
_UNSAFE = "takes an 'unsafe' flag that turns off its own checks of the offsets it reads with"
_QUANT = "a quantization internal (observers, qparams search, quantized-tensor accessors), not a model op"
_INTERNAL = "an internal kernel of another op, reached only after that op's own checks"

_RULES = (
    (re.compile(r"^from_file$"), _FILES),
    (re.compile(r"^(empty|empty_like|empty_permuted|empty_strided|empty_quantized|new_empty|new_empty_strided)$"),
     _UNINITIALISED),
    (re.compile(r"^(as_strided.*|set|resize.*|sparse_resize.*|unsafe_.*)$"), _STORAGE),
    (re.compile(r"^(fbgemm_.*|mkldnn_.*|to_mkldnn.*|cudnn_.*|miopen_.*|mps_.*|lstm_mps_.*)$"), _BACKEND),
    (re.compile(r"(sparse|nested|padded_tensor|^quantize_|quantized|^dequantize$|coalesce|^(hspmm|sspaddmm|smm)$|"
                r"^(indices|values|crow_indices|ccol_indices|col_indices|row_indices)(_copy)?$|^to_dense|^dense_dim$)"),
     _LAYOUT),
    (re.compile(r"^(pin_memory|is_pinned)$"), _PINNED),
    (re.compile(r"^combinations$"), _GROWTH),
    (re.compile(r"(_backward|backward_|_jvp$)"), _BACKWARD),
    (re.compile(r"^(choose_qparams.*|fused_moving_avg_obs_fake_quant|fake_quantize_per_(tensor|channel)_affine_cachemask"
                r"|q_.*|qscheme|int_repr)$"), _QUANT),
    (re.compile(r"^(slow_conv.*|thnn_conv.*|conv_depthwise3d|convolution_overrideable|batch_norm_(stats|elemt|"
                r"gather_stats|gather_stats_with_counts|update_stats))$"), _INTERNAL),
)


def _writes(schema) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _dispatcher_ops() -> dict:
    """``{name: [functional schemas]}`` of every ATen operator in torch's dispatcher (what
    libopforge_aten can find) with at least one overload that writes into no argument."""
    import torch

    ops: dict = {}
    for s in torch._C._jit_get_all_schemas():
        if not s.name.startswith("aten::") or _writes(s):
            continue
        try:  # TorchScript's builtins (aten::len, aten::save...) are not dispatcher operators
            torch._C._dispatch_find_schema_or_throw(s.name, s.overload_name)
        except RuntimeError:
            continue
        ops.setdefault(s.name[len("aten::"):], []).append(s)
    return ops


def _seeded(name: str, schemas) -> bool:
    import torch

    if any("Generator" in str(a.type) for s in schemas for a in s.arguments):
        return True
    packet = getattr(torch.ops.aten, name, None)
    for overload in (packet.overloads() if packet is not None else ()):
        if torch.Tag.nondeterministic_seeded in getattr(packet, overload).tags:
            return True
    return False


def decide(name: str, schemas) -> Optional[str]:
    """None when ``aten::name`` runs by default, else the reason it is refused."""
    if name.startswith("_") and name not in PRIVATE_ALLOWED:
        return "private"  # not vetted; not listed one by one (there are hundreds)
    for pattern, reason in _RULES:
        if pattern.search(name):
            return reason
    if _seeded(name, schemas):
        return _RNG
    if any(a.name == "unsafe" for s in schemas for a in s.arguments):
        return _UNSAFE
    return None


def generate() -> tuple[list[str], dict[str, str]]:
    """(allowed names, {refused public name: reason}) over this torch's dispatcher."""
    allowed, refused = [], {}
    for name, schemas in sorted(_dispatcher_ops().items()):
        reason = decide(name, schemas)
        if reason is None:
            allowed.append(name)
        elif reason != "private":
            refused[name] = reason
    return allowed, refused


def render(allowed: Iterable[str], refused: dict[str, str]) -> str:
    import torch

    lines = [
        "// The ATen operators libopforge_aten runs by default, and those it refuses with a reason.",
        f"// Generated from the rules in opforge/aten/policy.py over torch {torch.__version__}'s",
        "// dispatcher by `python -m opforge.aten.policy --write`; review changes like code.",
        "// Operators in neither list (private ones) are refused as not vetted.",
        "// OPFORGE_ATEN_ALLOW(name) / OPFORGE_ATEN_REFUSE(name, reason): define both before including.",
    ]
    lines += [f'OPFORGE_ATEN_ALLOW("{n}")' for n in allowed]
    lines += [f'OPFORGE_ATEN_REFUSE("{n}", "{r}")' for n, r in sorted(refused.items())]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def committed() -> tuple[frozenset, dict]:
    """(allowed names, {refused name: reason}) as the library was built with them."""
    text = POLICY_FILE.read_text()
    allowed = frozenset(re.findall(r'^OPFORGE_ATEN_ALLOW\("([^"]+)"\)', text, re.M))
    refused = dict(re.findall(r'^OPFORGE_ATEN_REFUSE\("([^"]+)", "([^"]+)"\)', text, re.M))
    return allowed, refused


def _has_functional_overload(name: str) -> bool:
    import torch

    packet = getattr(torch.ops.aten, name, None)
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return any(not _writes(getattr(packet, o)._schema) for o in packet.overloads())


@functools.lru_cache(maxsize=None)
def int_ranges() -> tuple:
    """((operator or "*", argument, lowest, highest, meaning), ...) from ``aten_arg_ranges.inc``."""
    return tuple((op, arg, int(lo), int(hi), meaning) for op, arg, lo, hi, meaning in re.findall(
        r'^OPFORGE_ATEN_INT_RANGE\("([^"]+)", "([^"]+)", (-?\d+), (-?\d+), "([^"]+)"\)', ARG_RANGES_FILE.read_text(),
        re.M))


#: ScalarType codes of dense numeric dtypes (uint8 ... bool, bfloat16), the only ones the library takes.
DENSE_SCALAR_TYPES = frozenset(range(12)) | {15}


def argument_problem(operator: str, name: str, type_kind: str, value: int) -> Optional[str]:
    """What is wrong with integer ``value`` for argument ``name`` (its real type's kind, e.g.
    ``"ScalarTypeType"``) of ``aten::operator``, in the library's words; None when nothing is.
    The same rules as libopforge_aten's (csrc/aten_op.cc, csrc/aten_guards.h): opforge's Python
    runs a node's op on meta tensors to type its outputs, and a hostile enum crashes even that."""
    if type_kind == "ScalarTypeType" and value not in DENSE_SCALAR_TYPES:
        return f"{value} is not a valid ScalarType here (a dtype of dense numbers (0 to 11: uint8 ... bool, or 15: bfloat16))"
    if type_kind == "LayoutType" and value != 0:
        return f"{value} is not a valid Layout here (0 (strided: dense tensors only))"
    if type_kind == "MemoryFormatType" and not 0 <= value <= 3:
        return f"{value} is not a valid MemoryFormat here (0 to 3)"
    for op, arg, lo, hi, meaning in int_ranges():
        if op in ("*", operator) and arg == name and not lo <= value <= hi:
            return f"'{name}' is {value}; valid values are {lo} to {hi} ({meaning})"
    return None


class AtenOpRefused(ValueError):
    """A model names an ATen operator libopforge_aten does not run by default."""


def parse_allow(allow) -> frozenset:
    """``allow_aten`` as given (a name, names, ``"*"``; ``"aten::x"`` or ``"x"``) -> bare names."""
    if allow is None:
        return frozenset()
    if isinstance(allow, str):
        allow = allow.split(",")
    return frozenset(a.strip().split("::")[-1].split(".")[0] for a in allow if a.strip())


def refusal(name: str, allow: frozenset = frozenset()) -> Optional[str]:
    """None when ``aten::name`` may run under ``allow``, else the error text (the library's words)."""
    name = name.split("::")[-1]
    allowed, refused = committed()
    if name in allowed or name in allow or "*" in allow:
        return None
    if name not in refused and not _has_functional_overload(name):
        return None  # unknown, or in-place / out= only: the library's own error names that
    why = refused.get(name, "it is not in the vetted set of pure tensor operators")
    return (f"ATen op aten::{name} is refused: {why}. A model is data, so libopforge_aten runs only the ATen "
            f"operators opforge's exporters emit and pure tensor math. If you trust this model, allow it: "
            f"opforge.ort_session(model, allow_aten={{'{name}'}}), or "
            f"sess_options.add_session_config_entry('{ALLOW_CONFIG_KEY}', '{name}') before registering "
            "libopforge_aten")


def check(ops: Iterable[str], allow=None) -> None:
    """Raises :class:`AtenOpRefused` for the first of ``ops`` (``"aten::x.overload"``) not allowed."""
    allow = parse_allow(allow)
    for op in ops:
        text = refusal(op.split("::")[-1].split(".")[0], allow)
        if text is not None:
            raise AtenOpRefused("opforge: " + text)


class MalformedAtenNode(ValueError):
    """An ``org.pytorch.aten::ATen`` node without the ``operator`` attribute that names its op."""


def model_nodes(model):
    """Every node of an ``onnx.ModelProto``: its graph's and its model-local functions', with the
    bodies of If / Loop / Scan nodes."""
    def walk(nodes):
        for node in nodes:
            yield node
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from walk(sub.node)

    for nodes in [model.graph.node] + [f.node for f in model.functions]:
        yield from walk(nodes)


def model_operators(model) -> list[str]:
    """The ``operator`` of every ``org.pytorch.aten::ATen`` node of an ``onnx.ModelProto``, wherever
    :func:`model_nodes` finds it (a refused op hidden in a function is still refused). Raises
    :class:`MalformedAtenNode` for a node that names none, with the library's words."""
    operators = []
    for node in model_nodes(model):
        if node.domain != ATEN_DOMAIN or node.op_type != "ATen":
            continue
        names = [a.s.decode() for a in node.attribute if a.name == "operator"]
        if not names or not names[0] or names[0] == "aten::":
            raise MalformedAtenNode(f"org.pytorch.aten::ATen node '{node.name}': it has no string attribute "
                                    "'operator' (the ATen operator to run, e.g. \"cummax\")")
        operators.append(names[0])
    return operators


def check_model(model, allow=None) -> None:
    """:func:`check` over :func:`model_operators`: raises :class:`AtenOpRefused` (or
    :class:`MalformedAtenNode`) before anything of the model runs."""
    check(model_operators(model), allow)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opforge.aten.policy",
                                     description="Regenerate or check libopforge_aten's allowed-op list.")
    parser.add_argument("--write", action="store_true", help=f"rewrite {POLICY_FILE.name} (then rebuild)")
    args = parser.parse_args(argv)
    allowed, refused = generate()
    text = render(allowed, refused)
    if args.write:
        POLICY_FILE.write_text(text)
        print(f"wrote {POLICY_FILE}: {len(allowed)} allowed, {len(refused)} refused with a reason")
        return 0
    same = POLICY_FILE.exists() and POLICY_FILE.read_text() == text
    print(f"{len(allowed)} allowed, {len(refused)} refused with a reason; {POLICY_FILE.name} is "
          + ("up to date" if same else "out of date: run with --write and review the diff"))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
