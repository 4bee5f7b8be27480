// Runs an AOTInductor package (.pt2) whose model calls opforge's ops, from C++ with no Python:
//
//   opforge_aoti_demo MODEL.pt2 LIBOPFORGE_TORCH.so DATA_DIR [THREADS]
//
// A custom op is not packaged in the .pt2: its kernels must be registered in the process before
// the package runs. dlopen(opforge.torch_library_path()) does that: the library registers every
// opforge op with torch's dispatcher when it loads (it is built on LibTorch's stable ABI, so one
// build serves every torch >= 2.10). DATA_DIR holds the inputs and torch's eager outputs as
// export_model.py writes them (inputs.txt / expected.txt: one line per tensor, "FILE DTYPE DIM...",
// each FILE raw little-endian data); the outputs are compared with the expected ones.
// Exit status: 0 all outputs match, 1 a mismatch, 2 an error (reported, never a crash).
#include <dlfcn.h>

#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

// The tensors a manifest (DATA_DIR/NAME.txt) lists, read from their raw files.
static std::vector<at::Tensor> load_tensors(const std::string& dir, const std::string& name) {
  std::ifstream manifest(dir + "/" + name + ".txt");
  if (!manifest) throw std::runtime_error("cannot read " + dir + "/" + name + ".txt");
  std::vector<at::Tensor> out;
  std::string line;
  while (std::getline(manifest, line)) {
    std::istringstream fields(line);
    std::string file, dtype;
    fields >> file >> dtype;
    std::vector<int64_t> shape;
    for (int64_t d; fields >> d;) shape.push_back(d);
    const auto type = dtype == "float32" ? at::kFloat : dtype == "int64" ? at::kLong : at::kDouble;
    if (dtype != "float32" && dtype != "int64" && dtype != "float64")
      throw std::runtime_error("unsupported dtype " + dtype + " in " + name + ".txt");
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    std::ifstream data(dir + "/" + file, std::ios::binary);
    data.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    if (!data || data.gcount() != static_cast<std::streamsize>(t.nbytes()))
      throw std::runtime_error("cannot read " + std::to_string(t.nbytes()) + " bytes from " + dir + "/" + file);
    out.push_back(t);
  }
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
    const std::vector<at::Tensor> inputs = load_tensors(data, "inputs");
    const std::vector<at::Tensor> expected = load_tensors(data, "expected");
    std::vector<at::Tensor> outputs = loader.run(inputs);
    // The median of 200 timed runs: a mean over a few runs swings with one slow run.
    std::vector<double> times;
    for (int i = 0; i < 200; ++i) {
      const auto start = std::chrono::steady_clock::now();
      outputs = loader.run(inputs);
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    const double ms = times[times.size() / 2];
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
    std::printf("%.3f ms per run, median (%d threads)\n", ms, at::get_num_threads());
    if (bad) return 1;
    std::printf("all %zu outputs match torch's\n", outputs.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
