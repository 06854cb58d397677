// Shared helpers of all backends.
#include "loom/backend/backend.h"

#include "loom/core/error.h"

namespace loom::backend {

void check_inputs(const char* who, const ir::Graph& g, std::span<const Buffer> inputs) {
  LOOM_CHECK_T(ExecError, inputs.size() == g.params().size(), "[", who, "] expected ",
               g.params().size(), " inputs, got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& t = g.node(g.params()[i]).type;
    LOOM_CHECK_T(ExecError, inputs[i].nbytes() >= static_cast<size_t>(t.nbytes()), "[", who,
                 "] input ", i, " of type ", t, " needs ", t.nbytes(), " bytes, got ",
                 inputs[i].nbytes());
  }
}

}  // namespace loom::backend
