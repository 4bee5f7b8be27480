"""A model file is data: libopforge_aten runs only a vetted set of ATen operators, refuses the rest
when the session is created (in the C++ library itself, so plain ONNX Runtime users get it, and
in opforge's Python before anything runs), lets a trusted model opt in, and bounds the sizes a
model asks for."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import opforge
from opforge.spec import ATEN_DOMAIN
from opforge.aten import fallback, nodes, policy

from helpers import Lambda, aten_model


def _plain_session(model: onnx.ModelProto, **config):
    """A session as a plain ONNX Runtime user makes one: no opforge Python in the path."""
    so = ort.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    so.register_custom_ops_library(opforge.aten_library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _from_file_model(path: str, size: int = 16, prepared: bool = True) -> onnx.ModelProto:
    """The issue's five-line model: ATen(operator="from_file", filename=path, size=size). ``prepared``:
    in the form fallback.prepare writes (constant inputs), which libopforge_aten reads as is;
    else as a hand-written g.at node writes it (typed attributes)."""
    if not prepared:
        node = helper.make_node("ATen", [], ["y"], domain=ATEN_DOMAIN, operator="from_file",
                                filename=path, size=size)
        inits = []
    else:
        inits = [helper.make_tensor("fname", TensorProto.STRING, [], [path.encode()]),
                 numpy_helper.from_array(np.zeros(0, np.int64), nodes.NONE_INPUT),
                 helper.make_tensor("size", TensorProto.INT64, [], [size])]
        node = helper.make_node("ATen", ["fname", nodes.NONE_INPUT, "size"], ["y"],
                                domain=ATEN_DOMAIN, operator="from_file", overload_name="")
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ATEN_DOMAIN, 1)])


# ---- the attack from the issue ------------------------------------------------------------

@pytest.mark.parametrize("prepared", [True, False], ids=["prepared-form", "g.at-form"])
def test_a_model_cannot_read_etc_passwd_through_ort_session(prepared):
    model = _from_file_model("/etc/passwd", prepared=prepared)
    with pytest.raises(policy.AtenOpRefused, match=r"aten::from_file is refused: reads the file the model names"):
        opforge.ort_session(model.SerializeToString())


def test_a_model_cannot_read_etc_passwd_through_plain_onnxruntime():
    with pytest.raises(Exception, match=r"aten::from_file is refused: reads the file the model names.*"
                                        r"add_session_config_entry\('opforge.aten.allow', 'from_file'\)"):
        _plain_session(_from_file_model("/etc/passwd"))


def test_a_trusted_model_opts_in_by_name(tmp_path):
    data = np.arange(4, dtype=np.float32)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    model = _from_file_model(str(path), size=4)
    (got,) = opforge.ort_session(model, allow_aten={"from_file"}).run(None, {})
    np.testing.assert_array_equal(got, data)
    (got,) = _plain_session(model, **{policy.ALLOW_CONFIG_KEY: "cummax, aten::from_file"}).run(None, {})
    np.testing.assert_array_equal(got, data)
    (got,) = _plain_session(model, **{policy.ALLOW_CONFIG_KEY: "*"}).run(None, {})
    np.testing.assert_array_equal(got, data)
    # the opt-in belongs to the session it was given to, not to the process
    with pytest.raises(Exception, match="aten::from_file is refused"):
        _plain_session(model)


def test_allow_aten_given_after_the_library_is_registered_is_an_error():
    so = ort.SessionOptions()
    so.register_custom_ops_library(opforge.aten_library_path())
    with pytest.raises(ValueError, match="allow_aten must be set before libopforge_aten is registered"):
        opforge.ort_session(_from_file_model("/nonexistent"), so, allow_aten={"from_file"})


# ---- the list of dangerous operators ------------------------------------------------------

#: (operator, overload, what the refusal says): files, uninitialised memory, storage and strides,
#: the global RNG, packed weights read from raw bytes, unchecked sparse indices, pinned memory,
#: backward kernels, `unsafe` flags, quantization and other ops' internal kernels (issue #43),
#: private operators, and overloads that write into their arguments.
DANGEROUS = [
    ("from_file", "", "reads the file the model names"),
    ("empty", "memory_format", "uninitialised memory"),
    ("empty_like", "", "uninitialised memory"),
    ("new_empty", "", "uninitialised memory"),
    ("empty_strided", "", "uninitialised memory"),
    ("as_strided", "", "storage or strides"),
    ("as_strided_copy", "", "storage or strides"),
    ("as_strided_scatter", "", "storage or strides"),
    ("set", "source_Tensor", "storage or strides"),
    ("resize", "", "storage or strides"),
    ("unsafe_split", "Tensor", "storage or strides"),
    ("bernoulli", "", "random-number generator"),
    ("rand", "", "random-number generator"),
    ("randn_like", "", "random-number generator"),
    ("normal", "Tensor_float", "random-number generator"),
    ("multinomial", "", "random-number generator"),
    ("randperm", "", "random-number generator"),
    ("dropout", "", "random-number generator"),
    ("native_dropout", "", "random-number generator"),
    ("fbgemm_linear_fp16_weight", "", "packed weights from raw bytes"),
    ("mkldnn_reorder_conv2d_weight", "", "backend-specific"),
    ("sparse_coo_tensor", "indices", "unchecked indices"),
    ("pin_memory", "", "page-locked"),
    ("combinations", "", "grows as n\\^r"),
    ("max_pool2d_with_indices_backward", "", "a backward kernel: it takes another op's saved results"),
    ("embedding_dense_backward", "", "a backward kernel"),
    ("segment_reduce", "", "an 'unsafe' flag"),
    ("choose_qparams_optimized", "", "a quantization internal"),
    ("slow_conv3d", "", "an internal kernel of another op"),
    ("_local_scalar_dense", "", "not in the vetted set"),
    ("_pin_memory", "", "not in the vetted set"),
    ("add_", "Tensor", "writes into its argument 'self'"),
    ("add", "out", "writes into its argument 'out'"),
    ("copy_", "", "writes into its argument 'self'"),
]


@pytest.mark.parametrize("operator,overload,why", DANGEROUS, ids=[f"{o}.{v or 'default'}" for o, v, _ in DANGEROUS])
def test_dangerous_operators_are_refused_by_the_library_at_session_creation(operator, overload, why):
    model = aten_model(operator, overload, [("x", TensorProto.FLOAT)])
    with pytest.raises(Exception, match=f"aten::{operator}.*{why}") as caught:
        _plain_session(model)
    assert "Exception during initialization" in str(caught.value)  # at creation, not at run time


@pytest.mark.parametrize("operator,overload,why", [d for d in DANGEROUS if "writes" not in d[2]],
                         ids=[o for o, _, w in DANGEROUS if "writes" not in w])
def test_dangerous_operators_are_refused_by_opforge_before_anything_runs(operator, overload, why):
    model = aten_model(operator, overload, [("x", TensorProto.FLOAT)])
    with pytest.raises(policy.AtenOpRefused, match=f"aten::{operator} is refused: .*{why}"):
        opforge.ort_session(model)
    with pytest.raises(policy.AtenOpRefused):
        fallback.prepare(model)


def test_the_export_of_a_refused_operator_fails_unless_allowed():
    model = Lambda(torch.poisson)  # no ONNX translation: an ATen node
    x = torch.zeros(2, 3)
    with pytest.raises(policy.AtenOpRefused, match="aten::poisson is refused: draws from"):
        opforge.export(model, (x,), dynamo=False, aten_fallback=True, opset_version=17, input_names=["x"])
    with pytest.warns(fallback.AtenFallbackWarning, match="poisson"):
        proto = opforge.export(model, (x,), dynamo=False, aten_fallback=True, opset_version=17, input_names=["x"],
                               allow_aten={"poisson"})
    (got,) = opforge.ort_session(proto, allow_aten=["poisson"]).run(None, {"x": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(got, np.zeros((2, 3), np.float32))  # rate 0: always 0


# ---- the committed list -------------------------------------------------------------------

def test_the_committed_list_is_what_the_rules_give_over_this_torch():
    """policy.inc is generated from aten_policy's rules; a torch that adds or changes
    operators makes this fail, so the new ones are reviewed (regenerate with --write)."""
    allowed, refused = policy.generate()
    assert policy.POLICY_FILE.read_text() == policy.render(allowed, refused)
    assert set(allowed) == policy.committed()[0]


def test_every_allowed_operator_is_functional_and_draws_no_random_numbers():
    ops = policy._dispatcher_ops()
    allowed, refused = policy.committed()
    assert not allowed & set(refused)
    for name in allowed:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            assert torch.Tag.nondeterministic_seeded not in op.tags, name
            assert "Generator" not in str(op._schema), name
        assert ops[name], name  # has an overload that writes into no argument


#: What the policy costs the coverage table: of its ATen ops, these are refused as ATen nodes
#: (the bridge still exports all of them as standard ONNX; only ATen-fallback nodes are affected).
COVERAGE_REFUSED = {
    "as_strided", "as_strided_copy", "unsafe_split",  # storage / strides by hand
    "empty", "empty_like", "new_empty",  # uninitialised memory
    "bernoulli", "dropout", "native_dropout", "gru", "lstm", "multinomial", "normal", "rand", "rand_like", "randint",
    "randint_like", "randn", "randn_like", "scaled_dot_product_attention",  # the global RNG
}


def test_every_op_of_the_coverage_table_runs_or_is_refused_with_a_reason():
    coverage = json.loads((policy.POLICY_FILE.parents[1] / "coverage.json").read_text())
    counted = set().union(*(set(v) for k, v in coverage.items() if k.isdigit()))
    allowed, refused = policy.committed()
    dispatcher = set(policy._dispatcher_ops())
    counted &= dispatcher  # aten::tensor is TorchScript's, not the dispatcher's
    assert counted - allowed == COVERAGE_REFUSED
    assert all(name in refused for name in COVERAGE_REFUSED)
    assert len(counted & allowed) == 384  # of 404: the measured effect (closing note, README)


# ---- sizes a model asks for ---------------------------------------------------------------

def _zeros_model(size_name="size") -> onnx.ModelProto:
    node = helper.make_node("ATen", ["size"], ["y"], domain=ATEN_DOMAIN, operator="zeros",
                            overload_name="")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("size", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ATEN_DOMAIN, 1)])


def test_a_model_cannot_demand_terabytes():
    sess = _plain_session(_zeros_model())
    np.testing.assert_array_equal(sess.run(None, {"size": np.array([3, 4])})[0], np.zeros((3, 4), np.float32))
    with pytest.raises(Exception, match=r"ATen op aten::zeros: argument 0 'size' \(SymInt\[\]\) asks for "
                                        r"1099511627776 elements, more than this node may make \(33554432"):
        sess.run(None, {"size": np.array([1 << 20, 1 << 20])})
    np.testing.assert_array_equal(sess.run(None, {"size": np.array([2, 2])})[0], np.zeros((2, 2), np.float32))


@pytest.mark.parametrize("operator,overload,consts,what", [
    ("repeat", "", [np.array([1 << 20, 1 << 20])], "argument 1 'repeats'"),
    ("expand", "", [np.array([1 << 16, 1 << 16, 3])], "argument 1 'size'"),
    ("one_hot", "", [np.array(1 << 40)], "argument 1 'num_classes'"),
    ("one_hot", "", [np.array(1 << 25)], "argument 1 'num_classes' \\(int\\) asks for 100663296"),  # 3 rows of 2^25
    ("constant_pad_nd", "", [np.array([1 << 40, 0])], "argument 1 'pad'"),
    ("unfold", "", [np.array(0), np.array(1 << 14), np.array(1)], "return 0 has"),  # a view: bounded before the copy
])
def test_sizes_from_the_model_are_bounded_by_the_inputs(operator, overload, consts, what):
    x = np.ones(1 << 16 if operator == "unfold" else 3, np.int64 if operator == "one_hot" else np.float32)
    ttype = TensorProto.INT64 if operator == "one_hot" else TensorProto.FLOAT
    model = aten_model(operator, overload, [("x", ttype)], consts=consts, out_types=(ttype,))
    sess = opforge.ort_session(model)
    with pytest.raises(Exception, match=f"{what}.*more than this node may make"):
        sess.run(None, {"x": x})


def test_counts_that_make_a_matrix_together_are_bounded():
    model = aten_model("eye", "m", [], consts=[np.array(1 << 16), np.array(1 << 16)], out_types=(TensorProto.FLOAT,))
    with pytest.raises(Exception, match="'n' times 'm' asks for 4294967296 elements"):
        opforge.ort_session(model).run(None, {})
    model = aten_model("eye", "m", [], consts=[np.array(2), np.array(3)], out_types=(TensorProto.FLOAT,))
    np.testing.assert_array_equal(opforge.ort_session(model).run(None, {})[0], np.eye(2, 3, dtype=np.float32))


def test_arange_extent_is_bounded():
    model = aten_model("arange", "", [], consts=[np.array(1e15)], out_types=(TensorProto.FLOAT,))
    with pytest.raises(Exception, match="its range asks for 1000000000000000 elements"):
        opforge.ort_session(model).run(None, {})
    model = aten_model("arange", "", [], consts=[np.array(5.0)], out_types=(TensorProto.FLOAT,))
    np.testing.assert_array_equal(opforge.ort_session(model).run(None, {})[0], np.arange(5, dtype=np.float32))


def test_the_size_bound_is_a_session_setting():
    key = policy.MAX_ELEMENTS_CONFIG_KEY
    sess = _plain_session(_zeros_model(), **{key: "10"})
    np.testing.assert_array_equal(sess.run(None, {"size": np.array([2, 5])})[0], np.zeros((2, 5), np.float32))
    with pytest.raises(Exception, match=f"asks for 12 elements, more than this node may make \\(10, set by '{key}'"):
        sess.run(None, {"size": np.array([3, 4])})
    with pytest.raises(Exception, match=f"'{key}' must be a positive integer, got 'lots'"):
        _plain_session(_zeros_model(), **{key: "lots"})


def test_diagnose_says_when_the_fallback_needs_an_opt_in():
    d = opforge.diagnose(Lambda(torch.poisson), (torch.zeros(2, 3),), opset_version=17)
    (poisson,) = [u for u in d.unsupported if "poisson" in u.op]
    assert poisson.way == "ATen fallback"
    assert "refuses it by default (draws from the process-wide random-number generator)" in poisson.advice
    assert "allow_aten={'poisson'}" in poisson.advice
    (cummax,) = opforge.diagnose(Lambda(lambda x: torch.cummax(x, 1)), (torch.zeros(2, 3),), opset_version=17).unsupported
    assert "allow_aten" not in cummax.advice
