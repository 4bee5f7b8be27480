"""opforge::ms_deform_attn (multi-scale deformable attention) against an independent pure-PyTorch
reference built on grid_sample: forward, gradients, every dtype, check_op's round trips (opcheck,
gradcheck, onnx.reference, both exporters, ORT), one exported model at other image sizes, query
counts and batches, the standard-ONNX (GridSample) lowering, hostile index tensors in torch and
ORT, NaN/inf locations, empty batches, and the Deformable DETR module."""

import math

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.ops.ms_deform_attn import MS_DEFORM_ATTN
from opforge.symbolics.onnx_schema import NodeTypeError
from opforge.testing import BadSample, Sample, op_tests, single_node_model

OP = "opforge::ms_deform_attn"


def level_layout(sizes):
    """(spatial_shapes, level_start_index, S) for levels of the given (H, W)."""
    shapes = torch.tensor(sizes, dtype=torch.int64).reshape(-1, 2)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), areas.cumsum(0)[:-1]])
    return shapes, starts, int(areas.sum())


def random_inputs(n=2, lq=5, m=2, d=3, sizes=((5, 6), (3, 4), (1, 2)), p=2, dtype=torch.float64, seed=0,
                  spread=1.3):
    """Arguments of the op; locations reach outside [0, 1] so zero padding is exercised."""
    g = torch.Generator().manual_seed(seed)
    shapes, starts, s = level_layout(sizes)
    levels = len(sizes)
    value = torch.randn(n, s, m, d, generator=g, dtype=dtype)
    loc = (torch.rand(n, lq, m, levels, p, 2, generator=g, dtype=dtype) - 0.5) * spread + 0.5
    weights = torch.rand(n, lq, m, levels, p, generator=g, dtype=dtype)
    return value, shapes, starts, loc, weights


def grid_sample_reference(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """The op in plain PyTorch: per level, grid_sample(align_corners=False, zeros) at 2*loc-1."""
    n, _, m, d = value.shape
    _, lq, _, levels, p, _ = sampling_locations.shape
    samples = []
    for level in range(levels):
        h, w = (int(v) for v in spatial_shapes[level])
        start = int(level_start_index[level])
        maps = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(n * m, d, h, w)
        grid = sampling_locations[:, :, :, level].transpose(1, 2).reshape(n * m, lq, p, 2) * 2 - 1
        samples.append(F.grid_sample(maps, grid, mode="bilinear", padding_mode="zeros", align_corners=False))
    sampled = torch.stack(samples, dim=3)  # (N*M, D, Lq, L, P)
    weights = attention_weights.transpose(1, 2).reshape(n * m, 1, lq, levels, p)
    return (sampled * weights).sum((-1, -2)).reshape(n, m * d, lq).transpose(1, 2)


# ---- forward and gradients against grid_sample -------------------------------------------------


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_forward_matches_grid_sample(dtype, tol):
    args = random_inputs(dtype=dtype)
    torch.testing.assert_close(opforge.ms_deform_attn(*args), grid_sample_reference(*args), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_forward_matches_float32(dtype):
    args = [t.to(dtype) if t.is_floating_point() else t for t in random_inputs(dtype=torch.float32)]
    want = grid_sample_reference(*[t.float() if t.is_floating_point() else t for t in args])
    got = opforge.ms_deform_attn(*args)
    assert got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def test_gradients_match_grid_sample():
    args = random_inputs(dtype=torch.float64)
    ours = [t.clone().requires_grad_(t.is_floating_point()) for t in args]
    theirs = [t.clone().requires_grad_(t.is_floating_point()) for t in args]
    grad = torch.randn(2, 5, 6, dtype=torch.float64)
    opforge.ms_deform_attn(*ours).backward(grad)
    grid_sample_reference(*theirs).backward(grad)
    for i in (0, 3, 4):
        torch.testing.assert_close(ours[i].grad, theirs[i].grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gradients_on_pixel_lines_and_the_left_edge_match_grid_sample(dtype):
    """Points exactly on pixel lines (where transformers' initialisation puts every sampling offset)
    and at x = -1: the gradient there is one-sided, so it matches grid_sample's only where the kernel
    rounds the position as grid_sample does ((2*loc - 1 + 1) * W/2 - 0.5, no FMA) and keeps x = -1
    (a corner with weight 0, but a gradient)."""
    sizes = ((8, 8), (4, 4))
    spatial_shapes, level_start_index, s = level_layout(sizes)
    n, lq, m, d, points = 2, 6, 2, 4, 4
    g = torch.Generator().manual_seed(0)
    value = torch.randn(n, s, m, d, dtype=dtype, generator=g)
    centres = torch.tensor([[(q % 8 + 0.5) / 8, (q // 8 + 0.5) / 8] for q in range(lq)], dtype=dtype)
    steps = torch.tensor([[-1.0, 0.0], [0.0, 1.0], [2.0, -1.0], [-4.5, 0.0]], dtype=dtype)  # whole pixels; x = -1
    loc = torch.zeros(n, lq, m, len(sizes), points, 2, dtype=dtype)
    for level, (h, w) in enumerate(sizes):
        loc[:, :, :, level] = centres[:, None, None, :] + steps / torch.tensor([w, h], dtype=dtype)
    weights = torch.rand(n, lq, m, len(sizes), points, dtype=dtype, generator=g)
    grad = torch.randn(n, lq, m * d, dtype=dtype, generator=g)
    ours = [t.clone().requires_grad_() for t in (value, loc, weights)]
    theirs = [t.clone().requires_grad_() for t in (value, loc, weights)]
    opforge.ms_deform_attn(ours[0], spatial_shapes, level_start_index, ours[1], ours[2]).backward(grad)
    grid_sample_reference(theirs[0], spatial_shapes, level_start_index, theirs[1], theirs[2]).backward(grad)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol)


def test_gradcheck_float64():
    value, shapes, starts, loc, weights = random_inputs(n=1, lq=3, m=2, d=2, sizes=((3, 4), (2, 2)), p=2)
    # keep sampling points off the pixel grid's integer lines, where bilinear sampling has kinks
    loc = (loc * 0.8 + 0.1).requires_grad_()
    value.requires_grad_()
    weights.requires_grad_()
    assert torch.autograd.gradcheck(lambda v, l, a: opforge.ms_deform_attn(v, shapes, starts, l, a),
                                    (value, loc, weights))


def test_mmcv_and_deformable_detr_call_forms():
    args = random_inputs()
    want = opforge.ms_deform_attn(*args)
    torch.testing.assert_close(opforge.MultiScaleDeformableAttnFunction.apply(*args, 64), want)
    torch.testing.assert_close(torch.ops.opforge.ms_deform_attn(*args, 64), want)
    from opforge.ops.ms_deform_attn import MSDeformAttnFunction

    assert MSDeformAttnFunction is opforge.MultiScaleDeformableAttnFunction


def test_double_backward_is_a_clear_error():
    value, shapes, starts, loc, weights = (t.requires_grad_() if t.is_floating_point() else t for t in random_inputs())
    out = opforge.ms_deform_attn(value, shapes, starts, loc, weights)
    (g_value,) = torch.autograd.grad(out.square().sum(), value, create_graph=True)
    with pytest.raises(RuntimeError, match=f"{OP}: double backward .* is not implemented"):
        g_value.sum().backward()


# ---- edge cases: empty batches, NaN/inf locations ------------------------------------------------


@pytest.mark.parametrize("n,lq", [(0, 5), (2, 0)])
def test_empty_batch_or_queries(n, lq):
    value, shapes, starts, loc, weights = (t.requires_grad_() if t.is_floating_point() else t
                                           for t in random_inputs(n=n, lq=lq))
    out = opforge.ms_deform_attn(value, shapes, starts, loc, weights)
    assert out.shape == (n, lq, 6)
    out.sum().backward()
    assert value.grad.shape == value.shape and not value.grad.any()


def test_nan_and_inf_locations_sample_zero():
    value, shapes, starts, loc, weights = random_inputs()
    bad = loc.clone()
    bad[0, 1, 0, 0, 0] = torch.tensor([float("nan"), 0.5])
    bad[1, 2, 1, 1, 1] = torch.tensor([0.5, float("inf")])
    bad[0, 3, 1, 2, 0] = torch.tensor([-float("inf"), float("nan")])
    # the same call with those points' weights zeroed and harmless locations: what "samples zero" means
    zeroed = weights.clone()
    for idx in ((0, 1, 0, 0, 0), (1, 2, 1, 1, 1), (0, 3, 1, 2, 0)):
        zeroed[idx] = 0
    want = opforge.ms_deform_attn(value, shapes, starts, loc, zeroed)
    got = opforge.ms_deform_attn(value, shapes, starts, bad, weights)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    sess = opforge.ort_session(single_node_model(MS_DEFORM_ATTN, (value, shapes, starts, bad, weights, 64)))
    (ort_out,) = sess.run(None, {"value": value.numpy(), "spatial_shapes": shapes.numpy(),
                                 "level_start_index": starts.numpy(), "sampling_locations": bad.numpy(),
                                 "attention_weights": weights.numpy()})
    np.testing.assert_allclose(ort_out, want.numpy(), rtol=1e-12, atol=1e-12)


# ---- hostile index tensors: torch and ORT refuse them, naming the argument ----------------------


def _hostile_cases():
    value, shapes, starts, loc, weights = random_inputs()
    s = value.shape[1]
    big = torch.tensor([[2 ** 40, 2 ** 40], [3, 4], [1, 2]])
    yield "sum differs from S", (value[:, :-1], shapes, starts, loc, weights), f"sum to {s} but value has S = {s - 1}"
    yield "zero size", (value, torch.tensor([[0, 6], [3, 4], [1, 2]]), starts, loc, weights), \
        r"spatial_shapes row 0 is \(0, 6\): sizes must be positive"
    yield "negative size", (value, torch.tensor([[5, 6], [-3, 4], [1, 2]]), starts, loc, weights), \
        r"spatial_shapes row 1 is \(-3, 4\): sizes must be positive"
    yield "huge sizes", (value, big, starts, loc, weights), r"overflow"
    yield "start disagrees", (value, shapes, torch.tensor([0, 30, 41]), loc, weights), \
        r"level_start_index\[2\] is 41 but spatial_shapes puts level 2 at 42"
    yield "start out of range", (value, shapes, torch.tensor([0, 30, 10 ** 12]), loc, weights), \
        r"level_start_index\[2\]"
    yield "N differs", (value, shapes, starts, loc[:1], weights[:1]), r"sampling_locations has N = 1"
    yield "M differs", (value[:, :, :1], shapes, starts, loc, weights), r"sampling_locations has M = 2 heads"
    yield "L differs", (value, shapes[:2], starts[:2], loc, weights), r"sampling_locations has L = 3 levels"
    yield "P differs", (value, shapes, starts, loc, weights[..., :1]), r"attention_weights has P = 1"
    yield "levels vs starts", (value, shapes, starts[:2], loc, weights), r"level_start_index has 2 entries"
    yield "no levels", (value[:, :0], shapes[:0], starts[:0], loc[:, :, :, :0], weights[:, :, :, :0]), \
        r"needs at least one level"


HOSTILE = list(_hostile_cases())


@pytest.mark.parametrize("args,match", [(a, m) for _, a, m in HOSTILE], ids=[name for name, _, _ in HOSTILE])
def test_hostile_index_tensors_are_refused_in_torch_and_ort(args, match):
    with pytest.raises(opforge.OpInputError, match=f"{OP}: .*{match}"):
        opforge.ms_deform_attn(*args)
    with pytest.raises(RuntimeError, match=f"{OP}: .*{match}"):
        torch.ops.opforge.ms_deform_attn(*args, 64)
    sess = opforge.ort_session(single_node_model(MS_DEFORM_ATTN, (*args, 64)))
    names = [a.onnx_name for a in MS_DEFORM_ATTN.tensor_args]
    with pytest.raises(Exception, match=f"{OP}: .*{match}"):
        sess.run(None, {n: t.numpy() for n, t in zip(names, args)})


def test_index_tensors_of_another_dtype_are_refused_clearly():
    value, shapes, starts, loc, weights = random_inputs()
    with pytest.raises(opforge.OpInputError, match=f"{OP}: spatial_shapes has dtype (torch.int32|Int) but must be int64"):
        opforge.ms_deform_attn(value, shapes.int(), starts, loc, weights)
    model = single_node_model(MS_DEFORM_ATTN, (value, shapes.int(), starts, loc, weights, 64))
    with pytest.raises(NodeTypeError, match=r"opforge::ms_deform_attn .* input 'spatial_shapes' of type "
                                            r"tensor\(int32\), which it does not take: it allows tensor\(int64\)"):
        opforge.ort_session(model)


def test_schema_has_a_type_variable_for_the_index_inputs():
    schema = onnx.defs.get_schema("ms_deform_attn", 1, "opforge")
    constraints = {c.type_param_str: sorted(c.allowed_type_strs) for c in schema.type_constraints}
    assert constraints == {"T": sorted(["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]),
                           "T_spatial_shapes": ["tensor(int64)"]}
    assert [i.type_str for i in schema.inputs] == ["T", "T_spatial_shapes", "T_spatial_shapes", "T", "T"]


# ---- check_op: opcheck, gradcheck, references, both exporters, ORT, bad samples -----------------

_SAMPLE_BATCH = ("value", "sampling_locations", "attention_weights")
SAMPLES = [
    Sample(*random_inputs(), 64, batch=_SAMPLE_BATCH, name="three-levels"),
    Sample(*random_inputs(n=1, lq=4, m=3, d=2, sizes=((4, 4),), p=3, seed=1, spread=0.6), 2, batch=_SAMPLE_BATCH,
           name="one-level-inside"),
]
_value, _shapes, _starts, _loc, _weights = random_inputs()
BAD = [
    BadSample(_value[:, :-1], _shapes, _starts, _loc, _weights, 64, match=f"{OP}: the levels' sizes sum to 44 but value has S = 43",
              name="sum-differs"),
    BadSample(_value, _shapes, _starts, _loc, _weights, 0, match=f"{OP}: im2col_step must be positive",
              name="im2col-step"),
]
test_check_op = op_tests(MS_DEFORM_ATTN, SAMPLES, bad_samples=BAD, gradgrad=False)


# ---- export: one model, other image sizes, query counts and batches ------------------------------


class _Attention(torch.nn.Module):
    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return opforge.ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)


_NAMES = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]


def _export(dynamo: bool, standard: bool, opset: int):
    args = [t.float() if t.is_floating_point() else t for t in random_inputs(n=2, lq=5, sizes=((5, 6), (3, 4)))]
    if dynamo:
        n, s, q = torch.export.Dim("n"), torch.export.Dim("s"), torch.export.Dim("q")
        kw = dict(dynamic_shapes=({0: n, 1: s}, None, None, {0: n, 1: q}, {0: n, 1: q}))
    else:
        kw = dict(dynamic_axes={"value": {0: "n", 1: "s"}, "sampling_locations": {0: "n", 1: "q"},
                                "attention_weights": {0: "n", 1: "q"}, "output": {0: "n", 1: "q"}},
                  output_names=["output"])
    return opforge.export(_Attention(), tuple(args), dynamo=dynamo, standard_onnx=standard, opset_version=opset,
                          input_names=_NAMES, **kw)


# torch.export notes that one Dim shared by several inputs keeps one name: that sharing is the point here
@pytest.mark.filterwarnings("ignore:# The axis name:UserWarning")
@pytest.mark.parametrize("dynamo,standard,opset", [(False, False, 17), (True, False, 18), (False, True, 16),
                                                    (False, True, 20), (True, True, 18), (True, True, 22)])
def test_one_exported_model_serves_other_sizes(dynamo, standard, opset):
    proto = _export(dynamo, standard, opset)
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert (("opforge", "ms_deform_attn") in ops) != standard
    assert (("", "GridSample") in ops) == standard
    if standard:  # plain ONNX Runtime, without opforge's library
        import onnxruntime as ort

        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    else:
        sess = opforge.ort_session(proto)
    for n, lq, sizes in ((3, 7, ((4, 7), (2, 3))), (1, 2, ((8, 8), (1, 1)))):
        args = [t.float() if t.is_floating_point() else t for t in random_inputs(n=n, lq=lq, sizes=sizes, seed=n)]
        (got,) = sess.run(None, {name: t.numpy() for name, t in zip(_NAMES, args)})
        np.testing.assert_allclose(got, grid_sample_reference(*args).numpy(), rtol=1e-5, atol=1e-5)


def test_standard_lowering_needs_opset_16():
    with pytest.raises(ValueError, match=r"ms_deform_attn has no standard-ONNX equivalent at opset 15 "
                                         r"\(needs opset >= 16\)"):
        opforge.export(_Attention(), tuple(random_inputs()), dynamo=False, opset_version=15,
                       standard_onnx={"ms_deform_attn"})


def test_wrong_index_type_in_an_exported_model_names_the_declaration():
    """A model whose node gets a float index input: the error names op, input, types and TensorArg."""
    value, shapes, starts, loc, weights = random_inputs()
    model = single_node_model(MS_DEFORM_ATTN, (value, shapes.double(), starts, loc, weights, 64))
    with pytest.raises(NodeTypeError, match=r"declared TensorArg\('spatial_shapes', dtypes=\('int64',\)\)"):
        opforge.ort_session(model)


# ---- the Deformable DETR module ------------------------------------------------------------------


class _PlainMSDeformAttn(torch.nn.Module):
    """The module's math with grid_sample and nothing from opforge: a state_dict written by the
    original module's parameter names must drive opforge.MSDeformAttn to the same output."""

    def __init__(self, d_model, n_levels, n_heads, n_points):
        super().__init__()
        self.n_levels, self.n_heads, self.n_points = n_levels, n_heads, n_points
        self.sampling_offsets = torch.nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = torch.nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = torch.nn.Linear(d_model, d_model)
        self.output_proj = torch.nn.Linear(d_model, d_model)

    def forward(self, query, reference_points, flat, shapes, starts, padding_mask=None):
        n, lq, c = query.shape
        value = self.value_proj(flat)
        if padding_mask is not None:
            value = value.masked_fill(padding_mask[..., None], 0.0)
        value = value.view(n, flat.shape[1], self.n_heads, c // self.n_heads)
        offsets = self.sampling_offsets(query).view(n, lq, self.n_heads, self.n_levels, self.n_points, 2)
        weights = F.softmax(self.attention_weights(query).view(n, lq, self.n_heads, -1), -1).view(
            n, lq, self.n_heads, self.n_levels, self.n_points)
        if reference_points.shape[-1] == 2:
            wh = shapes.flip(-1).to(query.dtype)
            loc = reference_points[:, :, None, :, None] + offsets / wh[None, None, None, :, None]
        else:
            loc = reference_points[:, :, None, :, None, :2] + offsets / self.n_points * \
                reference_points[:, :, None, :, None, 2:] * 0.5
        return self.output_proj(grid_sample_reference(value, shapes, starts, loc, weights))


@pytest.mark.parametrize("coords", [2, 4])
def test_module_loads_a_state_dict_of_the_original_names_and_matches(coords):
    torch.manual_seed(0)
    d_model, levels, heads, points = 32, 2, 4, 3
    plain = _PlainMSDeformAttn(d_model, levels, heads, points).double()
    ours = opforge.MSDeformAttn(d_model, levels, heads, points).double()
    assert set(ours.state_dict()) == set(plain.state_dict())
    ours.load_state_dict(plain.state_dict())
    shapes, starts, s = level_layout(((6, 5), (3, 3)))
    query, flat = torch.randn(2, 7, d_model, dtype=torch.float64), torch.randn(2, s, d_model, dtype=torch.float64)
    reference = torch.rand(2, 7, levels, coords, dtype=torch.float64)
    mask = torch.zeros(2, s, dtype=torch.bool)
    mask[1, -4:] = True
    torch.testing.assert_close(ours(query, reference, flat, shapes, starts, mask),
                               plain(query, reference, flat, shapes, starts, mask), rtol=1e-10, atol=1e-10)


def test_module_initialisation_is_the_original():
    attn = opforge.MSDeformAttn(d_model=64, n_levels=3, n_heads=8, n_points=4)
    assert not attn.sampling_offsets.weight.any() and not attn.attention_weights.weight.any()
    assert not attn.attention_weights.bias.any() and not attn.value_proj.bias.any()
    ring = attn.sampling_offsets.bias.view(8, 3, 4, 2)
    for head in range(8):
        angle = 2 * math.pi * head / 8
        direction = torch.tensor([math.cos(angle), math.sin(angle)])
        direction = direction / direction.abs().max()
        for point in range(4):
            torch.testing.assert_close(ring[head, :, point], (direction * (point + 1)).expand(3, 2))
    with pytest.raises(ValueError, match="d_model must be divisible by n_heads"):
        opforge.MSDeformAttn(d_model=30, n_heads=8)


def test_module_trains_and_exports_with_both_exporters():
    torch.manual_seed(0)
    attn = opforge.MSDeformAttn(d_model=16, n_levels=2, n_heads=2, n_points=2)
    shapes, starts, s = level_layout(((4, 4), (2, 3)))
    query, flat, ref = torch.randn(1, 5, 16), torch.randn(1, s, 16), torch.rand(1, 5, 2, 2)
    out = attn(query, ref, flat, shapes, starts)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())
    names = ["query", "reference_points", "input_flatten", "input_spatial_shapes", "input_level_start_index"]
    args = (query, ref, flat, shapes, starts)
    for dynamo in (True, False):
        proto = opforge.export(attn, args, dynamo=dynamo, input_names=names, opset_version=18 if dynamo else 17)
        (got,) = opforge.ort_session(proto).run(None, {n: t.numpy() for n, t in zip(names, args)})
        np.testing.assert_allclose(got, attn(*args).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_float_inputs_of_different_types_are_refused_naming_both():
    value, shapes, starts, loc, weights = random_inputs()
    model = single_node_model(MS_DEFORM_ATTN, (value.float(), shapes, starts, loc, weights.float(), 64))
    with pytest.raises(NodeTypeError, match=r"gets input 'sampling_locations' of type tensor\(double\) but 'value' of "
                                            r"type tensor\(float\); they share one element type \(T\)"):
        opforge.ort_session(model)
