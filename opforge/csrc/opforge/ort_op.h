// opforge's ONNX Runtime glue for an op's ORT kernels (lite custom-op API;
// installed with opforge, add opforge.build.include_paths() to the include
// path): storage-type mapping onto the compute cores, ORT's intra-op thread
// pool, one kernel per float type, error statuses, session config entries a
// kernel reads (ConfigKey, config_entry), and the kernel registry a library's
// source files add themselves to (OPFORGE_ORT_KERNELS), which
// OPFORGE_ORT_LIBRARY (ort_library.h) hands to ORT.
#pragma once

// The library is loaded by an already running ORT: no static API lookup, the
// OrtApi comes from RegisterCustomOps' argument (ort_library.h).
#ifndef ORT_API_MANUAL_INIT
#define ORT_API_MANUAL_INIT
#endif
#include <onnxruntime_cxx_api.h>
#include <onnxruntime_lite_custom_op.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/format.h"
#include "core/half.h"

namespace opforge {
namespace ort {

inline constexpr const char* kCpuEp = "CPUExecutionProvider";
inline constexpr const char* kCudaEp = "CUDAExecutionProvider";

using LiteOpPtr = std::unique_ptr<Ort::Custom::OrtLiteCustomOp>;

// ORT storage type -> compute-core scalar type (identical bit layout).
template <typename T>
struct core_scalar {
  using type = T;
};
template <>
struct core_scalar<Ort::Float16_t> {
  using type = core::float16_t;
};
template <>
struct core_scalar<Ort::BFloat16_t> {
  using type = core::bfloat16_t;
};
static_assert(sizeof(Ort::Float16_t) == 2 && sizeof(Ort::BFloat16_t) == 2, "16-bit layouts");

template <typename T>
const typename core_scalar<T>::type* core_ptr(const T* p) {
  return reinterpret_cast<const typename core_scalar<T>::type*>(p);
}
template <typename T>
typename core_scalar<T>::type* core_ptr(T* p) {
  return reinterpret_cast<typename core_scalar<T>::type*>(p);
}

inline std::string shape_str(const std::vector<int64_t>& s) { return core::dims_str(s.data(), s.size()); }

inline Ort::Status invalid_argument(const std::string& msg) {
  return Ort::Status(msg.c_str(), ORT_INVALID_ARGUMENT);
}

// Splits [0, total) into grain-sized slices and runs body(begin, end) on ORT's
// intra-op thread pool (so the session's intra_op_num_threads is honoured).
template <typename Body>
void parallel_for(OrtKernelContext* ctx, int64_t total, int64_t grain, const Body& body) {
  const int64_t tasks = (total + grain - 1) / grain;
  if (tasks <= 1) {
    body(int64_t(0), total);
    return;
  }
  struct Job {
    const Body* body;
    int64_t total, grain;
  } job{&body, total, grain};
  Ort::KernelContext(ctx).ParallelFor(
      [](void* p, size_t i) {
        const Job& j = *static_cast<const Job*>(p);
        const int64_t begin = static_cast<int64_t>(i) * j.grain;
        const int64_t end = begin + j.grain < j.total ? begin + j.grain : j.total;
        (*j.body)(begin, end);
      },
      static_cast<size_t>(tasks), 0, &job);
}

// Calls fn(T{}) for each element type the kernels support (float, double,
// float16, bfloat16): registration registers one kernel per type under one name.
template <typename Fn>
void for_each_float_type(Fn&& fn) {
  fn(float{});
  fn(double{});
  fn(Ort::Float16_t{});
  fn(Ort::BFloat16_t{});
}

// ---- node checks at kernel creation --------------------------------------------------
// ORT creates one kernel per node when a session is created. A malformed node must
// fail there, with an error naming the op and the argument: the lite API would
// otherwise dereference an omitted ("") input before the kernel runs (a crash), and
// ORT's own attribute errors name no op. An Ort::Exception thrown by a kernel's
// constructor makes session creation fail with its message.
[[noreturn]] inline void node_error(const std::string& msg) { throw Ort::Exception(std::string(msg), ORT_INVALID_ARGUMENT); }

// The node has exactly the inputs `names` (in order), none omitted, and `outputs` outputs.
inline void check_node_arity(const OrtKernelInfo* info, const char* op, std::initializer_list<const char*> names,
                             size_t outputs = 1) {
  const Ort::ConstKernelInfo ki(info);
  std::string expected;
  for (const char* name : names) expected += std::string(expected.empty() ? "" : ", ") + name;
  const size_t n = ki.GetInputCount();
  if (n != names.size())
    node_error(std::string(op) + ": the node has " + std::to_string(n) + " input(s); expected " +
               std::to_string(names.size()) + " (" + expected + ")");
  size_t i = 0;
  for (const char* name : names) {
    if (ki.GetInputName(i).empty())
      node_error(std::string(op) + ": input " + std::to_string(i) + " (" + name +
                 ") is omitted (\"\"), but it is required");
    ++i;
  }
  if (ki.GetOutputCount() != outputs)
    node_error(std::string(op) + ": the node has " + std::to_string(ki.GetOutputCount()) + " output(s); expected " +
               std::to_string(outputs));
}

// A required attribute of the node; its absence (or a wrong type) is an error naming op and attribute.
template <typename T>
T node_attribute(const OrtKernelInfo* info, const char* op, const char* name) {
  static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, float>, "int64_t or float attributes");
  try {
    return Ort::ConstKernelInfo(info).GetAttribute<T>(name);
  } catch (const Ort::Exception& e) {
    node_error(std::string(op) + ": the node needs the " + (std::is_same_v<T, float> ? "float" : "int") +
               " attribute '" + name + "' (" + e.what() + ")");
  }
}

// ---- session config entries a kernel reads -------------------------------------------
// A trusted caller tunes some kernels with session config entries (a budget, such as
// "opforge.roi_align_rotated.max_samples"). ORT gives a kernel no view of its session's
// options (not in the C API this is built on), and the kernel definitions are created once
// per process. So a library reads the entries its kernels declare (ConfigKey) when it is
// registered (RegisterCustomOps, ort_library.h), checks them there, and, when any is set,
// registers its kernels through definitions of their own for those values, which make them
// visible to config_entry while ORT creates a kernel. The values hold for the sessions made
// with those SessionOptions only; an entry added after the library is registered is not seen.

// "" when `value` is valid for `key`, else a message naming both.
using ConfigCheck = std::string (*)(const std::string& key, const std::string& value);

struct ConfigKeyInfo {
  std::string key;
  ConfigCheck check;
};

inline std::vector<ConfigKeyInfo>& config_keys() {
  static std::vector<ConfigKeyInfo> keys;
  return keys;
}

// Declares a session config entry this library's kernels read (at namespace scope, or as an
// inline variable in a header: the library reads each key once, however often declared).
struct ConfigKey {
  ConfigKey(const char* key, ConfigCheck check) {
    for (const ConfigKeyInfo& k : config_keys())
      if (k.key == key) return;
    config_keys().push_back({key, check});
  }
};

// The entries of one registration, by key (only the declared ones that were set).
using KernelConfig = std::map<std::string, std::string>;

// The configuration of the kernel being created on this thread (null: none was set).
inline const KernelConfig*& creating_config() {
  thread_local const KernelConfig* config = nullptr;
  return config;
}

// A library's lookup of the entry `key` of the kernel being created: its value, or null.
using ConfigLookup = const char* (*)(const char* key);

inline const char* own_config_lookup(const char* key) {
  const KernelConfig* config = creating_config();
  if (config == nullptr) return nullptr;
  const auto it = config->find(key);
  return it == config->end() ? nullptr : it->second.c_str();
}

// Where config_entry looks: this library's own thread state, or in a CUDA companion the
// library proper's (handed over when it loads the companion, ort_cuda_companion.h), since the
// library proper creates every kernel, the companion's too.
inline ConfigLookup& config_lookup() {
  static ConfigLookup lookup = own_config_lookup;
  return lookup;
}

// In a kernel's constructor: the session config entry `key` (declared with ConfigKey) of the
// SessionOptions the library was registered with; empty when it was not set.
inline std::optional<std::string> config_entry(const char* key) {
  const char* value = config_lookup()(key);
  return value ? std::optional<std::string>(value) : std::nullopt;
}

// A ConfigCheck: a positive integer within int64.
inline std::string positive_integer_entry(const std::string& key, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE || v <= 0)
    return "opforge: session config entry '" + key + "' must be a positive integer, got '" + value + "'";
  return "";
}

// The value of an entry that passed positive_integer_entry, or `fallback` when it is not set.
inline int64_t config_integer(const char* key, int64_t fallback) {
  const std::optional<std::string> value = config_entry(key);
  return value ? static_cast<int64_t>(std::strtoll(value->c_str(), nullptr, 10)) : fallback;
}

// ---- kernel registry ---------------------------------------------------------------
// Each kernel source file registers a function that appends its kernels
// (OPFORGE_ORT_KERNELS(append_my_op_kernels)), so adding an op touches no
// central list. The functions run once, on the first RegisterCustomOps, after
// the ORT API is initialised (kernel objects are created then, never at load).
using AppendKernels = std::function<void(std::vector<LiteOpPtr>&)>;

inline std::vector<AppendKernels>& kernel_appenders() {
  static std::vector<AppendKernels> appenders;
  return appenders;
}

// Kernel definitions, created once and never freed: ORT keeps raw pointers to
// them in every session that registered the library.
inline const std::vector<LiteOpPtr>& registered_kernels() {
  static const std::vector<LiteOpPtr> kernels = [] {
    std::vector<LiteOpPtr> v;
    for (AppendKernels append : kernel_appenders()) append(v);
    return v;
  }();
  return kernels;
}

struct KernelRegistrar {
  explicit KernelRegistrar(AppendKernels append) { kernel_appenders().push_back(std::move(append)); }
};

// The common case in one declaration: Kernel<T, Args...> for every float type T (ORT picks the
// kernel by the node's input type), as the op `name` of the execution provider `ep`:
//   const opforge::ort::FloatKernels<MyOpKernel> my_op_kernels("my_op", opforge::ort::kCpuEp);
// Args: the kernel template's other arguments (e.g. the EP's part of a kernel shared by EPs).
template <template <typename...> class Kernel, typename... Args>
void append_float_kernels(std::vector<LiteOpPtr>& ops, const char* name, const char* ep) {
  for_each_float_type([&](auto tag) {
    ops.emplace_back(Ort::Custom::CreateLiteCustomOp<Kernel<decltype(tag), Args...>>(name, ep));
  });
}

template <template <typename...> class Kernel, typename... Args>
struct FloatKernels : KernelRegistrar {
  FloatKernels(const char* name, const char* ep)
      : KernelRegistrar([name, ep](std::vector<LiteOpPtr>& ops) { append_float_kernels<Kernel, Args...>(ops, name, ep); }) {}
};

}  // namespace ort
}  // namespace opforge

#define OPFORGE_ORT_CONCAT_INNER(a, b) a##b
#define OPFORGE_ORT_CONCAT(a, b) OPFORGE_ORT_CONCAT_INNER(a, b)
// Registers `append_fn` (void(std::vector<opforge::ort::LiteOpPtr>&)) with this library's kernels.
#define OPFORGE_ORT_KERNELS(append_fn)                                                            \
  static const ::opforge::ort::KernelRegistrar OPFORGE_ORT_CONCAT(opforge_ort_kernels_, __LINE__)( \
      append_fn)
