"""mmdeploy::grid_sampler in libopforge_mmdeploy.so (the node mmdeploy 1.3.1's symbolic for
aten::grid_sampler writes) against torch.nn.functional.grid_sample: every interpolation x padding
x align_corners combination in float32 / float64 (tight) and float16 / bfloat16 (loose), grids
reaching past [-1, 1], exact pixel-centre hits, shapes that take every path of the kernel (several
images, C = 1 and 37, maps one pixel high or wide, several pixel blocks, channel-split work
items), empty tensors, attribute defaults, bad attributes and shapes (errors naming the op and the
argument), NaN / inf / huge grid values (the results core/grid_sample.h defines), and equal
results for 1 and 2 intra-op threads."""

import functools
import itertools
import os

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from opforge.testing.support import _ort_run

try:
    from opforge import mmdeploy_library_path as _library_path
except ImportError:  # the accessor is optional: the library's path in the source tree
    def _library_path():
        return os.path.join(os.path.dirname(__file__), "..", "opforge", "ort_kernels", "libopforge_mmdeploy.so")

MODES = ["bilinear", "nearest", "bicubic"]
PADDINGS = ["zeros", "border", "reflection"]
COMBOS = list(itertools.product(range(3), range(3), (0, 1)))
ONNX_TYPE = {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE,
             torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16}
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def combo_id(c):
    return f"{MODES[c[0]]}-{PADDINGS[c[1]]}-ac{c[2]}"


def model(dtype, attrs, inputs=("input", "grid"), opset=17):
    node = helper.make_node("grid_sampler", list(inputs), ["output"], domain="mmdeploy", **attrs)
    graph = helper.make_graph([node], "grid_sampler",
                              [helper.make_tensor_value_info(n, ONNX_TYPE[dtype], None) for n in inputs if n],
                              [helper.make_tensor_value_info("output", ONNX_TYPE[dtype], None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("mmdeploy", 1)])


def new_session(proto, threads=1):
    so = ort.SessionOptions()
    so.register_custom_ops_library(_library_path())
    so.intra_op_num_threads = threads
    so.log_severity_level = 4  # expected errors are not logged
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=None)
def session(dtype, mode, padding, align_corners, threads=1):
    attrs = dict(interpolation_mode=mode, padding_mode=padding, align_corners=align_corners)
    return new_session(model(dtype, attrs), threads)


def run(sess, x, grid):
    return _ort_run(sess, {"input": x, "grid": grid})[0]


def torch_ref(x, grid, mode, padding, align_corners):
    return F.grid_sample(x, grid, mode=MODES[mode], padding_mode=PADDINGS[padding], align_corners=bool(align_corners))


def close(got, want, dtype):
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, equal_nan=False)


def centres(n, size, align_corners):
    """The grid values of pixel centres 0..n-1 of an axis of `size` pixels."""
    i = torch.arange(n, dtype=torch.float64)
    return 2 * i / (size - 1) - 1 if align_corners else (2 * i + 1) / size - 1


def inputs(n, c, h, w, ho, wo, dtype, seed=0, lo=-1.5, hi=1.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    grid = torch.rand(n, ho, wo, 2, generator=g, dtype=torch.float64) * (hi - lo) + lo
    return x.to(dtype), grid.to(dtype)


# ---- agreement with torch ---------------------------------------------------------------------


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_matches_torch(dtype, combo):
    """Points anywhere in [-1.5, 1.5]^2 (a third outside the map), a row of exact pixel centres and a
    row on the map's edges (+-1), against torch in the same dtype."""
    x, grid = inputs(2, 5, 7, 9, 6, 11, dtype, seed=1)
    ac = combo[2]
    grid[:, 0, :9, 0] = centres(9, 9, ac).to(dtype)
    grid[:, 0, :9, 1] = centres(7, 7, ac)[torch.arange(9) % 7].to(dtype)
    grid[:, 1, :, :] = torch.tensor([-1.0, 1.0], dtype=dtype)[torch.arange(22).reshape(11, 2) % 2]
    got = run(session(dtype, *combo), x, grid)
    close(got, torch_ref(x, grid, *combo), dtype)
    if combo[0] == 1:  # nearest: every value is an input pixel or 0, exactly torch's
        assert torch.equal(got, torch_ref(x, grid, *combo))


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_pixel_centres_reproduce_the_input(combo):
    """An identity grid of pixel centres returns the map itself, in every mode and padding."""
    x, _ = inputs(1, 3, 6, 8, 6, 8, torch.float64, seed=2)
    ys, xs = torch.meshgrid(centres(6, 6, combo[2]), centres(8, 8, combo[2]), indexing="ij")
    grid = torch.stack([xs, ys], -1)[None]
    got = run(session(torch.float64, *combo), x, grid)
    torch.testing.assert_close(got, x, rtol=1e-12, atol=1e-12)
    close(got, torch_ref(x, grid, *combo), torch.float64)


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit(dtype, combo):
    """16-bit tensors compute in float32 and round once: torch in float32 on the same 16-bit values,
    rounded to the dtype, within one or two of the dtype's ulps."""
    x, grid = inputs(2, 4, 6, 7, 5, 6, dtype, seed=3)
    got = run(session(dtype, *combo), x, grid)
    want = torch_ref(x.float(), grid.float(), *combo).to(dtype)
    close(got, want, dtype)


SHAPES = {
    "N3-C37": (3, 37, 9, 8, 5, 7),             # channel unroll remainder (37 = 9 x 4 + 1)
    "C1": (2, 1, 10, 12, 13, 3),
    "upsample": (1, 6, 5, 4, 17, 19),
    "many-blocks": (1, 3, 12, 10, 50, 45),     # 2250 output pixels: several pixel blocks in every mode
    "channel-split": (1, 40, 16, 16, 8, 8),    # one pixel block: items split by channels
    "one-row": (2, 3, 1, 6, 4, 5),             # H = 1: the four-corner bilinear form
    "one-column": (1, 3, 5, 1, 4, 5),
    "one-pixel": (1, 2, 1, 1, 3, 3),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("combo", [(m, p, ac) for m in range(3) for p, ac in ((0, 0), (1, 1), (2, 0), (2, 1))],
                         ids=combo_id)
def test_shapes(shape, combo):
    x, grid = inputs(*shape, torch.float32, seed=4)
    close(run(session(torch.float32, *combo), x, grid), torch_ref(x, grid, *combo), torch.float32)


@pytest.mark.parametrize("opset", [11, 16])
def test_defaults_are_bilinear_zeros_without_align_corners(opset):
    """A node without attributes: torch's defaults (0, 0, 0), under other default-domain opsets."""
    x, grid = inputs(2, 3, 5, 6, 4, 4, torch.float32, seed=5)
    got = run(new_session(model(torch.float32, {}, opset=opset)), x, grid)
    close(got, F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False), torch.float32)
    assert not torch.allclose(got, F.grid_sample(x, grid, align_corners=True))  # the attribute matters


@pytest.mark.parametrize("shape", [(0, 3, 5, 6, 4, 4), (2, 3, 5, 6, 0, 4), (2, 3, 5, 6, 4, 0), (2, 0, 5, 6, 4, 4),
                                   (0, 3, 0, 6, 4, 4), (1, 3, 0, 0, 0, 2)],
                         ids=["N0", "Ho0", "Wo0", "C0", "N0-H0", "H0-Ho0"])
def test_empty(shape):
    x, grid = inputs(*shape, torch.float32)
    got = run(session(torch.float32, 0, 0, 0), x, grid)
    assert got.shape == (shape[0], shape[1], shape[4], shape[5])


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("attrs, words", [
    (dict(interpolation_mode=3), "interpolation_mode"),
    (dict(interpolation_mode=-1), "interpolation_mode"),
    (dict(padding_mode=-1), "padding_mode"),
    (dict(padding_mode=3), "padding_mode"),
    (dict(align_corners=2), "align_corners"),
    (dict(interpolation_mode=1.0), "interpolation_mode"),
    (dict(align_corners=[0, 1]), "align_corners"),
])
def test_bad_attributes_fail_at_session_creation(attrs, words):
    with pytest.raises(Exception) as info:
        new_session(model(torch.float32, attrs))
    assert "mmdeploy::grid_sampler" in str(info.value) and words in str(info.value)


def test_missing_input_fails_at_session_creation():
    with pytest.raises(Exception, match=r"mmdeploy::grid_sampler.*input 1 \(grid\) is omitted"):
        new_session(model(torch.float32, {}, inputs=("input", "")))


@pytest.mark.parametrize("x_shape, grid_shape, words", [
    ((3, 5, 6), (1, 4, 4, 2), "input must be 4-D"),
    ((1, 3, 5, 6), (4, 4, 2), "grid must be 4-D"),
    ((1, 3, 5, 6), (1, 4, 4, 3), "grid's last dimension must be 2"),
    ((2, 3, 5, 6), (1, 4, 4, 2), "batch sizes must match"),
    ((1, 3, 0, 6), (1, 4, 4, 2), "input has an empty feature map"),
])
def test_bad_shapes_fail_at_run(x_shape, grid_shape, words):
    sess = session(torch.float32, 0, 0, 0)
    with pytest.raises(Exception) as info:
        run(sess, torch.zeros(x_shape), torch.zeros(grid_shape))
    assert "mmdeploy::grid_sampler: " in str(info.value) and words in str(info.value)


# ---- hostile grid values ----------------------------------------------------------------------

HOSTILE = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30]


def hostile_grid(dtype):
    """Row r holds HOSTILE[r] in x (column 0), in y (column 1) and in both (column 2); the other
    columns are ordinary points."""
    _, grid = inputs(1, 1, 1, 1, len(HOSTILE), 5, dtype, seed=6, lo=-1.0, hi=1.0)
    for r, v in enumerate(HOSTILE):
        grid[0, r, 0, 0] = grid[0, r, 1, 1] = v
        grid[0, r, 2, :] = v
    return grid


def defined_reference(x, grid, mode, padding, ac):
    """The results core/grid_sample.h defines for non-finite coordinates, through torch on a grid
    where each such value is replaced by one torch samples the same way: zeros padding, the point is
    outside (0); border, NaN and -inf clamp to the first pixel and +inf to the last; reflection, all
    go to the first pixel. Finite values (1e30 included) are left to torch."""
    g = grid.double().clone()
    outside = torch.zeros(g.shape[:-1], dtype=torch.bool)
    for axis, size in ((0, x.shape[3]), (1, x.shape[2])):
        v, given = g[..., axis], g[..., axis].clone()
        first = -1.0 if ac else -1.0 + 1.0 / size  # the centre of pixel 0
        last = 1.0 if ac else 1.0 - 1.0 / size  # the centre of the last pixel
        bad = ~torch.isfinite(given)
        outside |= bad
        v[bad] = 0.0 if padding == 0 else first
        if padding == 1:
            v[given == float("inf")] = last
    want = torch_ref(x.double(), g, mode, padding, ac)
    if padding == 0:
        want = want.masked_fill(outside[:, None], 0.0)
    return want


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_hostile_grid_values(dtype, combo):
    """NaN, +-inf and +-1e30 in the grid: no crash, finite results, the values defined in
    core/grid_sample.h (torch's own where torch gives a number)."""
    mode, padding, ac = combo
    x, _ = inputs(2, 3, 5, 6, 1, 1, dtype, seed=7)
    grid = hostile_grid(dtype).expand(2, -1, -1, -1).contiguous()
    got = run(session(dtype, *combo), x, grid)
    assert torch.isfinite(got).all()
    huge = (grid.abs() == 1e30).any(-1)[:, None].expand_as(got)
    want = defined_reference(x, grid, *combo).to(dtype)
    if padding == 2:  # reflection of 1e30: exact here, torch's loses precision; checked below
        got_cmp, want_cmp = got.masked_fill(huge, 0), want.masked_fill(huge, 0)
    else:
        got_cmp, want_cmp = got, want
    close(got_cmp, want_cmp, dtype)
    if padding == 0:  # every hostile point is outside: exactly 0
        assert (got[~torch.isfinite(grid).all(-1)[:, None].expand_as(got)] == 0).all()
        assert (got[huge] == 0).all()
    if padding == 2:  # both coordinates 1e30: one pixel (or a convex mix of two), within the map's range
        for r in (3, 4):
            v = got[:, :, r, 2]
            assert ((v >= x.amin((2, 3)) - 1e-6) & (v <= x.amax((2, 3)) + 1e-6)).all()
    if (mode, padding) in ((0, 1), (0, 2), (1, 1), (1, 2)):  # torch is defined here, NaN and inf included
        finite_torch = torch_ref(x, grid, *combo)
        mask = ~huge if padding == 2 else torch.ones_like(huge)
        close(got[mask], finite_torch[mask], dtype)


# ---- threads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("combo", [(0, 0, 0), (1, 1, 1), (2, 2, 0), (0, 2, 1)], ids=combo_id)
def test_thread_counts_agree_bitwise(combo):
    x, grid = inputs(2, 9, 20, 24, 40, 60, torch.float32, seed=8)
    one = run(session(torch.float32, *combo, threads=1), x, grid)
    two = run(session(torch.float32, *combo, threads=2), x, grid)
    assert torch.equal(one, two)
    close(one, torch_ref(x, grid, *combo), torch.float32)


def test_reference_helpers_can_fail():
    """The comparisons above see a wrong answer: a flipped align_corners differs from torch."""
    x, grid = inputs(1, 2, 5, 6, 4, 4, torch.float32, seed=9)
    got = run(session(torch.float32, 0, 0, 1), x, grid)
    with pytest.raises(AssertionError):
        close(got, torch_ref(x, grid, 0, 0, 0), torch.float32)
    np.testing.assert_array_equal(got.numpy(), run(session(torch.float32, 0, 0, 1), x, grid).numpy())
