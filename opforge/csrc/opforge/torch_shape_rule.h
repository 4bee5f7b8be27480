// An op's shape rule (core/shape.h) for its fake impl, on LibTorch's stable ABI, which has no
// SymInt. The rule stays one C++ function templated on its Dim; the torch library instantiates it
// with RuleDim, a dim whose arithmetic, comparisons and printing run in the caller when the dim is
// symbolic. The caller is opforge.ShapeRule (opforge/shape_rule.py): it hands each tensor's sizes
// as RuleDims (a number, or a handle to one of its SymInts) and answers the callbacks on the
// SymInts themselves, so the rule's comparisons become torch's guards and the outputs come back as
// SymInt expressions, exactly as when the rule ran on c10::SymInt. Numbers stay in C++.
//
// A library registers each rule once, at load:
//   OPFORGE_SHAPE_RULE(my_ops, _my_op_output_shapes, "(SymInt[] x, SymInt[]? weight, float alpha)",
//                      my_op_rule)   // the rule "my_ops::_my_op_output_shapes"
// with `std::string my_op_rule(const opforge::RuleArgs& args, opforge::RuleShapes& out)` reading
// args.shape(0), args.integer(2)... in the signature's order. The library exports one C entry
// point, opforge_shape_rule_v1, which runs a rule by name. No torch or Python types here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/shape.h"

extern "C" {
// A dim across the C boundary: a number, or (symbolic != 0) the caller's handle of a symbolic size.
struct OpforgeRuleDim {
  int64_t value;
  int32_t symbolic;
};
// The caller's answers for symbolic dims; each returns 0, or nonzero when it raised (the caller keeps
// its exception and re-raises it once the rule returns).
struct OpforgeRuleHost {
  // out = a <op> b, op one of '+', '-', '*', '/' (floor division; the rules divide only
  // non-negative sizes, where it agrees with C++'s), '%'.
  int (*arith)(int op, const OpforgeRuleDim* a, const OpforgeRuleDim* b, OpforgeRuleDim* out);
  // *out = (a <op> b), op one of "==", "!=", "<", "<=", ">", ">=" (the caller records its guard).
  int (*compare)(const char* op, const OpforgeRuleDim* a, const OpforgeRuleDim* b, int* out);
  // *out = whether a is 1, size-obliviously (a symbolic size is not 1 unless known to be).
  int (*is_one)(const OpforgeRuleDim* a, int* out);
  // a as messages print it (its expression, e.g. s0), NUL-terminated, into buf[cap].
  int (*format)(const OpforgeRuleDim* a, char* buf, size_t cap);
};
// One argument of a rule, in its signature's order.
struct OpforgeRuleArg {
  int32_t kind;  // 0 shape (dims[count]), 1 absent optional shape, 2 int, 3 float, 4 bool, 5 int list (dims),
                 // 6 float list (reals[count])
  int64_t count;
  const OpforgeRuleDim* dims;
  int64_t integer;
  double real;
  const double* reals;
};
}

namespace opforge {

// Thrown through the rule when a callback raised: the entry point returns, the caller re-raises.
struct RuleHostError {};

class RuleDim {
 public:
  RuleDim(int64_t v = 0) : d_{v, 0} {}  // NOLINT: a number is a dim, as for int64_t and SymInt
  explicit RuleDim(OpforgeRuleDim d) : d_(d) {}

  bool symbolic() const { return d_.symbolic != 0; }
  std::optional<int64_t> known() const { return symbolic() ? std::nullopt : std::optional<int64_t>(d_.value); }
  OpforgeRuleDim raw() const { return d_; }

  static const OpforgeRuleHost*& host() {
    static thread_local const OpforgeRuleHost* current = nullptr;
    return current;
  }

#define OPFORGE_RULE_ARITH(OP, CH)                                                        \
  friend RuleDim operator OP(const RuleDim& a, const RuleDim& b) {                         \
    if (!a.symbolic() && !b.symbolic()) return RuleDim(a.d_.value OP b.d_.value);          \
    OpforgeRuleDim out{};                                                                  \
    if (host()->arith(CH, &a.d_, &b.d_, &out) != 0) throw RuleHostError{};                   \
    return RuleDim(out);                                                                   \
  }                                                                                        \
  friend RuleDim operator OP(const RuleDim& a, int64_t b) { return a OP RuleDim(b); }      \
  friend RuleDim operator OP(int64_t a, const RuleDim& b) { return RuleDim(a) OP b; }      \
  friend RuleDim operator OP(const RuleDim& a, int b) { return a OP RuleDim(int64_t(b)); } \
  friend RuleDim operator OP(int a, const RuleDim& b) { return RuleDim(int64_t(a)) OP b; }
  OPFORGE_RULE_ARITH(+, '+')
  OPFORGE_RULE_ARITH(-, '-')
  OPFORGE_RULE_ARITH(*, '*')
  OPFORGE_RULE_ARITH(/, '/')
  OPFORGE_RULE_ARITH(%, '%')
#undef OPFORGE_RULE_ARITH

#define OPFORGE_RULE_COMPARE(OP)                                                              \
  friend bool operator OP(const RuleDim& a, const RuleDim& b) {                                \
    if (!a.symbolic() && !b.symbolic()) return a.d_.value OP b.d_.value;                       \
    int out = 0;                                                                               \
    if (host()->compare(#OP, &a.d_, &b.d_, &out) != 0) throw RuleHostError{};                    \
    return out != 0;                                                                           \
  }                                                                                            \
  friend bool operator OP(const RuleDim& a, int64_t b) { return a OP RuleDim(b); }             \
  friend bool operator OP(int64_t a, const RuleDim& b) { return RuleDim(a) OP b; }             \
  friend bool operator OP(const RuleDim& a, int b) { return a OP RuleDim(int64_t(b)); }        \
  friend bool operator OP(int a, const RuleDim& b) { return RuleDim(int64_t(a)) OP b; }
  OPFORGE_RULE_COMPARE(==)
  OPFORGE_RULE_COMPARE(!=)
  OPFORGE_RULE_COMPARE(<)
  OPFORGE_RULE_COMPARE(<=)
  OPFORGE_RULE_COMPARE(>)
  OPFORGE_RULE_COMPARE(>=)
#undef OPFORGE_RULE_COMPARE

  bool is_one() const {
    if (!symbolic()) return d_.value == 1;
    int out = 0;
    if (host()->is_one(&d_, &out) != 0) throw RuleHostError{};
    return out != 0;
  }

  friend std::ostream& operator<<(std::ostream& os, const RuleDim& d) {
    if (!d.symbolic()) return os << d.d_.value;
    char buf[256] = {0};
    if (host()->format(&d.d_, buf, sizeof buf) != 0) throw RuleHostError{};
    buf[sizeof buf - 1] = '\0';
    return os << buf;
  }

 private:
  OpforgeRuleDim d_;
};

namespace core {
template <>
struct DimTraits<RuleDim> {
  static std::optional<int64_t> known(const RuleDim& d) { return d.known(); }
  static bool is_one(const RuleDim& d) { return d.is_one(); }
};
}  // namespace core

using RuleShape = core::Shape<RuleDim>;
using RuleShapes = std::vector<std::vector<RuleDim>>;

// A rule's arguments as the caller passed them, checked against the kind the rule reads.
class RuleArgs {
 public:
  RuleArgs(const OpforgeRuleArg* args, int count) : args_(args), count_(count) {}

  // A tensor's shape (SymInt[], or SymInt[]? when absent: present == false).
  RuleShape shape(int i) const {
    const OpforgeRuleArg& a = at(i, "a shape");
    if (a.kind == 1) return RuleShape{{}, false};
    expect(a, 0, i, "a shape");
    RuleShape s;
    for (int64_t k = 0; k < a.count; ++k) s.dims.emplace_back(a.dims[k]);
    return s;
  }
  int64_t integer(int i) const { return expect(at(i, "an int"), 2, i, "an int").integer; }
  double real(int i) const { return expect(at(i, "a float"), 3, i, "a float").real; }
  bool boolean(int i) const { return expect(at(i, "a bool"), 4, i, "a bool").integer != 0; }
  std::vector<int64_t> integers(int i) const {
    const OpforgeRuleArg& a = expect(at(i, "an int list"), 5, i, "an int list");
    std::vector<int64_t> out;
    for (int64_t k = 0; k < a.count; ++k) out.push_back(a.dims[k].value);
    return out;
  }
  std::vector<double> reals(int i) const {
    const OpforgeRuleArg& a = expect(at(i, "a float list"), 6, i, "a float list");
    return std::vector<double>(a.reals, a.reals + a.count);
  }
  int count() const { return count_; }

 private:
  const OpforgeRuleArg& at(int i, const char* what) const {
    if (i < 0 || i >= count_)
      throw std::runtime_error(core::message("shape rule: argument ", i, " (", what, ") not given; ", count_, " were"));
    return args_[i];
  }
  static const OpforgeRuleArg& expect(const OpforgeRuleArg& a, int kind, int i, const char* what) {
    if (a.kind != kind) throw std::runtime_error(core::message("shape rule: argument ", i, " must be ", what));
    return a;
  }
  const OpforgeRuleArg* args_;
  int count_;
};

using RuleFunction = std::string (*)(const RuleArgs&, RuleShapes&);

struct RuleEntry {
  const char* signature;
  RuleFunction function;
};

// The library's rules by name (one registry per library: hidden visibility keeps it private).
inline std::map<std::string, RuleEntry>& shape_rules() {
  static std::map<std::string, RuleEntry> rules;
  return rules;
}

struct ShapeRuleRegistration {
  ShapeRuleRegistration(const char* name, const char* signature, RuleFunction fn) {
    shape_rules()[name] = RuleEntry{signature, fn};
  }
};

}  // namespace opforge

#define OPFORGE_SHAPE_RULE_CONCAT_(a, b) a##b
#define OPFORGE_SHAPE_RULE_CONCAT(a, b) OPFORGE_SHAPE_RULE_CONCAT_(a, b)
// Registers `function` as the shape rule `ns::name` with `signature` ("(SymInt[] x, int k)").
#define OPFORGE_SHAPE_RULE(ns, name, signature, function)                                          \
  static const ::opforge::ShapeRuleRegistration OPFORGE_SHAPE_RULE_CONCAT(opforge_shape_rule_, name)( \
      #ns "::" #name, signature, function)

// The library's entry point, defined once per library (OPFORGE_SHAPE_RULE_ENTRY_POINT in one source):
//   mode 0: the signature of rule `name` into message[cap] (returns 0; 1 when there is no such rule);
//   mode 1: runs it. Returns 0 with the outputs in out (flattened: rank0, dims0..., rank1, ...; *count
//   entries, at most cap), 1 with the rule's refusal in message, 2 when a callback raised, 3 with an
//   error of the call itself in message (unknown rule, wrong argument kinds, out too small).
#define OPFORGE_SHAPE_RULE_ENTRY_POINT                                                                      \
  extern "C" __attribute__((visibility("default"))) int opforge_shape_rule_v1(                               \
      const char* name, int mode, const OpforgeRuleArg* args, int nargs, const OpforgeRuleHost* host,         \
      OpforgeRuleDim* out, int64_t cap, int64_t* count, char* message, size_t message_cap) {                  \
    return ::opforge::run_shape_rule_entry(name, mode, args, nargs, host, out, cap, count, message,          \
                                           message_cap);                                                     \
  }

namespace opforge {

inline void copy_message(const std::string& text, char* message, size_t cap) {
  if (cap == 0) return;
  const size_t n = text.size() < cap - 1 ? text.size() : cap - 1;
  std::memcpy(message, text.data(), n);
  message[n] = '\0';
}

inline int run_shape_rule_entry(const char* name, int mode, const OpforgeRuleArg* args, int nargs,
                                const OpforgeRuleHost* host, OpforgeRuleDim* out, int64_t cap, int64_t* count,
                                char* message, size_t message_cap) {
  const auto found = shape_rules().find(name ? name : "");
  if (found == shape_rules().end()) {
    copy_message(std::string("no shape rule named ") + (name ? name : "(null)"), message, message_cap);
    return mode == 0 ? 1 : 3;
  }
  if (mode == 0) {
    copy_message(found->second.signature, message, message_cap);
    return 0;
  }
  const OpforgeRuleHost* saved = RuleDim::host();
  RuleDim::host() = host;
  struct Restore {
    const OpforgeRuleHost* saved;
    ~Restore() { RuleDim::host() = saved; }
  } restore{saved};
  try {
    RuleShapes shapes;
    const std::string err = found->second.function(RuleArgs(args, nargs), shapes);
    if (!err.empty()) {
      copy_message(err, message, message_cap);
      return 1;
    }
    int64_t n = 0;
    for (const auto& shape : shapes) {
      if (n + 1 + static_cast<int64_t>(shape.size()) > cap) {
        copy_message("shape rule: the outputs' shapes do not fit the caller's buffer", message, message_cap);
        return 3;
      }
      out[n++] = OpforgeRuleDim{static_cast<int64_t>(shape.size()), 0};
      for (const RuleDim& d : shape) out[n++] = d.raw();
    }
    *count = n;
    return 0;
  } catch (const RuleHostError&) {
    return 2;
  } catch (const std::exception& e) {
    copy_message(e.what(), message, message_cap);
    return 3;
  }
}

}  // namespace opforge
