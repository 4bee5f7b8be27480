"""Tutorial 5: your own op, from nothing to ONNX Runtime, with opforge as a toolkit.

For a package you ship, the flow is three shell commands:

    opforge new-op swish --package my_ops --domain com.example   # a working op to edit
    pip install --no-build-isolation -e my_ops                   # torch extension + libmy_ops_ort.so
    python -m pytest my_ops                                      # opforge.testing checks, both exporters, ORT

after which ``import my_ops`` gives ``torch.ops.my_ops.swish`` and ``opforge.export`` /
``opforge.ort_session`` handle models using it with no further set-up (the package's
ORT library is found by its ONNX domain).

This script walks the same road in one process, the notebook way: it generates the
package into a temporary directory, builds its two libraries just in time
(``opforge.build.load`` for the torch extension, ``opforge.build.load_ort_library`` for
the ORT library), registers the op's spec (``opforge.register_op``), checks it with
``opforge.testing``, and runs a model that mixes it with ``opforge.my_add`` through both
exporters in one ONNX Runtime session.

Then an op with inputs of mixed element types, made from its schema alone:

    opforge new-op scaled_rows --package my_ops --schema \
        "scaled_rows(Tensor x, Tensor rows, float scale) -> Tensor" --dtypes rows=int64

writes the same kind of package for that signature (the argument list appears once, in the
schema): OpSpec args, dtype checks, fake impl, torch and ORT kernels with the right C++ types
(``Ort::Custom::Tensor<int64_t>`` for ``rows``, ``float`` for ``scale``), wrapper, module, tests
and a benchmark. Its math is a stated placeholder; what is left to write is the core's forward
(one C++ function), the shape rule, the numpy reference and example inputs.

    .venv/bin/python tutorials/05_your_own_op.py
"""

import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

import opforge
import opforge.build
from opforge.scaffold import new_op

PKG, NAME, DOMAIN = "tutorial_ops", "swish", "com.example.tutorial"
# The mixed-type op of step 6: a float tensor, an int64 index tensor and a float attribute.
MIXED_PKG, MIXED, MIXED_DOMAIN = "tutorial_schema_ops", "scaled_rows", "com.example.tutorial.schema"
MIXED_SCHEMA = f"{MIXED}(Tensor x, Tensor rows, float scale) -> Tensor"


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="opforge-tutorial05-"))

    step("1. opforge new-op: a complete, working op to start from")
    pkg_dir = new_op(NAME, PKG, work / PKG, domain=DOMAIN, cuda=False, log=lambda s: None)
    csrc = pkg_dir / "src" / PKG / "csrc"
    for f in sorted(p.relative_to(pkg_dir) for p in pkg_dir.rglob("*") if p.is_file()):
        print("  ", f)
    print("   the math lives in", (csrc / f"{NAME}.h").relative_to(pkg_dir), "- shared by torch and ORT kernels:")
    print("   " + next(line for line in (csrc / f"{NAME}.h").read_text().splitlines() if "return x * s" in line).strip())

    step("2. build both libraries just in time (incremental, cached under ~/.cache/opforge/jit)")
    t0 = time.perf_counter()
    torch_lib = opforge.build.load(f"{PKG}_torch", [str(csrc / f"{NAME}_torch.cpp")],
                                   extra_include_paths=[str(csrc)])
    ort_lib = opforge.build.load_ort_library(f"{PKG}_ort", [str(csrc / f"{NAME}_ort.cc")], domain=DOMAIN)
    print(f"   torch library:   {torch_lib}\n   ORT library:     {ort_lib}  ({time.perf_counter() - t0:.0f} s)")

    step("3. the spec: one description from which opforge derives everything else")
    spec_module = _load_spec_module(pkg_dir / "src" / PKG / f"{NAME}.py")
    spec = getattr(spec_module, NAME.upper())
    op = opforge.register_op(spec)  # fake impl, autograd, ONNX schema, TorchScript symbolics, dynamo translation
    opforge.check_library(PKG)  # every op of TORCH_LIBRARY(tutorial_ops) has a spec
    print(f"   torch op {spec.torch_qualname}  ->  ONNX node {spec.onnx_qualname}  (library by domain: "
          f"{Path(opforge.ort_library_path(DOMAIN)).name})")
    x = torch.linspace(-3, 3, 7, dtype=torch.float64, requires_grad=True)
    y = op(x, 1.5)
    y.sum().backward()
    print("   swish(x, 1.5) =", np.round(y.detach().numpy(), 4).tolist())
    print("   max |torch - x*sigmoid(1.5x)| =", float((y - x * torch.sigmoid(1.5 * x)).abs().max().detach()))

    step("4. opforge.testing: the generic round-trip checks every op should pass")
    from opforge.testing import BadSample, Sample, check_op

    t0 = time.perf_counter()
    check_op(spec, [Sample(torch.randn(4, 6), 0.8)],
             bad_samples=[BadSample(torch.arange(3, dtype=torch.int64), 1.0, match=NAME)],
             checks=("opcheck", "gradcheck", "reference", "float_attrs", "bad_inputs"))
    print(f"   opcheck, gradcheck, numpy reference, float32 attributes, bad inputs: ok ({time.perf_counter() - t0:.0f} s)")

    step("5. a model mixing opforge.my_add and the new op, both exporters, ONE ORT session each")

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = torch.nn.Parameter(torch.linspace(-1, 1, 6))

        def forward(self, x):
            return op(opforge.my_add(x, self.offset), 1.25)

    model = Mixed().eval()
    ok = True
    for dynamo in (True, False):
        kw = ({"dynamic_shapes": ({0: torch.export.Dim("batch")},)} if dynamo
              else {"dynamic_axes": {"x": {0: "batch"}}, "opset_version": 17})
        proto = opforge.export(model, (torch.randn(2, 6),), dynamo=dynamo, input_names=["x"], **kw)
        nodes = ", ".join(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in proto.graph.node)
        x5 = torch.randn(5, 6)
        (got,) = opforge.ort_session(proto).run(None, {"x": x5.numpy()})  # both libraries, found by domain
        diff = float(np.abs(got - model(x5).detach().numpy()).max())
        ok &= diff < 1e-5
        verdict = "ORT matches torch" if diff < 1e-5 else "ORT DIFFERS from torch"
        print(f"   [{'dynamo' if dynamo else 'torchscript'}] {nodes}\n      {verdict} at batch 5: max |diff| = {diff:.1e}")

    ok &= mixed_type_op_from_schema(work)

    step("7. shipping it")
    print(f"   pip install --no-build-isolation -e {pkg_dir}   then   python -m pytest {pkg_dir}")
    print("   the package's pyproject declares its ORT library as an entry point "
          f"(opforge.ort_libraries: {DOMAIN}), so opforge.ort_session finds it without importing the package")
    print("\ntutorial 05:", "all checks passed" if ok else "PARITY CHECK FAILED")
    return 0 if ok else 1


def mixed_type_op_from_schema(work: Path) -> bool:
    """Step 6: `new-op --schema` for an op with an int64 input; the generated pieces, built and checked."""
    step("6. an op with mixed input types, from its schema: new-op --schema ... --dtypes rows=int64")
    pkg_dir = new_op(MIXED, MIXED_PKG, work / MIXED_PKG, domain=MIXED_DOMAIN, schema=MIXED_SCHEMA,
                     dtypes={"rows": "int64"}, log=lambda s: None)
    csrc = pkg_dir / "src" / MIXED_PKG / "csrc"
    spec_path = pkg_dir / "src" / MIXED_PKG / f"{MIXED}.py"

    def show(path: Path, *needles: str) -> None:
        lines = path.read_text().splitlines()
        for needle in needles:
            print(f"   {path.name}: " + next(line for line in lines if needle in line).strip())

    print("   the schema's arguments, typed for every piece:")
    show(spec_path, 'TensorArg("rows"', 'AttrArg("scale"')
    show(csrc / f"{MIXED}_torch.cpp", "rows.scalar_type() == opforge::ScalarType::Long", "static_cast<float>(scale)")
    show(csrc / f"{MIXED}_ort.cc", "Ort::Custom::Tensor<int64_t>& rows")
    show(csrc / f"{MIXED}.h", "Input<int64_t> rows;", f"std::string {MIXED}_output_shapes(",
         f"std::string {MIXED}_forward(")
    print("   left to write (PLACEHOLDER until then): csrc/scaled_rows.h: scaled_rows_output_shapes (the one shape "
          "rule: kernels, fake impl, ONNX shape inference) and scaled_rows_forward, and in scaled_rows.py _reference, "
          "example_args")
    show(csrc / f"{MIXED}.h", "PLACEHOLDER: the output")

    t0 = time.perf_counter()
    opforge.build.load(f"{MIXED_PKG}_torch", [str(csrc / f"{MIXED}_torch.cpp")], extra_include_paths=[str(csrc)])
    opforge.build.load_ort_library(f"{MIXED_PKG}_ort", [str(csrc / f"{MIXED}_ort.cc")], domain=MIXED_DOMAIN)
    module = _load_spec_module(spec_path, f"{MIXED_PKG}_{MIXED}_spec")
    spec = getattr(module, MIXED.upper())
    op = opforge.register_op(spec)
    print(f"   built and registered {spec.torch_qualname} ({time.perf_counter() - t0:.0f} s)")

    from opforge.testing import Sample, check_op

    t0 = time.perf_counter()
    samples = [Sample(*module.example_args(sizes={"batch": 4, "n": 6}), name="2d")]
    check_op(spec, samples, checks=("opcheck", "gradcheck", "reference", "float_attrs"),
             dtypes=[torch.float32, torch.float64])
    print(f"   opcheck, gradcheck, numpy reference, float32 attributes: ok ({time.perf_counter() - t0:.0f} s)")

    x, rows, scale = module.example_args(sizes={"batch": 4, "n": 6})
    ok = True
    for dynamo in (True, False):
        kw = ({"dynamic_shapes": ({0: torch.export.Dim("batch")}, None)} if dynamo
              else {"dynamic_axes": {"x": {0: "batch"}}, "opset_version": 17})
        proto = opforge.export(module.ScaledRows(scale), (x, rows), dynamo=dynamo, input_names=["x", "rows"],
                               **kw, **({"verbose": False} if dynamo else {}))
        inputs = {i.name: onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type) for i in proto.graph.input}
        x9 = torch.randn(9, 6)
        (got,) = opforge.ort_session(proto).run(None, {"x": x9.numpy(), "rows": rows.numpy()})
        same = np.array_equal(got, op(x9, rows, scale).numpy())
        ok &= same
        verdict = "ORT matches torch bit for bit" if same else "ORT DIFFERS from torch"
        print(f"   [{'dynamo' if dynamo else 'torchscript'}] inputs {inputs}: {verdict} at batch 9")
    return ok


def _load_spec_module(path: Path, module_name: str = f"{PKG}_{NAME}_spec"):
    """Imports the generated spec module from its file (the JIT flow has no installed package)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(main())
