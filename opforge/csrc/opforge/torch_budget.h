// Budgets of a torch op library: process-wide limits on what one call of an op may take (output
// elements, samples...), which its kernels check before they allocate or run anything. Each is a
// named int64 with a default:
//
//   const opforge::BudgetDecl my_op_budget("opforge.my_op.max_samples", int64_t(1) << 31);
//   ... in the kernel: opforge::budget_value("opforge.my_op.max_samples", int64_t(1) << 31)
//
// A trusted caller changes them at run time through the library's entry point opforge_budget_v1
// (OPFORGE_TORCH_LIBRARY_ENTRY_POINTS; opforge.set_budget / TorchLibrary.set_budget in Python).
// The names are the ONNX Runtime session config entries of the same budgets, so one name
// documents both. Why process-wide: a torch op's schema has no room for them, and the program
// that calls the op is the one that decides.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace opforge {

// opforge_budget_v1(key, value, &current, text, cap): value > 0 sets budget `key` to it, 0 leaves
// it, -1 restores its default; *current gets the value in force after the call. Returns 0, or 1
// for an unknown key or a bad value (then `text` says which and lists the budgets). key == nullptr
// lists the budgets in `text`, one "key<TAB>value<TAB>default" line each; returns their count.
using BudgetEntryPoint = int (*)(const char* key, int64_t value, int64_t* current, char* text, size_t cap);

struct Budget {
  int64_t default_value;
  std::atomic<int64_t> value;
  explicit Budget(int64_t v) : default_value(v), value(v) {}
};

// The library's budgets. Declared during static initialisation (BudgetDecl), then only their
// values change (atomically), so kernels read them without a lock.
inline std::map<std::string, Budget>& budget_table() {
  static std::map<std::string, Budget> table;
  return table;
}

struct BudgetDecl {
  BudgetDecl(const char* key, int64_t default_value) { budget_table().try_emplace(key, default_value); }
};

inline void copy_budget_text(const std::string& text, char* out, size_t cap) {
  if (out == nullptr || cap == 0) return;
  const size_t n = text.size() < cap - 1 ? text.size() : cap - 1;
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

// One "key<TAB>value<TAB>default" line per budget.
inline std::string budget_listing() {
  std::string listing;
  for (const auto& [name, b] : budget_table())
    listing += name + "\t" + std::to_string(b.value.load()) + "\t" + std::to_string(b.default_value) + "\n";
  return listing;
}

inline int budget_entry(const char* key, int64_t value, int64_t* current, char* text, size_t cap) {
  if (key == nullptr) {
    copy_budget_text(budget_listing(), text, cap);
    return static_cast<int>(budget_table().size());
  }
  const auto it = budget_table().find(key);
  if (it == budget_table().end()) {
    copy_budget_text(std::string("opforge: no budget named '") + key + "'; this library's budgets:\n" +
                         budget_listing(),
                     text, cap);
    return 1;
  }
  if (value < -1) {
    copy_budget_text(std::string("opforge: budget '") + key + "' must be a positive number, got " +
                         std::to_string(value),
                     text, cap);
    return 1;
  }
  if (value > 0) it->second.value.store(value);
  if (value == -1) it->second.value.store(it->second.default_value);
  if (current != nullptr) *current = it->second.value.load();
  return 0;
}

// The value of budget `key` in this library's table; `fallback` (its default) when it is not there.
inline int64_t own_budget_value(const char* key, int64_t fallback) {
  const auto it = budget_table().find(key);
  return it == budget_table().end() ? fallback : it->second.value.load();
}

#ifndef OPFORGE_WITH_CUDA
// The library proper: its own table.
inline int64_t budget_value(const char* key, int64_t fallback) { return own_budget_value(key, fallback); }
#else
// A library's CUDA part (lib<name>_cuda.so, OPFORGE_WITH_CUDA) is loaded by the library proper,
// lib<name>.so beside it (opforge/torch_library.h), and reads the values in force there, through
// the library's entry point; where that cannot be found its own declared defaults hold.
inline BudgetEntryPoint library_budget_entry() {
  static const BudgetEntryPoint entry = []() -> BudgetEntryPoint {
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&library_budget_entry), &info) == 0 || info.dli_fname == nullptr)
      return nullptr;
    std::string path = info.dli_fname;
    const size_t part = path.rfind("_cuda.so");
    if (part == std::string::npos) return nullptr;
    path.replace(part, std::strlen("_cuda.so"), ".so");
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);  // already loaded: it loaded this part
    return library ? reinterpret_cast<BudgetEntryPoint>(dlsym(library, "opforge_budget_v1")) : nullptr;
  }();
  return entry;
}

inline int64_t budget_value(const char* key, int64_t fallback) {
  int64_t current = 0;
  if (const BudgetEntryPoint entry = library_budget_entry(); entry && entry(key, 0, &current, nullptr, 0) == 0)
    return current;
  return own_budget_value(key, fallback);
}
#endif

}  // namespace opforge

#define OPFORGE_BUDGET_ENTRY_POINT                                                                              \
  extern "C" __attribute__((visibility("default"))) int opforge_budget_v1(const char* key, int64_t value,     \
                                                                          int64_t* current, char* text,       \
                                                                          size_t cap) {                       \
    return ::opforge::budget_entry(key, value, current, text, cap);                                           \
  }
