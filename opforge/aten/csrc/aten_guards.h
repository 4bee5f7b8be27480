// What libopforge_aten checks about a node's arguments before its operator runs, and the
// memory budget it runs under. Included by aten_op.cc only (one translation unit).
//
// A model file is untrusted input, and an ATen node hands the model's values straight to a
// libtorch kernel. libtorch validates most arguments, but not all (issue #43): some integer
// enums index tables unchecked, a few kernels trust their index tensors, integer division
// traps on MIN / -1, some integers drive loops, and sizes hidden in data (a count tensor,
// one_hot's classes, a padding) make allocations no size argument shows. Each of those is
// handled here, before the call, by one of:
//   * check_int_ranges(): integer arguments that are enums or loop counts, checked against
//     their valid values (aten_arg_ranges.inc, which opforge's Python reads too);
//   * value_check_for(): arguments whose *data* a kernel trusts (ctc_loss's targets, the degree
//     tensor of the special polynomials, integer division's operands);
//   * NodeBudget: every CPU allocation libtorch makes for the node, on the thread that runs
//     it, counts against a byte budget; the first one past it fails before any memory is
//     taken. This bounds outputs and intermediates alike (eye(25000), bincount([3e8]),
//     mvlgamma(p=3e8)'s internal range) without per-op size rules, and also bounds the work of
//     kernels that allocate as they loop.
// Ops that could not be made safe this way (backward kernels, `unsafe=` flags, quantization
// internals...) are not on the allow-list at all (opforge/aten/policy.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/result_type.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace opforge_aten {

// ---- the per-node memory budget ---------------------------------------------------------------

struct NodeBudget {
  uint64_t left;            // bytes the node may still allocate
  uint64_t refused = 0;     // size of the allocation that was refused (0: none)
  uint64_t allocated = 0;   // bytes allocated so far
};

inline thread_local NodeBudget* t_node_budget = nullptr;

// Sits in front of libtorch's CPU allocator. Outside an ATen node (no budget on the thread) it
// only forwards: the user's own torch code is unaffected. The budget counts bytes allocated, not
// bytes live: a kernel that allocates in a loop uses it up too, which bounds its work.
class BudgetedCpuAllocator final : public c10::Allocator {
 public:
  explicit BudgetedCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    if (NodeBudget* budget = t_node_budget) {
      if (n > budget->left) {
        budget->refused = n;
        TORCH_CHECK(false, "opforge: an allocation of ", n, " bytes would exceed this node's memory budget");
      }
      budget->left -= n;
      budget->allocated += n;
    }
    return inner_->allocate(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  bool is_simple_data_ptr(const c10::DataPtr& data_ptr) const override {
    return inner_->is_simple_data_ptr(data_ptr);
  }

 private:
  c10::Allocator* inner_;
};

// Puts the budgeted allocator in front of whatever CPU allocator libtorch has now; true when it
// is the one libtorch uses (another library may have installed one with a higher priority, and
// then no budget could be kept: the caller refuses to run nodes rather than run them unbounded).
inline bool install_budgeted_allocator() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  c10::Allocator* current = c10::GetCPUAllocator();
  if (dynamic_cast<BudgetedCpuAllocator*>(current) != nullptr) return true;
  // One per allocator it wraps, never freed: tensors made through it may outlive everything.
  auto* wrapper = new BudgetedCpuAllocator(current);
  c10::SetCPUAllocator(wrapper, /*priority=*/0);
  return c10::GetCPUAllocator() == wrapper;
}

// While alive, the calling thread's CPU allocations count against `budget`.
class BudgetScope {
 public:
  explicit BudgetScope(NodeBudget& budget) : saved_(t_node_budget) { t_node_budget = &budget; }
  ~BudgetScope() { t_node_budget = saved_; }
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  NodeBudget* saved_;
};

// ---- integer arguments with a fixed set of valid values -------------------------------------

struct IntRange {
  const char* op;   // operator name without "aten::"; "*": every operator
  const char* arg;  // schema argument name
  int64_t lo, hi;   // valid values, inclusive
  const char* meaning;
};

#define OPFORGE_ATEN_INT_RANGE(op, arg, lo, hi, meaning) {op, arg, lo, hi, meaning},
inline const IntRange kIntRanges[] = {
#include "aten_arg_ranges.inc"
};
#undef OPFORGE_ATEN_INT_RANGE

// The ranges that apply to each argument of `schema` (by position): found once, when a node's
// kernel is created, so a run only compares numbers.
inline std::vector<std::vector<const IntRange*>> int_ranges_of(const c10::FunctionSchema& schema) {
  const std::string op = schema.name().substr(6);  // without "aten::"
  std::vector<std::vector<const IntRange*>> ranges(schema.arguments().size());
  for (size_t i = 0; i < ranges.size(); ++i)
    for (const IntRange& r : kIntRanges)
      if ((std::string(r.op) == "*" || op == r.op) && schema.arguments()[i].name() == r.arg) ranges[i].push_back(&r);
  return ranges;
}

// The error for an argument that breaks one of its ranges (an int, or an element of an int[]), or "".
inline std::string check_int_ranges(const c10::Argument& arg, const c10::IValue& value,
                                    const std::vector<const IntRange*>& ranges) {
  if (ranges.empty()) return "";
  std::vector<int64_t> values;
  if (value.isInt()) values.push_back(value.toInt());
  else if (value.isIntList()) values = value.toIntVector();
  for (const IntRange* r : ranges)
    for (int64_t v : values)
      if (v < r->lo || v > r->hi)
        return "'" + arg.name() + "' " + (value.isInt() ? "is " : "holds ") + std::to_string(v) + "; valid values are " +
               std::to_string(r->lo) + " to " + std::to_string(r->hi) + " (" + r->meaning + ")";
  return "";
}

// ---- argument data kernels trust --------------------------------------------------------------

// The largest degree the special polynomials (chebyshev, hermite, laguerre, legendre, ...) are
// given: their kernels loop `n` times per element (legendre_polynomial_p(0.5, n=1e18) ran for
// hours), and a degree past a few hundred is already all rounding error.
constexpr double kMaxPolynomialDegree = 65536;

inline const c10::IValue* find_argument(const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                                        const char* name) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size() && i < stack.size(); ++i)
    if (args[i].name() == name) return &stack[i];
  return nullptr;
}

// Checks of the data of arguments a kernel trusts, one per kind of operator: "" when fine, else
// what is wrong (naming the argument). They run before the op, on the node's own inputs (no
// copies beyond a dtype cast of an integer tensor).
using ValueCheck = std::string (*)(const c10::FunctionSchema&, const torch::jit::Stack&);

// ctc_loss's CPU kernel indexes log_probs with each target, unchecked (SIGSEGV at 2^40).
inline std::string check_ctc_targets(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const c10::IValue* log_probs = find_argument(schema, stack, "log_probs");
  const c10::IValue* targets = find_argument(schema, stack, "targets");
  if (log_probs && targets && log_probs->isTensor() && targets->isTensor()) {
    const at::Tensor& lp = log_probs->toTensor();
    const at::Tensor& t = targets->toTensor();
    if (lp.dim() < 1) return "'log_probs' must have a class dimension";
    if (t.is_floating_point() || t.is_complex()) return "'targets' must be an integer tensor";
    if (t.numel() > 0) {
      const int64_t classes = lp.size(-1);
      const at::Tensor as_long = t.to(at::kLong);
      const int64_t lo = as_long.min().item<int64_t>(), hi = as_long.max().item<int64_t>();
      if (lo < 0 || hi >= classes)
        return "'targets' holds " + std::to_string(lo < 0 ? lo : hi) + "; every target must be a class of " +
               "log_probs, 0 to " + std::to_string(classes - 1);
    }
  }
  return "";
}

// LAPACK's geev crashes on non-finite input (linalg_eigvals of a NaN matrix: SIGSEGV);
// linalg_eig checks for it itself, eigvals does not.
inline std::string check_finite_for_geev(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const c10::IValue* self = find_argument(schema, stack, "self");
  if (self && self->isTensor() && self->toTensor().numel() > 0 &&
      (self->toTensor().is_floating_point() || self->toTensor().is_complex()) &&
      !self->toTensor().isfinite().all().item<bool>())
    return "'self' holds NaN or infinity, which LAPACK's eigenvalue solver cannot take";
  return "";
}

// Per-channel parameters of the normalisations: native_batch_norm reads weight[c] ... for
// every channel c of the input without checking their sizes (an empty weight returned
// uninitialised memory). batch_norm and instance_norm check them, but not before they update
// running statistics: checked for all three.
inline std::string check_per_channel_sizes(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const c10::IValue* input = find_argument(schema, stack, "input");
  if (input && input->isTensor()) {
    const at::Tensor& x = input->toTensor();
    if (x.dim() < 2) return "'input' must have a channel dimension (at least 2-D)";
    for (const char* name : {"weight", "bias", "running_mean", "running_var"}) {
      const c10::IValue* p = find_argument(schema, stack, name);
      if (p && p->isTensor() && (p->toTensor().dim() != 1 || p->toTensor().size(0) != x.size(1)))
        return std::string("'") + name + "' must be 1-D with one value per channel of 'input' (" +
               std::to_string(x.size(1)) + "), got shape " + c10::str(p->toTensor().sizes());
    }
  }
  return "";
}

// native_group_norm takes the input's sizes again as N, C and HxW, and trusts them (N=0
// left the output unwritten); group_norm, the public op, derives them itself.
inline std::string check_group_norm_sizes(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const c10::IValue* input = find_argument(schema, stack, "input");
  const c10::IValue *n = find_argument(schema, stack, "N"), *c = find_argument(schema, stack, "C"),
                    *hxw = find_argument(schema, stack, "HxW"), *group = find_argument(schema, stack, "group");
  if (input && input->isTensor() && n && c && hxw && group && n->isInt() && c->isInt() && hxw->isInt() &&
      group->isInt()) {
    const at::Tensor& x = input->toTensor();
    const int64_t N = n->toInt(), C = c->toInt(), HxW = hxw->toInt(), G = group->toInt();
    const bool fits = x.dim() >= 2 && N == x.size(0) && C == x.size(1) && HxW >= 0 && C > 0 &&
                      HxW == (x.numel() / std::max<int64_t>(N * C, 1)) && N * C * HxW == x.numel();
    if (!fits)
      return "'N', 'C' and 'HxW' (" + std::to_string(N) + ", " + std::to_string(C) + ", " + std::to_string(HxW) +
             ") must be the input's batch, channels and the product of the rest; the input is " +
             c10::str(x.sizes());
    if (G <= 0 || C % G != 0)
      return "'group' is " + std::to_string(G) + "; it must be positive and divide C (" + std::to_string(C) + ")";
    for (const char* name : {"weight", "bias"}) {
      const c10::IValue* p = find_argument(schema, stack, name);
      if (p && p->isTensor() && p->toTensor().numel() != C)
        return std::string("'") + name + "' must hold one value per channel (" + std::to_string(C) + ")";
    }
  }
  return "";
}

// The special polynomials: a degree tensor (or number) drives a loop per element.
inline std::string check_polynomial_degree(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const c10::IValue* n = find_argument(schema, stack, "n");
  if (n != nullptr) {
    bool finite_and_small = true;
    if (n->isTensor()) {
      const at::Tensor d = n->toTensor().to(at::kDouble);
      finite_and_small = d.numel() == 0 || (d.isfinite().all().item<bool>() &&
                                            d.abs().max().item<double>() <= kMaxPolynomialDegree);
    } else if (n->isScalar() || n->isDouble() || n->isInt()) {
      const double d = n->toScalar().toDouble();
      finite_and_small = std::isfinite(d) && std::fabs(d) <= kMaxPolynomialDegree;
    }
    if (!finite_and_small)
      return "'n' must hold finite degrees of at most " + std::to_string(static_cast<int64_t>(kMaxPolynomialDegree)) +
             " in magnitude (its kernel loops n times per element)";
  }
  return "";
}

// Integer division rounding toward zero or down: x86's idiv traps (SIGFPE, the process dies)
// on MIN / -1 in 32 and 64 bits; torch's kernel does not test for it.
inline std::string check_division_overflow(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const c10::IValue* mode = find_argument(schema, stack, "rounding_mode");  // overloads without one divide exactly
  const c10::IValue* self = find_argument(schema, stack, "self");
  const c10::IValue* other = find_argument(schema, stack, "other");
  if (mode && mode->isString() && self && other && self->isTensor()) {
    const at::Tensor& a = self->toTensor();
    std::optional<at::Tensor> b_tensor;
    std::optional<c10::Scalar> b_scalar;
    if (other->isTensor()) b_tensor = other->toTensor();
    else if (other->isScalar() || other->isInt() || other->isDouble()) b_scalar = other->toScalar();
    if (b_tensor || b_scalar) {
      const at::ScalarType type = b_tensor ? at::result_type(a, *b_tensor) : at::result_type(a, *b_scalar);
      if (type == at::kInt || type == at::kLong) {
        const int64_t min = type == at::kInt ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
        const bool has_min = a.numel() > 0 && a.to(at::kLong).eq(min).any().item<bool>();
        const bool has_minus_one = b_tensor ? (b_tensor->numel() > 0 && b_tensor->to(at::kLong).eq(-1).any().item<bool>())
                                            : (b_scalar->isIntegral(false) && b_scalar->toLong() == -1);
        if (has_min && has_minus_one)
          return "'self' holds " + std::to_string(min) + " and 'other' holds -1: integer division of " +
                 c10::toString(type) + "'s minimum by -1 overflows (x86 traps on it)";
      }
    }
  }
  return "";
}

// The data check `schema`'s operator needs, or nullptr: chosen once, when a node's kernel is created.
inline ValueCheck value_check_for(const c10::FunctionSchema& schema) {
  const std::string op = schema.name().substr(6);  // without "aten::"
  if (op == "ctc_loss") return check_ctc_targets;
  if (op == "linalg_eigvals" || op == "linalg_eig") return check_finite_for_geev;
  if (op == "native_batch_norm" || op == "batch_norm" || op == "instance_norm") return check_per_channel_sizes;
  if (op == "native_group_norm") return check_group_norm_sizes;
  if (op.rfind("special_", 0) == 0 && op.find("_polynomial_") != std::string::npos) return check_polynomial_degree;
  if (op == "div" || op == "divide") return check_division_overflow;
  return nullptr;
}

}  // namespace opforge_aten
