// Planning: buffers, fusion into kernels, row merging, BLAS views, buffer lifetimes.
#include "backend/cpu/plan.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <span>

#include "loom/core/error.h"

namespace loom::cpu {

namespace {

using ir::OpKind;

Affine zero() { return {}; }
bool is_zero_on(const Affine& a, size_t lo, size_t hi) {
  for (size_t j = lo; j < std::min(hi, a.a.size()); ++j)
    if (a.a[j] != 0) return false;
  return true;
}
bool is_var(const Affine& a, size_t j) {
  if (a.c != 0 || j >= a.a.size() || a.a[j] != 1) return false;
  for (size_t k = 0; k < a.a.size(); ++k)
    if (k != j && a.a[k] != 0) return false;
  return true;
}
Affine scaled_plus(const Affine& x, int64_t scale, int64_t add) {
  Affine r{x.c * scale + add, x.a};
  for (int64_t& v : r.a) v *= scale;
  return r;
}

// Broadcast map from an output of shape `out` to an operand of shape `in`.
Coords broadcast(const Shape& out, const Shape& in, const Coords& c) {
  Coords r(in.size());
  size_t off = out.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d)
    r[d] = (in[d] == 1 && out[d + off] != 1) ? zero() : c[d + off];
  return r;
}

bool is_elementwise(OpKind op) { return ir::has_trait(op, ir::kElementwise); }

}  // namespace

Affine var(size_t j, size_t n) {
  Affine a;
  a.a.assign(n, 0);
  a.a[j] = 1;
  return a;
}

Affine linear(const std::vector<int64_t>& strides, const Coords& c, int64_t offset) {
  Affine r;
  r.c = offset;
  for (size_t d = 0; d < c.size(); ++d) {
    r.c += c[d].c * strides[d];
    if (r.a.size() < c[d].a.size()) r.a.resize(c[d].a.size(), 0);
    for (size_t j = 0; j < c[d].a.size(); ++j) r.a[j] += c[d].a[j] * strides[d];
  }
  while (!r.a.empty() && r.a.back() == 0) r.a.pop_back();
  return r;
}

bool trivial_reshape(const ir::Graph& g, NodeId n) {
  const ir::Node& node = g.node(n);
  const Shape& in = g.type(node.operands[0]).shape;
  std::vector<int64_t> a, b;
  for (int64_t d : in)
    if (d != 1) a.push_back(d);
  for (int64_t d : node.type.shape)
    if (d != 1) b.push_back(d);
  return a == b;
}

Coords operand_coords(const ir::Graph& g, NodeId n, size_t k, const Coords& c) {
  const ir::Node& node = g.node(n);
  const Shape& out = node.type.shape;
  const Shape& in = g.type(node.operands[k]).shape;
  switch (node.op) {
    case OpKind::RandUniform:
    case OpKind::RandNormal:  // the key i64[2] is read whole, at constant coordinates
      return Coords(in.size(), Affine{});
    case OpKind::Permute: {
      Coords r(in.size());
      for (size_t i = 0; i < node.attrs.ints.size(); ++i) r[node.attrs.ints[i]] = c[i];
      return r;
    }
    case OpKind::Slice: {
      Coords r = c;
      r[node.attrs.i] = scaled_plus(c[node.attrs.i], node.attrs.ints[2], node.attrs.ints[0]);
      return r;
    }
    case OpKind::Reshape: {  // trivial: the non-1 dims correspond in order
      Coords r(in.size());
      size_t j = 0;
      for (size_t d = 0; d < in.size(); ++d) {
        if (in[d] == 1) continue;
        while (out[j] == 1) ++j;
        r[d] = c[j++];
      }
      return r;
    }
    default: return broadcast(out, in, c);  // elementwise and expand
  }
}

Lowering lowering(OpKind op, DType dt) {
  switch (op) {
    case OpKind::Parameter:
    case OpKind::Constant:
    case OpKind::Iota:
    case OpKind::Neg:
    case OpKind::Abs:
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Tanh:
    case OpKind::Sin:
    case OpKind::Cos:
    case OpKind::Erf:
    case OpKind::Not:
    case OpKind::Convert:
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Rem:
    case OpKind::And:
    case OpKind::Or:
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
    case OpKind::Where:
    case OpKind::ReduceSum:
    case OpKind::ReduceMax:
    case OpKind::ReduceMin:
    case OpKind::ArgMax:
    case OpKind::Reshape:
    case OpKind::Permute:
    case OpKind::Expand:
    case OpKind::Slice:
    case OpKind::Concat:
    case OpKind::RandUniform:
    case OpKind::RandNormal: return Lowering::Fused;
    case OpKind::Pow:  // integer powers loop over the exponent's bits: the reference's
      return is_floating(dt) ? Lowering::Fused : Lowering::Fallback;
    case OpKind::MatMul:  // no integer products in BLAS; half precision is widened to float32
      return dt == DType::Float32 || dt == DType::Float64 ? Lowering::Blas : Lowering::Fallback;
    case OpKind::Gather:
    case OpKind::IndexSelect:  // data-dependent addresses, bounds checks: index.cpp
    case OpKind::IndexAdd: return native_index(op, dt) ? Lowering::Index : Lowering::Fallback;
    case OpKind::AllReduceSum:  // the reference kernels call the dist::Communicator
    case OpKind::AllReduceMax:
    case OpKind::AllReduceMin:
    case OpKind::AllGather:
    case OpKind::ReduceScatterSum:
    case OpKind::DistBroadcast:
    case OpKind::GradAllReduce: return Lowering::Fallback;
    case OpKind::Call:
    case OpKind::Scan:
    case OpKind::While: return Lowering::Loop;
  }
  LOOM_ASSERT(false);
  return Lowering::Fallback;
}

bool codegen_supports(const ir::Graph& g, NodeId n) {
  const ir::Node& node = g.node(n);
  if (!node.regions.empty() || !node.more_types.empty()) return false;
  const Lowering l = lowering(node.op, node.type.dtype);
  return l == Lowering::Fused || l == Lowering::Blas;
}

namespace {

// Ops that view_of may read through (a strided view of their operand's buffer; a reshape
// that merges or splits dims only of a dense view).
bool is_view_op(const ir::Graph& g, NodeId n) {
  const OpKind op = g.node(n).op;
  return op == OpKind::Permute || op == OpKind::Expand || op == OpKind::Slice ||
         op == OpKind::Reshape;
}

// True when v lays `shape` out densely in row-major order (size-1 dims' strides aside).
bool dense(const BlasView& v, const Shape& shape) {
  int64_t want = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && v.strides[d] != want) return false;
    want *= shape[d];
  }
  return true;
}

bool view_of(const ir::Graph& g, const std::vector<bool>& has_buf, NodeId n, BlasView* v,
             int depth) {
  if (depth > 64) return false;
  const ir::Node& node = g.node(n);
  if (has_buf[n]) {
    v->base = n;
    v->offset = 0;
    v->strides = contiguous_strides(node.type.shape);
    return true;
  }
  if (!is_view_op(g, n)) return false;
  BlasView in;
  if (!view_of(g, has_buf, node.operands[0].node, &in, depth + 1)) return false;
  const Shape& out = node.type.shape;
  const Shape& ish = g.type(node.operands[0]).shape;
  v->base = in.base;
  v->offset = in.offset;
  v->strides.assign(out.size(), 0);
  switch (node.op) {
    case OpKind::Permute:
      for (size_t i = 0; i < out.size(); ++i) v->strides[i] = in.strides[node.attrs.ints[i]];
      break;
    case OpKind::Slice:
      v->strides = in.strides;
      v->offset += node.attrs.ints[0] * in.strides[node.attrs.i];
      v->strides[node.attrs.i] *= node.attrs.ints[2];
      break;
    case OpKind::Expand: {
      size_t off = out.size() - ish.size();
      for (size_t d = 0; d < ish.size(); ++d)
        v->strides[d + off] = (ish[d] == 1 && out[d + off] != 1) ? 0 : in.strides[d];
      break;
    }
    default: {  // reshape
      if (!trivial_reshape(g, n)) {
        // Dims merged or split ([4,512,512] as [2048,512] for a weight gradient): the same
        // dense memory, when the operand is dense.
        if (!dense(in, ish)) return false;
        v->strides = contiguous_strides(out);
        break;
      }
      size_t j = 0;
      for (size_t d = 0; d < ish.size(); ++d) {
        if (ish[d] == 1) continue;
        while (out[j] == 1) ++j;
        v->strides[j++] = in.strides[d];
      }
    }
  }
  return true;
}

}  // namespace

bool blas_view(const ir::Graph& g, const std::vector<bool>& has_buf, NodeId operand, BlasView* v) {
  if (!view_of(g, has_buf, operand, v, 0)) return false;
  const Shape& s = g.node(operand).type.shape;
  int64_t rows = s[s.size() - 2], cols = s.back();
  int64_t sr = v->strides[s.size() - 2], sc = v->strides.back();
  // An empty matrix is read by no one: any layout will do.
  bool no_trans = rows == 0 || cols == 0 ||
                  ((sc == 1 || cols == 1) && (rows == 1 || sr >= std::max<int64_t>(cols, 1)));
  bool trans = (sr == 1 || rows == 1) && (cols == 1 || sc >= std::max<int64_t>(rows, 1));
  v->trans = !no_trans;
  v->ld = no_trans ? (rows <= 1 || cols == 0 ? std::max<int64_t>(cols, 1) : sr)
                   : (cols == 1 ? std::max<int64_t>(rows, 1) : sc);
  return no_trans || trans;
}

const char* post_op_name(PostOp::Kind k) {
  switch (k) {
    case PostOp::Relu: return "relu";
    case PostOp::Tanh: return "tanh";
    case PostOp::Sigmoid: return "sigmoid";
    case PostOp::Gelu: return "gelu_erf";
    case PostOp::Linear: return "linear";
    case PostOp::Add: return "add";
    case PostOp::Sub: return "sub";
    case PostOp::Mul: return "mul";
    case PostOp::Div: return "div";
    case PostOp::Max: return "max";
    case PostOp::Min: return "min";
  }
  return "?";
}

const char* library_name(Library l) { return l == Library::Onednn ? "onednn" : "openblas"; }

namespace {

// 0: the table; 1: OpenBLAS; 2: oneDNN. LOOM_MATMUL sets the first value.
int initial_forced_library() {
  const char* e = std::getenv("LOOM_MATMUL");
  if (e == nullptr) return 0;
  if (std::strcmp(e, "openblas") == 0) return 1;
  if (std::strcmp(e, "onednn") == 0) return 2;
  return 0;
}
std::atomic<int>& forced_library() {
  static std::atomic<int> f{initial_forced_library()};
  return f;
}

}  // namespace

void force_library(std::optional<Library> l) {
  forced_library().store(!l ? 0 : *l == Library::OpenBlas ? 1 : 2);
}

// Measured per CPU class (docs/architecture.md, "Products: OpenBLAS or oneDNN"); the ratios behind
// each branch: docs/architecture.md, "Measurements": library_table.
Library library_table(bool avx512, DType dt, int64_t m, int64_t n, int64_t k, int64_t batches,
                      bool a_trans, bool epilogue) {
  if (dt != DType::Float32 || k == 0) return Library::OpenBlas;
  // Narrow products (an MLP's logits): on AVX-512, brgemm from 10 columns up to k = 512 (the
  // MLP's [32,256]x[256,10]^T part: 2.12 against 3.34 us); with fewer columns or a longer k,
  // OpenBLAS (brgemm's [32,1024]x[1024,4]: 13.4 against 8.8 us).
  if (n < 16) return avx512 && n >= 10 && k <= 512 ? Library::Onednn : Library::OpenBlas;
  if (avx512) return Library::Onednn;
  if (a_trans && k >= 512) return Library::OpenBlas;
  const int64_t work = batches * m * n * k;
  if (work >= (int64_t{1} << 27)) return epilogue ? Library::Onednn : Library::OpenBlas;
  return Library::Onednn;
}

Library choose_library(DType dt, int64_t m, int64_t n, int64_t k, int64_t batches, bool a_trans,
                       bool epilogue) {
  if (dt != DType::Float32 || k == 0) return Library::OpenBlas;
  if (int f = forced_library().load(std::memory_order_relaxed); f != 0)
    return f == 2 ? Library::Onednn : Library::OpenBlas;
  return library_table(onednn_avx512(), dt, m, n, k, batches, a_trans, epilogue);
}

std::string describe_products(const ir::Graph& g, const Plan& plan) {
  std::string out;
  for (const Step& st : plan.steps) {
    if (st.kind != Step::MatMul) continue;
    const ir::Node& n = g.node(st.node);
    out += "matmul %" + std::to_string(st.node) + " " + g.type(n.operands[0]).str() + " x " +
           g.type(n.operands[1]).str() + (st.views[0].trans ? " A^T" : "") +
           (st.views[1].trans ? " B^T" : "") + " on " + library_name(st.lib);
    if (!st.post.empty()) {
      out += " post-ops";
      for (const PostOp& po : st.post) out += std::string(" ") + post_op_name(po.kind);
      out += " -> %" + std::to_string(st.out);
    }
    out += "\n";
  }
  return out;
}

namespace {

constexpr size_t kMaxStages = 6;
constexpr size_t kMaxPostOps = 8;
// A shared subexpression this large is stored only when recomputing costs over kRecomputeLarge:
// later kernels would read it from memory, dearer than arithmetic in kernels that wait on memory
// anyway (the exact GELU's 1 + erf term; docs/architecture.md, "Measurements": kRecomputeLarge).
constexpr int64_t kRecomputeLargeBytes = int64_t{1} << 20;
constexpr int64_t kRecomputeLarge = 24;

class Planner {
 public:
  Planner(const ir::Graph& g, const std::vector<std::vector<NodeId>>& results, bool allow_views)
      : g_(g), n_(g.size()), results_(results), allow_views_(allow_views) {
    stand_in_.assign(n_, false);
    for (const auto& rs : results_)
      for (size_t k = 1; k < rs.size(); ++k) stand_in_[rs[k]] = true;
  }

  Plan run() {
    decide_buffers();
    assign_buffers();
    for (NodeId id = 0; id < n_; ++id) {
      if (has_buf_[id] && g_.node(id).op != OpKind::Parameter && !view_[id]) plan_node(id);
    }
    for (auto& [node, buf] : output_copies_) add_copy(node, buf);
    compute_releases();
    plan_donation();
    return std::move(plan_);
  }

 private:
  void decide_buffers() {
    has_buf_.assign(n_, false);
    std::vector<int>& uses = uses_;
    uses.assign(n_, 0);
    std::vector<int64_t> cost(n_, 0), depth(n_, 0);
    for (NodeId id = 0; id < n_; ++id)
      for (const ir::Value& v : g_.node(id).operands) uses[v.node]++;
    for (const ir::Value& v : g_.outputs()) has_buf_[v.node] = true;
    for (NodeId id = 0; id < n_; ++id) {
      const ir::Node& node = g_.node(id);
      OpKind op = node.op;
      if (stand_in_[id]) has_buf_[id] = true;  // filled by its multi-result node's step
      bool ref = !codegen_supports(g_, id);
      if (op == OpKind::Parameter || op == OpKind::MatMul || op == OpKind::Concat || ref ||
          ir::has_trait(op, ir::kReduce))
        has_buf_[id] = true;
      if (ref) {
        for (const ir::Value& v : node.operands) has_buf_[v.node] = true;
      } else if (op == OpKind::Reshape && !trivial_reshape(g_, id)) {
        has_buf_[node.operands[0].node] = true;
      } else if (op == OpKind::MatMul) {
        for (const ir::Value& v : node.operands) {
          BlasView bv;
          if (blas_view(g_, has_buf_, v.node, &bv)) continue;
          // A layout op over a computed value (the transposed gradient of dW = dY^T X): store
          // the value, contiguously, and let the library read the layout through strides,
          // rather than a transposing copy that writes with a stride.
          NodeId base = v.node;
          while (!has_buf_[base] && is_view_op(g_, base)) base = g_.node(base).operands[0].node;
          if (base != v.node && !has_buf_[base]) {
            has_buf_[base] = true;
            if (blas_view(g_, has_buf_, v.node, &bv)) continue;
            has_buf_[base] = false;  // the layout is not a strided matrix: copy it after all
          }
          has_buf_[v.node] = true;
        }
      }
      // Transcendentals expand to ~20 instructions: recomputing them costs code and time.
      const bool heavy = ir::has_trait(op, ir::kCostly);
      int64_t c = heavy ? 12 : 1, dep = 1;
      for (const ir::Value& v : node.operands) {
        c += has_buf_[v.node] ? 0 : cost[v.node];
        dep = std::max(dep, has_buf_[v.node] ? 1 : depth[v.node] + 1);
      }
      // Bounded expressions keep kernels small and the code generator's recursion shallow.
      if (!has_buf_[id] && (dep > 32 || c > 64)) has_buf_[id] = true;
      cost[id] = has_buf_[id] ? 0 : c;
      depth[id] = has_buf_[id] ? 0 : dep;
      // A shared subexpression is recomputed by each consumer unless that costs too much.
      const int64_t limit = node.type.nbytes() >= kRecomputeLargeBytes ? kRecomputeLarge : 8;
      if (!has_buf_[id] && uses[id] > 1 && c > limit && op != OpKind::Constant) {
        has_buf_[id] = true;
        cost[id] = 0;
      }
    }
    plan_epilogues();
    // Slices that are contiguous blocks of a buffer: views into it, not computed.
    view_.assign(n_, 0);
    if (!allow_views_) return;
    for (NodeId id = 0; id < n_; ++id) {
      const ir::Node& node = g_.node(id);
      if (node.op != OpKind::Slice || has_buf_[id] || stand_in_[id] || node.attrs.ints[2] != 1)
        continue;
      NodeId src = node.operands[0].node;
      if (!has_buf_[src]) continue;
      const Shape& xs = g_.node(src).type.shape;
      bool block = true;
      for (int64_t d = 0; d < node.attrs.i; ++d) block = block && xs[d] == 1;
      if (!block) continue;
      view_[id] = 1;
      has_buf_[id] = true;
    }
  }

  void assign_buffers() {
    plan_.buf_of.assign(n_, -1);
    for (size_t p = 0; p < g_.params().size(); ++p) {
      NodeId id = g_.params()[p];
      plan_.buf_of[id] = add_buf(BufferInfo::Input, g_.node(id).type, static_cast<int>(p));
    }
    for (NodeId id = 0; id < n_; ++id) {
      if (!has_buf_[id] || plan_.buf_of[id] >= 0 || epilogue_of_product(id)) continue;
      if (view_[id]) {
        const ir::Node& node = g_.node(id);
        int base = plan_.buf_of[node.operands[0].node];
        std::vector<int64_t> st = contiguous_strides(g_.type(node.operands[0]).shape);
        int64_t offset = node.attrs.ints[0] * st[node.attrs.i];
        if (plan_.bufs[base].kind == BufferInfo::View) {
          offset += plan_.bufs[base].offset;
          base = plan_.bufs[base].base;
        }
        plan_.buf_of[id] = add_buf(BufferInfo::View, node.type, -1);
        plan_.bufs.back().base = base;
        plan_.bufs.back().offset = offset;
        continue;
      }
      plan_.buf_of[id] = add_buf(BufferInfo::Temp, g_.node(id).type, -1);
    }
    for (size_t k = 0; k < g_.outputs().size(); ++k) {
      NodeId id = g_.outputs()[k].node;
      BufferInfo& b = plan_.bufs[plan_.buf_of[id]];
      if (b.kind == BufferInfo::Temp) {
        b.kind = BufferInfo::Output;
        b.index = static_cast<int>(k);
        plan_.output_bufs.push_back(plan_.buf_of[id]);
      } else {  // an input, or a value that is already another output: copy it
        int nb = add_buf(BufferInfo::Output, g_.node(id).type, static_cast<int>(k));
        plan_.output_bufs.push_back(nb);
        output_copies_.push_back({id, nb});
      }
    }
    for (const auto& [product, e] : epilogues_) plan_.buf_of[product] = plan_.buf_of[e.end];
  }

  int add_buf(BufferInfo::Kind kind, const TensorType& t, int index) {
    plan_.bufs.push_back(BufferInfo{kind, t, index});
    return static_cast<int>(plan_.bufs.size() - 1);
  }

  void plan_node(NodeId id) {
    const ir::Node& node = g_.node(id);
    if (stand_in_[id] || epilogue_of_product(id)) return;  // a product runs at its epilogue's end
    if (auto it = epilogue_end_of_.find(id); it != epilogue_end_of_.end()) {
      plan_product(it->second);
    } else if (node.op == OpKind::MatMul && codegen_supports(g_, id)) {
      plan_product(id);
    } else if (!codegen_supports(g_, id)) {
      Step::Kind kind = ir::has_trait(node.op, ir::kRegion)                     ? Step::Loop
                        : lowering(node.op, node.type.dtype) == Lowering::Index ? Step::Index
                                                                                : Step::Ref;
      Step st{kind, -1, id, {}, {plan_.buf_of[id]}};
      if (id < results_.size() && !results_[id].empty()) {
        st.outs.clear();
        for (NodeId r : results_[id]) st.outs.push_back(plan_.buf_of[r]);
      }
      for (int b : st.outs) {
        if (b < 0) continue;
        if (fallback_out_.size() <= static_cast<size_t>(b)) fallback_out_.resize(b + 1, false);
        fallback_out_[b] = kind == Step::Ref || kind == Step::Index;
      }
      plan_.steps.push_back(std::move(st));
    } else if (node.op == OpKind::Concat) {
      plan_concat(id);
    } else if (ir::has_trait(node.op, ir::kReduce)) {
      plan_reduce(id);
    } else {
      Stage s = elementwise_stage(id, plan_.buf_of[id]);
      add_stage(std::move(s));
    }
  }

  void plan_product(NodeId id) {
    const ir::Node& node = g_.node(id);
    Step st{Step::MatMul, -1, id, {}, {}, {}};
    for (const ir::Value& v : node.operands) {
      st.views.emplace_back();
      LOOM_ASSERT(blas_view(g_, has_buf_, v.node, &st.views.back()));
    }
    st.out = id;
    if (auto it = epilogues_.find(id); it != epilogues_.end()) {
      st.lib = Library::Onednn;
      st.post = it->second.post;
      st.out = it->second.end;
    } else {
      st.lib = product_library(id, st.views[0].trans, false);
    }
    plan_.steps.push_back(std::move(st));
    plan_.blas_calls++;
  }

  Library product_library(NodeId id, bool a_trans, bool epilogue) const {
    const ir::Node& node = g_.node(id);
    const Shape& os = node.type.shape;
    const size_t r = os.size();
    int64_t batches = 1;
    for (size_t d = 0; d + 2 < r; ++d) batches *= os[d];
    return choose_library(node.type.dtype, os[r - 2], os[r - 1],
                          g_.type(node.operands[0]).shape.back(), batches, a_trans, epilogue);
  }

  // -- Epilogues: elementwise consumers of a oneDNN product folded into it as post-ops. --

  struct Epilogue {
    NodeId end = 0;            // the last consumer folded in: the step writes its buffer
    std::vector<PostOp> post;  // in order
  };

  bool epilogue_of_product(NodeId id) const { return epilogues_.count(id) != 0; }

  // The value of a constant read through expands and size-1 reshapes.
  bool const_value(NodeId y, double* v) const {
    for (int i = 0; i < 8; ++i) {
      const ir::Node& n = g_.node(y);
      if (n.op == OpKind::Constant) {
        *v = n.attrs.f;
        return true;
      }
      if (n.op != OpKind::Expand && !(n.op == OpKind::Reshape && trivial_reshape(g_, y)))
        return false;
      y = n.operands[0].node;
    }
    return false;
  }
  bool is_const(NodeId y, double want, double tol) const {
    double v = 0;
    return const_value(y, &v) && std::abs(v - want) <= tol;
  }
  // x is read only by the pattern being matched (`count` reads) and is no graph output.
  bool private_value(NodeId x, int count) const {
    return uses_[x] == count && !is_out_[x] && !stand_in_[x];
  }
  // A float32 value of the product's shape (post-ops keep the destination's shape and type).
  bool same_type(NodeId x, const TensorType& t) const { return g_.node(x).type == t; }

  void build_users() {
    user_start_.assign(n_ + 1, 0);
    for (NodeId id = 0; id < n_; ++id)
      for (const ir::Value& v : g_.node(id).operands) user_start_[v.node + 1]++;
    for (size_t i = 0; i < n_; ++i) user_start_[i + 1] += user_start_[i];
    users_.assign(user_start_[n_], 0);
    std::vector<int> at(user_start_.begin(), user_start_.end() - 1);
    for (NodeId id = 0; id < n_; ++id)
      for (const ir::Value& v : g_.node(id).operands) users_[at[v.node]++] = id;
  }
  std::span<const NodeId> users(NodeId x) const {
    return {users_.data() + user_start_[x], users_.data() + user_start_[x + 1]};
  }

  // gelu (composite.cpp) on x, read by us = its two users: returns the end node (0: none).
  NodeId match_gelu(NodeId x, std::span<const NodeId> us, const TensorType& t) const {
    // mul(mul(x, 0.5), add(erf(mul(x, 1/sqrt(2))), 1))
    for (int swap = 0; swap < 2; ++swap) {
      NodeId h = us[swap], e = us[1 - swap];
      const ir::Node &hn = g_.node(h), &en = g_.node(e);
      if (hn.op != OpKind::Mul || en.op != OpKind::Mul || !same_type(h, t) || !same_type(e, t))
        continue;
      auto other = [&](const ir::Node& n) {
        return n.operands[0].node == x ? n.operands[1].node : n.operands[0].node;
      };
      if (!is_const(other(hn), 0.5, 1e-12) || !is_const(other(en), M_SQRT1_2, 1e-7)) continue;
      if (!private_value(h, 1) || !private_value(e, 1)) continue;
      NodeId erf = users(e)[0];
      if (g_.node(erf).op != OpKind::Erf || !private_value(erf, 1)) continue;
      NodeId a = users(erf)[0];
      const ir::Node& an = g_.node(a);
      if (an.op != OpKind::Add || !private_value(a, 1) || !same_type(a, t)) continue;
      if (!is_const(an.operands[0].node == erf ? an.operands[1].node : an.operands[0].node, 1, 0))
        continue;
      NodeId m = users(a)[0];
      const ir::Node& mn = g_.node(m);
      if (users(h)[0] != m || mn.op != OpKind::Mul || !same_type(m, t)) continue;
      return m;
    }
    return 0;
  }

  // relu (composite.cpp) on x, read by its two users us: where(le(x, 0), 0, x).
  NodeId match_relu(NodeId x, std::span<const NodeId> us, const TensorType& t) const {
    for (int swap = 0; swap < 2; ++swap) {
      NodeId l = us[swap], w = us[1 - swap];
      const ir::Node &ln = g_.node(l), &wn = g_.node(w);
      if (ln.op != OpKind::Le || wn.op != OpKind::Where || !same_type(w, t)) continue;
      if (ln.operands[0].node != x || !is_const(ln.operands[1].node, 0, 0)) continue;
      if (!private_value(l, 1) || wn.operands[0].node != l || wn.operands[2].node != x ||
          !is_const(wn.operands[1].node, 0, 0))
        continue;
      return w;
    }
    return 0;
  }

  // sigmoid (composite.cpp) from its negation u of x: div(1, add(exp(neg(x)), 1)).
  NodeId match_sigmoid(NodeId u, const TensorType& t) const {
    if (!private_value(u, 1)) return 0;
    NodeId e = users(u)[0];
    if (g_.node(e).op != OpKind::Exp || !private_value(e, 1)) return 0;
    NodeId a = users(e)[0];
    const ir::Node& an = g_.node(a);
    if (an.op != OpKind::Add || !private_value(a, 1) || !same_type(a, t) ||
        !is_const(an.operands[0].node == e ? an.operands[1].node : an.operands[0].node, 1, 0))
      return 0;
    NodeId d = users(a)[0];
    const ir::Node& dn = g_.node(d);
    if (dn.op != OpKind::Div || dn.operands[1].node != a || !is_const(dn.operands[0].node, 1, 0) ||
        !same_type(d, t))
      return 0;
    return d;
  }

  // One consumer pattern at x: appends its post-op, returns the node it ends at (0: none).
  NodeId match_post_op(NodeId x, const TensorType& t, std::vector<PostOp>* post,
                       std::vector<NodeId>* binaries) const {
    if (is_out_[x] || stand_in_[x]) return 0;
    auto us = users(x);
    if (uses_[x] == 2 && us.size() == 2) {
      if (NodeId m = match_gelu(x, us, t)) {
        post->push_back(PostOp{PostOp::Gelu});
        return m;
      }
      if (NodeId w = match_relu(x, us, t)) {
        post->push_back(PostOp{PostOp::Relu});
        return w;
      }
      return 0;
    }
    if (uses_[x] != 1 || us.size() != 1) return 0;
    const NodeId u = us[0];
    const ir::Node& un = g_.node(u);
    if (!same_type(u, t)) return 0;
    switch (un.op) {
      case OpKind::Tanh: post->push_back(PostOp{PostOp::Tanh}); return u;
      case OpKind::Neg:
        if (NodeId d = match_sigmoid(u, t)) {
          post->push_back(PostOp{PostOp::Sigmoid});
          return d;
        }
        post->push_back(PostOp{PostOp::Linear, -1, 0});  // -x
        return u;
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Mul:
      case OpKind::Div:
      case OpKind::Maximum:
      case OpKind::Minimum: {
        const int k = un.operands[0].node == x ? 0 : 1;
        const NodeId y = un.operands[1 - k].node;
        if (y == x) return 0;
        const bool ordered = un.op == OpKind::Sub || un.op == OpKind::Div;
        double c = 0;
        // c - x: a linear post-op (merged into one before it). y - x, y a tensor (SGD's w - lr *
        // dW): linear(-1), then add(y), in place as oneDNN's sum when the output takes y's memory
        // (onednn.cpp); cheaper than a loop (docs/architecture.md, "Measurements": SGD update).
        if (ordered && k != 0) {
          if (un.op != OpKind::Sub) return 0;
          if (const_value(y, &c)) {
            post->push_back(PostOp{PostOp::Linear, -1, static_cast<float>(c)});
            return u;
          }
          const TensorType& yt = g_.node(y).type;
          if (yt.dtype != DType::Float32 || yt.shape.rank() > t.shape.rank() ||
              post->size() + 2 > kMaxPostOps)
            return 0;
          post->push_back(PostOp{PostOp::Linear, -1, 0});
          PostOp add;
          add.kind = PostOp::Add;
          add.operand = y;
          post->push_back(add);
          binaries->push_back(y);
          return u;
        }
        if (const_value(y, &c)) {
          const float cf = static_cast<float>(c);
          switch (un.op) {
            case OpKind::Add: post->push_back(PostOp{PostOp::Linear, 1, cf}); return u;
            case OpKind::Sub: post->push_back(PostOp{PostOp::Linear, 1, -cf}); return u;
            case OpKind::Mul: post->push_back(PostOp{PostOp::Linear, cf, 0}); return u;
            case OpKind::Maximum:
              if (c != 0) return 0;
              post->push_back(PostOp{PostOp::Relu});
              return u;
            default: break;  // x / c, min(x, c): a binary post-op on the constant's buffer
          }
        }
        const TensorType& yt = g_.node(y).type;
        if (yt.dtype != DType::Float32 || yt.shape.rank() > t.shape.rank()) return 0;
        PostOp po;
        switch (un.op) {
          case OpKind::Add: po.kind = PostOp::Add; break;
          case OpKind::Sub: po.kind = PostOp::Sub; break;
          case OpKind::Mul: po.kind = PostOp::Mul; break;
          case OpKind::Div: po.kind = PostOp::Div; break;
          case OpKind::Maximum: po.kind = PostOp::Max; break;
          default: po.kind = PostOp::Min; break;
        }
        po.operand = y;
        post->push_back(po);
        binaries->push_back(y);
        return u;
      }
      default: return 0;
    }
  }

  // Nodes strictly between x and end that a matched pattern computes (all private to it).
  void pattern_nodes(NodeId x, NodeId end, std::vector<NodeId>* out) const {
    std::vector<NodeId> stack(users(x).begin(), users(x).end());
    while (!stack.empty()) {
      NodeId n = stack.back();
      stack.pop_back();
      if (n == end || std::find(out->begin(), out->end(), n) != out->end()) continue;
      out->push_back(n);
      for (NodeId u : users(n)) stack.push_back(u);
    }
  }

  void plan_epilogues() {
    bool any = false;
    for (NodeId id = 0; id < n_ && !any; ++id)
      any = g_.node(id).op == OpKind::MatMul && g_.node(id).type.dtype == DType::Float32;
    if (!any) return;
    is_out_.assign(n_, false);
    for (const ir::Value& v : g_.outputs()) is_out_[v.node] = true;
    folded_.assign(n_, 0);
    build_users();
    for (NodeId id = 0; id < n_; ++id) {
      const ir::Node& node = g_.node(id);
      if (node.op != OpKind::MatMul || node.type.dtype != DType::Float32 || !has_buf_[id]) continue;
      const TensorType& t = node.type;
      const Shape& os = t.shape;
      if (os.numel() == 0 || g_.type(node.operands[0]).shape.back() == 0) continue;
      Epilogue e;
      std::vector<NodeId> binaries, inner;
      NodeId x = id;
      while (e.post.size() < kMaxPostOps) {
        // Binary operands are operands of the pattern's nodes, which only the product reaches:
        // they never depend on it, and the step runs at the pattern's end, after them.
        const size_t before = e.post.size(), bin_before = binaries.size();
        NodeId end = match_post_op(x, t, &e.post, &binaries);
        if (end == 0) break;
        // A pattern another product's epilogue already folded (products summed in a chain,
        // s2 = s1 + m2 with s1 = m1 + ...): folding it twice would run one product's step
        // where the other computes the pattern in registers; nor may a binary operand be a
        // value computed inside an epilogue, which no buffer holds.
        std::vector<NodeId> pattern;
        pattern_nodes(x, end, &pattern);
        pattern.push_back(end);
        bool taken =
            std::any_of(pattern.begin(), pattern.end(), [&](NodeId n) { return folded_[n] != 0; });
        for (size_t b = bin_before; b < binaries.size(); ++b)
          taken = taken || folded_[binaries[b]] == 1;
        if (taken) {
          e.post.resize(before);
          binaries.resize(bin_before);
          break;
        }
        // Two linear post-ops in a row come out wrong from oneDNN 2.6's gemm:jit (the pair
        // (x + 1) * 2 gives 3.5 for x = 1.5): one linear does both. Only a pattern's first
        // post-op can be a linear.
        if (before >= 1 && e.post[before - 1].kind == PostOp::Linear &&
            e.post[before].kind == PostOp::Linear) {
          PostOp& first = e.post[before - 1];
          const PostOp& second = e.post[before];
          first.beta = second.alpha * first.beta + second.beta;  // a2 (a1 x + b1) + b2
          first.alpha *= second.alpha;
          e.post.erase(e.post.begin() + static_cast<std::ptrdiff_t>(before));
        }
        if (x != id) inner.push_back(x);
        inner.insert(inner.end(), pattern.begin(), pattern.end() - 1);  // without end
        x = end;
      }
      if (e.post.empty()) continue;
      BlasView a;
      LOOM_ASSERT(blas_view(g_, has_buf_, node.operands[0].node, &a));
      if (product_library(id, a.trans, true) != Library::Onednn) continue;
      e.end = x;
      for (NodeId n : inner) {
        has_buf_[n] = false;
        folded_[n] = 1;
      }
      has_buf_[x] = true;
      folded_[x] = 2;
      for (size_t i = 0, b = 0; i < e.post.size(); ++i) {
        PostOp& po = e.post[i];
        if (!po.binary()) continue;
        NodeId y = binaries[b++];
        if (!view_of(g_, has_buf_, y, &po.view, 0)) {
          has_buf_[y] = true;
          LOOM_ASSERT(view_of(g_, has_buf_, y, &po.view, 0));
        }
      }
      epilogue_end_of_[x] = id;
      epilogues_[id] = std::move(e);
    }
  }

  Stage elementwise_stage(NodeId value, int out_buf) {
    Stage s;
    s.node = value;
    s.out_buf = out_buf;
    s.shape = g_.node(value).type.shape;
    s.out_strides = contiguous_strides(s.shape);
    return s;
  }

  void plan_concat(NodeId id) {
    const ir::Node& node = g_.node(id);
    int64_t axis = node.attrs.i, at = 0;
    std::vector<int64_t> st = contiguous_strides(node.type.shape);
    for (const ir::Value& v : node.operands) {
      Stage s = elementwise_stage(v.node, plan_.buf_of[id]);
      s.out_strides = st;
      const int64_t offset = at * st[axis];
      at += g_.type(v).shape[axis];
      add_stage(std::move(s), /*mergeable=*/false);  // a kernel of its own
      plan_.kernels.back().out_shift = offset;
    }
  }

  void plan_reduce(NodeId id) {
    const ir::Node& node = g_.node(id);
    Stage s;
    s.reduce = true;
    s.node = id;
    s.out_buf = plan_.buf_of[id];
    s.shape = g_.type(node.operands[0]).shape;
    if (node.op == OpKind::ArgMax) {
      if (!s.shape.empty()) s.reduced = {node.attrs.i};
    } else {
      s.reduced.assign(node.attrs.ints.begin(), node.attrs.ints.end());
    }
    s.out_strides = contiguous_strides(node.type.shape);
    s.columns = column_block(s, node.op);
    bool columns = s.columns > 0;
    add_stage(std::move(s), /*mergeable=*/!columns);
  }

  // The column block of a reduction that keeps the last axis (0: a row reduction). Blocks of
  // at most 256 columns, evenly sized in multiples of 8 (one AVX2 vector): the accumulator
  // row stays in L1, and a wide row splits across threads.
  static int64_t column_block(const Stage& s, OpKind op) {
    if (op == OpKind::ArgMax || s.shape.empty()) return 0;
    const int64_t last = s.shape.rank() - 1;
    if (std::find(s.reduced.begin(), s.reduced.end(), last) != s.reduced.end()) return 0;
    const int64_t n = s.shape[last];
    if (n < 2 || s.shape.numel() == 0) return 0;
    constexpr int64_t kMaxBlock = 256;
    const int64_t blocks = (n + kMaxBlock - 1) / kMaxBlock;
    return std::min(n, ((n + blocks - 1) / blocks + 7) / 8 * 8);
  }

  void add_copy(NodeId value, int buf) { add_stage(elementwise_stage(value, buf), false); }

  static Shape outer_of(const Stage& s) {
    Shape o;
    if (s.reduce) {
      for (int64_t d = 0; d < s.shape.rank(); ++d)
        if (std::find(s.reduced.begin(), s.reduced.end(), d) == s.reduced.end())
          o.push_back(s.shape[d]);
      if (s.columns > 0) o[o.size() - 1] = (o[o.size() - 1] + s.columns - 1) / s.columns;  // blocks
    } else if (!s.shape.empty()) {
      o = Shape(s.shape.begin(), s.shape.end() - 1);
    }
    return o;
  }

  // Reductions over trailing axes keep outer dims first, so a row can hold several stages.
  static bool trailing_reduction(const Stage& s) {
    int64_t r = s.shape.rank(), k = static_cast<int64_t>(s.reduced.size());
    for (int64_t i = 0; i < k; ++i)
      if (s.reduced[i] != r - k + i) return false;
    return true;
  }

  void add_stage(Stage s, bool mergeable = true) {
    Shape outer = outer_of(s);
    bool can_merge = mergeable && !plan_.steps.empty() && plan_.steps.back().kind == Step::Kernel &&
                     (!s.reduce || trailing_reduction(s));
    if (can_merge) {
      KernelSpec& k = plan_.kernels[plan_.steps.back().kernel];
      // A few stages per kernel: a row stays in cache, and functions stay small to compile.
      can_merge = k.chunk == 0 && mergeable_kernel_[plan_.steps.back().kernel] &&
                  k.outer == outer && k.stages.size() < kMaxStages && row_local(k, s) &&
                  !adds_fallback_wait(k, s);
    }
    if (can_merge) {
      plan_.kernels[plan_.steps.back().kernel].stages.push_back(std::move(s));
      return;
    }
    KernelSpec k;
    k.outer = outer;
    if (!s.reduce && !s.shape.empty()) {
      int64_t inner = s.shape.back(), rows = outer.numel();
      constexpr int64_t kChunk = 16384;
      if (rows < 64 && inner > 2 * kChunk) {  // a long row: split it so threads share it
        k.chunk = kChunk;
        k.outer.push_back((inner + kChunk - 1) / kChunk);
      }
    }
    k.stages.push_back(std::move(s));
    k.name = "k" + std::to_string(plan_.kernels.size());
    plan_.kernels.push_back(std::move(k));
    mergeable_kernel_.push_back(mergeable);
    plan_.steps.push_back(
        Step{Step::Kernel, static_cast<int>(plan_.kernels.size() - 1), 0, {}, {}});
  }

  // Stage s reads a buffer that a reference fallback fills and no stage of k reads: merged,
  // k's other stages would wait for the fallback too. The MLP's cross entropy counted its
  // labels in the kernel that sums the loss behind the labels' gather, and the whole
  // backward waited for that gather.
  bool adds_fallback_wait(const KernelSpec& k, const Stage& s) {
    if (fallback_out_.empty()) return false;  // no fallback (nor loop) step yet: no walks
    auto reads = [&](const Stage& st) {
      std::vector<int> bufs;
      const bool computes = !st.reduce && plan_.buf_of[st.node] == st.out_buf;
      collect_leaf_bufs(st.reduce ? g_.node(st.node).operands[0].node : st.node, &bufs,
                        computes ? static_cast<int>(st.node) : -1);
      return bufs;
    };
    std::vector<int> waits;
    for (int b : reads(s))
      if (b >= 0 && static_cast<size_t>(b) < fallback_out_.size() && fallback_out_[b])
        waits.push_back(b);
    if (waits.empty()) return false;
    for (const Stage& st : k.stages)
      for (int b : reads(st)) waits.erase(std::remove(waits.begin(), waits.end(), b), waits.end());
    return !waits.empty();
  }

  // Stage coordinates as loop variables: outer dims first, then the inner ones.
  static Coords stage_coords(const Stage& s) {
    size_t r = s.shape.size();
    Coords c(r);
    std::vector<size_t> order;
    for (size_t d = 0; d < r; ++d)
      if (!s.reduce || std::find(s.reduced.begin(), s.reduced.end(), d) == s.reduced.end())
        order.push_back(d);
    if (s.reduce)
      for (int64_t d : s.reduced) order.push_back(static_cast<size_t>(d));
    if (!s.reduce && r > 0) {  // elementwise: outer = all but the last, inner = the last
      order.clear();
      for (size_t d = 0; d < r; ++d) order.push_back(d);
    }
    for (size_t j = 0; j < order.size(); ++j) c[order[j]] = var(j, r);
    return c;
  }

  // Every read of a value that kernel k produces must stay in the same outer row.
  bool row_local(const KernelSpec& k, const Stage& s) {
    std::set<NodeId> produced;
    for (const Stage& st : k.stages) produced.insert(st.node);
    size_t nout = k.outer.size();
    bool ok = true;
    std::set<std::pair<NodeId, std::vector<int64_t>>> seen;
    std::function<void(NodeId, const Coords&)> walk = [&](NodeId n, const Coords& c) {
      if (!ok) return;
      const ir::Node& node = g_.node(n);
      bool computed_here = s.node == n && !s.reduce && plan_.buf_of[n] == s.out_buf;
      if (has_buf_[n] && !computed_here) {
        if (produced.count(n)) ok = ok && row_local_read(n, c, nout);
        return;
      }
      if (s.reduce && n == s.node) {
        walk(node.operands[0].node, c);
        return;
      }
      if (node.op == OpKind::Reshape && !trivial_reshape(g_, n)) {
        if (produced.count(node.operands[0].node)) ok = false;
        return;
      }
      std::vector<int64_t> key;
      for (const Affine& a : c) {
        key.push_back(a.c);
        key.insert(key.end(), a.a.begin(), a.a.end());
        key.push_back(INT64_MIN);
      }
      if (!seen.insert({n, key}).second) return;
      for (size_t i = 0; i < node.operands.size(); ++i)
        walk(node.operands[i].node, operand_coords(g_, n, i, c));
    };
    walk(s.node, stage_coords(s));
    return ok;
  }

  bool row_local_read(NodeId x, const Coords& c, size_t nout) {
    const ir::Node& node = g_.node(x);
    std::vector<size_t> outer_dims;
    if (ir::has_trait(node.op, ir::kReduce)) {
      const Shape& in = g_.type(node.operands[0]).shape;
      std::vector<int64_t> red;
      if (node.op == OpKind::ArgMax)
        red = {node.attrs.i};
      else
        red.assign(node.attrs.ints.begin(), node.attrs.ints.end());
      size_t od = 0;
      for (int64_t d = 0; d < in.rank(); ++d) {
        bool r = std::find(red.begin(), red.end(), d) != red.end();
        if (!r) outer_dims.push_back(od);
        if (!r || node.attrs.flag) ++od;
      }
    } else {
      for (size_t d = 0; d < nout && d < node.type.shape.size(); ++d) outer_dims.push_back(d);
    }
    if (outer_dims.size() != nout) return false;
    for (size_t d = 0; d < c.size(); ++d) {
      auto it = std::find(outer_dims.begin(), outer_dims.end(), d);
      if (it != outer_dims.end()) {
        if (!is_var(c[d], static_cast<size_t>(it - outer_dims.begin()))) return false;
      } else if (!is_zero_on(c[d], 0, nout)) {
        return false;
      }
    }
    return true;
  }

  // Buffers each step touches, for freeing temporaries after their last use.
  void compute_releases() {
    std::vector<int>& last = last_use_;
    last.assign(plan_.bufs.size(), -1);
    view_last_.assign(plan_.bufs.size(), -1);
    for (size_t si = 0; si < plan_.steps.size(); ++si) {
      const Step& st = plan_.steps[si];
      std::vector<int> used;
      if (st.kind == Step::Kernel) {
        for (const Stage& s : plan_.kernels[st.kernel].stages) {
          if (s.out_buf >= 0) used.push_back(s.out_buf);
          bool computes = !s.reduce && plan_.buf_of[s.node] == s.out_buf;
          collect_leaf_bufs(s.reduce ? g_.node(s.node).operands[0].node : s.node, &used,
                            computes ? static_cast<int>(s.node) : -1);
        }
      } else {
        used.push_back(plan_.buf_of[st.node]);
        used.insert(used.end(), st.outs.begin(), st.outs.end());
        for (const BlasView& bv : st.views) used.push_back(plan_.buf_of[bv.base]);
        for (const PostOp& po : st.post)
          if (po.binary()) used.push_back(plan_.buf_of[po.view.base]);
        if (st.kind != Step::MatMul)
          for (const ir::Value& v : g_.node(st.node).operands) used.push_back(plan_.buf_of[v.node]);
      }
      for (size_t j = 0, n = used.size(); j < n; ++j)  // a view keeps its base alive
        if (int b = used[j]; b >= 0 && plan_.bufs[b].kind == BufferInfo::View)
          used.push_back(plan_.bufs[b].base);
      std::sort(used.begin(), used.end());
      used.erase(std::unique(used.begin(), used.end()), used.end());
      for (int b : used) {
        if (b < 0) continue;
        last[b] = static_cast<int>(si);
        if (plan_.bufs[b].kind == BufferInfo::View)
          view_last_[plan_.bufs[b].base] =
              std::max(view_last_[plan_.bufs[b].base], static_cast<int>(si));
      }
    }
    for (size_t b = 0; b < plan_.bufs.size(); ++b)
      if (plan_.bufs[b].kind == BufferInfo::Temp && last[b] >= 0)
        plan_.steps[last[b]].release.push_back(static_cast<int>(b));
  }

  // Appends the buffers the expression at n reads (duplicates included).
  void collect_leaf_bufs(NodeId n, std::vector<int>* out, int root) {
    std::vector<NodeId> stack = {n};
    if (visit_mark_.size() < g_.size()) visit_mark_.assign(g_.size(), 0);
    const uint32_t stamp = ++visit_stamp_;
    while (!stack.empty()) {
      NodeId id = stack.back();
      stack.pop_back();
      if (visit_mark_[id] == stamp) continue;
      visit_mark_[id] = stamp;
      if (has_buf_[id] && static_cast<int>(id) != root) {
        out->push_back(plan_.buf_of[id]);
        continue;
      }
      for (const ir::Value& v : g_.node(id).operands) stack.push_back(v.node);
    }
  }

  void plan_donation() {
    plan_.donors.assign(plan_.bufs.size(), {});
    std::vector<int> writers(plan_.bufs.size(), 0), writer_step(plan_.bufs.size(), -1);
    for (size_t si = 0; si < plan_.steps.size(); ++si) {
      const Step& st = plan_.steps[si];
      auto wrote = [&](int b) {
        if (b < 0) return;
        if (writers[b]++ == 0) writer_step[b] = static_cast<int>(si);
      };
      if (st.kind == Step::Kernel) {
        for (const Stage& s : plan_.kernels[st.kernel].stages) wrote(s.out_buf);
      } else if (st.kind == Step::Ref || st.kind == Step::Loop || st.kind == Step::Index) {
        for (int b : st.outs) wrote(b);
      } else {
        wrote(plan_.buf_of[st.node]);
      }
    }
    for (size_t ob = 0; ob < plan_.bufs.size(); ++ob) {
      if (plan_.bufs[ob].kind != BufferInfo::Output || writers[ob] != 1) continue;
      int s = writer_step[ob];
      if (plan_.steps[s].kind == Step::Ref) continue;  // it returns its own fresh buffers
      // A loop writes its results on every iteration while reading its operands: only an
      // input it never reads (last read by an earlier step) may lend it memory.
      for (size_t ib = 0; ib < plan_.bufs.size(); ++ib) {
        const BufferInfo& in = plan_.bufs[ib];
        if (in.kind != BufferInfo::Input || in.type.nbytes() != plan_.bufs[ob].type.nbytes())
          continue;
        // A view of the input read at step s reads it where in_place does not look.
        const Step& st = plan_.steps[s];
        bool ok =
            view_last_[ib] < s &&
            (last_use_[ib] < s ||
             (last_use_[ib] == s && st.kind == Step::Kernel &&
              in_place(plan_.kernels[st.kernel], static_cast<int>(ob), static_cast<int>(ib))) ||
             (last_use_[ib] == s && st.kind == Step::MatMul &&
              adds_in_place(st, static_cast<int>(ib))));
        if (ok) plan_.donors[ob].push_back(in.index);
      }
    }
  }

  // Product step st may write its output over `ib`: it reads ib only as its last post-op's
  // addend, at the addresses it writes (a dense operand of the output's shape), which oneDNN
  // then runs as its sum post-op (onednn.cpp; an SGD update folded into the weight gradient).
  bool adds_in_place(const Step& st, int ib) const {
    if (st.post.empty() || st.post.back().kind != PostOp::Add) return false;
    for (const BlasView& v : st.views)
      if (plan_.buf_of[v.base] == ib) return false;
    for (size_t i = 0; i + 1 < st.post.size(); ++i)
      if (st.post[i].binary() && plan_.buf_of[st.post[i].view.base] == ib) return false;
    const PostOp& add = st.post.back();
    const TensorType& out = g_.node(st.out).type;
    return plan_.buf_of[add.view.base] == ib && add.view.offset == 0 &&
           g_.node(add.operand).type == out && add.view.strides == contiguous_strides(out.shape);
  }

  // Kernel k may write `ob` over `ib`: only the stage writing ob reads ib, and only at the
  // very addresses it writes, with elements of the same size.
  bool in_place(const KernelSpec& k, int ob, int ib) {
    if (itemsize(plan_.bufs[ob].type.dtype) != itemsize(plan_.bufs[ib].type.dtype)) return false;
    if (k.out_shift != 0) return false;  // writes at a shifted address
    for (const Stage& s : k.stages) {
      bool writer = s.out_buf == ob;
      if (writer && (s.reduce || s.out_offset != 0)) return false;
      Coords sc = stage_coords(s);
      Affine store = s.reduce ? Affine{} : linear(s.out_strides, sc, s.out_offset);
      bool ok = true;
      std::function<void(NodeId, const Coords&)> walk = [&](NodeId n, const Coords& c) {
        if (!ok) return;
        const ir::Node& node = g_.node(n);
        bool root = n == s.node && !s.reduce && plan_.buf_of[n] == s.out_buf;
        if (s.reduce && n == s.node) return walk(node.operands[0].node, c);
        if (has_buf_[n] && !root) {
          if (plan_.buf_of[n] == ib)
            ok = writer && linear(contiguous_strides(node.type.shape), c, 0) == store;
          return;
        }
        if (node.op == OpKind::Reshape && !trivial_reshape(g_, n)) {
          if (plan_.buf_of[node.operands[0].node] == ib)
            ok = writer && linear(contiguous_strides(node.type.shape), c, 0) == store;
          return;
        }
        for (size_t i = 0; i < node.operands.size(); ++i)
          walk(node.operands[i].node, operand_coords(g_, n, i, c));
      };
      walk(s.node, sc);
      if (!ok) return false;
    }
    return true;
  }

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

}  // namespace

Plan make_plan(const ir::Graph& g, const std::vector<std::vector<NodeId>>& results,
               bool allow_views) {
  return Planner(g, results, allow_views).run();
}

ir::Graph split_results(const ir::Graph& g, std::vector<std::vector<NodeId>>* results) {
  ir::Graph out;
  out.reserve(g.size());
  results->clear();
  // first[id]: the new node of old id's result 0; its results k >= 1 follow it in order.
  std::vector<NodeId> first(g.size());
  auto map = [&](ir::Value v) { return ir::Value{first[v.node] + v.index, 0}; };
  auto convert = [&](ir::Value v, DType dt) {
    ir::Node c;
    c.op = OpKind::Convert;
    c.operands.push_back(v);
    c.type = TensorType{dt, out.type(v).shape};
    return ir::Value{out.add(std::move(c)), 0};
  };
  for (NodeId id = 0; id < g.size(); ++id) {
    ir::Node n = g.node(id);
    for (ir::Value& v : n.operands) v = map(v);
    // A half-precision product runs as a float32 one between conversions: BLAS has none,
    // and float32 accumulation rounded once to the result's type is PyTorch's CPU semantics
    // (the reference accumulates in double: the two agree but where float32's rounding
    // error crosses a rounding boundary of the result's type).
    if (n.op == OpKind::MatMul &&
        (n.type.dtype == DType::BFloat16 || n.type.dtype == DType::Float16)) {
      const DType dt = n.type.dtype;
      for (ir::Value& v : n.operands) v = convert(v, DType::Float32);
      n.type.dtype = DType::Float32;
      first[id] = convert(ir::Value{out.add(std::move(n)), 0}, dt).node;
      continue;
    }
    const size_t count = n.num_results();
    std::vector<TensorType> more = n.more_types;
    first[id] = out.add(std::move(n));
    if (count == 1) continue;
    results->resize(out.size() + count - 1);
    (*results)[first[id]].push_back(first[id]);
    for (const TensorType& t : more) {
      ir::Node stand_in;
      stand_in.op = g.node(id).op;
      stand_in.type = t;
      (*results)[first[id]].push_back(out.add(std::move(stand_in)));
    }
  }
  for (ir::Value v : g.outputs()) out.outputs().push_back(map(v));
  results->resize(out.size());
  return out;
}

}  // namespace loom::cpu
