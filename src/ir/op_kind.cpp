// OpKind names: the IR tokens come from ops.def, like everything keyed by op.
#include "loom/ir/op_kind.h"

#include <ostream>

namespace loom::ir {

bool parse_op(std::string_view text, OpKind* out) {
  // A linear scan over ~45 names is cheaper than building a map for each parse.
  for (int i = 0; i < kNumOps; ++i) {
    if (kOpInfo[i].name == text) {
      *out = static_cast<OpKind>(i);
      return true;
    }
  }
  return false;
}

std::ostream& operator<<(std::ostream& os, OpKind op) { return os << op_name(op); }

}  // namespace loom::ir
