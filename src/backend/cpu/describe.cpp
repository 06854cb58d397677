// The canonical description of a kernel: its cache key, and the order of its buffers.
#include <map>
#include <sstream>

#include "backend/cpu/codegen_impl.h"

namespace loom::cpu::detail {

namespace {

class Describer {
 public:
  Describer(const ir::Graph& g, const Plan& p, const KernelSpec& k) : g_(g), p_(p), k_(k) {}

  KernelDescription run() {
    os_ << "outer" << k_.outer << " chunk" << k_.chunk << ";";
    for (size_t si = 0; si < k_.stages.size(); ++si) {
      const Stage& s = k_.stages[si];
      stage_of_[s.node] = static_cast<int>(si);
      os_ << (s.reduce ? "R" : "E") << s.shape << "r" << Shape(s.reduced) << " o" << s.out_offset
          << Shape(s.out_strides) << " ->" << buf(s.out_buf) << " = ";
      NodeId root = s.reduce ? g_.node(s.node).operands[0].node : s.node;
      if (s.reduce) os_ << op_text(s.node) << " ";
      os_ << expr(root, si, !s.reduce && p_.buf_of[s.node] == s.out_buf) << ";";
      if (s.out_buf >= 0) computed_[s.node] = true;
    }
    desc_.text = os_.str();
    return std::move(desc_);
  }

 private:
  int buf(int plan_buf) {
    if (plan_buf < 0) return -1;
    auto [it, fresh] = local_.try_emplace(plan_buf, static_cast<int>(desc_.bufs.size()));
    if (fresh) desc_.bufs.push_back(plan_buf);
    return it->second;
  }

  std::string op_text(NodeId n) {
    const ir::Node& node = g_.node(n);
    std::ostringstream o;
    o << ir::op_name(node.op) << ":" << node.type << "[";
    for (int64_t v : node.attrs.ints) o << v << ",";
    o << "|" << node.attrs.i << "|" << node.attrs.flag << "|" << node.attrs.f << "]";
    return o.str();
  }

  // Expressions are trees of node references; a shared node is written once and referred to
  // by its number afterwards, so the text is linear in the DAG.
  std::string expr(NodeId n, size_t stage, bool is_root) {
    const ir::Node& node = g_.node(n);
    bool leaf = p_.buf_of[n] >= 0 && !is_root;
    auto seen = numbered_.find(n);
    if (seen != numbered_.end() && !leaf) return "#" + std::to_string(seen->second);
    if (leaf) {
      auto st = stage_of_.find(n);
      if (st != stage_of_.end() && static_cast<size_t>(st->second) < stage &&
          k_.stages[st->second].reduce)
        return "S" + std::to_string(st->second) + ":" + node.type.str();
      return "B" + std::to_string(buf(p_.buf_of[n])) + ":" + node.type.str();
    }
    std::string s = op_text(n) + "(";
    for (const ir::Value& v : node.operands) s += expr(v.node, stage, false) + ",";
    s += ")";
    int id = static_cast<int>(numbered_.size());
    numbered_[n] = id;
    return "{" + std::to_string(id) + "}" + s;
  }

  const ir::Graph& g_;
  const Plan& p_;
  const KernelSpec& k_;
  std::ostringstream os_;
  KernelDescription desc_;
  std::map<int, int> local_;
  std::map<NodeId, int> numbered_;
  std::map<NodeId, int> stage_of_;
  std::map<NodeId, bool> computed_;
};

}  // namespace

KernelDescription describe(const ir::Graph& g, const Plan& p, const KernelSpec& k) {
  return Describer(g, p, k).run();
}

}  // namespace loom::cpu::detail
