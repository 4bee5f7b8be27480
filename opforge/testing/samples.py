"""What :func:`~opforge.testing.check_op` is given and compares with: samples, bad samples, the
check names and the default tolerances."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import torch

from ..spec import DTYPE_NAME_OF

CHECKS = ("opcheck", "gradcheck", "reference", "export_torchscript", "export_dynamo", "onnx_reference",
          "float_attrs", "bad_inputs")

#: Default dynamo-exporter opsets.
DYNAMO_OPSETS = (18, 20)
#: The opset of the dynamo export that ``onnx_reference`` evaluates.
ONNX_REFERENCE_OPSET = 18

#: gradcheck compares the full Jacobian up to this many input elements (summed over a
#: sample's floating tensors), a random projection of it (fast mode) above.
GRADCHECK_FULL_MAX_ELEMENTS = 2000

#: Default rtol (and atol) per dtype. 16-bit types: about one rounding of the output plus a
#: little for kernels that round intermediates (bfloat16 has 3 fewer mantissa bits than float16).
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}

#: ONNX float type string -> torch dtype (the float rows of spec.ELEMENT_TYPES).
_DTYPE_OF_ONNX_TYPE = {t: getattr(torch, n) for t, n in DTYPE_NAME_OF.items() if getattr(torch, n).is_floating_point}

Tolerance = Union[None, float, Mapping[torch.dtype, float]]


class Sample:
    """One valid call of the op: its torch-order arguments (tensors and attribute values).

    ``batch``: names of the tensor arguments whose dim 0 is one shared batch dim (they must agree
    in it), exported as dynamic: the export checks then also run ORT at twice the batch. Default:
    the first tensor argument and every other tensor argument of exactly its shape; ``()``
    exports static shapes only. Name only what really shares dim 0 (an NCHW input, not the K x 6
    rois beside it, even where K happens to equal N).

    How "twice the batch" is built (``opforge.testing.support._double_batch``): each ``batch``
    tensor ``t`` becomes ``torch.cat([t, copy], dim=0)``, its size in dim 0 doubled, other dims
    unchanged. ``copy`` is ``t.flip(0)``, and for a float tensor also multiplied elementwise by
    factors drawn uniformly from [0.5, 1] (fixed seed): new values, yet signs kept and magnitudes
    only shrunk, so a mask in [0, 1] or a positive scale stays valid. An integer or bool tensor is
    flipped only. Every other argument is passed unchanged. The exported model's outputs on these
    inputs must equal the torch op's on the same inputs. So leave out of ``batch`` what must stay
    exact or consistent with other arguments (indices, counts, sorted values), or pass ``batch=()``.

    ``rtol``/``atol``: a number for every dtype or ``{dtype: tol}``, replacing the defaults.
    """

    def __init__(self, *args: Any, batch: Optional[Sequence[str]] = None, rtol: Tolerance = None,
                 atol: Tolerance = None, name: Optional[str] = None):
        self.args = args
        self.batch = None if batch is None else tuple(batch)
        self.rtol, self.atol, self.name = rtol, atol, name

    def __repr__(self) -> str:
        return f"Sample({self.name or '...'})"


class BadSample:
    """A call the op must reject: torch must raise, and ORT must fail on the same inputs, each
    with a message matching the regex ``match`` (e.g. ``r"my_add.*broadcast"``)."""

    def __init__(self, *args: Any, match: str, name: Optional[str] = None):
        self.args = args
        self.match = match
        self.name = name

    def __repr__(self) -> str:
        return f"BadSample({self.name or '...'}, match={self.match!r})"
