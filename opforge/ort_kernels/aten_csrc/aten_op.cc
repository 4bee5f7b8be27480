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
// CUDA builds (OPFORGE_WITH_CUDA) register the kernel for the CUDA execution
// provider too: inputs are wrapped as CUDA tensors where ORT placed them, and
// the op runs on ORT's compute stream (made torch's current stream for the
// call), so it is ordered with the neighbouring ORT CUDA kernels.
#ifndef ORT_API_MANUAL_INIT  // also set by setup.py
#define ORT_API_MANUAL_INIT
#endif
#include <onnxruntime_cxx_api.h>

#include "opforge/ort_library.h"

#include <ATen/ScalarOps.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/InferenceMode.h>
#ifdef OPFORGE_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr const char* kAtenDomain = "org.pytorch.aten";
// ORT does not allow absent ("") entries inside a variadic input list, so
// opforge's export feeds this (empty) initializer where an argument is None;
// the kernel recognises it by name. Must match opforge/symbolics/aten_fallback.py.
constexpr const char* kNoneInput = "opforge_aten_none";

Ort::Status error(const std::string& msg, OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  return Ort::Status(msg.c_str(), code);
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

// Number of valid values of an enum argument type (0: not an enum). ScalarType
// stops before Undefined, which no kernel accepts.
int64_t enum_bound(c10::TypeKind kind) {
  switch (kind) {
    case c10::TypeKind::ScalarTypeType:
      return static_cast<int64_t>(c10::ScalarType::Undefined);
    case c10::TypeKind::LayoutType:
      return static_cast<int64_t>(c10::Layout::NumOptions);
    case c10::TypeKind::MemoryFormatType:
      return static_cast<int64_t>(c10::MemoryFormat::NumOptions);
    default:
      return 0;
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

  AtenKernel(c10::OperatorHandle handle, std::string n, std::vector<bool> none, bool cuda)
      : name(std::move(n)), op(std::move(handle)), is_none(std::move(none)), on_cuda(cuda) {}

  std::string where(const c10::Argument& arg, size_t i) const {
    return "ATen op " + name + ", argument " + std::to_string(i) + " '" + arg.name() + "' (" + arg.real_type()->str() + ")";
  }

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
        const int64_t bound = enum_bound(real->kind());
        if (bound > 0 && (value < 0 || value >= bound))
          return error(at + ": " + std::to_string(value) + " is not a valid " + real->str() + " (0 to " +
                       std::to_string(bound - 1) + ")");
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

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_ctx) { return compute(raw_ctx).release(); }

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
          n_in > 0 ? static_cast<c10::DeviceIndex>(ctx.GetInput(0).GetTensorMemoryInfo().GetDeviceId())
                   : c10::cuda::current_device();
      stream_guard.emplace(
          c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(ctx.GetGPUComputeStream()), device));
    }
#endif
    torch::jit::Stack stack;
    stack.reserve(args.size());
    for (size_t i = 0; i < args.size(); ++i) {
      const OrtValue* v = nullptr;
      if (i < n_in && !is_none[i]) v = static_cast<const OrtValue*>(ctx.GetInput(i));
      c10::IValue value;
      Ort::Status st = decode(args[i], i, v, value);
      if (!st.IsOK()) return st;
      stack.push_back(std::move(value));
    }
    try {
      op.callBoxed(&stack);
    } catch (const std::exception& e) {
      std::string what = e.what();
      return error("ATen op " + name + " failed: " + what.substr(0, what.find("\nException raised from")), ORT_FAIL);
    }
    std::vector<c10::IValue> results;  // flatten tensor lists (e.g. aten::unbind)
    for (auto& r : stack) {
      if (r.isTensorList()) {
        for (const at::Tensor& t : r.toTensorList().vec()) results.emplace_back(t);
      } else {
        results.push_back(std::move(r));
      }
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
        t = at::scalar_to_tensor(results[i].toScalar());
      } else {
        return error("ATen op " + name + ": return " + std::to_string(i) + " is a " + results[i].tagKind() +
                     ", not a tensor or number", ORT_NOT_IMPLEMENTED);
      }
      t = t.contiguous();
      auto onnx_type = to_onnx_type(t.scalar_type());
      if (!onnx_type)
        return error("ATen op " + name + ": return " + std::to_string(i) + " has dtype " +
                     std::string(c10::toString(t.scalar_type())) + ", which ONNX Runtime cannot hold", ORT_NOT_IMPLEMENTED);
      std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
      Ort::UnownedValue out = ctx.GetOutput(i, shape.data(), shape.size());
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
  explicit AtenOp(const char* provider) : ep(provider) {}

  // CustomOpBase hands these results to ORT as raw OrtStatus*: return released
  // pointers (returning an Ort::Status would free the status before ORT reads it).
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    return create(info, kernel).release();
  }

  Ort::Status create(const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo ki(info);
      const std::string op = ki.GetAttribute<std::string>("operator");
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
      std::vector<bool> none(ki.GetInputCount());
      for (size_t i = 0; i < none.size(); ++i) none[i] = ki.GetInputName(i) == kNoneInput;
      *kernel = new AtenKernel(*handle, display, std::move(none), ep == kCudaEp);
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
  static AtenOp cpu_op(kCpuEp);  // outlive every session
#ifdef OPFORGE_WITH_CUDA
  static AtenOp cuda_op(kCudaEp);
#endif
#ifdef OPFORGE_WITH_CUDA
  static const std::vector<AtenOp*> ops{&cpu_op, &cuda_op};
#else
  static const std::vector<AtenOp*> ops{&cpu_op};
#endif
  return opforge::ort::add_domain(options, "libopforge_aten", kAtenDomain, ops);
}
