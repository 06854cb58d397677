// Index steps: gather, index_select and floating-point index_add, run natively on planned
// memory (the reference kernels, src/backend/ref/index.cpp, are the specification). Every
// index is checked on the calling thread before anything is written, so a bad one raises the
// reference's ExecError; the work is then split across the pool by output rows (gather,
// index_select) or by destination columns (index_add: each element still takes its
// additions in order of j, so repeated indices round as the reference does).
#include <cstring>

#include "backend/cpu/program.h"
#include "backend/cpu/thread_pool.h"
#include "loom/backend/ref_backend.h"

namespace loom::cpu {

namespace {

using ir::OpKind;

// Bytes a task should move at least: smaller steps run on one thread.
constexpr int64_t kTaskBytes = 64 << 10;

// An int32 or int64 index array.
struct Indices {
  const void* p;
  bool wide;
  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
  }
};

void check_indices(const char* op, Indices idx, int64_t n, int64_t axis, int64_t extent) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = idx[i];
    if (static_cast<uint64_t>(k) >= static_cast<uint64_t>(extent))
      backend::throw_index_out_of_range(op, k, axis, extent);
  }
}

// Tasks for `bytes` of work over `units` independent units: one when parallel is off.
int64_t split(bool parallel, int64_t bytes, int64_t units) {
  if (!parallel) return 1;
  const int64_t pool = ThreadPool::instance().size();
  return std::max<int64_t>(1, std::min({pool, units, bytes / kTaskBytes}));
}

void run_tasks(int64_t tasks, const std::function<void(int)>& f) {
  if (tasks <= 1)
    f(0);
  else
    ThreadPool::instance().run(static_cast<int>(tasks), f);
}

// x viewed as [outer, extent, inner] along the node's axis.
struct Blocks {
  int64_t outer = 1, extent = 0, inner = 1;
  Blocks(const Shape& s, int64_t axis) : extent(s[axis]) {
    for (int64_t d = 0; d < axis; ++d) outer *= s[d];
    for (int64_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  }
};

// out[o, j, :] = x[o, idx[j], :], rows split into tasks.
void index_select(const Blocks& x, Indices idx, int64_t m, int64_t item, const char* src, char* dst,
                  bool parallel) {
  const int64_t rows = x.outer * m, row = x.inner * item;
  const int64_t tasks = split(parallel, rows * row, rows);
  run_tasks(tasks, [&](int t) {
    for (int64_t r = rows * t / tasks, end = rows * (t + 1) / tasks; r < end; ++r) {
      const int64_t o = r / m, j = r % m;
      std::memcpy(dst + r * row, src + (o * x.extent + idx[j]) * row, static_cast<size_t>(row));
    }
  });
}

// out[c] = x[c with c[axis] = idx[c]] over idx's shape, elements of T split into tasks.
template <class T>
void gather(const Shape& xs, const Shape& is, int64_t axis, Indices idx, const T* x, T* out,
            bool parallel) {
  const int64_t rank = is.rank(), n = is.numel();
  std::vector<int64_t> stride(static_cast<size_t>(rank), 1);
  for (int64_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * xs[d];
  const int64_t tasks = split(parallel, n * static_cast<int64_t>(sizeof(T)), n);
  run_tasks(tasks, [&](int t) {
    int64_t e = n * t / tasks;
    const int64_t end = n * (t + 1) / tasks;
    if (e == end) return;
    std::vector<int64_t> c(static_cast<size_t>(rank));  // idx's coordinates of e
    int64_t off = 0;                                    // x's offset of c, the axis left out
    for (int64_t d = rank - 1, rest = e; d >= 0; --d) {
      c[d] = rest % is[d];
      rest /= is[d];
      if (d != axis) off += c[d] * stride[d];
    }
    const int64_t last = rank - 1, step = last == axis ? 0 : stride[last];
    for (; e < end; ++e) {
      out[e] = x[off + idx[e] * stride[axis]];
      if (++c[last] < is[last]) {  // the innermost dim: one stride on
        off += step;
        continue;
      }
      off -= (c[last] - 1) * step;
      c[last] = 0;
      for (int64_t d = last - 1; d >= 0; --d) {  // odometer carry
        if (++c[d] < is[d]) {
          if (d != axis) off += stride[d];
          break;
        }
        if (d != axis) off -= (c[d] - 1) * stride[d];
        c[d] = 0;
      }
    }
  });
}

// out = base; out[o, idx[j], :] += src[o, j, :] in order of j. Destination columns (or outer
// blocks, when rows are short) split into tasks, so every element has one writer.
template <class T>
void index_add(const Blocks& b, Indices idx, int64_t m, const T* base, const T* src, T* out,
               bool parallel) {
  const int64_t n = b.outer * b.extent * b.inner;
  const int64_t copies = split(parallel, n * static_cast<int64_t>(sizeof(T)), n);
  if (out != base)
    run_tasks(copies, [&](int t) {
      const int64_t lo = n * t / copies, hi = n * (t + 1) / copies;
      std::memcpy(out + lo, base + lo, static_cast<size_t>(hi - lo) * sizeof(T));
    });
  const int64_t work = b.outer * m * b.inner * static_cast<int64_t>(sizeof(T));
  const bool by_columns = b.inner >= 64;
  const int64_t units = by_columns ? b.inner / 16 : b.outer;
  const int64_t tasks = split(parallel, work, units);
  run_tasks(tasks, [&](int t) {
    int64_t o0 = 0, o1 = b.outer, i0 = 0, i1 = b.inner;
    if (by_columns) {
      i0 = units * t / tasks * 16;
      i1 = t + 1 == tasks ? b.inner : units * (t + 1) / tasks * 16;
    } else {
      o0 = b.outer * t / tasks;
      o1 = b.outer * (t + 1) / tasks;
    }
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t j = 0; j < m; ++j) {
        T* to = out + (o * b.extent + idx[j]) * b.inner;
        const T* from = src + (o * m + j) * b.inner;
        for (int64_t i = i0; i < i1; ++i) to[i] += from[i];
      }
  });
}

template <class F>
void by_item(int64_t item, const F& f) {
  switch (item) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

}  // namespace

bool native_index(OpKind op, DType dt) {
  switch (op) {
    case OpKind::Gather:
    case OpKind::IndexSelect: return true;  // copies: any dtype
    case OpKind::IndexAdd: return dt == DType::Float32 || dt == DType::Float64;
    default: return false;
  }
}

void run_index(const Program& p, const Step& st, void* const* ptr, bool parallel) {
  const ir::Node& node = p.graph.node(st.node);
  const char* op = ir::op_name(node.op).data();
  const TensorType& xt = p.graph.type(node.operands[0]);
  const TensorType& it = p.graph.type(node.operands[1]);
  LOOM_ASSERT(it.dtype == DType::Int32 || it.dtype == DType::Int64);
  const Indices idx{ptr[p.plan.buf_of[node.operands[1].node]], it.dtype == DType::Int64};
  const void* x = ptr[p.plan.buf_of[node.operands[0].node]];
  void* out = ptr[st.outs[0]];
  const int64_t axis = node.attrs.i, n = it.shape.numel();
  check_indices(op, idx, n, axis, xt.shape[axis]);
  if (node.type.numel() == 0) return;
  const int64_t item = itemsize(xt.dtype);
  switch (node.op) {
    case OpKind::Gather:
      return by_item(item, [&]<class T>(T) {
        gather(xt.shape, it.shape, axis, idx, static_cast<const T*>(x), static_cast<T*>(out),
               parallel);
      });
    case OpKind::IndexSelect:
      return index_select(Blocks(xt.shape, axis), idx, n, item, static_cast<const char*>(x),
                          static_cast<char*>(out), parallel);
    case OpKind::IndexAdd: {
      const void* src = ptr[p.plan.buf_of[node.operands[2].node]];
      if (xt.dtype == DType::Float32)
        return index_add(Blocks(xt.shape, axis), idx, n, static_cast<const float*>(x),
                         static_cast<const float*>(src), static_cast<float*>(out), parallel);
      return index_add(Blocks(xt.shape, axis), idx, n, static_cast<const double*>(x),
                       static_cast<const double*>(src), static_cast<double*>(out), parallel);
    }
    default: LOOM_ASSERT(false);
  }
}

}  // namespace loom::cpu
