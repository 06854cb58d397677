// pure_callback steps: the operands' buffers handed to the host function as HostArrays and its
// results copied into the step's outputs.
#include <memory>
#include <vector>

#include "backend/cpu/program.h"
#include "loom/core/host_callback.h"

namespace loom::cpu {

void run_callback(const Program& p, const Step& st, void* const* ptr) {
  static const std::shared_ptr<void> borrowed = std::make_shared<char>(0);
  const ir::Node& n = p.graph.node(st.node);
  std::vector<HostArray> args;
  args.reserve(n.operands.size());
  for (const ir::Value& v : n.operands) {
    const TensorType& t = p.graph.type(v);
    // Borrowed for the call: the function gets the program's own buffer, without a copy.
    args.push_back(HostArray{
        t, Buffer::wrap(ptr[p.plan.buf_of[v.node]], static_cast<size_t>(t.nbytes()), borrowed)});
  }
  std::vector<TensorType> want;
  std::vector<void*> outs;
  for (uint32_t k = 0; k < n.num_results(); ++k) {
    want.push_back(n.result_type(k));
    outs.push_back(ptr[st.outs[k]]);
  }
  detail::call_host_callback(n.attrs.i, args, want, outs);
}

}  // namespace loom::cpu
