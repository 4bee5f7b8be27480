// Runs a model with opforge custom ops through ONNX Runtime's C++ API, on the CPU, and checks
// every output against the values torch computed.
//
// Usage: opforge_cpp_demo MODEL.onnx LIBOPFORGE_ORT.so DATA_DIR
//
// DATA_DIR is what export_model.py writes: manifest.txt, one line per tensor
// (`input|output NAME FILE RANK DIM...`), and the tensors as raw little-endian float32 files.
// Exit status: 0 every output matches, 1 an output differs, 2 any error (ONNX Runtime's included).

#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// numpy.allclose's rule, |got - expected| <= kAbsTol + kRelTol * |expected|: torch and ORT
// run float32 kernels with different summation orders, so the last bits may differ.
constexpr double kAbsTol = 1e-4;
constexpr double kRelTol = 1e-4;

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

struct SavedTensors {
  std::map<std::string, Tensor> inputs;
  std::map<std::string, Tensor> outputs;
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
  return text + "]";
}

Tensor ReadTensor(const fs::path& file, std::vector<int64_t> shape) {
  size_t count = 1;
  for (int64_t dim : shape) count *= static_cast<size_t>(dim);
  Tensor tensor{std::move(shape), std::vector<float>(count)};
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + file.string());
  const auto bytes = static_cast<std::streamsize>(count * sizeof(float));
  in.read(reinterpret_cast<char*>(tensor.values.data()), bytes);
  if (in.gcount() != bytes || in.peek() != std::ifstream::traits_type::eof()) {
    throw std::runtime_error(file.string() + ": expected exactly " + std::to_string(count) +
                             " float32 values for shape " + ShapeString(tensor.shape));
  }
  return tensor;
}

SavedTensors ReadManifest(const fs::path& dir) {
  std::ifstream manifest(dir / "manifest.txt");
  if (!manifest) throw std::runtime_error("cannot open " + (dir / "manifest.txt").string());
  SavedTensors saved;
  std::string line;
  for (int line_number = 1; std::getline(manifest, line); ++line_number) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string kind, name, file;
    size_t rank = 0;
    bool ok = static_cast<bool>(fields >> kind >> name >> file >> rank) && (kind == "input" || kind == "output");
    std::vector<int64_t> shape(ok ? rank : 0);
    for (int64_t& dim : shape) ok = ok && (fields >> dim) && dim >= 0;
    if (!ok) {
      throw std::runtime_error("manifest.txt line " + std::to_string(line_number) +
                               ": expected `input|output NAME FILE RANK DIM...`, got: " + line);
    }
    (kind == "input" ? saved.inputs : saved.outputs)[name] = ReadTensor(dir / file, std::move(shape));
  }
  return saved;
}

bool HostIsLittleEndian() {
  const uint16_t one = 1;
  unsigned char first_byte = 0;
  std::memcpy(&first_byte, &one, 1);
  return first_byte == 1;
}

// Prints how far one output is from torch's and says whether it is within tolerance.
bool Compare(const std::string& name, const Ort::Value& got, const Tensor& expected) {
  const auto info = got.GetTensorTypeAndShapeInfo();
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    std::cout << name << ": MISMATCH: not a float32 tensor (ONNX element type " << info.GetElementType() << ")\n";
    return false;
  }
  if (info.GetShape() != expected.shape) {
    std::cout << name << ": MISMATCH: shape " << ShapeString(info.GetShape()) << ", torch's is "
              << ShapeString(expected.shape) << "\n";
    return false;
  }
  const float* values = got.GetTensorData<float>();
  double max_abs_error = 0, max_rel_error = 0, max_tolerance_used = 0;
  size_t mismatched = 0;
  for (size_t i = 0; i < expected.values.size(); ++i) {
    const double want = expected.values[i];
    const double error = std::fabs(values[i] - want);
    const double tolerance_used = error / (kAbsTol + kRelTol * std::fabs(want));
    // Comparisons written so that a NaN counts as a mismatch and shows in the maxima.
    if (!(tolerance_used <= 1)) ++mismatched;
    if (!(tolerance_used <= max_tolerance_used)) max_tolerance_used = tolerance_used;
    if (!(error <= max_abs_error)) max_abs_error = error;
    // Relative error only where it means something: near zero the absolute tolerance rules.
    if (std::fabs(want) >= kAbsTol && !(error / std::fabs(want) <= max_rel_error)) {
      max_rel_error = error / std::fabs(want);
    }
  }
  std::cout << name << ": shape " << ShapeString(expected.shape) << ", max abs error " << max_abs_error
            << ", max rel error " << max_rel_error << ", worst error / tolerance " << max_tolerance_used;
  if (mismatched == 0) {
    std::cout << ": ok\n";
  } else {
    std::cout << ": MISMATCH in " << mismatched << " of " << expected.values.size() << " values\n";
  }
  return mismatched == 0;
}

int Run(const fs::path& model_path, const fs::path& library_path, const fs::path& data_dir) {
  if (!HostIsLittleEndian()) throw std::runtime_error("the saved tensors are little-endian; this host is not");
  SavedTensors saved = ReadManifest(data_dir);

  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "opforge_cpp_demo");
  Ort::SessionOptions options;
  // ORT loads the library and calls its RegisterCustomOps, which adds the opforge domain's kernels.
  options.RegisterCustomOpsLibrary(library_path.c_str());
  Ort::Session session(env, model_path.c_str(), options);
  std::cout << "ONNX Runtime " << Ort::GetVersionString() << " (C API " << ORT_API_VERSION << "), model "
            << model_path.string() << "\n";

  Ort::AllocatorWithDefaultOptions allocator;
  const auto cpu_memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<std::string> input_names, output_names;
  std::vector<Ort::Value> inputs;
  for (size_t i = 0; i < session.GetInputCount(); ++i) {
    input_names.push_back(session.GetInputNameAllocated(i, allocator).get());
    auto saved_input = saved.inputs.find(input_names.back());
    if (saved_input == saved.inputs.end()) {
      throw std::runtime_error("the model's input '" + input_names.back() + "' is not in manifest.txt");
    }
    Tensor& tensor = saved_input->second;
    inputs.push_back(Ort::Value::CreateTensor<float>(cpu_memory, tensor.values.data(), tensor.values.size(),
                                                     tensor.shape.data(), tensor.shape.size()));
  }
  for (size_t i = 0; i < session.GetOutputCount(); ++i) {
    output_names.push_back(session.GetOutputNameAllocated(i, allocator).get());
    if (!saved.outputs.count(output_names.back())) {
      throw std::runtime_error("the model's output '" + output_names.back() + "' is not in manifest.txt");
    }
  }
  if (inputs.size() != saved.inputs.size() || output_names.size() != saved.outputs.size()) {
    throw std::runtime_error("manifest.txt names tensors the model does not have");
  }

  std::vector<const char*> input_name_ptrs, output_name_ptrs;
  for (const auto& name : input_names) input_name_ptrs.push_back(name.c_str());
  for (const auto& name : output_names) output_name_ptrs.push_back(name.c_str());
  const std::vector<Ort::Value> outputs =
      session.Run(Ort::RunOptions{nullptr}, input_name_ptrs.data(), inputs.data(), inputs.size(),
                  output_name_ptrs.data(), output_name_ptrs.size());

  size_t mismatched_outputs = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!Compare(output_names[i], outputs[i], saved.outputs.at(output_names[i]))) ++mismatched_outputs;
  }
  if (mismatched_outputs) {
    std::cout << "MISMATCH: " << mismatched_outputs << " of " << outputs.size()
              << " outputs differ from torch's (tolerance: abs " << kAbsTol << " + rel " << kRelTol << ")\n";
    return 1;
  }
  std::cout << "all " << outputs.size() << " outputs match torch's (tolerance: abs " << kAbsTol << " + rel "
            << kRelTol << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " MODEL.onnx LIBOPFORGE_ORT.so DATA_DIR\n";
    return 2;
  }
  try {
    std::cout << std::setprecision(3);
    return Run(argv[1], argv[2], argv[3]);
  } catch (const Ort::Exception& e) {
    std::cerr << "ONNX Runtime error (code " << e.GetOrtErrorCode() << "): " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 2;
}
