// The planner behind make_plan (plan.h), for the files that build a plan: plan.cpp (which
// values get buffers, a step per node), epilogue_match.cpp, stages.cpp, buffer_lifetimes.cpp.
// No LLVM here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "backend/cpu/plan.h"

namespace loom::cpu::detail {

// Ops that view_of may read through (a strided view of their operand's buffer; a reshape
// that merges or splits dims only of a dense view). Defined in library_choice.cpp.
bool is_view_op(const ir::Graph& g, NodeId n);
// Fills v when n is a strided view of a buffer (has_buf) that a library can read in place.
bool view_of(const ir::Graph& g, const std::vector<bool>& has_buf, NodeId n, BlasView* v,
             int depth);

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
  Plan plan_;
};

}  // namespace loom::cpu::detail
