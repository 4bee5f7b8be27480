"""Plausible values: argument guesses by name, the candidate calls a baseline search tries
(small tensors of each profile's shape, then variants, then int64 and bool data), and calling an
overload in torch (``torch_call``; on meta tensors, ``meta_values``)."""

from __future__ import annotations

import hashlib

import torch

from .hostile import DTYPES, LAYOUTS, MEMFMTS
from .schemas import Schema, is_optional


INT_GUESS = {
    "dim": 1, "dim0": 0, "dim1": 0, "dim2": 1, "reduction": 1, "groups": 1, "window_length": 4, "n": 2, "step": 1,
    "offset": 0, "ignore_index": -100, "steps": 4, "edge_order": 1, "quant_min": 0, "quant_max": 255,
    "interpolation_mode": 0, "padding_mode": 0, "sections": 2, "start": 0, "size": 2, "index": 0, "diagonal": 0,
    "padding_idx": -1, "mode": 0, "axis": 0, "bins": 4, "n_fft": 4, "k": 1, "length": 4, "blank": 0,
    "num_weights": 4, "zero_point": 0, "end": 2, "source": 0, "destination": 1, "p": 1, "N": 2, "C": 3, "HxW": 20,
    "group": 1, "decimals": 0, "split_size": 1, "row": 3, "col": 3, "dimension": 0, "count": 2, "minlength": 0,
    "numel": 4, "n_bins": 200, "bit_width": 8, "chunks": 2, "correction": 1, "m": 3, "start_dim": 0, "end_dim": -1,
    "num_groups": 1, "num_classes": -1, "upscale_factor": 1, "downscale_factor": 1, "repeats": 2, "idx": 0,
    "max": 3, "a": 3, "b": 2, "i": 0, "fill_value": 1, "pow": 2, "ind": 0, "el": 1, "pad": 1, "context_id": 0,
    "hop_length": 1, "win_length": 4, "output_size": 6, "divisor_override": 1, "compute_mode": 0, "min": 0,
    "axis0": 0, "axis1": 1,
}
FLOAT_GUESS = {"eps": 1e-5, "momentum": 0.1, "p": 2.0, "margin": 1.0, "beta": 1.0, "base": 10.0, "scale": 1.0,
               "rtol": 1e-5, "atol": 1e-8, "alpha": 1.0, "delta": 1.0, "q": 0.5, "ratio": 0.16, "label_smoothing": 0.0,
               "max_norm": 1.0, "norm_type": 2.0, "padding_value": 0.0, "dx": 1.0, "rcond": 1e-15, "d": 1.0,
               "tol": 1e-5, "a": 1.5, "b": 0.5, "x": 0.5, "el": 0.5}
NUMBER_GUESS = {"alpha": 1, "beta": 1, "value": 0.5, "end": 4, "start": 0, "step": 1, "p": 2, "threshold": 0.5,
                "fill_value": 0.5, "min": -0.5, "max": 0.5, "exponent": 2, "n": 2, "lambd": 0.5, "ord": 2, "a": 3,
                "b": 2, "self": 3, "other": 2, "x": 0.5, "scale": 1.0, "input_scale": 1.0, "min_val": -1.0,
                "max_val": 1.0, "negative_slope": 0.01, "margin": 1.0, "size": 2, "spacing": 1.0, "weight": 0.5,
                "maxnorm": 1.0, "scalar": 2, "scalar1": 2, "scalar2": 3, "lower": 0.1, "upper": 0.3, "s": 2,
                "dx": 1.0, "element": 1, "test_element": 1}
STR_GUESS = {"reduce": "sum", "interpolation": "linear", "padding": "valid", "approximate": "none", "UPLO": "L",
             "ord": "fro", "mode": "reduced", "equation": "ij->ji", "substr": "b", "p": "fro", "indexing": "ij",
             "padding_side": "right", "string": "abc", "pad_mode": "reflect", "norm": "backward",
             "rounding_mode": "trunc", "side": "left", "separator": ",", "a": "abc", "b": "b", "self": "abc",
             "el": "a"}
BOOL_GUESS = {"unbiased": True, "output_mask": None, "check_errors": True, "center": False, "periodic": True,
              "sorted": True, "some": True, "compute_uv": True, "largest": True, "full_matrices": True,
              "include_self": True, "pivot": True, "left": True}
INDEX_NAMES = {"index", "indices", "offsets", "lengths", "repeats", "counts", "input_lengths", "target_lengths",
               "pivots", "LU_pivots", "tensor_indices_or_sections"}
PROFILES = [(2, 3, 4, 5), (3, 4), (4,), (2, 3, 4), (3, 3), (2, 3, 3), (), (1, 2, 4, 4, 4), (1, 2, 6, 6)]
MAX_TRIALS = 100


def stable_hash(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def gen(seed, *key) -> torch.Generator:
    return torch.Generator().manual_seed(stable_hash(seed, *key) % 2**63)


def tensor_of(shape, dtype, g, fill="randn", hi=2):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, max(hi, 1), shape, generator=g, dtype=torch.int64).to(dtype)
    if fill == "positive":
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 + 1.0).to(dtype)
    if fill == "unit":
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 1.8 - 0.9).to(dtype)
    if fill == "sorted":
        return torch.sort(torch.randn(shape, generator=g, dtype=torch.float64), dim=-1).values.to(dtype)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def default_of(arg):
    """(True, value) for an argument with a default we can encode, else (False, None)."""
    if not arg.has_default_value():
        return (is_optional(arg), None)
    v = arg.default_value
    if isinstance(v, torch.dtype):
        return (v in DTYPES, DTYPES.index(v) if v in DTYPES else None)
    if isinstance(v, torch.layout):
        return (v in LAYOUTS, LAYOUTS.get(v))
    if isinstance(v, torch.memory_format):
        return (v in MEMFMTS, MEMFMTS.get(v))
    if v is None or isinstance(v, (bool, int, float, str)):
        return (True, v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float)) for x in v):
        return (True, list(v))
    return (False, None)


def candidate_calls(s: Schema, seed):
    """Candidate baseline calls (lists of argument values; tensors are torch tensors), likeliest
    first: float32 tensors of each profile's shape, then the variants, then int64 and bool data."""
    has_sized = any(k in ("tensor", "int", "ints") for k in s.kinds) or any(is_optional(a) for a in s.args)
    order = [(shape, torch.float32, 0) for shape in PROFILES]
    if has_sized:
        order += [(shape, torch.float32, v) for v in (1, 2, 3) for shape in PROFILES]
        order += [(shape, dt, v) for dt in (torch.int64, torch.bool) for v in (0, 1, 3) for shape in PROFILES[:6]]
    for shape, dt, variant in order:
        values = plausible(s, shape, dt, variant, seed)
        if not torch_crashes(s, values):
            yield values


def torch_crashes(s: Schema, values) -> bool:
    """Calls libtorch itself crashes on (the baseline search must not make them)."""
    named = {a.name: v for a, v in zip(s.args, values)}
    if s.name in ("native_batch_norm", "_native_batch_norm_legit_no_training", "batch_norm", "instance_norm",
                  "cudnn_batch_norm", "miopen_batch_norm"):
        return not named.get("training", named.get("use_input_stats", True)) and (
            named.get("running_mean") is None or named.get("running_var") is None)
    return False


def plausible(s: Schema, shape, dt, variant, seed):
    rank = len(shape)
    spatial = max(1, rank - 2)
    first_tensor = True
    values = []
    for i, (arg, kind) in enumerate(zip(s.args, s.kinds)):
        name = arg.name
        g = gen(seed, s.qualname, i, shape, str(dt), variant)
        has_default, default = default_of(arg)
        n_fixed = getattr(arg, "N", None)
        if kind is None or kind == "device":
            values.append(None)
            continue
        if kind == "tensor":
            if is_optional(arg) and variant != 3:
                values.append(None)
                continue
            if name in INDEX_NAMES or (name == "target" and variant == 2):
                if name == "target":
                    tshape = shape[:1] if rank else ()
                    hi = shape[1] if rank > 1 else 2
                elif name in ("repeats", "counts", "lengths", "input_lengths", "target_lengths"):
                    tshape = (shape[1] if rank > 1 else (shape[0] if rank else 1),) if variant != 1 else ()
                    hi = 3
                elif variant == 2:
                    tshape, hi = (2,), 2
                else:
                    tshape, hi = shape, 2
                t = tensor_of(tshape, torch.int64, g, hi=hi)
                if name in ("repeats", "counts", "lengths", "input_lengths", "target_lengths"):
                    t = t + 1
                values.append(t)
            elif name in ("mask", "condition"):
                values.append(tensor_of(shape, torch.bool, g))
            elif name in ("sorted_sequence", "boundaries"):
                values.append(tensor_of(shape if variant != 2 else (4,), torch.float32 if dt != torch.int64 else dt,
                                        g, "sorted"))
            else:
                tshape = shape
                if not first_tensor and variant == 1:
                    tshape = ()
                t_dt = dt if (first_tensor or dt != torch.bool) else torch.float32
                fill = "positive" if name in ("self",) and s.name in ("mvlgamma", "polygamma", "digamma") else "randn"
                if s.name.startswith(("grid_sampler",)) and name == "grid":
                    fill = "unit"
                values.append(tensor_of(tshape, t_dt, g, fill, hi=2))
                first_tensor = False
            continue
        if (is_optional(arg) and variant == 3 and kind in ("number", "int", "float")
                and (not arg.has_default_value() or arg.default_value is None)):
            pass  # given: clamp(min=None, max=None) is an error
        elif name == "scale_factors" and any(a.name == "output_size" for a in s.args):
            values.append([2.0] * (n_fixed or spatial))  # upsample .vec: exactly one of the two
            continue
        elif name == "output_size" and is_optional(arg) and any(a.name == "scale_factors" for a in s.args):
            values.append(None)
            continue
        elif name == "rounding_mode":
            values.append("trunc")
            continue
        elif has_default and not (variant == 1 and kind in ("int",) and name in ("dim",)):
            values.append(default)
            continue
        if kind in ("int",):
            v = INT_GUESS.get(name, 1)
            if variant == 1 and name in ("dim", "dim0", "dim1", "dim2", "axis", "dimension"):
                v = 0 if name != "dim2" else 1
            if name in ("dim",) and rank == 0:
                v = 0
            values.append(v)
        elif kind == "ints":
            if name in ("padding", "output_padding"):
                v = [0] * (n_fixed or spatial)
            elif name in ("stride", "dilation"):
                v = [1] * (n_fixed or spatial)
            elif name in ("kernel_size",):
                v = [2] * (n_fixed or spatial)
            elif name == "output_size":
                v = [2] * (n_fixed or spatial)
            elif name in ("dim", "dims"):
                if name == "dims" and variant == 1:
                    v = list(range(rank))
                else:
                    v = [0] if variant == 1 or rank < 2 else [1]
            elif name in ("size", "sizes", "input_size", "input_sizes", "self_sizes", "self", "shape"):
                v = list(shape) if variant != 1 else [-1] if name in ("size", "shape") else list(shape)
            elif name == "normalized_shape":
                v = list(shape[-1:])
            elif name == "repeats":
                v = [1] * max(rank, 1)
            elif name in ("split_sizes",):
                v = [1, shape[0] - 1] if rank else [1]
            elif name in ("pad",):
                v = [1, 1]
            else:
                v = [1] if not n_fixed else [1] * n_fixed
            if n_fixed and len(v) != n_fixed:
                v = (v * n_fixed)[:n_fixed]
            values.append(v)
        elif kind == "float":
            values.append(FLOAT_GUESS.get(name, 0.5))
        elif kind == "floats":
            values.append([1.0] * (n_fixed or spatial) if name == "scale_factors" else [0.5, 1.5])
        elif kind == "number":
            v = NUMBER_GUESS.get(name, 2)
            values.append(v if variant != 2 or not isinstance(v, float) else 2)
        elif kind == "bool":
            values.append(BOOL_GUESS.get(name, False) or False)
        elif kind == "bools":
            values.append([True] * (n_fixed or 3))
        elif kind == "str":
            values.append(STR_GUESS.get(name, "abc"))
        elif kind == "dtype":
            values.append(6)
        elif kind in ("layout", "memfmt"):
            values.append(0)
        else:
            values.append(None)
    return values


def torch_call(s: Schema, values):
    positional, keywords = [], {}
    for arg, v in zip(s.args, values):
        if arg.kwarg_only:
            keywords[arg.name] = v
        else:
            positional.append(v)
    return s.op(*positional, **keywords)


def flatten_results(r) -> list:
    if isinstance(r, (tuple, list)):
        out = []
        for x in r:
            out.extend(x if isinstance(x, (list, tuple)) else [x])
        return out
    return [r]


def meta_values(s: Schema, values):
    out = []
    for arg, v in zip(s.args, values):
        if isinstance(v, torch.Tensor):
            out.append(torch.empty(v.shape, dtype=v.dtype, device="meta"))
        elif arg.name == "device":
            out.append(torch.device("meta"))
        else:
            out.append(v)
    return out
