"""Which ATen ops each torch exporter handles, per opset, with and without opforge: measured.

* dynamo (``dynamo=True``): the ops torchlib translates (its registry) and the ops opforge's
  samples show it translates through torch's decompositions.
* TorchScript without opforge: torch's own symbolic registry at each opset.
* TorchScript with opforge: torch's, plus opforge's curated rules, plus every bridged op whose
  sample really exports at that opset (``torch.onnx.export(..., dynamo=False)`` is run).

``opforge coverage`` prints it; ``tests/test_coverage.py`` fails if an op covered in the
committed snapshot (``aten/coverage.json``) stops being covered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import json
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch

from ..spec import TORCHSCRIPT_OPSETS

SNAPSHOT = Path(__file__).parent / "coverage.json"


@dataclasses.dataclass
class Coverage:
    opsets: list
    dynamo: set  # user-facing ATen ops the dynamo exporter handles
    torch_only: dict  # opset -> ops torch's TorchScript exporter handles (of those)
    with_opforge: dict  # opset -> ops it handles after `import opforge`
    refused: dict  # (op, opset) -> the reason the bridge gives
    not_covered: dict  # op -> why opforge does not cover it
    internal: dict  # op -> why it needs no rule

    def to_json(self) -> dict:
        return {str(o): sorted(self.with_opforge[o]) for o in self.opsets}

    def table(self) -> str:
        n = len(self.dynamo)
        lines = [f"User-facing ATen ops the dynamo exporter handles: {n}",
                 "", "| opset | TorchScript exporter | with opforge |", "|---:|---:|---:|"]
        for o in self.opsets:
            lines.append(f"| {o} | {len(self.torch_only[o] & self.dynamo)} / {n} | "
                         f"{len(self.with_opforge[o] & self.dynamo)} / {n} |")
        return "\n".join(lines)


def _torchlib_names() -> set:
    from ..exporter_cache import torchlib_registry

    names = set()
    for key in torchlib_registry().functions:
        schema = getattr(key, "_schema", None)
        name = schema.name if schema is not None else (key if isinstance(key, str) else "")
        if name.startswith("aten::"):
            names.add(name[len("aten::"):].split(".")[0])
    return names


def _exports(name: str, opset: int) -> Optional[str]:
    """None if the op's sample exports at ``opset`` with dynamo=False, else the reason."""
    from .samples import SAMPLES

    sample = SAMPLES[name]
    inputs = sample.inputs(torch.float32 if sample.float_only else torch.int64)
    try:
        with warnings.catch_warnings(), _native_stdout_silenced():
            warnings.simplefilter("ignore")
            sample.export(inputs, opset, io.BytesIO())  # as the round-trip tests do: dynamic batch
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        text = str(exc).split("[Caused by")[0].strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


@contextlib.contextmanager
def _native_stdout_silenced():
    # A failed TorchScript export prints its graph from C++ straight to fd 1; a refusal is a
    # measured result here, not something to dump into the report.
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


#: Ops dynamo cannot translate that opforge covers with a composition of its own (measured by
#: tests/test_coverage.py, which exports each with dynamo=True and expects a failure).
NOT_IN_DYNAMO = ("hypot", "copysign", "fmax", "fmin", "pdist", "fft_ihfft2", "fft_ihfftn")


def measure(opsets=TORCHSCRIPT_OPSETS, progress: Optional[Callable[[str], None]] = None) -> Coverage:
    # (opforge's rules are registered: importing this module imported opforge first)
    from . import bridge, rules, samples

    internal = dict(samples.INTERNAL)
    sampled = samples.SAMPLES
    dynamo = {n for n in _torchlib_names() if n not in internal and not n.startswith("_")}
    dynamo |= {n for n in sampled if n not in NOT_IN_DYNAMO}
    # Ops dynamo handles only through torch's decompositions are not torchlib names: the sampled
    # ones, and those opforge does not bridge (complex FFTs), count too.
    dynamo |= {n for n, why in samples.NOT_BRIDGED.items() if "dynamo cannot" not in why}
    dynamo -= {n for n, why in samples.NOT_BRIDGED.items() if "dynamo cannot" in why}
    ruled = {r.aten: r for r in rules.RULES}
    torch_only, with_opforge, refused = {}, {}, {}
    for opset in opsets:
        torch_only[opset] = {n for n in dynamo | set(sampled) if rules.has_torch_rule(n, opset)}
        # A sampled op that torch has a rule for is sampled because torch's rule refuses or
        # mis-exports that call (index_add, threshold != 0, ...): the export decides.
        covered = set(torch_only[opset]) - set(sampled)
        # A rule counts from the opset where it takes every dtype (bitwise_xor's is registered
        # from 9 for bool tensors, but integers need opset 18).
        covered |= {n for n, r in ruled.items() if opset in r.opsets and opset >= r.since}
        for name in sorted(set(sampled) - covered):
            if progress:
                progress(f"opset {opset}: {name}")
            why = _exports(name, opset)
            if why is None:
                covered.add(name)
            else:
                refused[(name, opset)] = why
                # The bridge runs only after torch's own rule refused the call (adaptive_avg_pool1d
                # to a size that does not divide the input at 9-10): torch alone cannot export it
                # either, so neither column counts the op there.
                if bridge.BRIDGE_REFUSED_TOO in why:
                    torch_only[opset].discard(name)
        # An alias dynamo lists (conj) is covered where every op the tracer records for it is
        # (conj: _conj, torch's rule, which sends complex calls to the bridge).
        covered |= {n for n, ops in samples.TRACED_AS.items() if n in dynamo and all(
            op in covered or rules.has_torch_rule(op, opset) for op in ops.split(", "))}
        with_opforge[opset] = covered
    not_covered = {}
    for name in sorted(dynamo):
        if all(name in with_opforge[o] for o in opsets if o >= 11):
            continue
        first = next((o for o in opsets if name in with_opforge[o]), None)
        if name in samples.NOT_BRIDGED:
            why = samples.NOT_BRIDGED[name]
        elif name in ruled and ruled[name].opsets[0] < ruled[name].since:
            rule = ruled[name]
            why = (f"integers from opset {rule.since} ({rule.onnx}); below, opforge exports bool tensors (from "
                   f"opset {rule.opsets[0]}) and refuses integers with a clear error: ONNX has no bitwise ops there")
        elif first is not None and name in torch_only[first]:
            why = (f"torch's own rule from opset {first} (opforge never shadows it; below that, "
                   "export at a higher opset or use the ATen fallback)")
        elif first is not None:
            why = f"from opset {first}: " + refused.get((name, first - 1), "ONNX cannot express it below")
        else:
            why = "no opforge sample yet: the bridge is not registered for it (opforge.aten.samples.SAMPLES)"
        not_covered[name] = why
    return Coverage(list(opsets), dynamo, torch_only, with_opforge, refused, not_covered, internal)


def parse_opsets(text: str) -> list:
    if "-" in text:
        lo, hi = (int(v) for v in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(v) for v in text.split(",")]


def run(args) -> int:
    from . import samples

    opsets = parse_opsets(args.opsets)
    bad = [o for o in opsets if o not in TORCHSCRIPT_OPSETS]
    if bad:
        print(f"opforge coverage: the TorchScript exporter has opsets {TORCHSCRIPT_OPSETS[0]}.."
              f"{TORCHSCRIPT_OPSETS[-1]}, not {bad}", file=sys.stderr)
        return 2

    def progress(msg):
        if not args.quiet:
            print(f"\r\033[Kmeasuring {msg}", end="", file=sys.stderr, flush=True)

    cov = measure(opsets, progress)
    if not args.quiet:
        print("\r\033[K", end="", file=sys.stderr)
    if args.write_snapshot:
        SNAPSHOT.write_text(json.dumps(cov.to_json(), indent=1, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps({"dynamo": sorted(cov.dynamo), "torchscript": {str(o): sorted(cov.torch_only[o] & cov.dynamo) for o in opsets},
                          "torchscript_with_opforge": cov.to_json(),
                          "refused": {f"{n}@{o}": why for (n, o), why in sorted(cov.refused.items())},
                          "not_covered": cov.not_covered, "internal": cov.internal,
                          "traced_as": samples.TRACED_AS, "neither_exporter": samples.NEITHER_EXPORTER},
                         indent=1))
        return 0
    print(cov.table())
    print("\nCovered with opforge at these opsets and not by torch (first opset each):")
    firsts = {}
    for o in opsets:
        for n in sorted((cov.with_opforge[o] - cov.torch_only[o]) & cov.dynamo):
            firsts.setdefault(n, o)
    print("  " + ", ".join(f"{n} ({o}+)" for n, o in sorted(firsts.items())))
    print("\nRefused below their first opset (the reason the export gives):")
    seen = set()
    for (n, o), why in sorted(cov.refused.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        if n not in seen:
            seen.add(n)
            print(f"  {n} @ opset {o}: {why}")
    print("\nNot covered with dynamo=False (dynamo handles them):")
    for n, why in sorted(cov.not_covered.items()):
        print(f"  {n}: {why}")
    print("\nInternal ops (need no rule: the tracer never records them):")
    for n, why in sorted(cov.internal.items()):
        print(f"  {n}: {why}")
    print("\nOps torch decomposes that the tracer records as another op (that op is the one counted):")
    print("  " + ", ".join(f"{n} -> {to}" for n, to in sorted(samples.TRACED_AS.items())))
    print("\nOps torch decomposes that the dynamo exporter cannot export either (not counted; the ATen "
          "fallback exports them):")
    for n, why in sorted(samples.NEITHER_EXPORTER.items()):
        print(f"  {n}: {why}")
    return 0
