"""An overload's baseline, the plausible call the other cases vary: the per-op calls the generic
search does not find (``OVERRIDES``), the search for the first candidate call torch runs
(``baseline``, cached), and ``TrialServer``, the forked child that runs the candidates (and the
meta calls of ``sessions.output_types``), so that a crash in libtorch costs a fork."""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import os
import pickle
import signal
import warnings

import torch

from .models import onnx_type_of
from .plausible_values import (MAX_TRIALS, candidate_calls, flatten_results, meta_values, plausible, tensor_of,
                               torch_call)
from .schemas import Schema, schemas


# Per-op baselines the generic search does not find (argument name -> value; the others are guessed).
def _t(*shape, dtype=torch.float32, fill="randn", seed=0, hi=2, values=None):
    if values is not None:
        return torch.tensor(values, dtype=dtype).reshape(shape) if shape else torch.tensor(values, dtype=dtype)
    return tensor_of(shape, dtype, torch.Generator().manual_seed(seed), fill, hi=hi)


def _log_probs():
    return torch.log_softmax(_t(5, 1, 4, dtype=torch.float32, seed=3), -1)


OVERRIDES = {
    "grid_sampler_2d": lambda: dict(input=_t(1, 2, 4, 4), grid=_t(1, 3, 3, 2, fill="unit"), interpolation_mode=0,
                                    padding_mode=0, align_corners=False),
    "grid_sampler": lambda: dict(input=_t(1, 2, 4, 4), grid=_t(1, 3, 3, 2, fill="unit"), interpolation_mode=0,
                                 padding_mode=0, align_corners=False),
    "grid_sampler_3d": lambda: dict(input=_t(1, 2, 4, 4, 4), grid=_t(1, 2, 2, 2, 3, fill="unit"),
                                    interpolation_mode=0, padding_mode=0, align_corners=False),
    "grid_sampler_2d_backward": lambda: dict(grad_output=_t(1, 2, 3, 3), input=_t(1, 2, 4, 4),
                                             grid=_t(1, 3, 3, 2, fill="unit"), interpolation_mode=0, padding_mode=0,
                                             align_corners=False, output_mask=[True, True]),
    "grid_sampler_3d_backward": lambda: dict(grad_output=_t(1, 2, 2, 2, 2), input=_t(1, 2, 4, 4, 4),
                                             grid=_t(1, 2, 2, 2, 3, fill="unit"), interpolation_mode=0,
                                             padding_mode=0, align_corners=False, output_mask=[True, True]),
    "max_pool2d_with_indices_backward": lambda: dict(
        grad_output=_t(1, 1, 2, 2), self=_t(1, 1, 4, 4), kernel_size=[2, 2], stride=[2, 2], padding=[0, 0],
        dilation=[1, 1], ceil_mode=False, indices=_t(1, 1, 2, 2, dtype=torch.int64, values=[0, 3, 9, 14])),
    "max_pool3d_with_indices_backward": lambda: dict(
        grad_output=_t(1, 1, 1, 2, 2), self=_t(1, 1, 2, 4, 4), kernel_size=[2, 2, 2], stride=[2, 2, 2],
        padding=[0, 0, 0], dilation=[1, 1, 1], ceil_mode=False,
        indices=_t(1, 1, 1, 2, 2, dtype=torch.int64, values=[0, 19, 9, 30])),
    "adaptive_max_pool2d_backward": lambda: dict(grad_output=_t(1, 1, 2, 2), self=_t(1, 1, 4, 4),
                                                 indices=_t(1, 1, 2, 2, dtype=torch.int64, values=[0, 3, 9, 14])),
    "adaptive_max_pool3d_backward": lambda: dict(grad_output=_t(1, 1, 1, 2, 2), self=_t(1, 1, 2, 4, 4),
                                                 indices=_t(1, 1, 1, 2, 2, dtype=torch.int64, values=[0, 19, 9, 30])),
    "max_pool2d_with_indices": lambda: dict(self=_t(1, 1, 4, 4), kernel_size=[2, 2], stride=[2, 2]),
    "embedding_dense_backward": lambda: dict(grad_output=_t(3, 4), indices=_t(3, dtype=torch.int64, values=[0, 2, 4]),
                                             num_weights=5, padding_idx=-1, scale_grad_by_freq=False),
    "embedding_backward": lambda: dict(grad=_t(3, 4), indices=_t(3, dtype=torch.int64, values=[0, 2, 4]),
                                       num_weights=5, padding_idx=-1, scale_grad_by_freq=False, sparse=False),
    "embedding": lambda: dict(weight=_t(5, 4), indices=_t(3, dtype=torch.int64, values=[0, 2, 4])),
    "embedding_bag": lambda: dict(weight=_t(5, 4), indices=_t(4, dtype=torch.int64, values=[0, 2, 4, 1]),
                                  offsets=_t(2, dtype=torch.int64, values=[0, 2])),
    "ctc_loss.IntList": lambda: dict(log_probs=_log_probs(), targets=_t(1, 2, dtype=torch.int64, values=[1, 2]),
                                     input_lengths=[5], target_lengths=[2]),
    "ctc_loss.Tensor": lambda: dict(log_probs=_log_probs(), targets=_t(1, 2, dtype=torch.int64, values=[1, 2]),
                                    input_lengths=_t(1, dtype=torch.int64, values=[5]),
                                    target_lengths=_t(1, dtype=torch.int64, values=[2])),
    "segment_reduce": lambda: dict(data=_t(6), reduce="sum", lengths=_t(2, dtype=torch.int64, values=[2, 4])),
    "unfold_backward": lambda: dict(grad_in=_t(4, 2), input_sizes=[5], dim=0, size=2, step=1),
    "select_backward": lambda: dict(grad_output=_t(3), input_sizes=[2, 3], dim=0, index=1),
    "index_select_backward": lambda: dict(grad=_t(2, 3), self_sizes=[4, 3], dim=0,
                                          index=_t(2, dtype=torch.int64, values=[0, 2])),
    "one_hot": lambda: dict(self=_t(3, dtype=torch.int64, values=[0, 2, 1]), num_classes=-1),
    "bincount": lambda: dict(self=_t(4, dtype=torch.int64, values=[0, 2, 1, 2])),
    "repeat_interleave.Tensor": lambda: dict(repeats=_t(3, dtype=torch.int64, values=[1, 2, 0])),
    "repeat_interleave.self_Tensor": lambda: dict(self=_t(3), repeats=_t(3, dtype=torch.int64, values=[1, 2, 0]),
                                                  dim=0),
    "eye": lambda: dict(n=3),
    "constant_pad_nd": lambda: dict(self=_t(2, 3), pad=[1, 1]),
    "upsample_nearest2d": lambda: dict(self=_t(1, 1, 2, 2), output_size=[4, 4]),
    "pdist": lambda: dict(self=_t(4, 3)),
    "vander": lambda: dict(x=_t(3), N=4),
    "mvlgamma": lambda: dict(self=_t(3, fill="positive"), p=1),
    "choose_qparams_optimized": lambda: dict(input=_t(8), numel=8, n_bins=200, ratio=0.16, bit_width=8),
    "matrix_power": lambda: dict(self=_t(3, 3), n=2),
    "zeros": lambda: dict(size=[2, 3]),
    "kron": lambda: dict(self=_t(2, 2), other=_t(2, 2, seed=1)),
    "mv": lambda: dict(self=_t(3, 4), vec=_t(4)),
    "addmv": lambda: dict(self=_t(3), mat=_t(3, 4), vec=_t(4)),
    "addr": lambda: dict(self=_t(3, 4), vec1=_t(3), vec2=_t(4)),
    "addbmm": lambda: dict(self=_t(3, 5), batch1=_t(2, 3, 4), batch2=_t(2, 4, 5)),
    "baddbmm": lambda: dict(self=_t(2, 3, 5), batch1=_t(2, 3, 4), batch2=_t(2, 4, 5)),
    "batch_norm": lambda: dict(input=_t(2, 3, 4), weight=None, bias=None, running_mean=_t(3),
                               running_var=_t(3, fill="positive"), training=False, momentum=0.1, eps=1e-5,
                               cudnn_enabled=False),
    "native_batch_norm": lambda: dict(input=_t(2, 3, 4), weight=None, bias=None, running_mean=_t(3),
                                      running_var=_t(3, fill="positive"), training=False, momentum=0.1, eps=1e-5),
    "instance_norm": lambda: dict(input=_t(2, 3, 4), weight=None, bias=None, running_mean=None, running_var=None,
                                  use_input_stats=True, momentum=0.1, eps=1e-5, cudnn_enabled=False),
    "binary_cross_entropy": lambda: dict(self=_t(3, 4, fill="positive") / 4, target=_t(3, 4, fill="positive") / 4),
    "conv_transpose1d": lambda: dict(input=_t(1, 2, 5), weight=_t(2, 3, 2)),
    "conv_transpose2d.input": lambda: dict(input=_t(1, 2, 5, 5), weight=_t(2, 3, 2, 2)),
    "conv_transpose3d.input": lambda: dict(input=_t(1, 2, 3, 3, 3), weight=_t(2, 3, 2, 2, 2)),
    "conv3d": lambda: dict(input=_t(1, 2, 4, 4, 4), weight=_t(3, 2, 2, 2, 2)),
    "conv_tbc": lambda: dict(self=_t(5, 2, 3), weight=_t(2, 3, 4), bias=_t(4), pad=0),
    "diagonal_scatter": lambda: dict(self=_t(3, 3), src=_t(3)),
    "linalg_cholesky": lambda: dict(self=_t(3, 3) @ _t(3, 3).T + 3 * torch.eye(3)),
    "fractional_max_pool2d": lambda: dict(self=_t(1, 1, 6, 6), kernel_size=[2, 2], output_size=[3, 3],
                                          random_samples=_t(1, 1, 2, fill="unit").abs()),
    "index_add": lambda: dict(self=_t(3, 4), dim=0, index=_t(2, dtype=torch.int64, values=[0, 2]), source=_t(2, 4)),
    "index_copy": lambda: dict(self=_t(3, 4), dim=0, index=_t(2, dtype=torch.int64, values=[0, 2]), source=_t(2, 4)),
    "index_reduce": lambda: dict(self=_t(3, 4), dim=0, index=_t(2, dtype=torch.int64, values=[0, 2]), source=_t(2, 4),
                                 reduce="amax"),
    "scatter.reduce": lambda: dict(self=_t(3, 4), dim=0, index=_t(2, 4, dtype=torch.int64, hi=3), src=_t(2, 4),
                                   reduce="add"),
    "scatter.value_reduce": lambda: dict(self=_t(3, 4), dim=0, index=_t(2, 4, dtype=torch.int64, hi=3), value=2,
                                         reduce="add"),
    "stft": lambda: dict(self=_t(16), n_fft=4, return_complex=False),
    "narrow.Tensor": lambda: dict(self=_t(3, 4), dim=1, start=_t(dtype=torch.int64, values=1), length=2),
    "upsample_nearest3d": lambda: dict(self=_t(1, 1, 2, 2, 2), output_size=[4, 4, 4]),
    "upsample_trilinear3d": lambda: dict(self=_t(1, 1, 2, 2, 2), output_size=[4, 4, 4], align_corners=False),
    "view_as_complex": lambda: dict(self=_t(3, 2)),
    "view_as_complex_copy": lambda: dict(self=_t(3, 2)),
    "linspace.Tensor_Tensor": lambda: dict(start=_t(values=0.0), end=_t(values=1.0), steps=4),
    "linspace.Tensor_Scalar": lambda: dict(start=_t(values=0.0), end=1.0, steps=4),
    "linspace.Scalar_Tensor": lambda: dict(start=0.0, end=_t(values=1.0), steps=4),
    "logspace.Tensor_Tensor": lambda: dict(start=_t(values=0.0), end=_t(values=1.0), steps=4),
    "logspace.Tensor_Scalar": lambda: dict(start=_t(values=0.0), end=1.0, steps=4),
    "logspace.Scalar_Tensor": lambda: dict(start=0.0, end=_t(values=1.0), steps=4),
    "layer_norm": lambda: dict(input=_t(2, 3, 4), normalized_shape=[4]),
    "native_layer_norm": lambda: dict(input=_t(2, 3, 4), normalized_shape=[4], weight=None, bias=None, eps=1e-5),
    "group_norm": lambda: dict(input=_t(2, 4, 3), num_groups=2),
    "native_group_norm": lambda: dict(input=_t(2, 4, 3), weight=None, bias=None, N=2, C=4, HxW=3, group=2, eps=1e-5),
    "nll_loss": lambda: dict(self=torch.log_softmax(_t(3, 4), -1), target=_t(3, dtype=torch.int64, values=[0, 3, 1])),
    "nll_loss_nd": lambda: dict(self=torch.log_softmax(_t(3, 4), -1),
                                target=_t(3, dtype=torch.int64, values=[0, 3, 1])),
    "nll_loss2d": lambda: dict(self=torch.log_softmax(_t(1, 3, 2, 2), 1),
                               target=_t(1, 2, 2, dtype=torch.int64, values=[0, 2, 1, 1])),
    "cross_entropy_loss": lambda: dict(self=_t(3, 4), target=_t(3, dtype=torch.int64, values=[0, 3, 1])),
    "multi_margin_loss": lambda: dict(self=_t(3, 4), target=_t(3, dtype=torch.int64, values=[0, 3, 1])),
    "multilabel_margin_loss": lambda: dict(self=_t(3, 4), target=_t(3, 4, dtype=torch.int64,
                                                                     values=[0, 3, -1, 1, 2, -1, 0, 0, 3, 1, -1, 0])),
    "take": lambda: dict(self=_t(3, 4), index=_t(3, dtype=torch.int64, values=[0, 11, 5])),
    "index_select": lambda: dict(self=_t(3, 4), dim=1, index=_t(2, dtype=torch.int64, values=[0, 3])),
    "searchsorted.Tensor": lambda: dict(sorted_sequence=_t(5, fill="sorted"), self=_t(3)),
    "bucketize.Tensor": lambda: dict(self=_t(3), boundaries=_t(5, fill="sorted")),
    "im2col": lambda: dict(self=_t(1, 2, 4, 4), kernel_size=[2, 2], dilation=[1, 1], padding=[0, 0], stride=[1, 1]),
    "col2im": lambda: dict(self=_t(1, 8, 9), output_size=[4, 4], kernel_size=[2, 2], dilation=[1, 1], padding=[0, 0],
                           stride=[1, 1]),
    "linalg_solve": lambda: dict(A=_t(3, 3) + 3 * torch.eye(3), B=_t(3, 2)),
    "lstm_cell": lambda: dict(input=_t(2, 3), hx=None, w_ih=_t(8, 3), w_hh=_t(8, 2)),
    "gru_cell": lambda: dict(input=_t(2, 3), hx=_t(2, 2), w_ih=_t(6, 3), w_hh=_t(6, 2)),
    "rnn_tanh_cell": lambda: dict(input=_t(2, 3), hx=_t(2, 2), w_ih=_t(2, 3), w_hh=_t(2, 2)),
    "rnn_relu_cell": lambda: dict(input=_t(2, 3), hx=_t(2, 2), w_ih=_t(2, 3), w_hh=_t(2, 2)),
}


@dataclasses.dataclass
class Baseline:
    values: list
    result: object  # torch's flattened results, or None (torch refused the call: error text)
    error: str | None
    trials: int
    torch_crashed: list = dataclasses.field(default_factory=list)  # candidates libtorch crashed on


_BASELINES: dict = {}


def baseline_candidates(s: Schema, seed) -> list:
    over = OVERRIDES.get(f"{s.name}.{s.overload}") or (OVERRIDES.get(s.name) if not s.overload or
                                                      f"{s.name}.{s.overload}" not in OVERRIDES else None)
    cands = candidate_calls(s, seed)
    if over is not None:
        given = over()
        names = [a.name for a in s.args]
        if set(given) <= set(names):
            base = plausible(s, (2, 3, 4, 5), torch.float32, 0, seed)
            base = [given.get(n, v) for n, v in zip(names, base)]
            cands = _chain([base], cands)
    return [c for _, c in zip(range(MAX_TRIALS), cands)]


def baseline(s: Schema, seed=0) -> Baseline:
    """The first candidate call torch runs (cached). The candidates are tried in a forked child
    (TrialServer): libtorch itself crashes on some plausible calls (native_batch_norm(training=False)
    without running stats, batch_norm_backward...), which must not kill the fuzzer; a crashing
    candidate is skipped and remembered (``Baseline.torch_crashed``)."""
    key = (s.qualname, seed)
    if key in _BASELINES:
        return _BASELINES[key]
    cands = baseline_candidates(s, seed)
    index, first_error, crashed = TRIALS.search(s, seed, len(cands))
    found = None
    if index is not None:
        try:  # the call the child ran: the same again here, for its result
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = torch_call(s, [v.clone() if isinstance(v, torch.Tensor) else v for v in cands[index]])
            found = Baseline(cands[index], flatten_results(r), None, index + 1, crashed)
        except Exception as e:  # noqa: BLE001 - not deterministic after all
            first_error = first_error or (index, f"{type(e).__name__}: {str(e)[:200]}")
    if found is None:
        values = cands[first_error[0]] if first_error else plausible(s, (2, 3, 4, 5), torch.float32, 0, seed)
        found = Baseline(values, None, first_error[1] if first_error else "no candidate", len(cands), crashed)
    _BASELINES[key] = found
    return found


class TrialServer:
    """A forked child that tries baseline candidates in torch (a crash there costs a fork, not the
    fuzzer). Requests: "<qualname> <seed> <first>"; answers: "T k" (trying), "E k <error>", "OK k", "END"."""

    def __init__(self):
        self.pid = None

    def _start(self):
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # never returns: the child must not go on running the parent's code
            try:
                os.close(req_w)
                os.close(ans_r)
                self._serve(os.fdopen(req_r, "r"), ans_w)
            finally:
                os._exit(0)
        os.close(req_r)
        os.close(ans_w)
        self.pid, self.req, self.ans = pid, os.fdopen(req_w, "w"), os.fdopen(ans_r, "r")

    @staticmethod
    def _serve(requests, out):
        by_name = {x.qualname: x for x in schemas()[0]}
        warnings.simplefilter("ignore")
        for line in requests:
            if line.startswith("META "):  # output types of a call on meta tensors (or NONE)
                qualname, spec = pickle.loads(base64.b64decode(line[5:]))
                s = by_name[qualname]
                values = [torch.empty(v[1], dtype=getattr(torch, v[2]), device="meta")
                          if isinstance(v, tuple) and v and v[0] == "meta-tensor" else v for v in spec]
                signal.alarm(20)
                try:
                    r = flatten_results(torch_call(s, meta_values(s, values)))
                    answer = "TYPES " + ",".join(str(onnx_type_of(x)) for x in r) if r else "NONE"
                except Exception:  # noqa: BLE001 - meta cannot say
                    answer = "NONE"
                signal.alarm(0)
                os.write(out, (answer + "\n").encode())
                continue
            qualname, seed, first = line.split()
            s = by_name[qualname]
            cands = baseline_candidates(s, int(seed))
            signal.alarm(20)  # a hang here dies, and the fuzzer goes on
            for k in range(int(first), len(cands)):
                os.write(out, f"T {k}\n".encode())
                try:
                    torch_call(s, [v.clone() if isinstance(v, torch.Tensor) else v for v in cands[k]])
                    os.write(out, f"OK {k}\n".encode())
                    break
                except Exception as e:  # noqa: BLE001 - the next one
                    msg = " ".join(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}".split())
                    os.write(out, f"E {k} {msg}\n".encode())
            signal.alarm(0)
            os.write(out, b"END\n")

    def search(self, s: Schema, seed, n) -> tuple:
        """(index of the first candidate torch runs or None, (index, first error) or None, [indices
        of candidates on which libtorch crashed])."""
        first, first_error, crashed = 0, None, []
        while first < n:
            if self.pid is None:
                self._start()
            self.req.write(f"{s.qualname} {seed} {first}\n")
            self.req.flush()
            tried, ok = None, None
            while True:
                line = self.ans.readline()
                if not line:  # the child died on candidate `tried`
                    os.waitpid(self.pid, 0)
                    self.req.close()
                    self.ans.close()
                    self.pid = None
                    if ok is not None:
                        return ok, first_error, crashed
                    crashed.append(tried if tried is not None else first)
                    first = crashed[-1] + 1
                    break
                kind, *rest = line.rstrip("\n").split(" ", 2)
                if kind == "END":
                    return ok, first_error, crashed
                k = int(rest[0])
                if kind == "OK":
                    ok = k
                if kind == "E" and first_error is None:
                    first_error = (k, rest[1].strip() if len(rest) > 1 else "")
                tried = k
        return None, first_error, crashed


    def meta_types(self, s: Schema, values):
        """ONNX types of the outputs of ``s`` called on meta tensors of the values' shapes and dtypes,
        or None (meta cannot say, or libtorch crashed on it: fractional_max_pool2d_backward with
        output_size=[] did)."""
        spec = [("meta-tensor", tuple(v.shape), str(v.dtype)[6:]) if isinstance(v, torch.Tensor) else v
                for v in values]
        if self.pid is None:
            self._start()
        self.req.write("META " + base64.b64encode(pickle.dumps((s.qualname, spec))).decode() + "\n")
        self.req.flush()
        line = self.ans.readline()
        if not line:  # died
            os.waitpid(self.pid, 0)
            self.req.close()
            self.ans.close()
            self.pid = None
            return None
        line = line.strip()
        return [int(t) for t in line[6:].split(",")] if line.startswith("TYPES ") else None

    def close(self):
        if self.pid is not None:
            self.req.close()
            self.ans.close()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None


TRIALS = TrialServer()
atexit.register(TRIALS.close)


def _chain(*its):
    for it in its:
        yield from it
