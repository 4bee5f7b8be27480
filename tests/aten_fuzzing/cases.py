"""The cases: each overload's baseline, intmin, hostile-argument and None variants and its
findings, then the model cases, numbered (``all_cases``: an index is stable for a given torch and
allow-list); the quick tier's sample; the argument values of a case (``case_values``)."""

from __future__ import annotations

import collections
import dataclasses
import functools

import torch

from .baselines import baseline
from .findings import EXTRAS, MODEL_CASES
from .hostile import HOSTILE, INF, INT64_MAX, INT64_MIN, NAN
from .plausible_values import gen, stable_hash, tensor_of
from .schemas import Schema, is_optional, schemas


@dataclasses.dataclass
class Case:
    index: int
    schema: Schema | None
    variant: tuple  # ("baseline",) ("intmin",) ("arg", i, h) ("none", i) ("extra", k) ("model", k)
    desc: str
    paths: str = "ab"


def variants(s: Schema) -> list:
    out = [("baseline",)]
    if not s.allowed:  # refused: its findings only
        return out + [("extra", k) for k, extra in enumerate(EXTRAS) if extra.target == s.qualname]
    if any(k in ("tensor", "number", "int") for k in s.kinds):
        out.append(("intmin",))
    for i, (arg, kind) in enumerate(zip(s.args, s.kinds)):
        if kind is None:
            continue
        for h in range(len(HOSTILE[kind])):
            out.append(("arg", i, h))
        if is_optional(arg):
            out.append(("none", i))
    for k, extra in enumerate(EXTRAS):
        if extra.target == s.qualname:
            out.append(("extra", k))
    return out


def variant_desc(s: Schema, v) -> str:
    if v[0] == "baseline":
        return "baseline"
    if v[0] == "intmin":
        return "intmin: int64 tensors, the first INT64_MIN, the others -1 (Scalars -1)"
    if v[0] == "arg":
        arg = s.args[v[1]]
        h = HOSTILE[s.kinds[v[1]]][v[2]]
        return f"arg {v[1]} '{arg.name}' ({arg.real_type}) = {h!r}"
    if v[0] == "none":
        return f"arg {v[1]} '{s.args[v[1]].name}' = None"
    return f"finding: {EXTRAS[v[1]].desc}"


@functools.lru_cache(maxsize=None)
def all_cases() -> list:
    cases = []
    for s in schemas()[0]:
        for v in variants(s):
            paths = "ab"
            cases.append(Case(len(cases), s, v, f"{s.qualname} {variant_desc(s, v)}", paths))
    for k, m in enumerate(MODEL_CASES):
        cases.append(Case(len(cases), None, ("model", k), f"model: {m.desc}", "ab"))
    return cases


def sample_indices(seed=0, per_schema=2) -> list:
    """The quick tier's subset: every schema's baseline and intmin case, ``per_schema`` hostile
    variants chosen by a hash of (seed, schema), every finding and model case."""
    chosen, by_schema = [], collections.defaultdict(list)
    for c in all_cases():
        by_schema[c.schema.qualname if c.schema else "model"].append(c)
    for key, cs in by_schema.items():
        for c in cs:
            if c.variant[0] in ("baseline", "intmin", "extra", "model"):
                chosen.append(c.index)
        hostile = [c for c in cs if c.variant[0] in ("arg", "none")]
        if hostile:
            picks = {stable_hash(seed, key, j) % len(hostile) for j in range(per_schema)}
            chosen += [hostile[p].index for p in picks]
    return sorted(chosen)


def hostile_tensor(base: torch.Tensor | None, how: str, others: list, g) -> torch.Tensor:
    if base is None:
        base = others[0] if others else torch.ones(2, 3)
    dt = base.dtype
    shape = tuple(base.shape)
    if how == "empty":
        return torch.zeros((0,) + shape[1:] if shape else (0,), dtype=dt)
    if how == "0d":
        return base.reshape(-1)[:1].reshape(()).clone() if base.numel() else torch.zeros((), dtype=dt)
    if how == "mismatch":
        return tensor_of(shape[:-1] + (shape[-1] + 1,) if shape else (7,), dt, g)
    if how in ("nan", "inf"):
        if not dt.is_floating_point:
            dt = torch.float32
        return torch.full(shape, NAN if how == "nan" else INF, dtype=dt)
    numel_others = max([o.numel() for o in others if isinstance(o, torch.Tensor)] + [base.numel(), 1])
    value = {"2**33": 2**33, "-2**40": -(2**40), "INT64_MIN": INT64_MIN, "INT64_MAX": INT64_MAX, "-1": -1,
             "past_end": numel_others + 2}[how]
    if dt == torch.bool:
        dt = torch.int64
    if dt.is_floating_point:
        return torch.full(shape, float(value), dtype=dt)
    if dt != torch.int64:
        dt = torch.int64
    t = base.to(dt).clone() if base.numel() else torch.zeros(shape, dtype=dt)
    t.view(-1)[:: max(1, t.numel() // 2)] = value  # some entries hostile, the rest valid
    return t


def case_values(c: Case, seed) -> tuple[list, bool]:
    """(argument values, whether torch's baseline result applies)."""
    s = c.schema
    b = baseline(s, seed)
    values = [v.clone() if isinstance(v, torch.Tensor) else (list(v) if isinstance(v, list) else v) for v in b.values]
    v = c.variant
    g = gen(seed, c.index)
    tensors = [x for x in values if isinstance(x, torch.Tensor)]
    if v[0] == "baseline":
        return values, b.result is not None
    if v[0] == "intmin":
        first = True
        for i, (x, kind) in enumerate(zip(values, s.kinds)):
            if kind == "tensor" and isinstance(x, torch.Tensor):
                values[i] = torch.full(tuple(x.shape), INT64_MIN if first else -1, dtype=torch.int64)
                first = False
            elif kind == "number":
                values[i] = -1
        if not tensors:  # scalar ops: the first int INT64_MIN, the others -1
            ints = [i for i, k in enumerate(s.kinds) if k in ("int", "number")]
            for j, i in enumerate(ints):
                values[i] = INT64_MIN if j == 0 else -1
        return values, False
    if v[0] == "none":
        values[v[1]] = None
        return values, False
    if v[0] == "extra":
        extra = EXTRAS[v[1]]
        names = [a.name for a in s.args]
        for name, x in extra.args().items():
            values[names.index(name)] = x
        return values, False
    i, h = v[1], v[2]
    kind = s.kinds[i]
    hostile = HOSTILE[kind][h]
    if kind == "tensor":
        values[i] = hostile_tensor(values[i], hostile, [t for t in tensors if t is not values[i]], g)
    elif kind == "bool":
        values[i] = not bool(values[i]) if values[i] is not None else True
    else:
        values[i] = hostile
    return values, False
