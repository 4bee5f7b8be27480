"""opforge: PyTorch custom ops end to end, from torch to ONNX Runtime (also: python -m opforge).

    opforge demo [--exporter {both,dynamo,torchscript}] [--opset N] [--out DIR]
    opforge info
    opforge new-op NAME --package PKG [--dir DIR] [--domain DOMAIN] [--cuda|--no-cuda|--prototype] [--force]
                   [--schema "NAME(Tensor x, Tensor index, float alpha) -> Tensor" [--dtypes index=int64]
                    [--backward {python,cpp}] [--no-grad NAME[,NAME]]]
    opforge ort-library-path [DOMAIN]
    opforge fetch-ort-headers [--dest DIR] [--force]
    opforge include-paths
    opforge triton-repo MODEL.onnx DIR [--max-batch N] [--instances K] [--name NAME] [--kind {auto,cpu,gpu}]
                        [--server-repo PATH] [--force]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def _demo_model():
    import torch

    from .ops import MyAddFunction

    class DemoModel(torch.nn.Module):
        """Linear -> my_add(., learned offset) via MyAddFunction.apply -> ReLU."""

        def __init__(self, features: int = 16):
            super().__init__()
            self.proj = torch.nn.Linear(features, features)
            self.offset = torch.nn.Parameter(torch.randn(features))

        def forward(self, x):
            return torch.relu(MyAddFunction.apply(self.proj(x), self.offset))

    torch.manual_seed(0)
    return DemoModel().eval()


def cmd_demo(args) -> int:
    import numpy as np
    import torch

    import opforge

    model = _demo_model()
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="opforge-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    exporters = ["torchscript", "dynamo"] if args.exporter == "both" else [args.exporter]
    export_x = torch.randn(2, 16)  # exported at batch 2 ...
    run_x = torch.randn(5, 16)  # ... run at batch 5 (dynamic batch)
    with torch.no_grad():
        expected = model(run_x).numpy()
    ok = True
    for exporter in exporters:
        dynamo = exporter == "dynamo"
        opset = args.opset or (18 if dynamo else 17)
        path = out_dir / f"demo_{exporter}_opset{opset}.onnx"
        print(f"[{exporter}] exporting DemoModel (MyAddFunction.apply inside) at opset {opset} -> {path}")
        t0 = time.perf_counter()
        proto = opforge.export(
            model,
            (export_x,),
            path,
            dynamo=dynamo,
            opset_version=opset,
            input_names=["x"],
            output_names=["y"],
            dynamic_shapes=({0: torch.export.Dim("batch")},) if dynamo else None,
            dynamic_axes=None if dynamo else {"x": {0: "batch"}, "y": {0: "batch"}},
        )
        nodes = ", ".join(f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in proto.graph.node)
        print(f"[{exporter}]   exported in {time.perf_counter() - t0:.1f}s; graph: {nodes}")
        session = opforge.ort_session(path)
        (got,) = session.run(None, {"x": run_x.numpy()})
        diff = float(np.abs(got - expected).max())
        match = np.allclose(got, expected, rtol=1e-5, atol=1e-5)
        ok &= match
        print(
            f"[{exporter}]   ONNX Runtime (libopforge_ort) vs torch at batch {run_x.shape[0]}: "
            f"max |diff| = {diff:.2e} -> {'PASS' if match else 'FAIL'}"
        )
    print("demo:", "all parity checks passed" if ok else "PARITY CHECK FAILED")
    return 0 if ok else 1


EXTENSIONS_GROUP = "opforge.extensions"


def _load_extensions() -> list[str]:
    """Imports the packages declared in the ``opforge.extensions`` entry point group (their
    ops register themselves on import); returns what could not be loaded, with why."""
    import importlib.metadata

    failed = []
    for ep in importlib.metadata.entry_points(group=EXTENSIONS_GROUP):
        try:
            ep.load()
        except Exception as exc:  # noqa: BLE001 - reported by info, not fatal
            failed.append(f"{ep.name} ({ep.value}): {type(exc).__name__}: {exc}")
    return failed


def cmd_info(args) -> int:
    import onnx
    import onnxruntime
    import torch

    import opforge
    from opforge.ort_kernels import ORTX_PIN, cuda_companion_path, cuda_companion_status
    from opforge.prototype import is_prototype
    from opforge.spec import REGISTRY

    failed = _load_extensions()
    print(f"opforge        {opforge.__version__}")
    print(f"torch          {torch.__version__} (cuda {torch.version.cuda})")
    print(f"onnx           {onnx.__version__}")
    print(f"onnxruntime    {onnxruntime.__version__}")
    ortx = opforge.ortx_version()
    print(f"onnxruntime-extensions {ortx or f'not installed (pip install {ORTX_PIN}; needed for prototype ops)'}")
    state, reason = opforge.ops._registry._C.cuda_part
    print(f"torch library  {opforge.torch_library_path()} (stable ABI, torch >= 2.10; CUDA part {state}"
          f"{': ' + reason if reason else ''})")
    if opforge.BUILT_WITH_CUDA:
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU visible"
        print(f"CUDA kernels   built (torch CUDA + ORT CUDAExecutionProvider); {gpu}")
    else:
        print("CUDA kernels   not built (rebuild with CUDA_HOME set and OPFORGE_CUDA=1)")
    for domain, (provider, path) in opforge.ort_libraries().items():
        print(f"ORT library    {domain}: {path}  [{provider}]")
        if os.path.isfile(path) and cuda_companion_path(path):
            print(f"  CUDA EP part {cuda_companion_status(path)}")
    for spec in REGISTRY.values():
        opsets = spec.torchscript_opsets
        extras = [f"TorchScript opsets {opsets[0]}-{opsets[-1]}"]
        if spec.standard_dynamo or spec.standard_torchscript:
            extras.append("standard-ONNX lowering")
        if not spec.differentiable:
            extras.append("no autograd")
        if is_prototype(spec.onnx_qualname):
            extras.append("prototype: numpy kernel, ORT through onnxruntime-extensions")
        print(f"op             {spec.onnx_qualname} v{spec.domain_version}: torch.ops.{spec.namespace}.{spec.name} "
              f"({spec.namespace}::{spec.schema}; {'; '.join(extras)})")
    for f in failed:
        print(f"extension      could not load {f}")
    return 0


def cmd_ort_library_path(args) -> int:
    from .ort_kernels import ort_library_path

    if args.domain != "opforge":
        _load_extensions()
    print(ort_library_path(args.domain))
    return 0


def cmd_new_op(args) -> int:
    from .scaffold import new_op

    new_op(args.name, args.package, args.dir, domain=args.domain, cuda=args.cuda, force=args.force,
           prototype=args.prototype, schema=args.schema, dtypes=args.dtypes, backward=args.backward,
           no_grad=args.no_grad)
    return 0


def cmd_fetch_ort_headers(args) -> int:
    from .build import fetch_ort_headers

    print(fetch_ort_headers(args.dest, force=args.force))
    return 0


def cmd_build_aten(args) -> int:
    from .build_aten import main

    return main(verbose=args.verbose)


def cmd_include_paths(args) -> int:
    from .build import include_paths

    print("\n".join(include_paths()))
    return 0


def cmd_triton_repo(args) -> int:
    from .triton_repo import VERSION_RULE, write_triton_repo

    repo = write_triton_repo(args.model, args.dir, name=args.name, max_batch=args.max_batch,
                             instances=args.instances, kind=args.kind, server_repo=args.server_repo, force=args.force)

    def shapes(specs):
        batch = ["batch"] if args.max_batch > 0 else []
        return ", ".join(f"{s.name} {s.data_type} {batch + [d if d >= 0 else '?' for d in s.dims]}" for s in specs)

    print(f"wrote {repo.config}")
    print(f"wrote {repo.model}")
    for library in repo.libraries:
        print(f"wrote {library}")
    print(f"  inputs:  {shapes(repo.inputs)}")
    print(f"  outputs: {shapes(repo.outputs)}")
    batching = f"dynamic batching up to {args.max_batch}" if args.max_batch > 0 else "no batching"
    print(f"  {batching}; {args.instances} instance(s); platform onnxruntime_onnx")
    for path in repo.op_library_filenames:
        print(f"  op_library_filename: {path} (the path the server opens)")
    if repo.op_library_filenames:
        print(f"note: {VERSION_RULE}.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="opforge", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"opforge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="export a model using MyAddFunction.apply and check ORT parity")
    demo.add_argument("--exporter", choices=["both", "dynamo", "torchscript"], default="both")
    demo.add_argument("--opset", type=int, default=None, help="ONNX opset (default: 17 TorchScript, 18 dynamo)")
    demo.add_argument("--out", default=None, help="directory for the .onnx files (default: a new temp dir)")
    demo.set_defaults(func=cmd_demo)

    info = sub.add_parser("info", help="versions, library paths and registered ops")
    info.set_defaults(func=cmd_info)

    lib = sub.add_parser("ort-library-path", help="print the path of the ORT library of an ONNX domain")
    lib.add_argument("domain", nargs="?", default="opforge", help="ONNX domain (default: opforge)")
    lib.set_defaults(func=cmd_ort_library_path)

    new = sub.add_parser("new-op", help="write a standalone package with one working custom op",
                         description="Writes an installable package with a working op y = x * sigmoid(alpha * x) "
                         "(torch CPU/CUDA kernels, ORT CPU/CUDA-EP kernels, spec, tests, README); with --prototype, "
                         "the same op as a spec and a numpy kernel, no C++; with --schema, a package for that "
                         "signature, every piece generated from it and placeholder math to replace.")
    new.add_argument("name", help="op name (torch.ops.PKG.NAME)")
    new.add_argument("--package", required=True, metavar="PKG", help="Python package and torch namespace")
    new.add_argument("--dir", default=None, metavar="DIR", help="where to write it (default: ./PKG)")
    new.add_argument("--domain", default=None, help="ONNX domain of the op (default: PKG), e.g. com.example")
    cuda = new.add_mutually_exclusive_group()
    cuda.add_argument("--cuda", dest="cuda", action="store_true", default=True,
                      help="include CUDA kernels, built when OPFORGE_CUDA allows (default)")
    cuda.add_argument("--no-cuda", dest="cuda", action="store_false", help="CPU kernels only")
    cuda.add_argument("--prototype", action="store_true",
                      help="no C++: the op as a spec + numpy kernel, run in ONNX Runtime through "
                           "onnxruntime-extensions (pure-Python package; move it to C++ later)")
    new.add_argument("--force", action="store_true", help="write into a non-empty directory")
    new.add_argument("--schema", default=None, metavar="SCHEMA",
                     help='the op\'s torch schema, e.g. "NAME(Tensor x, Tensor index, float alpha) -> Tensor" '
                          "(Tensor, Tensor?, int, float, bool, int[] arguments; one or several Tensor outputs): "
                          "the whole package is generated for it, with placeholder math to replace (CPU kernels)")
    new.add_argument("--dtypes", action="append", default=None, metavar="NAME=DTYPE[,NAME=DTYPE]",
                     help="with --schema: element type of a tensor input that is not of the op's float types "
                          "(int64, int32, int16, int8, uint8, bool), e.g. index=int64; repeatable")
    new.add_argument("--backward", choices=["python", "cpp"], default=None,
                     help="with --schema: the backward as an autograd formula in Python (default) or as a C++ op "
                          "of its own, _NAME_backward, next to the forward")
    new.add_argument("--no-grad", action="append", default=None, metavar="NAME[,NAME]",
                     help="with --schema: a float tensor input without a gradient (e.g. rois): "
                          "TensorArg(differentiable=False), None from the backward; repeatable")
    new.set_defaults(func=cmd_new_op)

    fetch = sub.add_parser("fetch-ort-headers", help="fetch ONNX Runtime's C/C++ headers (Debian's libonnxruntime-dev)")
    fetch.add_argument("--dest", default=None, help="directory (default: opforge's cache)")
    fetch.add_argument("--force", action="store_true", help="fetch again even if present")
    fetch.set_defaults(func=cmd_fetch_ort_headers)

    aten = sub.add_parser("build-aten", help="build libopforge_aten.so (the ATen fallback's ORT kernel) for the "
                          "running torch, into opforge's cache; prints its path")
    aten.add_argument("-v", "--verbose", action="store_true", help="show the compiler's output")
    aten.set_defaults(func=cmd_build_aten)

    inc = sub.add_parser("include-paths", help="print the include directories for a package's kernels")
    inc.set_defaults(func=cmd_include_paths)

    triton = sub.add_parser(
        "triton-repo", help="write a Triton Inference Server model repository for an exported model",
        description="Writes DIR/NAME/config.pbtxt (platform onnxruntime_onnx; inputs and outputs from the model; "
        "dynamic batching; model_operations { op_library_filename } naming opforge's library), DIR/NAME/1/model.onnx "
        "and the ORT libraries the model needs, beside the config. The libraries need ONNX Runtime API >= 21: "
        "Triton >= 2.56.0 (NGC container 25.03), whose onnxruntime backend is ONNX Runtime 1.21.0.")
    triton.add_argument("model", metavar="MODEL.onnx", help="an exported model (opforge.export)")
    triton.add_argument("dir", metavar="DIR", help="the model repository (created if missing)")
    triton.add_argument("--max-batch", type=int, default=8, metavar="N",
                        help="Triton's max_batch_size: the first dim of every input and output is the batch dim and "
                             "must be dynamic; 0: no batching, the shapes as exported (default: 8)")
    triton.add_argument("--instances", type=int, default=1, metavar="K",
                        help="model instances, each with its own ONNX Runtime session (default: 1)")
    triton.add_argument("--name", default=None, help="the model's name in the repository (default: MODEL's stem)")
    triton.add_argument("--kind", choices=["auto", "cpu", "gpu"], default="auto",
                        help="where the instances run (default auto: Triton's choice, a GPU where there is one)")
    triton.add_argument("--server-repo", default=None, metavar="PATH",
                        help="DIR's absolute path as the server sees it, e.g. /models when DIR is mounted there in "
                             "the container: op_library_filename is opened as written (default: DIR's absolute path)")
    triton.add_argument("--force", action="store_true", help="replace an existing DIR/NAME")
    triton.set_defaults(func=cmd_triton_repo)

    cov = sub.add_parser("coverage", help="which ATen ops each exporter handles per opset, with and without opforge",
                         description="Measures, per opset, the user-facing ATen ops the dynamo exporter handles and "
                         "how many of them the TorchScript exporter (dynamo=False) exports without and with opforge "
                         "(each bridged op's sample is exported at every opset). Progress goes to stderr.")
    cov.add_argument("--opsets", default="9-20", help="a range like 9-20 or a list like 11,17,20 (default: 9-20)")
    cov.add_argument("--json", action="store_true", help="print the measurement as JSON")
    cov.add_argument("--write-snapshot", action="store_true",
                     help="also write the regression baseline (opforge/aten/coverage.json)")
    cov.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    cov.set_defaults(func=cmd_coverage)
    return parser


def cmd_coverage(args) -> int:
    from .aten import coverage

    return coverage.run(args)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a CLI reports, it does not dump a traceback by default
        print(f"opforge {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
