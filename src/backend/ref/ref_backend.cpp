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
    register_control_flow_kernels(t);
    register_collective_kernels(t);
    register_attention_kernels(t);
    register_callback_kernels(t);
    return t;
  }();
  return table;
}

Kernel find_kernel(ir::OpKind op) { return kernel_table().kernels[static_cast<int>(op)]; }
RegionKernel find_region_kernel(ir::OpKind op) {
  return kernel_table().region_kernels[static_cast<int>(op)];
}

}  // namespace loom::detail::ref

namespace loom::backend {

namespace {

using detail::ref::Array;
using ir::NodeId;

constexpr NodeId kNever = static_cast<NodeId>(-1);

// Immutable after construction; run() keeps all its state on the stack, so concurrent runs
// are safe. Values are stored per (node, result): node id's results start at base_[id].
// Regions of control-flow nodes are compiled once here, into nested RefExecutables.
class RefExecutable final : public Executable {
 public:
  explicit RefExecutable(const ir::Graph& g) : graph_(g) { plan(); }

  std::vector<Buffer> run(std::span<const Buffer> inputs) const override {
    check_inputs("ref", graph_, inputs);
    std::vector<Array> values(base_.back());
    std::vector<Array> operands;
    for (NodeId id = 0; id < graph_.size(); ++id) {
      if (!live_[id]) continue;
      const ir::Node& n = graph_.node(id);
      if (n.op == ir::OpKind::Parameter) {
        values[base_[id]] = Array{n.type, inputs[static_cast<size_t>(param_pos_[id])]};
        continue;
      }
      operands.clear();
      for (const ir::Value& v : n.operands) operands.push_back(values[base_[v.node] + v.index]);
      Array* out = values.data() + base_[id];
      for (uint32_t k = 0; k < n.num_results(); ++k)
        out[k] = detail::ref::make_array(n.result_type(k));
      if (!ir::several_results(n.op)) {
        detail::ref::find_kernel(n.op)(n, operands, out[0]);
      } else {
        detail::ref::find_region_kernel(n.op)(n, region_ptrs_[id], operands,
                                              std::span<Array>(out, n.num_results()));
      }
      for (const ir::Value& v : n.operands) {
        if (last_use_[v.node] != id) continue;
        for (uint32_t k = base_[v.node]; k < base_[v.node + 1]; ++k) values[k] = Array{};
      }
    }
    return copy_outputs(values);
  }

  int64_t num_kernels() const override { return num_kernels_; }

 private:
  // Marks the nodes the outputs need, records each value's last consumer, checks that every
  // needed op has a kernel and compiles the regions, so that errors surface at compile time.
  void plan() {
    const size_t n = graph_.size();
    live_.assign(n, false);
    last_use_.assign(n, kNever);
    param_pos_.assign(n, -1);
    base_.assign(n + 1, 0);
    region_exes_.resize(n);
    region_ptrs_.resize(n);
    for (size_t id = 0; id < n; ++id)
      base_[id + 1] = base_[id] + static_cast<uint32_t>(graph_.node(id).num_results());
    for (const ir::Value& v : graph_.outputs()) {
      LOOM_ASSERT(v.node < n);
      live_[v.node] = true;
    }
    for (size_t id = n; id-- > 0;) {
      if (!live_[id]) continue;
      const ir::Node& node = graph_.node(static_cast<NodeId>(id));
      plan_node(static_cast<NodeId>(id), node);
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

  // Checks one needed node's kernel; a control-flow node gets its regions compiled.
  void plan_node(NodeId id, const ir::Node& node) {
    if (!ir::several_results(node.op)) {
      LOOM_CHECK_T(CompileError, node.num_results() == 1 && node.regions.empty(), "[ref] node %",
                   id, " (", node.op, "): only control-flow ops have several results or regions");
      LOOM_CHECK_T(CompileError, detail::ref::find_kernel(node.op) != nullptr,
                   "[ref] no reference kernel for op ", node.op, " (node %", id, ")");
      return;
    }
    LOOM_CHECK_T(CompileError, detail::ref::find_region_kernel(node.op) != nullptr,
                 "[ref] no reference kernel for op ", node.op, " (node %", id, ")");
    for (const auto& r : node.regions) {
      LOOM_CHECK_T(CompileError, r != nullptr, "[ref] node %", id, " has a null region");
      region_exes_[id].push_back(std::make_shared<RefExecutable>(*r));
      region_ptrs_[id].push_back(region_exes_[id].back().get());
    }
  }

  // A fresh buffer per output: outputs never alias the inputs or each other.
  std::vector<Buffer> copy_outputs(const std::vector<Array>& values) const {
    std::vector<Buffer> results;
    results.reserve(graph_.outputs().size());
    for (const ir::Value& v : graph_.outputs()) {
      const Array& a = values[base_[v.node] + v.index];
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
  std::vector<uint32_t> base_;      // per node: index of its result 0 in the value table
  // Per node: its compiled regions (control-flow nodes only), and the same as raw pointers.
  std::vector<std::vector<std::shared_ptr<const Executable>>> region_exes_;
  std::vector<std::vector<const Executable*>> region_ptrs_;
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
  if (ir::several_results(n.op)) return ref_eval_node_all(g, id, operands)[0];
  std::vector<detail::ref::Array> in;
  for (size_t k = 0; k < n.operands.size(); ++k)
    in.push_back(detail::ref::Array{g.type(n.operands[k]), operands[k]});
  detail::ref::Array out = detail::ref::make_array(n.type);
  detail::ref::find_kernel(n.op)(n, in, out);
  return out.buf;
}

std::vector<Buffer> ref_eval_node_all(const ir::Graph& g, ir::NodeId id,
                                      std::span<const Buffer> operands) {
  if (!ir::several_results(g.node(id).op)) return {ref_eval_node(g, id, operands)};
  return ref_compile_node(g, id)->run(operands);
}

std::shared_ptr<const Executable> ref_compile_node(const ir::Graph& g, ir::NodeId id) {
  ir::Graph one;
  ir::Node copy = g.node(id);
  for (size_t k = 0; k < copy.operands.size(); ++k) {
    ir::Node p;
    p.op = ir::OpKind::Parameter;
    p.type = g.type(copy.operands[k]);
    p.attrs.i = static_cast<int64_t>(k);
    copy.operands[k] = {one.add(std::move(p)), 0};
  }
  const uint32_t results = static_cast<uint32_t>(copy.num_results());
  const NodeId nid = one.add(std::move(copy));
  for (uint32_t k = 0; k < results; ++k) one.outputs().push_back({nid, k});
  return std::make_shared<RefExecutable>(one);
}

}  // namespace loom::backend
