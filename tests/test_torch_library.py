"""libopforge_torch.so, opforge's torch op library on LibTorch's stable ABI: what it links and
needs from torch (only the stable C shims, so one build loads in every torch >= 2.10), that it
registers every op with no Python in the process (opforge.torch_library_path(), for C++ programs
and AOTInductor runners), and the shape rules it carries (RuleDim callbacks on torch's SymInts)."""

import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

import opforge
from helpers import needed_libraries
from preloaded_python import run_command

ROOT = Path(__file__).resolve().parents[1]
TORCH_LIB = Path(torch.__file__).resolve().parent / "lib"
TORCH_INCLUDE = Path(torch.__file__).resolve().parent / "include"

# What a stable-ABI library may take from outside: torch's stable C shims, the C and C++ runtimes,
# OpenMP, and in the CUDA part the CUDA runtime and cuBLAS.
ALLOWED_UNDEFINED = re.compile(r"^(aoti_torch_\w+|torch_\w+|cuda\w+|cublas\w+|__cuda\w+|GOMP_\w+|omp_\w+"
                               r"|_ITM_\w+|__gmon_start__|_Unwind_\w+)(@\S+)?$"
                               r"|.*@(GLIBC|GLIBCXX|CXXABI|GCC)_[\d.]+$")


def _undefined_symbols(path) -> list:
    out = subprocess.run(["nm", "-D", "--undefined-only", str(path)], check=True, capture_output=True, text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def _libraries() -> list:
    main = Path(opforge.torch_library_path())
    companion = main.with_name(main.stem + "_cuda.so")
    return [main] + ([companion] if companion.is_file() else [])


@pytest.mark.parametrize("which", ["cpu", "cuda"])
def test_torch_library_uses_only_stable_c_shims(which):
    """No at::, c10:: or torch:: C++ symbol (those change between torch versions): the library
    reaches torch only through the stable C shims; and it needs no libpython."""
    libraries = _libraries()
    if which == "cuda" and len(libraries) == 1:
        assert not opforge.BUILT_WITH_CUDA
        return  # a CPU-only build: no CUDA part to check (the CPU part is the other case)
    path = libraries[0 if which == "cpu" else 1]
    undefined = _undefined_symbols(path)
    assert any(s.startswith("aoti_torch_") for s in undefined), undefined  # it does use the shims
    demangled = subprocess.run(["c++filt"], input="\n".join(undefined), capture_output=True, text=True).stdout
    cxx_torch = [s for s in demangled.splitlines() if re.search(r"\b(at|c10|torch|caffe2)::", s)]
    assert cxx_torch == [], cxx_torch
    assert [s for s in undefined if not ALLOWED_UNDEFINED.match(s)] == []
    needed = needed_libraries(path)
    assert not [n for n in needed if "python" in n or n.startswith(("libc10", "libtorch_python"))], needed
    if which == "cpu":
        assert not [n for n in needed if "cuda" in n or "cublas" in n], needed


def test_torch_library_reports_its_cuda_part():
    state, reason = opforge.ops._registry._C.cuda_part
    if len(_libraries()) == 1:
        assert state == "not built" and not opforge.BUILT_WITH_CUDA
    else:
        assert state in ("loaded", "failed"), (state, reason)
        assert opforge.BUILT_WITH_CUDA == (state == "loaded")
        if state == "failed":
            assert reason  # why the CUDA part could not load (no CUDA runtime of its major)


CXX_PROGRAM = r"""
// Loads opforge's torch library into a process with libtorch and no Python, then runs
// opforge::my_add through torch's dispatcher: the library registers its ops by itself.
#include <dlfcn.h>
#include <link.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdio>
#include <cstring>

static int saw_python = 0;
static int visit(struct dl_phdr_info* info, size_t, void*) {
  if (info->dlpi_name && std::strstr(info->dlpi_name, "libpython")) saw_python = 1;
  return 0;
}

int main(int argc, char** argv) {
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 2;
  }
  using torch::stable::Tensor;
  Tensor a = torch::stable::empty({3}, torch::headeronly::ScalarType::Float);
  Tensor b = torch::stable::empty({3}, torch::headeronly::ScalarType::Float);
  for (int i = 0; i < 3; ++i) {
    static_cast<float*>(a.mutable_data_ptr())[i] = float(i);
    static_cast<float*>(b.mutable_data_ptr())[i] = 10.0f;
  }
  std::array<StableIValue, 2> stack{torch::stable::detail::from(a), torch::stable::detail::from(b)};
  if (torch_call_dispatcher("opforge::my_add", "", stack.data(), TORCH_ABI_VERSION) != TORCH_SUCCESS) {
    std::printf("opforge::my_add failed\n");
    return 3;
  }
  Tensor out = torch::stable::detail::to<Tensor>(stack[0]);
  const float* o = static_cast<const float*>(out.const_data_ptr());
  dl_iterate_phdr(visit, nullptr);
  std::printf("%g %g %g python=%d\n", o[0], o[1], o[2], saw_python);
  return 0;
}
"""


def test_torch_library_registers_the_ops_without_python(tmp_path):
    """opforge.torch_library_path() in a C++ program: dlopen, then call an op through the
    dispatcher. (dlopen of the old Python extension module failed on PyModule_Create2.)"""
    source = tmp_path / "no_python.cpp"
    source.write_text(textwrap.dedent(CXX_PROGRAM))
    exe = tmp_path / "no_python"
    build = run_command(["g++", "-std=c++20", "-O1", "-o", str(exe), str(source), f"-I{TORCH_INCLUDE}",
                         f"-L{TORCH_LIB}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{TORCH_LIB}", "-ldl"])
    assert build.returncode == 0, build.stderr[-3000:]
    run = run_command([str(exe), opforge.torch_library_path()])
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == ["10", "12", "14", "python=0"], run.stdout


def test_shape_rule_runs_on_symints_through_the_library():
    """The C++ rule on RuleDims: numbers stay in C++, SymInts are answered in Python (their
    arithmetic and printing), and a refusal names the symbolic size as torch prints it."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    s = env.create_symintnode(env.create_symbol(7, ConstantSource("batch")), hint=7)
    rule = opforge.ShapeRule("opforge::_my_add_output_shapes")
    assert rule([2, 3], [3]) == [[2, 3]]
    (out,) = rule([s, 1, 3], [4, 1])
    assert out[0] is s and out[1:] == [4, 3]
    with pytest.raises(ValueError, match=rf"shapes of a \[{s}, 3\] and b \[5, 3\] are not broadcastable"):
        rule([s, 3], [5, 3])
    (out,) = opforge.ShapeRule("opforge::_deform_conv2d_output_shapes")(
        [s, 4, 9, 9], [6, 4, 3, 3], [s, 18, 7, 7], [s, 9, 7, 7], [6], 1, 1, 0, 0, 1, 1, 1, 1, True)
    assert out[0] is s and out[1:] == [6, 7, 7]
    with pytest.raises(RuntimeError, match="is not registered: no loaded torch library has this shape rule"):
        opforge.ShapeRule("opforge::_no_such_rule")([1], [1])


def test_aten_library_of_another_torch_is_refused_with_what_to_do(tmp_path, monkeypatch):
    """libopforge_aten.so links libtorch's C++ API: a build stamped for another torch is never
    loaded; the error names both versions and `opforge build-aten`, whose cached build for the
    running torch is then used."""
    import opforge.build
    from opforge.ort_kernels import aten_cache as aten_build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    packaged = tmp_path / "libopforge_aten.so"
    packaged.write_bytes(b"a build for another torch")
    (tmp_path / "libopforge_aten.so.torch").write_text("1.0.0+another\n")
    with pytest.raises(RuntimeError, match=rf"built for torch 1\.0\.0\+another, but this process runs torch "
                                           rf"{re.escape(torch.__version__)}.*-m opforge build-aten"):
        aten_build.aten_library_for_this_torch(packaged)
    cached = aten_build.cached_library_path()
    assert cached.parent == opforge.build.cache_dir() / "aten" / torch.__version__  # opforge's one cache
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"a build for this torch")
    (cached.parent / "libopforge_aten.so.torch").write_text(torch.__version__ + "\n")
    assert aten_build.aten_library_for_this_torch(packaged) == str(cached)
    # the packaged build when it is this torch's (what setup.py stamps)
    assert aten_build.built_for(Path(opforge.aten_library_path())) == torch.__version__
