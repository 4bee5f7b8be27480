"""Helpers shared by the tests (imported as a plain module: pytest puts tests/ on sys.path)."""

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

import opforge
from opforge.testing import node_model


def single_node_model(op_type: str, input_types, n_outputs: int = 1, domain: str = opforge.spec.DOMAIN, **attrs):
    """A model with one node (inputs I0.., outputs O0..) of unknown shapes."""
    return node_model(op_type, [(f"I{i}", t) for i, t in enumerate(input_types)],
                      [(f"O{i}", input_types[0]) for i in range(n_outputs)], domain=domain, ir_version=9, **attrs)


class Lambda(torch.nn.Module):
    """A function as a model (what the exporters take)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def deform_inputs(n=2, c=6, o=4, h=9, w=8, kh=3, kw=2, stride=(1, 2), pad=(1, 0), dil=(1, 2), groups=2,
                  offset_groups=3, dtype=torch.float64, offset_scale=2.0, seed=0):
    """Random deform_conv2d arguments (input, weight, offset, mask, bias, oh, ow)."""
    g = torch.Generator().manual_seed(seed)
    oh = (h + 2 * pad[0] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (w + 2 * pad[1] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype)
    weight = torch.randn(o, c // groups, kh, kw, generator=g, dtype=dtype)
    offset = torch.randn(n, 2 * offset_groups * kh * kw, oh, ow, generator=g, dtype=dtype) * offset_scale
    mask = torch.rand(n, offset_groups * kh * kw, oh, ow, generator=g, dtype=dtype)
    bias = torch.randn(o, generator=g, dtype=dtype)
    return x, weight, offset, mask, bias


#: deform_conv2d geometries (deform_inputs keyword arguments), by name: the torch tests run them all,
#: the CUDA tests some of them
DEFORM_CONFIGS = {
    "basic-3x3": dict(n=2, c=4, o=6, h=7, w=7, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
    "stride-2": dict(n=2, c=4, o=4, h=9, w=8, kh=3, kw=3, stride=(2, 2), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
    "non-square-mixed": dict(n=2, c=6, o=4, h=9, w=8, kh=3, kw=2, stride=(1, 2), pad=(1, 0), dil=(1, 2), groups=2, offset_groups=3),
    "dilation-2": dict(n=1, c=4, o=4, h=10, w=10, kh=3, kw=3, stride=(1, 1), pad=(2, 2), dil=(2, 2), groups=1, offset_groups=2),
    "groups-4": dict(n=2, c=8, o=8, h=6, w=7, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=4, offset_groups=1),
    "offset-groups-span-weight-groups": dict(n=2, c=6, o=6, h=6, w=6, kh=2, kw=2, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=3, offset_groups=2),
    "1x1": dict(n=3, c=5, o=3, h=5, w=4, kh=1, kw=1, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1, offset_groups=5),
    "batch-1-big-offsets": dict(n=1, c=3, o=2, h=8, w=8, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
    # several pixel tiles per image (C*kh*kw = 576 -> ~455-pixel tiles) and several images
    "multi-tile-batch-5": dict(n=5, c=64, o=8, h=24, w=26, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
}


class DCNv2Block(torch.nn.Module):
    """A DCNv2 block as users write it: convolutions predict the offsets and the mask of a 3x3
    deformable conv (``dcn_cls``: torchvision.ops.DeformConv2d or opforge.DeformConv2d; bias on)."""

    def __init__(self, dcn_cls, c=4, o=8, groups=2, offset_groups=2):
        super().__init__()
        self.offset = torch.nn.Conv2d(c, 2 * offset_groups * 9, 3, padding=1)
        self.mask = torch.nn.Conv2d(c, offset_groups * 9, 3, padding=1)
        self.dcn = dcn_cls(c, o, 3, padding=1, groups=groups)

    def forward(self, x):
        return self.dcn(x, self.offset(x), torch.sigmoid(self.mask(x)))


class DCNv1Block(torch.nn.Module):
    """opforge.DeformConv2d without a mask, stride 2, its offsets predicted by a convolution."""

    def __init__(self):
        super().__init__()
        self.offset = torch.nn.Conv2d(4, 2 * 9, 3, padding=1, stride=2)
        self.dcn = opforge.DeformConv2d(4, 6, 3, padding=1, stride=2)

    def forward(self, x):
        return self.dcn(x, self.offset(x))


def aten_model(operator, overload, inputs, consts=(), n_out=1, out_types=(TensorProto.FLOAT, TensorProto.INT64),
               initializers=()):
    """A model with one org.pytorch.aten::ATen node: graph inputs ``inputs`` [(name, type)], then
    the ``initializers`` (TensorProtos) and ``consts`` (arrays, as Constant nodes) as further inputs."""
    from opforge.spec import ATEN_DOMAIN

    nodes = [helper.make_node("Constant", [], [f"c{i}"], value=numpy_helper.from_array(np.asarray(c)))
             for i, c in enumerate(consts)]
    nodes.append(helper.make_node("ATen", [n for n, _ in inputs] + [i.name for i in initializers] +
                                  [f"c{i}" for i in range(len(consts))], [f"y{i}" for i in range(n_out)],
                                  domain=ATEN_DOMAIN, operator=operator, overload_name=overload))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                              [helper.make_tensor_value_info(f"y{i}", out_types[i], None) for i in range(n_out)],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ATEN_DOMAIN, 1)])


def run_in_ort(spec, values) -> torch.Tensor:
    """The op's torch-order arguments ``values`` through a one-node model in ONNX Runtime (with
    the op's library; every dtype, bfloat16 included); the first output. Expected errors are not
    logged."""
    import onnxruntime

    from opforge.testing import single_node_model as spec_model
    from opforge.testing.support import _ort_run

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    sess = opforge.ort_session(spec_model(spec, values), options)
    tensors, _ = spec.split_args(list(values))
    return _ort_run(sess, {a.onnx_name: t for a, t in zip(spec.tensor_args, tensors) if t is not None})[0]


def scratch_venv(base) -> str:
    """A venv in ``base/venv`` (no pip of its own) that sees this venv's packages; returns its python.
    Packages installed into it (`pip install -e`, via the parent's pip) stay out of this venv."""
    import subprocess
    import sys
    import sysconfig

    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    purelib = sysconfig.get_paths()["purelib"]
    # addsitedir (not a plain path line): the main venv's .pth files (editable opforge) apply too
    (site / "opforge_parent_env.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    return str(venv / "bin" / "python")


def needed_libraries(path) -> list:
    """The NEEDED entries of a shared library (readelf -d)."""
    import subprocess

    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def run_paths(path) -> list:
    """The RUNPATH and RPATH entries of a shared library, in order."""
    import subprocess

    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    entries = []
    for line in out.splitlines():
        if "(RUNPATH)" in line or "(RPATH)" in line:
            entries += line.split("[", 1)[1].rsplit("]", 1)[0].split(":")
    return entries


def without_cuda(args) -> list:
    """``args`` as a command run on a simulated box without CUDA: in a private mount namespace
    whose torch nvidia wheels (site-packages/nvidia) and /usr/local/cuda are empty tmpfs
    mounts, so no CUDA runtime, cuBLAS or driver stub can be found. Needs root (unshare -m);
    the test is skipped, saying so, elsewhere."""
    import os
    import shlex
    import shutil
    import sysconfig

    import pytest

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("simulating a box without CUDA needs root and unshare (a private mount namespace)")
    hidden = [d for d in (os.path.join(sysconfig.get_paths()["purelib"], "nvidia"), "/usr/local/cuda")
              if os.path.isdir(d)]
    mounts = "".join(f"mount -t tmpfs none {shlex.quote(d)} && " for d in hidden)
    return ["unshare", "-m", "bash", "-c", mounts + "exec " + shlex.join(str(a) for a in args)]


def profiling_session_options():
    """ONNX Runtime SessionOptions that profile (the CUDA EP tests read from the profile which EP ran
    each node), writing the profile into a fresh temporary folder, not the working directory."""
    import os
    import tempfile

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="opforge-ort-profile-"), "profile")
    return so


# ---- throwaway venvs ---------------------------------------------------------------------------------

#: What pip and uv print when they cannot reach the package index; a pin the index lacks still fails.
UNREACHABLE = ("Network is unreachable", "Temporary failure in name resolution", "Max retries exceeded",
               "Failed to establish a new connection", "Connection refused", "ProxyError", "dns error",
               "error sending request", "tcp connect error", "Could not connect")
#: Packages a venv that sees this one must take from it, never install a copy of its own; pip is
#: held to this venv's versions of the PyPI ones (opforge is this checkout's).
PARENT_PINS = ("torch", "numpy", "onnxruntime", "onnx")
PARENT_PACKAGES = (*PARENT_PINS, "opforge")


def cached_venv(base, requirements: list, *, sees_this_venv: bool = False, what: str = "") -> str:
    """The python of ``base/venv``, a throwaway venv with ``requirements``, (re)made when its stamp
    (written last) is missing or names other requirements; a lock keeps concurrent runs from making
    it twice. Skips only when the package index cannot be reached.

    * ``sees_this_venv``: a scratch venv on this venv's packages (:func:`scratch_venv`), installed
      into with pip (uv does not see packages on a .pth path and would install torch again), held
      to this venv's versions of PARENT_PACKAGES (pip must not bring a copy).
    * else a self-contained python3.11 venv (pip and setuptools seeded, as ``python -m venv`` makes
      it), installed into with uv: uv links the packages from its cache (UV_CACHE_DIR, default
      ~/.cache/uv), about 1 s for torch 2.0.1 once cached where pip unpacks its 2.5 GB every time
      (~47 s on the 2-core CI machine). Never a uv-managed Python: python3.11 from PATH."""
    import fcntl
    import importlib.metadata
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    base = Path(base)
    venv, stamp = base / "venv", base / "opforge-venv-stamp.json"
    python = venv / "bin" / "python"
    what = what or base.name
    base.parent.mkdir(parents=True, exist_ok=True)
    with open(base.parent / f"{base.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = {"requirements": list(requirements), "sees_this_venv": sees_this_venv}
        if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == wanted:
            return str(python)
        shutil.rmtree(base, ignore_errors=True)  # half-made or stale
        base.mkdir(parents=True)
        if sees_this_venv:
            scratch_venv(base)
            pins = base / "constraints.txt"
            pins.write_text("".join(f"{p}=={importlib.metadata.version(p)}\n" for p in PARENT_PINS))
            # --no-compile: Python compiles what a run imports, when it imports it; pip compiling every
            # module of transformers or ray up front took 11 of the 17 s a transformers venv took
            install = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-compile",
                       "-c", str(pins)]
        else:
            base_python = shutil.which("python3.11")
            if base_python is None:
                pytest.fail(f"python3.11 is not on PATH: the {what} venv is made with it", pytrace=False)
            uv = [sys.executable, "-m", "uv", "--quiet", "--no-python-downloads"]
            subprocess.run(uv + ["venv", "--seed", "--python", base_python, str(venv)], check=True,
                           capture_output=True, timeout=300)
            install = uv + ["pip", "install", "--python", str(python)]
        proc = subprocess.run(install + list(requirements), capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            shutil.rmtree(base, ignore_errors=True)
            if any(s in proc.stdout + proc.stderr for s in UNREACHABLE):
                pytest.skip(f"the package index is unreachable, so the {what} venv ({' '.join(requirements)}) "
                            f"cannot be made:\n{proc.stderr[-2000:]}")
            pytest.fail(f"installing {' '.join(requirements)} into {venv} failed (exit {proc.returncode}):\n"
                        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}", pytrace=False)
        if sees_this_venv:
            site = next((venv / "lib").glob("python*/site-packages"))
            copies = sorted(p.name for p in site.iterdir()
                            if p.name.split("-")[0].lower() in PARENT_PACKAGES)
            if copies:
                shutil.rmtree(base, ignore_errors=True)
                pytest.fail(f"pip put its own {copies} into the {what} venv: it must use this venv's",
                            pytrace=False)
        stamp.write_text(json.dumps(wanted))
        return str(python)
