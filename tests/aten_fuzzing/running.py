"""Running one case: its model through each path (``run_case``; the model cases,
``run_model_case``), judged by the rules: a clean error, or results equal between the two runs,
the inputs unchanged and a baseline result equal to torch's."""

from __future__ import annotations

import numpy as np
import torch

from .baselines import baseline
from .cases import Case, case_values
from .findings import MODEL_CASES
from .models import build_model
from .schemas import Schema
from .sessions import (NO_TORCH_COMPARISON, OUTPUT_REFUSALS, CaseFailure, Runtime, _short, diff_detail,
                       equal_to_torch, judge_error, output_types, outputs_equal)


def _fail(path: str, kind: str, detail: str) -> CaseFailure:
    f = CaseFailure(kind, detail)
    f.path = path
    return f


def _try_path(rt: Runtime, path: str, model, feeds, op: str, python_refused: bool):
    """One path's session and two runs: (outputs of both runs, None), or (None, (error, outcome))
    when it ended in an error judge_error accepts. A CaseFailure leaves tagged with the path."""
    try:
        try:
            return rt.run_twice(rt.session(path, model), feeds), None
        except CaseFailure:
            raise
        except Exception as e:  # noqa: BLE001 - judged
            return None, (e, judge_error(e, op, path, python_refused=python_refused))
    except CaseFailure as f:
        f.path = path
        raise


def run_case(c: Case, rt: Runtime, seed, verbose=False) -> str:
    if c.variant[0] == "model":
        return run_model_case(c, rt, verbose)
    s = c.schema
    values, compare_torch = case_values(c, seed)
    b = baseline(s, seed)
    if c.variant[0] == "none" and b.values[c.variant[1]] is None:
        return "same-as-baseline"
    if verbose:
        print("  values: " + describe_values(s, values), flush=True)
        print(f"  baseline in torch: {'ok' if b.result is not None else b.error} ({b.trials} trials"
              + (f"; libtorch itself crashed on candidates {b.torch_crashed}" if b.torch_crashed else "") + ")",
              flush=True)
    types = output_types(s, values, b)
    outcomes = []
    compare_torch = compare_torch and s.name not in NO_TORCH_COMPARISON
    for path in c.paths:
        print(f"PATH {path}", flush=True)
        model, feeds = build_model(s, values, types, typed=(path == "b"))
        outs, error = _try_path(rt, path, model, feeds, s.name, python_refused=not s.allowed)
        if error is not None:
            e, outcome = error
            if verbose:
                print(f"  [{path}] error: {_short(str(e), 500)}", flush=True)
            outcomes.append(outcome)
            if compare_torch and outcome == "rejected" and not any(t in str(e) for t in OUTPUT_REFUSALS):
                raise _fail(path, "torch-succeeds", f"ORT failed where torch succeeds: {_short(str(e))}")
            continue
        if not s.allowed:
            raise _fail(path, "not-refused", "an op outside the allow-list ran")
        if not outputs_equal(outs[0], outs[1]):
            raise _fail(path, "uninitialised", diff_detail(outs[0], outs[1]))
        if compare_torch:
            why = equal_to_torch(outs[0], b.result)
            if why:
                raise _fail(path, "differs-from-torch", why)
        if verbose:
            print(f"  [{path}] result: " + ", ".join(f"{np.asarray(o).dtype}{list(np.asarray(o).shape)}"
                                                    for o in outs[0]), flush=True)
        outcomes.append("ok")
    return "+".join(sorted(set(outcomes)))


def run_model_case(c: Case, rt: Runtime, verbose=False) -> str:
    m = MODEL_CASES[c.variant[1]]
    outcomes = []
    for path in c.paths:
        print(f"PATH {path}", flush=True)
        model, feeds = m.build()
        outs, error = _try_path(rt, path, model, feeds, m.op, python_refused=m.python_refuses)
        if error is not None:
            if verbose:
                print(f"  [{path}] error: {_short(str(error[0]), 500)}", flush=True)
            outcomes.append(error[1])
            continue
        if not outputs_equal(outs[0], outs[1]):
            raise _fail(path, "uninitialised", diff_detail(outs[0], outs[1]))
        if m.op != "max":
            raise _fail(path, "no-error", "the model ran")
        if not np.array_equal(outs[0][0], np.array([2, 2])):  # the indices of the row maxima: the only right answer
            raise _fail(path, "wrong-result", f"max.dim indices {outs[0][0].tolist()}, want [2, 2]")
        outcomes.append("ok")
    return "+".join(sorted(set(outcomes)))


def describe_values(s: Schema, values) -> str:
    parts = []
    for a, v in zip(s.args, values):
        if isinstance(v, torch.Tensor):
            flat = v.reshape(-1)[:4].tolist()
            parts.append(f"{a.name}={str(v.dtype)[6:]}{list(v.shape)}{flat}")
        else:
            parts.append(f"{a.name}={v!r}")
    return ", ".join(parts)
