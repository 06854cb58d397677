// The reference backend: an Executable that walks a copy of the graph in index order and runs
// one plain-loop kernel per node, looked up in a table keyed by OpKind (filled per family).
#include "loom/backend/ref_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable t;
    register_source_kernels(t);
    register_elementwise_kernels(t);
    register_reduce_kernels(t);
    register_layout_kernels(t);
    register_index_kernels(t);
    register_linalg_kernels(t);
    register_random_kernels(t);
    return t;
  }();
  return table;
}

Kernel find_kernel(ir::OpKind op) { return kernel_table().kernels[static_cast<int>(op)]; }

}  // namespace loom::detail::ref

namespace loom::backend {

namespace {

using detail::ref::Array;
using ir::NodeId;

constexpr NodeId kNever = static_cast<NodeId>(-1);

// Immutable after construction; run() keeps all its state on the stack, so concurrent runs
// are safe.
class RefExecutable final : public Executable {
 public:
  explicit RefExecutable(const ir::Graph& g) : graph_(g) { plan(); }

  std::vector<Buffer> run(std::span<const Buffer> inputs) const override {
    check_inputs("ref", graph_, inputs);
    std::vector<Array> values(graph_.size());
    std::vector<Array> operands;
    for (NodeId id = 0; id < graph_.size(); ++id) {
      if (!live_[id]) continue;
      const ir::Node& n = graph_.node(id);
      if (n.op == ir::OpKind::Parameter) {
        values[id] = Array{n.type, inputs[static_cast<size_t>(param_pos_[id])]};
        continue;
      }
      operands.clear();
      for (const ir::Value& v : n.operands) operands.push_back(values[v.node]);
      Array out = detail::ref::make_array(n.type);
      detail::ref::find_kernel(n.op)(n, operands, out);
      values[id] = std::move(out);
      for (const ir::Value& v : n.operands) {
        if (last_use_[v.node] == id) values[v.node] = Array{};  // free early
      }
    }
    return copy_outputs(values);
  }

  int64_t num_kernels() const override { return num_kernels_; }

 private:
  // Marks the nodes the outputs need, records each value's last consumer, and checks that
  // every needed op has a kernel, so that errors surface at compile time.
  void plan() {
    const size_t n = graph_.size();
    live_.assign(n, false);
    last_use_.assign(n, kNever);
    param_pos_.assign(n, -1);
    for (const ir::Value& v : graph_.outputs()) {
      LOOM_ASSERT(v.node < n);
      live_[v.node] = true;
    }
    for (size_t id = n; id-- > 0;) {
      if (!live_[id]) continue;
      const ir::Node& node = graph_.node(static_cast<NodeId>(id));
      LOOM_CHECK_T(CompileError, node.num_results() == 1 && node.regions.empty(), "[ref] node %",
                   id, " (", node.op, "): ops with several results or regions are not supported");
      LOOM_CHECK_T(CompileError, detail::ref::find_kernel(node.op) != nullptr,
                   "[ref] no reference kernel for op ", node.op, " (node %", id, ")");
      if (node.op != ir::OpKind::Parameter) ++num_kernels_;
      for (const ir::Value& v : node.operands) {
        LOOM_ASSERT(v.node < id);
        live_[v.node] = true;
        if (last_use_[v.node] == kNever) last_use_[v.node] = static_cast<NodeId>(id);
      }
    }
    for (const ir::Value& v : graph_.outputs()) last_use_[v.node] = kNever;  // keep outputs
    for (size_t i = 0; i < graph_.params().size(); ++i) {
      param_pos_[graph_.params()[i]] = static_cast<int64_t>(i);
    }
    for (size_t id = 0; id < n; ++id) {
      LOOM_CHECK_T(CompileError,
                   !live_[id] || graph_.node(static_cast<NodeId>(id)).op != ir::OpKind::Parameter ||
                       param_pos_[id] >= 0,
                   "[ref] parameter node %", id, " is not among the graph's params()");
    }
  }

  // A fresh buffer per output: outputs never alias the inputs or each other.
  std::vector<Buffer> copy_outputs(const std::vector<Array>& values) const {
    std::vector<Buffer> results;
    results.reserve(graph_.outputs().size());
    for (const ir::Value& v : graph_.outputs()) {
      const Array& a = values[v.node];
      const size_t nbytes = static_cast<size_t>(a.type.nbytes());
      Buffer b = Buffer::allocate(nbytes);
      if (nbytes > 0) std::memcpy(b.data(), a.buf.data(), nbytes);
      results.push_back(std::move(b));
    }
    return results;
  }

  ir::Graph graph_;
  std::vector<bool> live_;
  std::vector<NodeId> last_use_;    // the last node reading each value (kNever: keep it)
  std::vector<int64_t> param_pos_;  // position in params() of each Parameter node
  int64_t num_kernels_ = 0;
};

class RefBackend final : public Backend {
 public:
  std::string_view name() const override { return "ref"; }
  std::shared_ptr<const Executable> compile(const ir::Graph& g,
                                            const CompileOptions&) const override {
    return std::make_shared<RefExecutable>(g);
  }
};

}  // namespace

std::unique_ptr<Backend> make_ref_backend() { return std::make_unique<RefBackend>(); }

Buffer ref_eval_node(const ir::Graph& g, ir::NodeId id, std::span<const Buffer> operands) {
  const ir::Node& n = g.node(id);
  std::vector<detail::ref::Array> in;
  for (size_t k = 0; k < n.operands.size(); ++k)
    in.push_back(detail::ref::Array{g.type(n.operands[k]), operands[k]});
  detail::ref::Array out = detail::ref::make_array(n.type);
  detail::ref::find_kernel(n.op)(n, in, out);
  return out.buf;
}

}  // namespace loom::backend
