// Runs an AOTInductor package (.pt2) whose model calls opforge's ops, from C++ with no Python:
//
//   opforge_aoti_demo MODEL.pt2 LIBOPFORGE_TORCH.so DATA_DIR [THREADS]
//
// A custom op is not packaged in the .pt2: its kernels must be registered in the process before
// the package runs. dlopen(opforge.torch_library_path()) does that: the library registers every
// opforge op with torch's dispatcher when it loads (it is built on LibTorch's stable ABI, so one
// build serves every torch >= 2.10). DATA_DIR holds inputs.pt and expected.pt (lists of tensors
// saved by export_model.py with torch.save); the outputs are compared with expected.pt.
// Exit status: 0 all outputs match, 1 a mismatch, 2 an error (reported, never a crash).
#include <dlfcn.h>

#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/serialize.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

static std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : torch::pickle_load(bytes).toListRef()) out.push_back(v.toTensor());
  return out;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.pt2 LIBOPFORGE_TORCH.so DATA_DIR [THREADS]\n", argv[0]);
    return 2;
  }
  const std::string model = argv[1], library = argv[2], data = argv[3];
  if (argc > 4) at::set_num_threads(std::stoi(argv[4]));
  // RTLD_NOW: a library that cannot resolve a symbol fails here, not in the middle of a run.
  if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "error: cannot load %s: %s\n", library.c_str(), dlerror());
    return 2;
  }
  try {
    torch::inductor::AOTIModelPackageLoader loader(model);
    const std::vector<at::Tensor> inputs = load_tensors(data + "/inputs.pt");
    const std::vector<at::Tensor> expected = load_tensors(data + "/expected.pt");
    std::vector<at::Tensor> outputs = loader.run(inputs);
    const int runs = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < runs; ++i) outputs = loader.run(inputs);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / runs;
    if (outputs.size() != expected.size()) {
      std::printf("MISMATCH: %zu outputs, expected %zu\n", outputs.size(), expected.size());
      return 1;
    }
    int bad = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const bool same_shape = outputs[i].sizes() == expected[i].sizes();
      const double err = same_shape ? (outputs[i] - expected[i]).abs().max().item<double>() : -1.0;
      const bool ok = same_shape && err <= 1e-4;
      bad += !ok;
      std::printf("output %zu: shape %s, max abs error %.3g: %s\n", i, c10::str(outputs[i].sizes()).c_str(), err,
                  ok ? "ok" : "MISMATCH");
    }
    std::printf("%.3f ms per run (%d threads)\n", ms, at::get_num_threads());
    if (bad) return 1;
    std::printf("all %zu outputs match torch's\n", outputs.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
