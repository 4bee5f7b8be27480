"""Export time with the dynamo exporter (dynamo=True): ``opforge.export`` against torch's own
``torch.onnx.export`` with the same ``custom_translation_table`` (the anchor), side by side in
one process, after a warm-up export of each.

torch builds torchlib's registry anew for every export (about a second on a 2-core machine);
opforge.export builds it once per process (opforge.exporter_cache). The models are the same
bytes, which this script checks before it times anything.

    .venv/bin/python benchmarks/bench_dynamo_export.py [--repeats N] [--json]
"""

from __future__ import annotations

import warnings

import torch

import opforge
from opforge.symbolics import dynamo as dynamo_rules
from timing import bench_parser, print_ms, report, round_robin

warnings.simplefilter("ignore")


class SmallModel(torch.nn.Module):
    """An opforge op between two torch layers: what a custom op usually sits in."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x, y):
        h = opforge.my_add(self.conv(x), y).relu().mean((2, 3))
        return self.head(h)


def main(argv=None) -> int:
    parser = bench_parser(__doc__, repeats=5, threads=None, repeats_help="timed exports per candidate (median reported)")
    parser.add_argument("--opset", type=int, default=18)
    args = parser.parse_args(argv)

    model = SmallModel().eval()
    inputs = (torch.randn(2, 3, 16, 16), torch.randn(2, 8, 16, 16))
    table = dynamo_rules.translation_table(None, args.opset)

    def torch_export():
        return torch.onnx.export(model, inputs, dynamo=True, opset_version=args.opset, custom_translation_table=table,
                                 verbose=False).model_proto

    def opforge_export():
        return opforge.export(model, inputs, dynamo=True, opset_version=args.opset, standard_onnx=False,
                              verbose=False)

    same = torch_export().SerializeToString() == opforge_export().SerializeToString()
    if not same:
        raise SystemExit("bench_dynamo_export: opforge.export and torch.onnx.export wrote different models")
    ms = round_robin({"torch.onnx.export": torch_export, "opforge.export": opforge_export}, args.repeats, warmup=1)
    result = {"opset": args.opset, "ms": ms, "same_model": same,
              "speedup_vs_torch": ms["torch.onnx.export"] / ms["opforge.export"]}

    def table(r):
        print(f"dynamo export of a conv + opforge.my_add + linear model, opset {args.opset}, median of {args.repeats}:")
        print_ms(r["ms"], 18, "8.1f")
        print(f"  speedup vs torch.onnx.export: {r['speedup_vs_torch']:.2f}x (same model bytes: {r['same_model']})")

    report(result, args.json, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
