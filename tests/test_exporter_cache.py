"""opforge.exporter_cache: the dynamo exporter's torchlib registry and torch's
CompositeImplicitAutograd list built once per process while opforge exports, not once per export.
The models must not change: the same bytes as torch's own exporter writes without the cache."""

import functools

import pytest
import torch
from torch._C import DispatchKey
from torch.onnx._internal.exporter import _registration

import opforge
from opforge import exporter_cache
from opforge.symbolics import dynamo as dynamo_rules


class _Mixed(torch.nn.Module):
    # an opforge op (custom translation), a torchlib op and a decomposed one (aten::addcmul)
    def forward(self, a, b):
        return torch.addcmul(opforge.my_add(a, b).sin(), a, b, value=0.5)


ARGS = (torch.randn(3, 4), torch.randn(3, 4))


def _torch_export(opset, table):
    program = torch.onnx.export(_Mixed().eval(), ARGS, dynamo=True, opset_version=opset, custom_translation_table=table,
                                verbose=False)
    return program.model_proto.SerializeToString()


def test_models_are_the_same_bytes_with_and_without_the_cache():
    for opset in (18, 20):
        table = dynamo_rules.translation_table(None, opset)
        without = _torch_export(opset, table)
        with exporter_cache.reused_exporter_setup():
            first, again = _torch_export(opset, table), _torch_export(opset, table)
        assert first == without and again == without


def test_the_registry_is_built_once_per_opset_and_copied_per_export(monkeypatch):
    builds = []
    original = exporter_cache._ORIGINALS.get("from_torchlib", _registration.ONNXRegistry.__dict__["from_torchlib"])

    def counting(cls, opset_version=18):
        builds.append(opset_version)
        return original.__func__(cls, opset_version)

    # A process's first export registers ops as it goes (its registry is keyed by the count of
    # registered ops): alone in a process, this test counted two builds. Counted after one.
    opforge.export(_Mixed().eval(), ARGS, dynamo=True, opset_version=18, verbose=False)
    monkeypatch.setitem(exporter_cache._ORIGINALS, "from_torchlib", classmethod(counting))
    monkeypatch.setattr(exporter_cache, "_REGISTRIES", {})
    for _ in range(3):
        opforge.export(_Mixed().eval(), ARGS, dynamo=True, opset_version=18, verbose=False)
    assert builds.count(18) == 1, builds
    # each export registers opforge's translations into its own copy, never into the shared one
    shared = exporter_cache.torchlib_registry(18)
    copy = exporter_cache.fresh_registry(18)
    assert copy is not shared and copy.functions == shared.functions
    assert all(copy.functions[k] is not shared.functions[k] for k in shared.functions)
    copy.register_op(torch.ops.opforge.my_add.default, lambda a, b: a)
    assert copy.functions["opforge::my_add"] and "opforge::my_add" not in shared.functions


def test_the_registries_of_two_opsets_list_torchlib_once_and_equal_torchs_own(monkeypatch):
    import importlib

    apis = _registration.onnxscript_apis
    onnxscript_module = importlib.import_module(apis._name)  # what the proxy forwards to
    listings = []
    real = onnxscript_module.get_torchlib_ops
    monkeypatch.setattr(onnxscript_module, "get_torchlib_ops", lambda: listings.append(1) or real())
    monkeypatch.setattr(exporter_cache, "_REGISTRIES", {})
    monkeypatch.setattr(exporter_cache, "_TORCHLIB_OPS", {})
    built = {opset: exporter_cache.torchlib_registry(opset) for opset in (18, 20)}
    assert len(listings) == 1
    assert "get_torchlib_ops" not in vars(apis)  # the lazy-module proxy is left as it was
    for opset, registry in built.items():
        own = _registration.ONNXRegistry.from_torchlib(opset)  # torch's, unpatched: lists again
        assert registry.functions == own.functions and registry.functions
    # torchlib's functions changed (as counted): listed again
    exporter_cache._TORCHLIB_OPS["key"] = ("stale",)
    exporter_cache._REGISTRIES.clear()
    exporter_cache.torchlib_registry(18)
    assert len(listings) == 2 + len(built)


def test_registering_ops_builds_the_registry_anew():
    first = exporter_cache.torchlib_registry(18)
    assert exporter_cache.torchlib_registry(18) is first
    lib = torch.library.Library("opforge_cache_test", "DEF")  # noqa: F841 - kept alive while checked
    lib.define("probe(Tensor x) -> Tensor")
    assert exporter_cache.torchlib_registry(18) is not first


def test_torch_is_left_as_it_was_after_the_export():
    from torch.export import exported_program

    before = (_registration.ONNXRegistry.__dict__["from_torchlib"], exported_program._collect_all_valid_cia_ops,
              torch._ops.OperatorBase.__dict__["py_impl"], exported_program._override_composite_implicit_decomp)
    with exporter_cache.reused_exporter_setup():
        with exporter_cache.reused_exporter_setup():  # nested: the inner exit restores nothing
            pass
        assert _registration.ONNXRegistry.__dict__["from_torchlib"] is not before[0]
    assert (_registration.ONNXRegistry.__dict__["from_torchlib"], exported_program._collect_all_valid_cia_ops,
            torch._ops.OperatorBase.__dict__["py_impl"], exported_program._override_composite_implicit_decomp) == before


def test_the_short_py_impl_registers_as_torchs_does_and_keeps_its_errors():
    lib = torch.library.Library("opforge_py_impl_test", "DEF")  # noqa: F841 - kept alive while checked
    lib.define("probe(Tensor x) -> Tensor")
    op = torch.ops.opforge_py_impl_test.probe.default
    kernel = lambda x: x  # noqa: E731
    with exporter_cache.reused_exporter_setup():
        assert torch._ops.OperatorBase.__dict__["py_impl"] is not exporter_cache._ORIGINALS["py_impl"]
        op._dispatch_cache[DispatchKey.AutogradCPU] = "stale"
        assert op.py_impl(DispatchKey.AutogradCPU)(kernel) is kernel
        assert op.py_kernels[DispatchKey.AutogradCPU] is kernel and not op._dispatch_cache  # the cache is cleared
        with pytest.raises(RuntimeError, match="Trying to override a python impl for DispatchKey.AutogradCPU"):
            op.py_impl(DispatchKey.AutogradCPU)(kernel)
        with pytest.raises(AssertionError, match="register a mode"):
            op.py_impl(DispatchKey.Python)(kernel)
    assert op.py_kernels == {DispatchKey.AutogradCPU: kernel}
    op.py_kernels.clear()


def _cia_ops_to_callable():
    """What run_decompositions hands the override for the dynamo exporter's decomposition table."""
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _decomp

    onnx_ops = set(_decomp.get_onnx_implemented_overloads(exporter_cache.torchlib_registry(18)))
    table = _decomp.create_onnx_friendly_decomposition_table(onnx_ops)
    return exported_program._split_decomp_table_to_cia_and_python_decomp(table)[0]


def _kernel_state(ops):
    """op -> {dispatch key: what the Python kernel is}, and whether a fake rule is registered."""
    from torch._subclasses import fake_impls

    def what(kernel):
        # a partial by its function and arguments; a closure (a new one per call, in torch's) by its
        # name and the op it closes over; any other function by identity
        if isinstance(kernel, functools.partial):
            return ("partial", kernel.func.__name__, tuple(sorted(kernel.keywords.items(), key=str)))
        closure = getattr(kernel, "__closure__", None) or ()
        return (getattr(kernel, "__qualname__", type(kernel).__name__),
                tuple(c.cell_contents for c in closure if isinstance(c.cell_contents, (torch._ops.OpOverload, bool))),
                kernel if getattr(kernel, "__qualname__", "").count("<locals>") == 0 else None)
    return {op: ({key: what(k) for key, k in op.py_kernels.items()}, fake_impls._is_op_registered_to_fake_rule(op))
            for op in ops}


def test_the_direct_cia_override_installs_and_removes_what_torchs_does():
    from torch.export import exported_program

    cia = _cia_ops_to_callable()
    assert len(cia) > 400
    states = {}
    for name, override in (("torch", exporter_cache._ORIGINALS.get("override_cia",
                                                                    exported_program._override_composite_implicit_decomp)),
                           ("opforge", None)):
        with exporter_cache.reused_exporter_setup():
            override = override or exported_program._override_composite_implicit_decomp
            assert (override is exporter_cache._ORIGINALS["override_cia_directly"]) == (name == "opforge")
            before = _kernel_state(cia)
            with override(cia):
                inside = _kernel_state(cia)
            after = _kernel_state(cia)
        states[name] = (before, inside, after)
    assert states["opforge"] == states["torch"]
    before, inside, after = states["torch"]
    assert inside != before  # kernels were installed ...
    assert {op: k for op, (k, _) in after.items()} == {op: k for op, (k, _) in before.items()}  # ... and removed


def test_decompositions_are_the_same_graphs_with_the_direct_cia_override():
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _fx_passes

    class CompositeOps(torch.nn.Module):  # CompositeImplicitAutograd ops the table decomposes, and one it keeps
        def forward(self, a, b):
            return (torch.kron(a, b).sum() + torch.diff(a, dim=1).sum() + torch.nn.functional.hinge_embedding_loss(a, b)
                    + torch.special.xlog1py(a, b.abs()).sum() + torch.nn.functional.gelu(a).sum())

    program = torch.export.export(CompositeOps(), ARGS, strict=False)
    registry = exporter_cache.torchlib_registry(18)
    graphs = {}
    for name in ("torch", "opforge"):
        with exporter_cache.reused_exporter_setup():
            if name == "torch":  # torch's own override, the other patches as they are
                fast = exported_program._override_composite_implicit_decomp
                exported_program._override_composite_implicit_decomp = exporter_cache._ORIGINALS["override_cia"]
            try:
                graphs[name] = _fx_passes.decompose_with_registry(program, registry).graph_module.code
            finally:
                if name == "torch":
                    exported_program._override_composite_implicit_decomp = fast
    assert graphs["opforge"] == graphs["torch"]
    assert "kron" not in graphs["torch"] and "diff" not in graphs["torch"] and "gelu" in graphs["torch"]
