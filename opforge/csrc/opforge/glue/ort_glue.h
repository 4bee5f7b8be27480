// Glue between ONNX Runtime's lite custom-op API and the compute cores of `opforge new-op --schema`
// packages (no op-specific code): node checks and attribute reads for session creation, inputs as
// the cores read them, the cores' alloc(k, shape) over the node's outputs, and the session's
// intra-op pool as their parallel_for. Installed with opforge and included from there, like
// core_tensor.h; a package's kernels name it `namespace ort_glue = opforge::ort_glue;`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <list>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "opforge/glue/core_tensor.h"
#include "opforge/ort_op.h"

namespace opforge {
namespace ort_glue {
inline namespace OPFORGE_GLUE_NAMESPACE {

// ---- session creation ----------------------------------------------------------------------

struct NodeInput {
  const char* name;
  bool optional;
};

// The node's inputs: each required one given, an optional one given or omitted ("" or left off at
// the end), and `outputs` outputs. An omitted optional input followed by a given one is refused:
// the lite API reads inputs by position and cannot skip it (ONNX Runtime would crash instead).
inline void check_node_inputs(const OrtKernelInfo* info, const char* op, std::initializer_list<NodeInput> inputs,
                              size_t outputs) {
  const Ort::ConstKernelInfo ki(info);
  const size_t given = ki.GetInputCount();
  if (given > inputs.size())
    opforge::ort::node_error(std::string(op) + ": the node has " + std::to_string(given) +
                             " inputs; expected at most " + std::to_string(inputs.size()));
  const NodeInput* omitted = nullptr;
  size_t i = 0;
  for (const NodeInput& input : inputs) {
    const bool present = i < given && !ki.GetInputName(i).empty();
    if (!present && !input.optional)
      opforge::ort::node_error(std::string(op) + ": input " + std::to_string(i) + " (" + input.name +
                               ") is missing or omitted (\"\"), but it is required");
    if (!present && omitted == nullptr) omitted = &input;
    if (present && omitted != nullptr)
      opforge::ort::node_error(std::string(op) + ": optional input " + omitted->name +
                               " is omitted but a later input (" + input.name +
                               ") is given; this kernel takes omitted optional inputs only at the end");
    ++i;
  }
  if (ki.GetOutputCount() != outputs)
    opforge::ort::node_error(std::string(op) + ": the node has " + std::to_string(ki.GetOutputCount()) +
                             " output(s); expected " + std::to_string(outputs));
}

// An int-list attribute (a torch int[]); its absence is an error naming op and attribute.
inline std::vector<int64_t> node_ints(const OrtKernelInfo* info, const char* op, const char* name) {
  try {
    return Ort::ConstKernelInfo(info).GetAttributes<int64_t>(name);
  } catch (const Ort::Exception& e) {
    opforge::ort::node_error(std::string(op) + ": the node needs the int list attribute '" + name + "' (" +
                             e.what() + ")");
  }
}

// A float-list attribute (a torch float[]), float32 values as ONNX stores them; its absence is an
// error naming op and attribute.
inline std::vector<float> node_floats(const OrtKernelInfo* info, const char* op, const char* name) {
  try {
    return Ort::ConstKernelInfo(info).GetAttributes<float>(name);
  } catch (const Ort::Exception& e) {
    opforge::ort::node_error(std::string(op) + ": the node needs the float list attribute '" + name + "' (" +
                             e.what() + ")");
  }
}

// A bool attribute: ONNX has none, a torch bool is exported as an int attribute 0 or 1.
inline bool node_bool(const OrtKernelInfo* info, const char* op, const char* name) {
  const int64_t value = opforge::ort::node_attribute<int64_t>(info, op, name);
  if (value != 0 && value != 1)
    opforge::ort::node_error(std::string(op) + ": attribute " + name + " (a bool) must be 0 or 1, got " +
                             std::to_string(value));
  return value != 0;
}

// The op definition ORT registers for `Kernel`: the lite API's, except that a node's inputs are
// counted only up to the last one given. ORT hands an omitted ("") input over as no value at all,
// which the lite API would read; counted this way, omitted trailing optional inputs (what the
// TorchScript exporter writes for a None) reach Compute as std::nullopt.
template <typename Kernel>
struct LiteOp : Ort::Custom::OrtLiteCustomStruct<Kernel> {
  using Base = Ort::Custom::OrtLiteCustomStruct<Kernel>;

  LiteOp(const char* name, const char* ep) : Base(name, ep) {
    base_create_kernel() = OrtCustomOp::CreateKernel;
    OrtCustomOp::CreateKernel = [](const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info) -> void* {
      auto* kernel = static_cast<typename Base::Kernel*>(base_create_kernel()(op, api, info));
      const Ort::ConstKernelInfo ki(info);
      while (kernel->num_input_ > 0 && ki.GetInputName(kernel->num_input_ - 1).empty()) --kernel->num_input_;
      return kernel;
    };
  }

  static decltype(OrtCustomOp::CreateKernel)& base_create_kernel() {
    static decltype(OrtCustomOp::CreateKernel) create = nullptr;
    return create;
  }
};

template <typename Kernel>
opforge::ort::LiteOpPtr make_op(const char* name, const char* ep) {
  return opforge::ort::LiteOpPtr(new LiteOp<Kernel>(name, ep));
}

// ---- compute -------------------------------------------------------------------------------

// The compute type of ORT element type T: float for float16 / bfloat16 (widened, rounded once), else T.
template <typename T>
using compute_t =
    std::conditional_t<std::is_same_v<T, Ort::Float16_t> || std::is_same_v<T, Ort::BFloat16_t>, float, T>;

// A float input in the compute type: ORT's buffer itself, or a float32 copy kept in `keep`.
template <typename T>
glue::Input<compute_t<T>> float_input(const Ort::Custom::Tensor<T>& t, std::list<std::vector<float>>& keep) {
  glue::Input<compute_t<T>> in;
  in.shape = t.Shape();
  if constexpr (std::is_same_v<compute_t<T>, T>) {
    in.data = t.Data();
  } else {
    const int64_t n = t.NumberOfElement();
    std::vector<float>& copy = keep.emplace_back(static_cast<size_t>(n));
    const auto* src = opforge::ort::core_ptr(t.Data());
    for (int64_t i = 0; i < n; ++i) copy[i] = opforge::core::load(src[i]);
    in.data = copy.data();
  }
  return in;
}
template <typename T>
glue::Input<compute_t<T>> float_input(const std::optional<const Ort::Custom::Tensor<T>*>& t,
                                      std::list<std::vector<float>>& keep) {
  if (t.has_value()) return float_input(**t, keep);
  glue::Input<compute_t<T>> absent;
  absent.present = false;
  return absent;
}

// An input of its own element type (an index tensor): ORT's buffer as it is.
template <typename T>
glue::Input<T> typed_input(const Ort::Custom::Tensor<T>& t) {
  glue::Input<T> in;
  in.data = t.Data();
  in.shape = t.Shape();
  return in;
}
template <typename T>
glue::Input<T> typed_input(const std::optional<const Ort::Custom::Tensor<T>*>& t) {
  if (t.has_value()) return typed_input(**t);
  glue::Input<T> absent;
  absent.present = false;
  return absent;
}

// The core's alloc(k, shape) over the node's outputs: ORT's buffer itself, or for the 16-bit types a
// float32 buffer that finish() rounds into ORT's.
template <typename T>
class Outputs {
 public:
  using F = compute_t<T>;

  Outputs(std::vector<Ort::Custom::Tensor<T>*> tensors, const char* op, const char* function)
      : tensors_(std::move(tensors)), data_(tensors_.size(), nullptr), wide_(tensors_.size()),
        allocated_(tensors_.size(), false), op_(op), function_(function) {}

  // The functor the core calls.
  auto allocator() {
    return [this](int k, const std::vector<int64_t>& shape) -> F* {
      if (k < 0 || k >= static_cast<int>(tensors_.size()))  // a bug in the core: fail the run, never write astray
        throw Ort::Exception(std::string(op_) + ": " + function_ + " allocates output " + std::to_string(k) +
                             ", but there are " + std::to_string(tensors_.size()), ORT_INVALID_ARGUMENT);
      data_[k] = tensors_[k]->Allocate(shape);
      allocated_[k] = true;
      if constexpr (std::is_same_v<F, T>) {
        return data_[k];
      } else {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        wide_[k].assign(static_cast<size_t>(n), 0.0f);
        return wide_[k].data();
      }
    };
  }

  // After the core returned "": every output allocated, 16-bit ones rounded into ORT's buffers.
  Ort::Status finish() {
    for (size_t k = 0; k < tensors_.size(); ++k) {
      if (!allocated_[k])
        return opforge::ort::invalid_argument(std::string(op_) + ": " + function_ +
                                              " returned without allocating output " + std::to_string(k));
      if constexpr (!std::is_same_v<F, T>) {
        auto* dst = opforge::ort::core_ptr(data_[k]);
        using Storage = std::remove_pointer_t<decltype(dst)>;
        for (size_t i = 0; i < wide_[k].size(); ++i) dst[i] = opforge::core::store<Storage>(wide_[k][i]);
      }
    }
    return Ort::Status(nullptr);
  }

 private:
  std::vector<Ort::Custom::Tensor<T>*> tensors_;
  std::vector<T*> data_;
  std::vector<std::vector<float>> wide_;
  std::vector<bool> allocated_;
  const char* op_;
  const char* function_;
};

// The core's parallel_for(n, grain, body): the session's intra-op pool (intra_op_num_threads).
struct ParallelFor {
  OrtKernelContext* ctx;

  template <typename Body>
  void operator()(int64_t n, int64_t grain, const Body& body) const {
    if (n > 0) opforge::ort::parallel_for(ctx, n, grain > 0 ? grain : 1, body);
  }
};

}  // namespace OPFORGE_GLUE_NAMESPACE
}  // namespace ort_glue
}  // namespace opforge
