// OpKind and per-op traits, generated from ops.def. Pure data, thread-safe.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string_view>

namespace loom::ir {

enum OpTrait : uint32_t {
  kSource = 1u << 0,       // no operands
  kTypeGiven = 1u << 1,    // result dtype (and for sources the shape) comes from the caller
  kElementwise = 1u << 2,  // per-element, with broadcasting
  kFloatOnly = 1u << 3,    // operands must be floating point
  kBoolOnly = 1u << 4,     // operands must be bool
  kNumeric = 1u << 5,      // operands must not be bool
  kCompare = 1u << 6,      // result is bool
  kReduce = 1u << 7,
  kLinalg = 1u << 8,
  kLayout = 1u << 9,
  kIndex = 1u << 10,
  kRandom = 1u << 11,
  kRegion = 1u << 12,       // owns regions (control flow)
  kNoGrad = 1u << 13,       // not differentiable: operands get no adjoint
  kCostly = 1u << 14,       // expands to many instructions (transcendentals, random draws)
  kDist = 1u << 15,         // the dist family (type rules in src/ir/ops/collective.cpp)
  kCollective = 1u << 16,   // talks to the other ranks when it runs (dist::Communicator)
  kMultiResult = 1u << 17,  // several results and no regions (attention): infer_region_types
};

enum class OpKind : uint8_t {
#define LOOM_OP(Name, text, arity, traits, ints, i, flag, f) Name,
#include "loom/ir/ops.def"
#undef LOOM_OP
};

struct OpInfo {
  std::string_view name;
  int arity;  // -1: variadic
  uint32_t traits;
  std::string_view ints_name, i_name, flag_name, f_name;
};

// The printed name of an ops.def attribute column: "" for a placeholder ('_...').
constexpr std::string_view attr_column_name(std::string_view s) { return s[0] == '_' ? "" : s; }

inline constexpr OpInfo kOpInfo[] = {
#define LOOM_OP(Name, text, arity, traits, ints, i, flag, f) \
  {text,                                                     \
   arity,                                                    \
   static_cast<uint32_t>(traits),                            \
   attr_column_name(#ints),                                  \
   attr_column_name(#i),                                     \
   attr_column_name(#flag),                                  \
   attr_column_name(#f)},
#include "loom/ir/ops.def"
#undef LOOM_OP
};
inline constexpr int kNumOps = static_cast<int>(sizeof(kOpInfo) / sizeof(kOpInfo[0]));

inline const OpInfo& info(OpKind op) { return kOpInfo[static_cast<int>(op)]; }
inline std::string_view op_name(OpKind op) { return info(op).name; }
inline bool has_trait(OpKind op, uint32_t t) { return (info(op).traits & t) != 0; }
// Ops whose nodes may have several results (control flow and kMultiResult): built by
// Builder::make_region, typed by infer_region_types, run by region kernels.
inline bool several_results(OpKind op) { return has_trait(op, kRegion | kMultiResult); }
// Finds an op by its IR token; returns false when none matches.
bool parse_op(std::string_view text, OpKind* out);
std::ostream& operator<<(std::ostream& os, OpKind op);

}  // namespace loom::ir
