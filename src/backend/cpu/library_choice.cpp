// How each op runs (lowering()), and for products: how a library reads the operands in place
// (blas_view), which library runs them (choose_library), and their description.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/plan.h"
#include "backend/cpu/plan_impl.h"
#include "loom/core/error.h"

namespace loom::cpu {

using ir::OpKind;

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
    case OpKind::IndexAdd: return native_index(op, dt) ? Lowering::Native : Lowering::Fallback;
    case OpKind::ArgSort: return Lowering::Fallback;  // a stable sort per line: the reference's
    case OpKind::Attention:  // blocks of scores between products: attention.cpp
    case OpKind::AttentionGrad:
      return dt == DType::Float32 || dt == DType::Float64 ? Lowering::Native : Lowering::Fallback;
    case OpKind::PureCallback: return Lowering::Native;  // the host function: callback.cpp
    case OpKind::AllReduceSum:  // the reference kernels call the dist::Communicator
    case OpKind::AllReduceMax:
    case OpKind::AllReduceMin:
    case OpKind::AllGather:
    case OpKind::ReduceScatterSum:
    case OpKind::DistBroadcast:
    case OpKind::GradAllReduce:
    case OpKind::Shard:  // partitioned away before a backend sees a graph
    case OpKind::MeshAllReduce:
    case OpKind::MeshAllGather:
    case OpKind::MeshReduceScatter:
    case OpKind::MeshSlice:
    case OpKind::MeshAllToAll: return Lowering::Fallback;
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

bool detail::is_view_op(const ir::Graph& g, NodeId n) {
  const OpKind op = g.node(n).op;
  return op == OpKind::Permute || op == OpKind::Expand || op == OpKind::Slice ||
         op == OpKind::Reshape;
}

bool detail::reshape_strides(const Shape& from, const std::vector<int64_t>& strides,
                             const Shape& to, std::vector<int64_t>* out) {
  out->assign(to.size(), 0);
  if (from.numel() == 0 || from.rank() == 0) {
    *out = contiguous_strides(to);
    return true;
  }
  // Chunks of dims that are contiguous among themselves, matched from the last dim: each
  // chunk of `from` must hold exactly a run of `to`'s dims (as torch's view computes them).
  int64_t to_d = static_cast<int64_t>(to.size()) - 1;
  int64_t base = strides.back(), from_numel = 1, to_numel = 1;
  for (int64_t d = static_cast<int64_t>(from.size()) - 1; d >= 0; --d) {
    from_numel *= from[d];
    if (d > 0 && (from[d - 1] == 1 || strides[d - 1] == from_numel * base)) continue;
    while (to_d >= 0 && (to_numel < from_numel || to[to_d] == 1)) {
      (*out)[to_d] = to_numel * base;
      to_numel *= to[to_d];
      --to_d;
    }
    if (to_numel != from_numel) return false;
    if (d > 0) {
      base = strides[d - 1];
      from_numel = to_numel = 1;
    }
  }
  return to_d == -1;
}

bool detail::view_of(const ir::Graph& g, const std::vector<bool>& has_buf, NodeId n, BlasView* v,
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
    default:  // reshape: dims merged or split where the strides allow it, size-1 dims anywhere
      if (!reshape_strides(ish, in.strides, out, &v->strides)) return false;
  }
  return true;
}

bool blas_view(const ir::Graph& g, const std::vector<bool>& has_buf, NodeId operand, BlasView* v) {
  if (!detail::view_of(g, has_buf, operand, v, 0)) return false;
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

}  // namespace loom::cpu
