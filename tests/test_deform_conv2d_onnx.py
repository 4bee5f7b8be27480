"""deform_conv2d round trips: torchvision and opforge models, both exporters, custom op (opset 17/18)
and standard DeformConv (opset 19/20), in ONNX Runtime and onnx.reference; our ORT kernel vs ORT's
built-in DeformConv; ORT error statuses."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torchvision
from onnx import TensorProto, helper

import opforge
from opforge.symbolics import reference

from helpers import DCNv1Block, DCNv2Block, deform_inputs


MODELS = {
    "torchvision-dcnv2": lambda: DCNv2Block(torchvision.ops.DeformConv2d),
    "opforge-dcnv2": lambda: DCNv2Block(opforge.DeformConv2d),
    "opforge-dcnv1-stride2": lambda: DCNv1Block(),
}
CASES = [(e, o) for e in ("torchscript", "dynamo") for o in (17, 18, 19, 20) if not (e == "dynamo" and o < 18)]
#: onnx.reference outputs by (graph, the implementation each node resolves to, input): its DeformConv
#: runs Python loops, 3-6 s a run here, and a model exports to the same graph at opsets 19 and 20,
#: whose nodes resolve to the same implementations (DeformConv-19, Conv-11, ...): evaluated once.
_REFERENCE_OUTPUTS: dict = {}


def export(model, x, exporter, opset, **kw):
    dynamo = exporter == "dynamo"
    if dynamo:
        dims = {0: torch.export.Dim("n"), 2: torch.export.Dim("h", min=4), 3: torch.export.Dim("w", min=4)}
        dyn = dict(dynamic_shapes=(dims,))
    else:
        dyn = dict(dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}})
    return opforge.export(model, (x,), dynamo=dynamo, opset_version=opset, input_names=["x"], **dyn, **kw)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _reference_output(proto, x: np.ndarray) -> np.ndarray:
    opsets = {o.domain: o.version for o in proto.opset_import}
    nodes = list(proto.graph.node) + [n for f in proto.functions for n in f.node]
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes for a in n.attribute):
        return reference.evaluator(proto).run(None, {"x": x})[0]  # subgraphs: not keyed here
    resolved = tuple(onnx.defs.get_schema(n.op_type, opsets[""], "").since_version if n.domain in ("", "ai.onnx")
                     else (n.domain, opsets.get(n.domain)) for n in nodes)
    key = (proto.graph.SerializeToString(), tuple(f.SerializeToString() for f in proto.functions), resolved,
           x.shape, x.tobytes())
    if key not in _REFERENCE_OUTPUTS:
        _REFERENCE_OUTPUTS[key] = reference.evaluator(proto).run(None, {"x": x})[0]
    return _REFERENCE_OUTPUTS[key]


def _round_trip_cases():
    # the opsets of one model and exporter on one worker: they share the reference's runs
    return [pytest.param(m, e, o, marks=pytest.mark.xdist_group(f"dcn-round-trip:{m}:{e}"), id=f"{m}-{e}-opset{o}")
            for m in MODELS for e, o in CASES]


@pytest.mark.parametrize("model_name,exporter,opset", _round_trip_cases())
def test_round_trip(model_name, exporter, opset):
    model = MODELS[model_name]().eval()
    proto = export(model, torch.randn(2, 4, 9, 11), exporter, opset)
    onnx.checker.check_model(proto, full_check=True)
    kinds = [(n.domain, n.op_type) for n in proto.graph.node if "eform" in n.op_type]
    assert kinds == ([("", "DeformConv")] if opset >= 19 else [("opforge", "deform_conv2d")])

    x = torch.randn(3, 4, 12, 7)  # other batch and spatial size than at export
    with torch.no_grad():
        expected = model(x).numpy()
    (got,) = opforge.ort_session(proto).run(None, {"x": x.numpy()})
    ref = _reference_output(proto, x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ref, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_custom_op_can_be_forced_at_any_opset(exporter):
    model = DCNv2Block(torchvision.ops.DeformConv2d).eval()
    proto = export(model, torch.randn(1, 4, 8, 8), exporter, 20, standard_onnx=False)
    assert [(n.domain, n.op_type) for n in proto.graph.node if "eform" in n.op_type] == [("opforge", "deform_conv2d")]
    x = torch.randn(2, 4, 10, 9)
    with torch.no_grad():
        np.testing.assert_allclose(opforge.ort_session(proto).run(None, {"x": x.numpy()})[0], model(x).numpy(),
                                   rtol=1e-4, atol=1e-4)


def test_standard_deform_conv_below_opset_19_is_a_clear_error():
    with pytest.raises(ValueError, match=r"opforge::deform_conv2d has no standard-ONNX equivalent at opset 17"):
        export(DCNv2Block(torchvision.ops.DeformConv2d).eval(), torch.randn(1, 4, 8, 8), "dynamo", 17,
               standard_onnx={"deform_conv2d"})


def test_plain_torch_onnx_export_of_a_torchvision_model():
    """After `import opforge`, torchvision's DeformConv2d exports with plain torch.onnx.export(dynamo=False)."""
    import io

    buf = io.BytesIO()
    model = DCNv2Block(torchvision.ops.DeformConv2d).eval()
    torch.onnx.export(model, (torch.randn(1, 4, 8, 8),), buf, dynamo=False, opset_version=16, input_names=["x"])
    proto = onnx.load_from_string(buf.getvalue())
    assert ("opforge", "deform_conv2d") in [(n.domain, n.op_type) for n in proto.graph.node]
    x = torch.randn(1, 4, 8, 8)
    with torch.no_grad():
        np.testing.assert_allclose(opforge.ort_session(proto).run(None, {"x": x.numpy()})[0], model(x).numpy(),
                                   rtol=1e-4, atol=1e-4)


# ---- the ORT kernel against ORT's built-in DeformConv ---------------------------------

ATTRS = ("stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "groups", "offset_groups")


def custom_model(elem, stride, pad, dil, groups, offset_groups, use_mask):
    names = ["input", "weight", "offset", "mask", "bias"]
    vals = dict(zip(ATTRS, (*stride, *pad, *dil, groups, offset_groups)), use_mask=int(use_mask))
    node = helper.make_node("deform_conv2d", names, ["y"], domain="opforge", **vals)
    graph = helper.make_graph([node], "dcn", [helper.make_tensor_value_info(n, elem, None) for n in names],
                              [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("opforge", 1)])


def builtin_model(elem, stride, pad, dil, groups, offset_groups, use_mask):
    names = ["input", "weight", "offset", "bias"] + (["mask"] if use_mask else [])
    node = helper.make_node("DeformConv", names, ["y"], dilations=list(dil), group=groups, offset_group=offset_groups,
                            pads=[pad[0], pad[1], pad[0], pad[1]], strides=list(stride))
    graph = helper.make_graph([node], "dcn", [helper.make_tensor_value_info(n, elem, None) for n in names],
                              [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


KERNEL_CASES = {
    "dcnv2-3x3": dict(n=2, c=8, o=6, h=10, w=9, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=2, offset_groups=2),
    "dcnv1-mixed": dict(n=3, c=6, o=4, h=9, w=8, kh=3, kw=2, stride=(1, 2), pad=(1, 0), dil=(1, 2), groups=2, offset_groups=3),
    "multi-tile": dict(n=2, c=64, o=16, h=30, w=31, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_ort_kernel_matches_ort_builtin_and_torch(name, threads):
    cfg = KERNEL_CASES[name]
    use_mask = "dcnv1" not in name
    x, w, off, mask, b = deform_inputs(**cfg, dtype=torch.float32)
    attrs = (cfg["stride"], cfg["pad"], cfg["dil"], cfg["groups"], cfg["offset_groups"], use_mask)
    feeds = {"input": x.numpy(), "weight": w.numpy(), "offset": off.numpy(), "bias": b.numpy()}
    ours = opforge.ort_session(custom_model(TensorProto.FLOAT, *attrs), intra_op_num_threads=threads)
    (got,) = ours.run(None, {**feeds, "mask": mask.numpy()})
    builtin = ort.InferenceSession(builtin_model(TensorProto.FLOAT, *attrs).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (anchor,) = builtin.run(None, {**feeds, **({"mask": mask.numpy()} if use_mask else {})})
    expected = opforge.deform_conv2d(x, off, w, b, stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dil"],
                                     mask=mask if use_mask else None)
    np.testing.assert_allclose(got, anchor, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got, expected.numpy())  # same core as the torch kernel: bit-identical


def test_ort_kernel_float64():
    cfg = KERNEL_CASES["dcnv1-mixed"]
    x, w, off, mask, b = deform_inputs(**cfg, dtype=torch.float64)
    sess = opforge.ort_session(custom_model(TensorProto.DOUBLE, cfg["stride"], cfg["pad"], cfg["dil"], 2, 3, True))
    (got,) = sess.run(None, {"input": x.numpy(), "weight": w.numpy(), "offset": off.numpy(), "mask": mask.numpy(),
                             "bias": b.numpy()})
    expected = torchvision.ops.deform_conv2d(x, off, w, b, stride=cfg["stride"], padding=cfg["pad"],
                                             dilation=cfg["dil"], mask=mask)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ort_kernel_16bit_types_match_torch_bit_for_bit(dtype):
    """float16 / bfloat16: both kernels compute in float32 with the same core and round once."""
    cfg = KERNEL_CASES["dcnv2-3x3"]
    x, w, off, mask, b = deform_inputs(**cfg, dtype=torch.float32)
    x, w, off, mask, b = (t.to(dtype) for t in (x, w, off, mask, b))
    elem = TensorProto.FLOAT16 if dtype == torch.float16 else TensorProto.BFLOAT16
    sess = opforge.ort_session(custom_model(elem, cfg["stride"], cfg["pad"], cfg["dil"], 2, 2, True))
    # numpy has no bfloat16: feed / read raw 16-bit patterns through OrtValue
    def ort_value(t):
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(t.view(torch.int16).numpy(), elem)
    io = sess.io_binding()
    for name, t in zip(["input", "weight", "offset", "mask", "bias"], (x, w, off, mask, b)):
        io.bind_ortvalue_input(name, ort_value(t))
    expected = opforge.deform_conv2d(x, off, w, b, stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dil"],
                                     mask=mask)
    out_bits = np.full(tuple(expected.shape), -1, dtype=np.int16)  # ORT writes into this buffer
    io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out_bits, elem))
    sess.run_with_iobinding(io)
    got = torch.from_numpy(out_bits).view(dtype)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    reference = torchvision.ops.deform_conv2d(*(t.double() for t in (x, off, w, b)), stride=cfg["stride"],
                                              padding=cfg["pad"], dilation=cfg["dil"], mask=mask.double())
    torch.testing.assert_close(got.double(), reference, rtol=2e-2, atol=5e-2)


def test_ort_bad_inputs_give_error_status_and_session_survives():
    cfg = KERNEL_CASES["dcnv2-3x3"]
    x, w, off, mask, b = deform_inputs(**cfg, dtype=torch.float32)
    sess = opforge.ort_session(custom_model(TensorProto.FLOAT, (1, 1), (1, 1), (1, 1), 2, 2, True))
    good = {"input": x.numpy(), "weight": w.numpy(), "offset": off.numpy(), "mask": mask.numpy(), "bias": b.numpy()}
    bad_feeds = {
        r"offset must have shape \[2, 36, 10, 9\]": dict(offset=off.numpy()[:, :35]),
        r"mask must have shape \[2, 18, 10, 9\]": dict(mask=mask.numpy()[:, :, :9]),
        r"weight.size\(1\) \* groups must equal input channels": dict(weight=w.numpy()[:, :3]),
        r"input must be 4-D": dict(input=x.numpy()[0]),
    }
    for msg, override in bad_feeds.items():
        with pytest.raises(Exception, match="INVALID_ARGUMENT.*opforge::deform_conv2d: .*" + msg):
            sess.run(None, {**good, **override})
    (got,) = sess.run(None, good)
    expected = opforge.deform_conv2d(x, off, w, b, padding=1, mask=mask)
    np.testing.assert_array_equal(got, expected.numpy())


@pytest.mark.parametrize("attrs,msg", [
    (((0, 1), (1, 1), (1, 1), 2, 2), r"stride must be positive, got \(0, 1\)"),
    (((1, 1), (1, 1), (1, 0), 2, 2), r"dilation must be positive, got \(1, 0\)"),
], ids=["stride", "dilation"])
def test_ort_bad_attributes_fail_the_session(attrs, msg):
    # attribute-only rules are checked when the kernel is created: no run ever sees them
    with pytest.raises(Exception, match="opforge::deform_conv2d: " + msg):
        opforge.ort_session(custom_model(TensorProto.FLOAT, *attrs, True))


def test_ort_attributes_that_disagree_with_the_shapes_give_error_status():
    x, w, off, mask, b = deform_inputs(**KERNEL_CASES["dcnv2-3x3"], dtype=torch.float32)
    sess = opforge.ort_session(custom_model(TensorProto.FLOAT, (1, 1), (1, 1), (1, 1), 3, 2, True))
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*opforge::deform_conv2d: groups \(3\) must divide input "
                                        r"channels \(8\)"):
        sess.run(None, {"input": x.numpy(), "weight": w.numpy(), "offset": off.numpy(), "mask": mask.numpy(),
                        "bias": b.numpy()})


# ---- a realistic model ------------------------------------------------------------------

class DCNBasicBlock(torch.nn.Module):
    """ResNet basic block whose 3x3 convs are modulated deformable convs (DCNv2)."""

    def __init__(self, channels, dcn_cls):
        super().__init__()
        self.offsets = torch.nn.ModuleList(torch.nn.Conv2d(channels, 27, 3, padding=1) for _ in range(2))
        self.dcns = torch.nn.ModuleList(dcn_cls(channels, channels, 3, padding=1, bias=False) for _ in range(2))
        self.bns = torch.nn.ModuleList(torch.nn.BatchNorm2d(channels) for _ in range(2))
        for off in self.offsets:  # offsets start small, like trained DCN layers
            torch.nn.init.normal_(off.weight, std=0.01)
            torch.nn.init.zeros_(off.bias)

    def forward(self, x):
        y = x
        for i in range(2):
            om = self.offsets[i](y)
            y = self.bns[i](self.dcns[i](y, om[:, :18], torch.sigmoid(om[:, 18:])))
            y = torch.relu(y) if i == 0 else y
        return torch.relu(x + y)


class SmallDCNResNet(torch.nn.Module):
    def __init__(self, dcn_cls):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
        self.blocks = torch.nn.Sequential(DCNBasicBlock(16, dcn_cls), DCNBasicBlock(16, dcn_cls))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


@pytest.mark.parametrize("dcn_cls", [torchvision.ops.DeformConv2d, opforge.DeformConv2d], ids=["torchvision", "opforge"])
@pytest.mark.parametrize("exporter,opset", [("torchscript", 17), ("torchscript", 19), ("dynamo", 18), ("dynamo", 19)])
def test_small_dcn_resnet_runs_in_ort(dcn_cls, exporter, opset):
    model = SmallDCNResNet(dcn_cls).eval()
    with torch.no_grad():  # non-trivial BN statistics
        for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.1, 0.1)
            bn.running_var.uniform_(0.5, 1.5)
    proto = export(model, torch.randn(1, 3, 32, 32), exporter, opset)
    n_dcn = sum("eform" in n.op_type for n in proto.graph.node)
    assert n_dcn == 4
    x = torch.randn(2, 3, 40, 36)
    with torch.no_grad():
        expected = model(x).numpy()
    (got,) = opforge.ort_session(proto).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


class _DcnBlock(torch.nn.Module):
    """What users export: offsets and mask from a conv, opforge's DeformConv2d (in training mode,
    as a freshly built model is)."""

    def __init__(self):
        super().__init__()
        self.offset_mask = torch.nn.Conv2d(4, 27, 3, padding=1)
        self.dcn = opforge.DeformConv2d(4, 6, 3, padding=1)

    def forward(self, x):
        om = self.offset_mask(x)
        return self.dcn(x, om[:, :18], torch.sigmoid(om[:, 18:]))


@pytest.mark.parametrize("how", ["opforge.export-torchscript", "opforge.export-dynamo", "torch.onnx.export-torchscript"])
def test_a_clean_export_prints_no_warning_from_opforge(how, tmp_path):
    import os
    import warnings

    model, x = _DcnBlock(), torch.randn(2, 4, 8, 8)
    package = os.path.dirname(opforge.__file__)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "opforge.export-torchscript":
            opforge.export(model, (x,), dynamo=False, opset_version=17, input_names=["x"],
                           dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}})
        elif how == "opforge.export-dynamo":
            opforge.export(model, (x,), dynamo=True, dynamic_shapes=({0: torch.export.Dim("n")},))
        else:
            torch.onnx.export(model, (x,), str(tmp_path / "m.onnx"), dynamo=False, opset_version=17,
                              input_names=["x"], dynamic_axes={"x": {0: "n"}})
    ours = [f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}" for w in caught
            if w.filename.startswith(package) or issubclass(w.category, torch.jit.TracerWarning)
            or "training mode" in str(w.message)]
    assert ours == []
    if how.startswith("opforge"):  # nothing at all: torch's own notices about the legacy exporter are muted there
        assert [str(w.message) for w in caught] == []
    assert model.training  # the model's mode is restored


class _FrozenBackboneDetector(torch.nn.Module):
    """The usual detector: a training model whose backbone is frozen in eval mode (BatchNorm with
    fixed statistics), a training head with Dropout and BatchNorm."""

    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                            torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Conv2d(8, 27, 3, padding=1), torch.nn.BatchNorm2d(27),
                                        torch.nn.Dropout(0.5))
        self.dcn = opforge.DeformConv2d(8, 6, 3, padding=1)

    def forward(self, x):
        f = self.backbone(x)
        om = self.head(f)
        return self.dcn(f, om[:, :18], torch.sigmoid(om[:, 18:]))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_export_leaves_every_training_flag_and_buffer_as_it_was(dynamo):
    model = _FrozenBackboneDetector()
    model.backbone.eval()
    with torch.no_grad():  # statistics that differ from BatchNorm's initial ones
        for bn in (model.backbone[1], model.head[1]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    flags = {name: m.training for name, m in model.named_modules()}
    assert flags["backbone"] is False and flags["backbone.1"] is False and flags["head.2"] is True
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    opforge.export(model, (torch.randn(2, 4, 8, 8),), dynamo=dynamo, opset_version=18 if dynamo else 17)
    assert {name: m.training for name, m in model.named_modules()} == flags
    after = model.state_dict()
    assert after.keys() == buffers.keys()
    for k, v in buffers.items():
        assert torch.equal(after[k], v), f"{k} changed by the export"


def test_plain_torchscript_export_after_import_opforge_keeps_every_training_flag(tmp_path):
    """torch's own TorchScript exporter restores with model.train(), which sets every submodule;
    after `import opforge` it keeps each submodule's flag too."""
    model = _FrozenBackboneDetector()
    model.backbone.eval()
    flags = {name: m.training for name, m in model.named_modules()}
    torch.onnx.export(model, (torch.randn(2, 4, 8, 8),), str(tmp_path / "m.onnx"), dynamo=False, opset_version=17)
    assert {name: m.training for name, m in model.named_modules()} == flags
    model.eval()  # and an eval model stays eval
    torch.onnx.export(model, (torch.randn(2, 4, 8, 8),), str(tmp_path / "m.onnx"), dynamo=False, opset_version=17)
    assert not any(m.training for m in model.modules())
