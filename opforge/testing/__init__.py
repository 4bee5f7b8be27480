"""Round-trip checks for one op: torch op, both ONNX exporters, ONNX Runtime, ``onnx.reference``.

Give the op's spec and a few sample argument lists; :func:`check_op` runs every check that
applies and raises :class:`AssertionError` naming the check, the sample, the dtype (and the
exporter and opset) with the largest difference it found::

    from opforge.testing import Sample, BadSample, check_op, op_tests

    SAMPLES = [
        Sample(torch.randn(4, 3), 0.5, name="2d"),                # torch-order arguments:
        Sample(torch.randn(2, 5, 7), 1.5, batch=(), rtol=1e-4),   # tensors and attribute values
    ]
    BAD = [BadSample(torch.randn(3), -1.0, match=r"swish.*alpha")]  # must be rejected by torch AND ORT

    check_op(SWISH, SAMPLES, bad_samples=BAD)                      # everything that applies
    check_op(SWISH, SAMPLES, checks=["reference", "export_dynamo"])  # just these

    # in a test module: one pytest test per check (ids = check names), inapplicable ones skipped
    test_swish = op_tests(SWISH, SAMPLES, bad_samples=BAD)

The checks (:data:`CHECKS`):

``opcheck``
    ``torch.library.opcheck`` (schema, fake impl, autograd registration, AOT dispatch) on
    each sample in float32 and float64.
``gradcheck``
    ``torch.autograd.gradcheck`` and ``gradgradcheck`` in float64 (differentiable ops only;
    ``gradgrad=False`` leaves out the second order, for ops whose backward has no autograd).
    Samples with more than :data:`GRADCHECK_FULL_MAX_ELEMENTS` input elements use gradcheck's
    fast mode (a random projection of the Jacobian).
``reference``
    The torch op against the spec's numpy ``reference``, for every dtype. Attributes reach
    the reference as they would from ONNX: keyed by ONNX name, bools as ints, floats rounded
    to float32. numpy has no bfloat16, so bfloat16 is compared with the reference computed in
    float32 on the bfloat16-rounded inputs.
``export_torchscript`` / ``export_dynamo``
    A module calling the op (the sample's attribute values fixed, its tensors as inputs) is
    exported with ``opforge.export`` at each opset; the graph must hold the custom node, and
    ONNX Runtime (``opforge.ort_session``) must match torch, for every dtype. The batch dim
    (``Sample.batch``) is exported dynamic and ORT is run again at twice the batch.
``onnx_reference``
    ``onnx.reference`` (with the spec's reference) against ORT on the dynamo export (opset 18).
``float_attrs``
    For each float attribute: the torch op gives bit-identical results for a value that float32
    cannot represent and for its float32 rounding. ONNX stores float attributes as float32, so
    a kernel computing with the double would not match its own exported model.
``bad_inputs``
    Each :class:`BadSample` must raise in torch and in ORT (a single-node model of the op),
    both messages matching ``BadSample.match``. (A crash instead takes the test process down.)

Default tolerances (``rtol`` = ``atol``): float64 1e-10, float32 1e-5, float16 1e-2,
bfloat16 2e-2; a sample's ``rtol``/``atol`` override them (a number for every dtype, or a
``{dtype: tol}`` dict).

An inapplicable check (no backward, no reference, no float attribute, no bad samples, no
opsets) is left out when ``checks=None``, is a ``ValueError`` when asked for by name, and is a
pytest skip (saying why) in :func:`op_tests`.
"""

from __future__ import annotations

import inspect
from typing import Callable, Iterable, Optional, Sequence

import torch

from ..registration import torch_op
from ..spec import OpSpec
from .checks import RUNNERS, reference_kwargs
from .samples import CHECKS, DYNAMO_OPSETS, GRADCHECK_FULL_MAX_ELEMENTS, ONNX_REFERENCE_OPSET, TOLERANCES, BadSample, Sample
from .support import (_check_samples, _dynamo_opsets, _resolve_dtypes, _torchscript_opsets, not_applicable,
                      node_model, single_node_model)


def check_op(spec: OpSpec, samples: Iterable[Sample], *, bad_samples: Iterable[BadSample] = (),
             checks: Optional[Iterable[str]] = None, dtypes: Optional[Sequence[torch.dtype]] = None,
             torchscript_opsets: Optional[Iterable[int]] = None, dynamo_opsets: Optional[Iterable[int]] = None,
             gradgrad: bool = True) -> None:
    """Runs the round-trip ``checks`` (default: every one that applies) of the op ``spec``.

    ``samples``: valid calls (:class:`Sample`); ``bad_samples``: calls that must be rejected
    (:class:`BadSample`). ``dtypes``: floating dtypes the samples are cast to (default: those of
    ``spec.onnx_types``). ``torchscript_opsets``: default the first and last of
    ``spec.torchscript_opsets``; ``dynamo_opsets``: default (18, 20). ``gradgrad=False`` leaves
    out ``gradgradcheck`` (for ops whose backward is not differentiable).

    Raises AssertionError (naming check, sample, dtype, exporter/opset) on the first failure,
    and ValueError for a check asked for by name that does not apply.
    """
    samples, bad_samples = list(samples), list(bad_samples)
    _check_samples(spec, samples, "sample")
    _check_samples(spec, bad_samples, "bad sample")
    options = dict(samples=samples, bad_samples=bad_samples, dtypes=dtypes, torchscript_opsets=torchscript_opsets,
                   dynamo_opsets=dynamo_opsets)
    if checks is None:
        selected = [c for c in CHECKS if not_applicable(spec, c, **options) is None]
    else:
        selected = [checks] if isinstance(checks, str) else list(checks)
        for check in selected:
            reason = not_applicable(spec, check, **options)
            if reason is not None:
                raise ValueError(f"check_op: check {check!r} does not apply to {spec.torch_qualname}: {reason}")
    op = torch_op(spec)
    resolved = dict(dtypes=_resolve_dtypes(spec, dtypes),
                    torchscript_opsets=_torchscript_opsets(spec, torchscript_opsets),
                    dynamo_opsets=_dynamo_opsets(dynamo_opsets), gradgrad=gradgrad)
    for check in selected:
        RUNNERS[check](spec, op, samples=samples, bad_samples=bad_samples, **resolved)


def op_tests(spec: OpSpec, samples: Iterable[Sample], *, bad_samples: Iterable[BadSample] = (),
             **check_op_kwargs) -> Callable:
    """A pytest test function parametrised over :data:`CHECKS` (ids = check names) running
    :func:`check_op` one check at a time; a check that does not apply is skipped, saying why::

        test_swish = op_tests(SWISH, SAMPLES, bad_samples=BAD, gradgrad=False)
    """
    import pytest

    samples, bad_samples = list(samples), list(bad_samples)
    if "checks" in check_op_kwargs:
        raise TypeError("op_tests: runs every check as its own test; select with pytest -k instead of checks=")
    inspect.signature(check_op).bind(spec, samples, **check_op_kwargs)  # a misspelt option fails here, not per test
    _check_samples(spec, samples, "sample")
    _check_samples(spec, bad_samples, "bad sample")

    @pytest.mark.parametrize("check", CHECKS)
    def test(check):
        reason = not_applicable(spec, check, samples=samples, bad_samples=bad_samples, **check_op_kwargs)
        if reason is not None:
            pytest.skip(f"{check}: {reason}")
        check_op(spec, samples, bad_samples=bad_samples, checks=[check], **check_op_kwargs)

    test.__name__ = f"test_{spec.name}"
    test.__doc__ = f"check_op round trips of {spec.torch_qualname}"
    return test


__all__ = ["BadSample", "CHECKS", "DYNAMO_OPSETS", "GRADCHECK_FULL_MAX_ELEMENTS", "ONNX_REFERENCE_OPSET", "Sample",
           "TOLERANCES", "check_op", "not_applicable", "op_tests", "node_model", "reference_kwargs", "single_node_model"]
