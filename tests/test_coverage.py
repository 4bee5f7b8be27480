"""`opforge coverage`: measured per opset, and no covered op may regress."""

import io
import json

import pytest
import torch

from opforge.aten import bridge, coverage, rules, samples
from preloaded_python import run_python


@pytest.fixture(scope="module")
def measured():
    return coverage.measure()


def test_no_covered_op_regresses(measured):
    baseline = json.loads(coverage.SNAPSHOT.read_text())
    lost = {o: sorted(set(ops) - measured.with_opforge[int(o)]) for o, ops in baseline.items()}
    assert not any(lost.values()), f"ops no longer exported with dynamo=False: {lost}"


def test_opforge_adds_coverage_at_every_opset_and_never_removes_torchs(measured):
    for o in measured.opsets:
        assert measured.torch_only[o] <= measured.with_opforge[o]
        assert len(measured.with_opforge[o] & measured.dynamo) > len(measured.torch_only[o] & measured.dynamo)
    # the examples, at opset 11 and up
    for name in ["hypot", "logaddexp", "logaddexp2", "expm1", "exp2", "deg2rad", "rad2deg", "heaviside",
                 "xlogy", "erfc", "frac", "sinc", "signbit", "addcdiv", "addr", "logcumsumexp", "angle", "copysign"]:
        assert all(name in measured.with_opforge[o] for o in range(11, 21)), name
        assert not any(name in measured.torch_only[o] for o in range(9, 21)), name


def test_a_call_torchs_own_rule_refuses_counts_in_neither_column(measured):
    # torch has rules for these at 9 and 10, but they refuse the sampled call (a size that does
    # not divide the input; a threshold other than 0) and the bridge needs opset 11 for it
    for name in ["adaptive_avg_pool1d", "threshold"]:
        for o in (9, 10):
            assert rules.has_torch_rule(name, o), (name, o)
            assert name not in measured.torch_only[o] and name not in measured.with_opforge[o], (name, o)
            why = measured.refused[(name, o)]
            assert why.startswith("Unsupported: ONNX export of operator") and bridge.BRIDGE_REFUSED_TOO in why
        # from 11 the bridge takes the call torch's rule refuses
        assert all(name in measured.with_opforge[o] for o in range(11, 21)), name


def test_every_not_covered_op_has_a_reason(measured):
    assert all(why for why in measured.not_covered.values())
    assert measured.not_covered["allclose"] == samples.NOT_BRIDGED["allclose"]
    assert "Python bool" in measured.not_covered["allclose"]
    # from opset 11 only what ONNX cannot express is left
    assert set(measured.not_covered) == {"allclose", "equal", "is_nonzero", "bitwise_and", "bitwise_xor"}
    assert "opset 18" in measured.not_covered["bitwise_and"] and "bool" in measured.not_covered["bitwise_and"]


def test_ops_whose_torch_rule_starts_later_are_covered_from_opset_11(measured):
    # Torch's own rule starts at 12..18; below it the bridge lowers torch's decompositions or
    # opforge's compositions (the round trips are in test_aten_bridge / test_aten_lowerings).
    for name in ["tril", "triu", "celu", "einsum", "nll_loss", "nll_loss_nd", "cross_entropy_loss", "diagonal",
                 "native_dropout", "scaled_dot_product_attention", "grid_sampler", "scatter_reduce", "col2im",
                 "fake_quantize_per_channel_affine", "stft", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"]:
        first_torch = min((o for o in measured.opsets if name in measured.torch_only[o]), default=21)
        assert all(name in measured.with_opforge[o] for o in range(11, 21)), name
        assert first_torch > 11, name  # torch alone does not cover opset 11


def test_ops_dynamo_reaches_only_through_decompositions_are_counted_and_covered(measured):
    # not torchlib names: dynamo handles them through torch's decompositions (or, for the
    # complex FFTs, with complex values as real pairs)
    for name in ["nansum", "isin", "hstack", "gradient", "hsplit", "special_log_ndtr", "linalg_vecdot",
                 "triplet_margin_loss", "max_unpool2d", "fft_fftshift", "fft_rfft"]:
        assert name in measured.dynamo, name
        assert name not in coverage._torchlib_names(), name
    # special_erfcx is a torchlib name that the TorchScript exporter had no rule for
    assert "special_erfcx" in coverage._torchlib_names()
    for name in ["nansum", "isin", "gradient", "hsplit", "special_log_ndtr", "special_erfcx", "linalg_vecdot",
                 "triplet_margin_loss", "max_unpool2d", "fft_fftshift"]:
        assert all(name in measured.with_opforge[o] for o in range(11, 21)), name
        assert not any(name in measured.torch_only[o] for o in measured.opsets), name
    # torch's rules start at 11/12/13: the bridge covers the opsets below
    for name, first_torch in [("hstack", 11), ("tensordot", 12), ("tensor_split", 13)]:
        assert min(o for o in measured.opsets if name in measured.torch_only[o]) == first_torch
        assert all(name in measured.with_opforge[o] for o in range(9, 21)), name
    assert not set(samples.NEITHER_EXPORTER) & measured.dynamo
    # aliases are counted as the op the tracer records; conj alone is also a torchlib name, and
    # is covered where _conj is (torch's rule, which sends complex calls to the bridge)
    assert set(samples.TRACED_AS) & measured.dynamo == {"conj"}
    assert all("conj" in measured.with_opforge[o] for o in measured.opsets)


def test_complex_ops_are_counted_and_covered(measured):
    # complex values inside a model, as real pairs (round trips in test_aten_bridge)
    for name in ["complex", "polar", "view_as_real", "view_as_complex", "imag", "fft_fft", "fft_rfft", "fft_irfftn",
                 "fft_hfft2"]:
        assert name in measured.dynamo and name not in measured.not_covered, name
        assert all(name in measured.with_opforge[o] for o in range(11, 21)), name


@pytest.mark.parametrize("name", coverage.NOT_IN_DYNAMO)
def test_ops_counted_beyond_dynamo_really_fail_in_dynamo(name):
    sample = samples.SAMPLES[name]
    with pytest.raises(Exception):
        torch.onnx.export(sample.module(), sample.inputs(torch.float32), io.BytesIO(), dynamo=True, verbose=False)


def test_cli_prints_the_table_and_refuses_unknown_opsets():
    out = run_python(["-m", "opforge.cli", "coverage", "--opsets", "17,20", "-q"], cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| 17 |" in out.stdout and "| 20 |" in out.stdout and "Internal ops" in out.stdout
    assert "Torch IR graph" not in out.stdout
    bad = run_python(["-m", "opforge.cli", "coverage", "--opsets", "21"], cwd="/")
    assert bad.returncode == 2 and "9..20" in bad.stderr
