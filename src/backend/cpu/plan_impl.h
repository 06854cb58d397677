// The planner behind make_plan (plan.h), for the files that build a plan: plan.cpp (which
// values get buffers, a step per node), epilogue_match.cpp, stages.cpp, buffer_lifetimes.cpp.
// No LLVM here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "backend/cpu/plan.h"

namespace loom::cpu::detail {

// Ops that view_of may read through (a strided view of their operand's buffer; a reshape
// where reshape_strides allows it). Defined in library_choice.cpp.
bool is_view_op(const ir::Graph& g, NodeId n);
// The strides at which a view of `from` laid out with `strides` reads as shape `to` (a
// reshape), or false when the reshape needs a copy (merged dims that are not contiguous).
bool reshape_strides(const Shape& from, const std::vector<int64_t>& strides, const Shape& to,
                     std::vector<int64_t>* out);
// Fills v when n is a strided view of a buffer (has_buf) that a library can read in place.
bool view_of(const ir::Graph& g, const std::vector<bool>& has_buf, NodeId n, BlasView* v,
             int depth);

// Operand slots an attention step reads through strided views (attention_plan.cpp): q, k, v,
// and the gradient's dO; the mask, the log-sum-exp and delta have buffers of their own.
bool attention_viewed_slot(ir::OpKind op, size_t k);

// Makes one plan (make_plan); not thread-safe, one per call.
class Planner {
 public:
  Planner(const ir::Graph& g, const std::vector<std::vector<NodeId>>& results, bool allow_views)
      : g_(g), n_(g.size()), results_(results), allow_views_(allow_views) {
    stand_in_.assign(n_, false);
    for (const auto& rs : results_)
      for (size_t k = 1; k < rs.size(); ++k) stand_in_[rs[k]] = true;
  }

  Plan run();

 private:
  void decide_buffers();
  void assign_buffers();
  int add_buf(BufferInfo::Kind kind, const TensorType& t, int index);
  void plan_node(NodeId id);
  void plan_product(NodeId id);
  // Whether a library or kernel reads `operand` in place (fits: the layout it reads suits it),
  // as it stands or once the value under its layout ops gets a buffer of its own (the product
  // that computes the value then writes it); false leaves has_buf_ as it was.
  template <class Fits>
  bool read_in_place(NodeId operand, const Fits& fits) {
    if (fits(operand)) return true;
    NodeId base = operand;
    while (!has_buf_[base] && is_view_op(g_, base)) base = g_.node(base).operands[0].node;
    if (base == operand || has_buf_[base]) return false;
    has_buf_[base] = true;
    if (fits(operand)) return true;
    has_buf_[base] = false;
    return false;
  }
  // The nodes holding id's results in order (split_results' stand-ins after the first).
  std::vector<NodeId> results_of(NodeId id) const {
    if (id < results_.size() && !results_[id].empty()) return results_[id];
    return {id};
  }
  Library product_library(NodeId id, bool a_trans, bool epilogue) const;

  // -- Epilogues: elementwise consumers of a oneDNN product folded into it as post-ops. --

  struct Epilogue {
    NodeId end = 0;            // the last consumer folded in: the step writes its buffer
    std::vector<PostOp> post;  // in order
  };
  bool epilogue_of_product(NodeId id) const { return epilogues_.count(id) != 0; }

  bool const_value(NodeId y, double* v) const;
  bool is_const(NodeId y, double want, double tol) const;
  bool private_value(NodeId x, int count) const;
  // A float32 value of the product's shape (post-ops keep the destination's shape and type).
  bool same_type(NodeId x, const TensorType& t) const { return g_.node(x).type == t; }

  void build_users();
  std::span<const NodeId> users(NodeId x) const;
  NodeId match_gelu(NodeId x, std::span<const NodeId> us, const TensorType& t) const;
  NodeId match_relu(NodeId x, std::span<const NodeId> us, const TensorType& t) const;
  NodeId match_sigmoid(NodeId u, const TensorType& t) const;
  NodeId match_post_op(NodeId x, const TensorType& t, std::vector<PostOp>* post,
                       std::vector<NodeId>* binaries) const;
  NodeId match_binary(NodeId x, NodeId u, const TensorType& t, std::vector<PostOp>* post,
                      std::vector<NodeId>* binaries) const;
  void pattern_nodes(NodeId x, NodeId end, std::vector<NodeId>* out) const;
  void plan_epilogues();
  Stage elementwise_stage(NodeId value, int out_buf);
  void plan_concat(NodeId id);

  // -- Attention read and written in place (attention_plan.cpp). --

  bool attention_node(NodeId id) const;  // attention or its gradient (not a result stand-in)
  // feeds_attention_: values read only as attention's q, k, v or dO, through layouts (a
  // reshape among them then leaves its operand without a buffer of its own).
  void mark_attention_chains();
  bool attention_view(NodeId operand, BlasView* v) const;
  // `operand` gets a buffer, filled by a kernel through its layouts.
  void copy_layout(NodeId operand);
  // Gives buffers to what the layouts under n read from memory; true when it gave one.
  bool read_layouts(NodeId n);
  void settle_attention_inputs();
  // Results whose only reader is a chain of layouts (permute, reshape, a concat's piece):
  // the step writes them where the chain ends.
  void plan_attention_outputs();
  bool result_view(NodeId result, const std::vector<NodeId>& chain, BlasView* v) const;
  void attention_views(NodeId id, Step* st) const;
  void plan_reduce(NodeId id);
  static int64_t column_block(const Stage& s, ir::OpKind op);
  void add_copy(NodeId value, int buf) { add_stage(elementwise_stage(value, buf), false); }

  static Shape outer_of(const Stage& s);
  static bool trailing_reduction(const Stage& s);
  void add_stage(Stage s, bool mergeable = true);
  bool adds_fallback_wait(const KernelSpec& k, const Stage& s);
  static Coords stage_coords(const Stage& s);
  bool row_local(const KernelSpec& k, const Stage& s);
  bool row_local_read(NodeId x, const Coords& c, size_t nout);
  void compute_releases();
  void collect_leaf_bufs(NodeId n, std::vector<int>* out, int root);
  void plan_donation();
  bool adds_in_place(const Step& st, int ib) const;
  bool in_place(const KernelSpec& k, int ob, int ib);
  const ir::Graph& g_;
  size_t n_;
  const std::vector<std::vector<NodeId>>& results_;  // see split_results
  std::vector<bool> stand_in_;        // result k >= 1 of a multi-result node: no step of its own
  std::vector<int> last_use_;         // per buffer: the last step that touches it
  std::vector<uint32_t> visit_mark_;  // collect_leaf_bufs: nodes seen in the current walk
  uint32_t visit_stamp_ = 0;
  std::vector<int> view_last_;  // per buffer: the last step that reads a view of it
  bool allow_views_ = false;
  std::vector<uint8_t> view_;  // per node: a View buffer
  std::vector<bool> has_buf_;
  std::vector<int> uses_;     // per node: operand slots that read it
  std::vector<bool> is_out_;  // per node: a graph output (epilogue matching only)
  // Per node: 1 computed inside a folded epilogue (no buffer), 2 an epilogue's end.
  std::vector<uint8_t> folded_;
  std::vector<int> user_start_;  // users of node x: users_[user_start_[x] .. user_start_[x+1])
  std::vector<NodeId> users_;
  std::map<NodeId, Epilogue> epilogues_;      // per product folded with its consumers
  std::map<NodeId, NodeId> epilogue_end_of_;  // epilogue end -> its product
  std::vector<bool> mergeable_kernel_;
  std::vector<bool> fallback_out_;  // per buffer: a reference fallback step fills it
  std::vector<std::pair<NodeId, int>> output_copies_;
  bool attention_ = false;  // the graph holds an attention node (mark_attention_chains)
  std::vector<uint8_t> feeds_attention_;
  std::map<NodeId, BlasView> out_view_;  // per attention result written into another buffer
  std::set<NodeId> filled_;              // layouts whose whole buffer an attention step writes
  std::set<std::pair<NodeId, NodeId>> filled_pieces_;  // {concat, piece} an attention step writes
  Plan plan_;
};

}  // namespace loom::cpu::detail
