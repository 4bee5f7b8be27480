// libopforge_aten.so: ONNX Runtime kernel for org.pytorch.aten::ATen nodes
// (what torch's ATen-fallback export emits), run through libtorch's dispatcher.
//
//   node attributes: operator ("cummax"), overload_name ("" or "Tensor")
//   node inputs:     the op's schema arguments in order; tensors as tensors,
//                    non-tensor arguments as constant inputs (0-d or 1-D
//                    tensors), "" for None / trailing defaults
//   node outputs:    the op's returns in order
//
// The schema is resolved once per node (kernel creation); each run decodes the
// inputs into the schema's argument types, wraps ORT's input buffers as torch
// tensors WITHOUT copying, calls the op boxed and copies the results into
// ORT's outputs. Anything unexpected is an ORT error status naming the op and
// the argument, never a crash.
//
// Unlike libopforge_ort (which must not), this library links libtorch.
//
// A model is data, not code: a node may name any operator of libtorch's
// dispatcher, so the kernel is default-deny. It runs only the operators of
// aten_policy.inc (public, functional, pure tensor math; generated and reviewed
// from the rules in opforge/aten/policy.py) and refuses the rest when
// the session is created, naming the op and how to allow it. The session config
// entry "opforge.aten.allow" (comma-separated names, or "*"), read when the
// library is registered, opts a trusted model in. What an allowed op is given is
// checked before it runs (sizes the model asks for against the node's inputs;
// enums, loop counts and the data some kernels trust: aten_guards.h), what it
// allocates counts against the node's memory budget while it runs, and every
// result is bounded before it is copied out, so a hostile model cannot demand
// terabytes, read memory it was not given or hang the session
// ("opforge.aten.max_elements" raises the bound and the budget).
//
// CUDA builds (OPFORGE_WITH_CUDA) register the kernel for the CUDA execution
// provider too: inputs are wrapped as CUDA tensors where ORT placed them, and
// the op runs on ORT's compute stream (made torch's current stream for the
// call), so it is ordered with the neighbouring ORT CUDA kernels.
#ifndef ORT_API_MANUAL_INIT  // also set by setup.py
#define ORT_API_MANUAL_INIT
#endif
#include <onnxruntime_cxx_api.h>

#include "opforge/ort_library.h"
#include "aten_guards.h"
#include "aten_policy.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/InferenceMode.h>
#ifdef OPFORGE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

constexpr const char* kAtenDomain = "org.pytorch.aten";
// ORT does not allow absent ("") entries inside a variadic input list, so
// opforge's export feeds this (empty) initializer where an argument is None;
// the kernel recognises it by name. Must match opforge/aten/fallback.py.
constexpr const char* kNoneInput = "opforge_aten_none";

Ort::Status error(const std::string& msg, OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  return Ort::Status(msg.c_str(), code);
}

using namespace opforge_aten;  // aten_policy.h, aten_guards.h

// Registration-time policies live as long as the library (their op objects do).
std::shared_ptr<const AtenPolicy> policy_from(Ort::UnownedSessionOptions& options, std::string* problem) {
  auto policy = std::make_shared<AtenPolicy>();
  if (options.HasConfigEntry(kAllowKey)) {
    std::stringstream names(options.GetConfigEntry(kAllowKey));
    for (std::string name; std::getline(names, name, ',');) {
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      if (name.rfind("aten::", 0) == 0) name = name.substr(6);
      name = name.substr(0, name.find('.'));  // an overload names its operator
      if (!name.empty()) policy->allowed.insert(name);
    }
  }
  if (options.HasConfigEntry(kMaxElementsKey)) {
    const std::string text = options.GetConfigEntry(kMaxElementsKey);
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value <= 0) {
      *problem = std::string("libopforge_aten: session config entry '") + kMaxElementsKey + "' must be a positive " +
                 "integer, got '" + text + "'";
      return nullptr;
    }
    policy->max_elements = value;
  }
  return policy;
}

std::optional<at::ScalarType> to_torch_type(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return at::kFloat;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return at::kDouble;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return at::kHalf;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return at::kBFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return at::kChar;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return at::kByte;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return at::kShort;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return at::kInt;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return at::kLong;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return at::kBool;
    default: return std::nullopt;
  }
}

std::optional<ONNXTensorElementDataType> to_onnx_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case at::kDouble: return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
    case at::kHalf: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case at::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    case at::kChar: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case at::kByte: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case at::kShort: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16;
    case at::kInt: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case at::kLong: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case at::kBool: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
    default: return std::nullopt;
  }
}

constexpr const char* kCpuEp = "CPUExecutionProvider";
constexpr const char* kCudaEp = "CUDAExecutionProvider";

// The torch device of ORT memory (CPU, or the GPU it lives on).
at::Device device_of(const Ort::ConstMemoryInfo& mem) {
  if (mem.GetDeviceType() == OrtMemoryInfoDeviceType_GPU)
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(mem.GetDeviceId()));
  return at::Device(at::kCPU);
}

// Whether `value` is a valid value of an enum argument type; "" when it is, else what the valid
// values are. Enums travel as integers, and torch indexes tables with them unchecked. Of the
// dtypes, only those of dense numeric tensors: quantized, bit-packed and float8 types make
// tensors no kernel here expects (and ONNX Runtime cannot hold). Of the layouts, only strided:
// a sparse tensor's indices are not checked (zeros(layout=torch.sparse_coo) reached them).
std::string invalid_enum(c10::TypeKind kind, int64_t value) {
  switch (kind) {
    case c10::TypeKind::ScalarTypeType: {
      const bool dense = (value >= static_cast<int64_t>(c10::ScalarType::Byte) &&
                          value <= static_cast<int64_t>(c10::ScalarType::Bool)) ||
                         value == static_cast<int64_t>(c10::ScalarType::BFloat16);
      return dense ? "" : "a dtype of dense numbers (0 to 11: uint8 ... bool, or 15: bfloat16)";
    }
    case c10::TypeKind::LayoutType:
      return value == static_cast<int64_t>(c10::Layout::Strided) ? "" : "0 (strided: dense tensors only)";
    case c10::TypeKind::MemoryFormatType:
      return value >= 0 && value < static_cast<int64_t>(c10::MemoryFormat::NumOptions)
                 ? ""
                 : "0 to " + std::to_string(static_cast<int64_t>(c10::MemoryFormat::NumOptions) - 1);
    default:
      return "";
  }
}

// ONNX Runtime's inputs are read-only (they may be the caller's arrays or the
// model's initializers), and the kernel wraps them without copying: an op that
// writes into an argument (in-place ops such as add_, out= overloads) would
// change them behind the caller's back. Names the first such argument, or "".
std::string written_argument(const c10::FunctionSchema& schema) {
  for (const c10::Argument& arg : schema.arguments())
    if (arg.alias_info() != nullptr && arg.alias_info()->isWrite()) return arg.name();
  return "";
}

struct AtenKernel {
  std::string name;  // "aten::cummax" or "aten::frexp.Tensor", for messages
  c10::OperatorHandle op;
  std::vector<bool> is_none;  // per node input: fed the None marker
  bool on_cuda;               // kernel of the CUDA execution provider
  std::shared_ptr<const AtenPolicy> policy;
  bool allocator_installed = opforge_aten::install_budgeted_allocator();  // see aten_guards.h
  // What the guards need of the schema, found once here rather than on every run (aten_guards.h)
  std::vector<std::vector<const opforge_aten::IntRange*>> int_ranges;  // per argument
  opforge_aten::ValueCheck value_check;                                // nullptr: none
  std::vector<size_t> running_stats;  // arguments batch_norm & co. write into although their schemas do not say

  AtenKernel(c10::OperatorHandle handle, std::string n, std::vector<bool> none, bool cuda,
             std::shared_ptr<const AtenPolicy> p)
      : name(std::move(n)), op(std::move(handle)), is_none(std::move(none)), on_cuda(cuda), policy(std::move(p)),
        int_ranges(opforge_aten::int_ranges_of(op.schema())), value_check(opforge_aten::value_check_for(op.schema())) {
    const auto& args = op.schema().arguments();
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].name() == "running_mean" || args[i].name() == "running_var") running_stats.push_back(i);
  }

  std::string too_large(const std::string& what, int64_t elements, int64_t bound, int64_t input_elements) const {
    return "ATen op " + name + ": " + what + " " + std::to_string(elements) + " elements, more than this node may make (" +
           std::to_string(bound) +
           (policy->max_elements > 0 ? std::string(", set by '") + kMaxElementsKey + "'"
                                     : ": the larger of 2^25 and 64 per element of its inputs, which have " +
                                           std::to_string(input_elements)) +
           "); a model cannot demand memory at will. If you trust this model, raise the bound: "
           "sess_options.add_session_config_entry('" + kMaxElementsKey + "', 'N') before registering libopforge_aten";
  }

  // The sizes the model asks for, before anything is allocated.
  Ort::Status check_sizes(const torch::jit::Stack& stack, int64_t input_elements) const {
    const auto& args = op.schema().arguments();
    const int64_t bound = policy->bound(input_elements);
    for (size_t i = 0; i < args.size(); ++i) {
      const int64_t asked = requested_elements(args[i].name(), stack[i], input_elements);
      if (asked > bound) return error(too_large(argument(args[i], i) + " asks for", asked, bound, input_elements));
    }
    // two counts that make a matrix together: eye(n, m), tril_indices(row, col)
    for (const auto& [a, b] : {std::pair<const char*, const char*>{"n", "m"}, {"row", "col"}}) {
      int64_t product = 1, found = 0;
      for (size_t i = 0; i < args.size(); ++i)
        if ((args[i].name() == a || args[i].name() == b) && stack[i].isInt()) {
          product = saturating_mul(product, std::max<int64_t>(stack[i].toInt(), 0));
          ++found;
        }
      if (found == 2 && product > bound)
        return error(too_large(std::string("'") + a + "' times '" + b + "' asks for", product, bound, input_elements));
    }
    // arange / range take their extent as numbers: (end - start) / step elements
    const std::string& base = op.schema().name();
    if (base == "aten::arange" || base == "aten::range") {
      double start = 0, end = 0, step = 1;
      for (size_t i = 0; i < args.size(); ++i) {
        if (!stack[i].isScalar() && !stack[i].isDouble() && !stack[i].isInt()) continue;
        const double v = stack[i].toScalar().toDouble();
        if (args[i].name() == "start") start = v;
        if (args[i].name() == "end") end = v;
        if (args[i].name() == "step") step = v;
      }
      const double count = step != 0 ? std::fabs((end - start) / step) : 0;
      if (!(count <= static_cast<double>(bound)))  // also NaN
        return error(too_large("its range asks for", saturating_from(count), bound, input_elements));
    }
    return Ort::Status(nullptr);
  }

  static std::string argument(const c10::Argument& arg, size_t i) {
    return "argument " + std::to_string(i) + " '" + arg.name() + "' (" + arg.real_type()->str() + ")";
  }
  std::string where(const c10::Argument& arg, size_t i) const { return "ATen op " + name + ", " + argument(arg, i); }

  // Wraps ORT's buffer as a torch tensor, no copy. ORT keeps inputs alive for the call.
  Ort::Status wrap_tensor(const Ort::ConstValue& v, const std::string& where, at::Tensor& out) const {
    if (!v.IsTensor()) return error(where + ": expected a tensor input");
    auto info = v.GetTensorTypeAndShapeInfo();
    auto type = to_torch_type(info.GetElementType());
    if (!type) return error(where + ": unsupported ONNX element type " + std::to_string(info.GetElementType()));
    std::vector<int64_t> shape = info.GetShape();
    void* data = const_cast<void*>(v.GetTensorRawData());
    out = at::from_blob(data, shape, at::TensorOptions().dtype(*type).device(device_of(v.GetTensorMemoryInfo())));
    return Ort::Status(nullptr);
  }

  // Decodes one schema argument from input value v (null: input absent).
  Ort::Status decode(const c10::Argument& arg, size_t i, const OrtValue* raw, c10::IValue& out) const {
    const std::string at = where(arg, i);
    c10::TypePtr type = arg.type();
    if (raw == nullptr) {
      if (type->kind() == c10::TypeKind::OptionalType) {
        out = c10::IValue();
        return Ort::Status(nullptr);
      }
      if (arg.default_value()) {
        out = *arg.default_value();
        return Ort::Status(nullptr);
      }
      return error(at + ": input is missing and the argument has no default");
    }
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    Ort::ConstValue v(raw);
    at::Tensor t;
    if (type->kind() == c10::TypeKind::TensorType) {
      Ort::Status st = wrap_tensor(v, at, t);
      if (st.IsOK()) out = t;
      return st;
    }
    if (type->kind() == c10::TypeKind::StringType) {
      if (!v.IsTensor() || v.GetTensorTypeAndShapeInfo().GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING ||
          v.GetTensorTypeAndShapeInfo().GetElementCount() != 1)
        return error(at + ": expected a 1-element string tensor");
      const size_t len = v.GetStringTensorElementLength(0);
      std::string s(len, '\0');
      v.GetStringTensorElement(len, 0, s.data());
      out = s;
      return Ort::Status(nullptr);
    }
    Ort::Status st = wrap_tensor(v, at, t);
    if (!st.IsOK()) return st;
    switch (type->kind()) {
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType:
      case c10::TypeKind::ScalarTypeType:
      case c10::TypeKind::LayoutType:
      case c10::TypeKind::MemoryFormatType: {
        if (t.numel() != 1 || t.is_floating_point()) return error(at + ": expected one integer, got a tensor of " + std::to_string(t.numel()) + " " + std::string(c10::toString(t.scalar_type())) + " values");
        const int64_t value = t.item<int64_t>();
        // Enums travel as integers (the schema's type says int; the real type says
        // which enum) and torch indexes tables with them unchecked.
        c10::TypePtr real = arg.real_type();
        if (auto opt = real->cast<c10::OptionalType>()) real = opt->getElementType();
        if (const std::string valid = invalid_enum(real->kind(), value); !valid.empty())
          return error(at + ": " + std::to_string(value) + " is not a valid " + real->str() + " here (" + valid + ")");
        out = value;
        return Ort::Status(nullptr);
      }
      case c10::TypeKind::FloatType:
        if (t.numel() != 1) return error(at + ": expected one number, got " + std::to_string(t.numel()) + " values");
        out = t.item<double>();
        return Ort::Status(nullptr);
      case c10::TypeKind::BoolType:
        if (t.numel() != 1) return error(at + ": expected one bool, got " + std::to_string(t.numel()) + " values");
        out = t.item<double>() != 0;
        return Ort::Status(nullptr);
      case c10::TypeKind::NumberType:
        if (t.numel() != 1) return error(at + ": expected one number, got " + std::to_string(t.numel()) + " values");
        out = t.item();
        return Ort::Status(nullptr);
      case c10::TypeKind::ListType: {
        auto elem = type->castRaw<c10::ListType>()->getElementType();
        if (elem->kind() == c10::TypeKind::IntType || elem->kind() == c10::TypeKind::SymIntType) {
          if (t.dim() > 1 || t.is_floating_point()) return error(at + ": expected a 1-D integer tensor");
          at::Tensor l = t.to(at::kLong).contiguous();
          out = std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
          return Ort::Status(nullptr);
        }
        if (elem->kind() == c10::TypeKind::FloatType) {
          at::Tensor l = t.to(at::kDouble).contiguous();
          out = std::vector<double>(l.data_ptr<double>(), l.data_ptr<double>() + l.numel());
          return Ort::Status(nullptr);
        }
        if (elem->kind() == c10::TypeKind::BoolType) {
          at::Tensor l = t.to(at::kBool).contiguous();
          c10::List<bool> bools;
          for (int64_t k = 0; k < l.numel(); ++k) bools.push_back(l.data_ptr<bool>()[k]);
          out = bools;
          return Ort::Status(nullptr);
        }
        return error(at + ": list arguments of this element type cannot be decoded");
      }
      default:
        return error(at + ": argument type cannot be decoded from an ONNX input");
    }
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) {
    try {  // nothing may escape into ORT's C frames: ORT API calls throw Ort::Exception
      return compute(raw_ctx).release();
    } catch (const std::exception& e) {
      return error("ATen op " + name + ": " + first_line(e.what()), ORT_FAIL).release();
    }
  }

  static std::string first_line(const std::string& what) { return what.substr(0, what.find("\nException raised from")); }

  std::string over_budget(const opforge_aten::NodeBudget& budget, int64_t input_elements) const {
    const uint64_t total = budget.allocated + budget.left;
    return "ATen op " + name + ": asks for " + std::to_string(budget.refused) + " bytes more after " +
           std::to_string(budget.allocated) + ", more than this node may allocate (" + std::to_string(total) +
           " bytes: " + std::to_string(kBudgetBytesPerElement) + " per element of its bound, " +
           (policy->max_elements > 0 ? std::string("set by '") + kMaxElementsKey + "'"
                                     : "the larger of 2^25 and 64 per element of its inputs, which have " +
                                           std::to_string(input_elements)) +
           "); a model cannot demand memory at will. If you trust this model, raise the bound: "
           "sess_options.add_session_config_entry('" + kMaxElementsKey + "', 'N') before registering libopforge_aten";
  }

  Ort::Status compute(OrtKernelContext* raw_ctx) {
    Ort::KernelContext ctx(raw_ctx);
    const c10::FunctionSchema& schema = op.schema();
    const auto& args = schema.arguments();
    const size_t n_in = ctx.GetInputCount();
    if (n_in > args.size())
      return error("ATen op " + name + ": node has " + std::to_string(n_in) + " inputs but its schema takes " +
                   std::to_string(args.size()) + " arguments");
    c10::InferenceMode guard;
#ifdef OPFORGE_WITH_CUDA
    // ORT's stream becomes torch's current stream (and device) for this call.
    std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
    if (on_cuda) {
      // the stream belongs to the GPU the node's inputs are on (not necessarily the current one)
      const c10::DeviceIndex device =
          n_in > 0 && static_cast<const OrtValue*>(ctx.GetInput(0)) != nullptr && !is_none[0]
              ? static_cast<c10::DeviceIndex>(ctx.GetInput(0).GetTensorMemoryInfo().GetDeviceId())
              : c10::cuda::current_device();
      stream_guard.emplace(
          c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(ctx.GetGPUComputeStream()), device));
    }
#endif
    torch::jit::Stack stack;
    stack.reserve(args.size());
    int64_t input_elements = 0;
    for (size_t i = 0; i < args.size(); ++i) {
      const OrtValue* v = nullptr;
      if (i < n_in && !is_none[i]) v = static_cast<const OrtValue*>(ctx.GetInput(i));
      c10::IValue value;
      Ort::Status st = decode(args[i], i, v, value);
      if (!st.IsOK()) return st;
      if (value.isTensor()) input_elements = saturating_add(input_elements, value.toTensor().numel());
      stack.push_back(std::move(value));
    }
    if (Ort::Status st = check_sizes(stack, input_elements); !st.IsOK()) return st;
    // batch_norm / native_batch_norm / instance_norm update their running statistics in place when
    // training, although their schemas do not say they write: give them copies, never ORT's
    // (read-only, possibly shared) buffers.
    for (size_t i : running_stats)
      if (stack[i].isTensor()) stack[i] = stack[i].toTensor().clone();
    for (size_t i = 0; i < args.size(); ++i)
      if (std::string bad = opforge_aten::check_int_ranges(args[i], stack[i], int_ranges[i]); !bad.empty())
        return error(where(args[i], i) + ": " + bad);
    if (value_check != nullptr) {
      try {
        if (std::string bad = value_check(schema, stack); !bad.empty()) return error("ATen op " + name + ": " + bad);
      } catch (const std::exception& e) {
        return error("ATen op " + name + ": checking its arguments failed: " + first_line(e.what()));
      }
    }
    const int64_t bound = policy->bound(input_elements);
    opforge_aten::NodeBudget budget{static_cast<uint64_t>(saturating_mul(bound, kBudgetBytesPerElement))};
    std::vector<c10::IValue> results;  // flatten tensor lists (e.g. aten::unbind)
    try {
      if (on_cuda == false && !allocator_installed)
        return error("ATen op " + name + ": libtorch's CPU allocator was replaced by another library, so this node's "
                     "memory cannot be bounded; refusing to run it", ORT_FAIL);
      opforge_aten::BudgetScope scope(budget);
      op.callBoxed(&stack);
      for (auto& r : stack) {
        if (r.isTensorList()) {
          for (const at::Tensor& t : r.toTensorList().vec()) results.emplace_back(t);
        } else {
          results.push_back(std::move(r));
        }
      }
      // Views (expand, unfold...) are free until copied out: bound what is materialised.
      for (size_t i = 0; i < results.size(); ++i)
        if (results[i].isTensor() && results[i].toTensor().numel() > bound)
          return error(too_large("return " + std::to_string(i) + " has", results[i].toTensor().numel(), bound,
                                 input_elements));
      for (auto& r : results)
        if (r.isTensor()) r = r.toTensor().contiguous();
    } catch (const std::exception& e) {
      if (budget.refused > 0) return error(over_budget(budget, input_elements));
      return error("ATen op " + name + " failed: " + first_line(e.what()), ORT_FAIL);
    }
    const size_t n_out = ctx.GetOutputCount();
    if (n_out > results.size())
      return error("ATen op " + name + ": node has " + std::to_string(n_out) + " outputs but the op returned " +
                   std::to_string(results.size()));
    for (size_t i = 0; i < n_out; ++i) {
      at::Tensor t;
      if (results[i].isTensor()) {
        t = results[i].toTensor();
      } else if (results[i].isScalar() || results[i].isInt() || results[i].isDouble() || results[i].isBool()) {
        const c10::Scalar value = results[i].toScalar();
        t = at::scalar_tensor(value, at::TensorOptions().dtype(value.type()));  // a 0-d tensor of its type
      } else {
        return error("ATen op " + name + ": return " + std::to_string(i) + " is a " + results[i].tagKind() +
                     ", not a tensor or number", ORT_NOT_IMPLEMENTED);
      }
      auto onnx_type = to_onnx_type(t.scalar_type());
      if (!onnx_type)
        return error("ATen op " + name + ": return " + std::to_string(i) + " has dtype " +
                     std::string(c10::toString(t.scalar_type())) + ", which ONNX Runtime cannot hold", ORT_NOT_IMPLEMENTED);
      std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
      Ort::UnownedValue out = ctx.GetOutput(i, shape.data(), shape.size());
      if (static_cast<OrtValue*>(out) == nullptr) continue;  // an omitted output (""): nothing reads it
      auto out_type = out.GetTensorTypeAndShapeInfo().GetElementType();
      if (out_type != *onnx_type)
        return error("ATen op " + name + ": return " + std::to_string(i) + " has dtype " +
                     std::string(c10::toString(t.scalar_type())) + " but the model declares ONNX type " +
                     std::to_string(out_type));
      if (t.numel() == 0) continue;
      const at::Device out_device = device_of(out.GetTensorMemoryInfo());
      if (out_device.is_cpu() && t.device().is_cpu()) {
        std::memcpy(out.GetTensorMutableRawData(), t.const_data_ptr(), t.nbytes());
      } else {  // device copy, on the current (= ORT's) stream
        try {
          at::from_blob(out.GetTensorMutableRawData(), shape, t.options().device(out_device)).copy_(t);
        } catch (const std::exception& e) {
          return error("ATen op " + name + ": copying return " + std::to_string(i) + " failed: " + e.what(), ORT_FAIL);
        }
      }
    }
    return Ort::Status(nullptr);
  }
};

struct AtenOp : Ort::CustomOpBase<AtenOp, AtenKernel, /*WithStatus=*/true> {
  const char* ep;  // kCpuEp or kCudaEp
  std::shared_ptr<const AtenPolicy> policy;
  AtenOp(const char* provider, std::shared_ptr<const AtenPolicy> p) : ep(provider), policy(std::move(p)) {}

  // CustomOpBase hands these results to ORT as raw OrtStatus*: return released
  // pointers (returning an Ort::Status would free the status before ORT reads it).
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return create(info, kernel).release();
  }

  Ort::Status create(const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      std::string op;
      try {
        op = ki.GetAttribute<std::string>("operator");
      } catch (const Ort::Exception&) {
        return error("org.pytorch.aten::ATen node '" + ki.GetNodeName() +
                     "': it has no string attribute 'operator' (the ATen operator to run, e.g. \"cummax\")");
      }
      if (op.empty() || op == "aten::") return error("org.pytorch.aten::ATen node '" + ki.GetNodeName() + "': its 'operator' attribute is empty");
      std::string overload;
      try {
        overload = ki.GetAttribute<std::string>("overload_name");
      } catch (const Ort::Exception&) {  // absent attribute: the default overload
      }
      const std::string qualified = op.rfind("aten::", 0) == 0 ? op : "aten::" + op;
      auto handle = c10::Dispatcher::singleton().findSchema({qualified, overload});
      const std::string display = qualified + (overload.empty() ? "" : "." + overload);
      if (!handle) return error("ATen op " + display + ": no such operator (or overload) in this libtorch");
      if (const std::string written = written_argument(handle->schema()); !written.empty())
        return error("ATen op " + display + " writes into its argument '" + written +
                     "' (in-place or out= overload); ONNX Runtime inputs are read-only, so only functional "
                     "overloads run here: export the out-of-place op instead");
      const std::string base = qualified.substr(6);
      if (!policy->allows(base)) return error(AtenPolicy::refusal(base));
      std::vector<bool> none(ki.GetInputCount());
      for (size_t i = 0; i < none.size(); ++i) none[i] = ki.GetInputName(i) == kNoneInput;
      *kernel = new AtenKernel(*handle, display, std::move(none), ep == kCudaEp, policy);
      return Ort::Status(nullptr);
    } catch (const std::exception& e) {
      return error(std::string("org.pytorch.aten::ATen: ") + e.what());
    }
  }
  const char* GetName() const { return "ATen"; }
  const char* GetExecutionProviderType() const { return ep; }
  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return INPUT_OUTPUT_VARIADIC; }
  int GetVariadicInputMinArity() const { return 0; }
  bool GetVariadicInputHomogeneity() const { return false; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_VARIADIC; }
  int GetVariadicOutputMinArity() const { return 1; }
  bool GetVariadicOutputHomogeneity() const { return false; }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  OrtStatus* error = nullptr;
  if (!opforge::ort::init_api(api_base, "libopforge_aten", &error)) return error;
  try {
    // One set of op objects per distinct policy (the session's opt-ins), kept for the
    // library's lifetime: ORT needs them to outlive every session using them.
    Ort::UnownedSessionOptions session_options(options);
    std::string problem;
    std::shared_ptr<const AtenPolicy> policy = policy_from(session_options, &problem);
    if (!policy) return Ort::Status(problem.c_str(), ORT_INVALID_ARGUMENT).release();
    std::string key;
    for (const std::string& name : std::set<std::string>(policy->allowed.begin(), policy->allowed.end()))
      key += name + ",";
    key += "|" + std::to_string(policy->max_elements);
    static std::mutex mutex;
    static std::map<std::string, std::vector<std::unique_ptr<AtenOp>>> ops_by_policy;
    std::lock_guard<std::mutex> lock(mutex);
    auto& ops = ops_by_policy[key];
    if (ops.empty()) {
      ops.push_back(std::make_unique<AtenOp>(kCpuEp, policy));
#ifdef OPFORGE_WITH_CUDA
      ops.push_back(std::make_unique<AtenOp>(kCudaEp, policy));
#endif
    }
    return opforge::ort::add_domain(options, "libopforge_aten", kAtenDomain, ops);
  } catch (const std::exception& e) {
    return Ort::Status(e).release();
  }
}
