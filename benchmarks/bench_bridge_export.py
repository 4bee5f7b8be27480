"""Export time with the TorchScript exporter (dynamo=False), plain torch vs after `import opforge`:
a model with no bridged op must not get slower (the bridge loads nothing until it is used), and
what a bridged op costs (first export of a signature: torch.export + translation; then cached in
memory; and a signature another process translated, read from OPFORGE_ATEN_CACHE_DIR).

    .venv/bin/python benchmarks/bench_bridge_export.py [--repeat N]
"""

import argparse
import io
import os
import statistics
import tempfile
import time
import warnings

import torch

warnings.simplefilter("ignore")


def _model():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(16 * 30 * 30, 10)).eval()


def _export_ms(model, args, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        torch.onnx.export(model, args, io.BytesIO(), dynamo=False, opset_version=17)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


class _Bridged(torch.nn.Module):
    def forward(self, x):
        return torch.logaddexp(x, x.flip(0)) + torch.hypot(x, x)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args(argv)
    os.environ.pop("OPFORGE_ATEN_CACHE_DIR", None)  # the first export must translate, not read a cache
    x = torch.randn(1, 3, 32, 32)
    _export_ms(_model(), (x,), 15)  # warm up the exporter: its first exports are slower
    plain = _export_ms(_model(), (x,), args.repeat)
    import opforge  # noqa: F401
    from opforge import exporter_cache

    with_opforge = _export_ms(_model(), (x,), args.repeat)
    assert exporter_cache.built_registries() == [], "the bridge loaded for a model without bridged ops"
    y = torch.randn(8, 16)
    start = time.perf_counter()
    torch.onnx.export(_Bridged(), (y,), io.BytesIO(), dynamo=False, opset_version=17)
    first = (time.perf_counter() - start) * 1e3
    cached = _export_ms(_Bridged(), (y,), args.repeat)
    from opforge.aten import bridge, translation

    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["OPFORGE_ATEN_CACHE_DIR"] = cache_dir
        for _ in range(2):  # the first writes the disk cache, the second reads it
            translation._translate_cached.cache_clear()
            bridge.lowered.cache_clear()
            start = time.perf_counter()
            torch.onnx.export(_Bridged(), (y,), io.BytesIO(), dynamo=False, opset_version=17)
            from_disk = (time.perf_counter() - start) * 1e3
        del os.environ["OPFORGE_ATEN_CACHE_DIR"]
    print(f"conv model, no bridged op: plain torch {plain:.1f} ms, after import opforge {with_opforge:.1f} ms "
          f"(ratio {with_opforge / plain:.2f})")
    print(f"model with 2 bridged ops: first export {first:.0f} ms (loads torchlib, torch.export per signature), "
          f"then {cached:.1f} ms (cached); "
          f"{from_disk:.1f} ms with the translations read from OPFORGE_ATEN_CACHE_DIR")


if __name__ == "__main__":
    main()
