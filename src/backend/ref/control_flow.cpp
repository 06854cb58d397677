// Reference kernels of the control-flow ops: call, scan and while run their regions with the
// reference interpreter itself (executables compiled once per node by RefExecutable), one
// region run per iteration, so the loop semantics read as plainly as docs/ir.md states them.
#include <cstring>

#include "backend/ref/ref_impl.h"
#include "loom/core/error.h"

namespace loom::detail::ref {

namespace {

using Regions = std::span<const backend::Executable* const>;

// Runs region `r` (compiled as `exe`) on `args`; returns its outputs as arrays.
std::vector<Array> run_region(const backend::Executable& exe, const ir::Graph& r,
                              std::span<const Array> args) {
  std::vector<Buffer> ins;
  ins.reserve(args.size());
  for (const Array& a : args) ins.push_back(a.buf);
  std::vector<Buffer> outs = exe.run(ins);
  std::vector<Array> res;
  res.reserve(outs.size());
  for (size_t k = 0; k < outs.size(); ++k) res.push_back(Array{r.type(r.outputs()[k]), outs[k]});
  return res;
}

void call_kernel(const ir::Node& node, Regions regions, std::span<const Array> in,
                 std::span<Array> out) {
  std::vector<Array> res = run_region(*regions[0], *node.regions[0], in);
  for (size_t k = 0; k < out.size(); ++k) out[k] = std::move(res[k]);
}

// Slice t of `xs` along its leading dim, as a fresh array of type `slice`.
Array leading_slice(const Array& xs, const TensorType& slice, int64_t t) {
  Array a = make_array(slice);
  const size_t nbytes = static_cast<size_t>(slice.nbytes());
  if (nbytes > 0)
    std::memcpy(a.buf.data(), static_cast<const char*>(xs.buf.data()) + t * nbytes, nbytes);
  return a;
}

// Step t (t = length-1..0 when reversed) binds the index t, the carries, slice t of each xs and
// the captured operands; the body's y_k lands in slice t of ys_k, so a reversed scan still
// pairs ys[t] with xs[t] (jax.lax.scan).
void scan_kernel(const ir::Node& node, Regions regions, std::span<const Array> in,
                 std::span<Array> out) {
  const ir::Graph& body = *node.regions[0];
  const ir::ScanAttrs a = ir::ScanAttrs::of(node);
  const int64_t c = a.counts[0], x = a.counts[1], length = a.length;
  std::vector<Array> carry(in.begin(), in.begin() + c);
  std::vector<Array> args(1 + in.size());
  for (size_t k = c + x; k < in.size(); ++k) args[1 + k] = in[k];  // captured: bound once
  for (int64_t step = 0; step < length; ++step) {
    const int64_t t = a.reverse ? length - 1 - step : step;
    args[0] = make_array({DType::Int64, {}});
    args[0].set_i(0, t);
    for (int64_t k = 0; k < c; ++k) args[1 + k] = carry[k];
    for (int64_t k = c; k < c + x; ++k)
      args[1 + k] = leading_slice(in[k], body.node(body.params()[1 + k]).type, t);
    std::vector<Array> res = run_region(*regions[0], body, args);
    for (int64_t k = 0; k < c; ++k) carry[k] = std::move(res[k]);
    for (size_t k = c; k < res.size(); ++k) {
      const size_t nbytes = static_cast<size_t>(res[k].type.nbytes());
      if (nbytes > 0)
        std::memcpy(static_cast<char*>(out[k].buf.data()) + t * nbytes, res[k].buf.data(), nbytes);
    }
  }
  for (int64_t k = 0; k < c; ++k) out[k] = std::move(carry[k]);
}

// while cond(state) { state = body(state) }; the captured operands never change.
void while_kernel(const ir::Node& node, Regions regions, std::span<const Array> in,
                  std::span<Array> out) {
  const ir::Graph& cond = *node.regions[0];
  const ir::Graph& body = *node.regions[1];
  const int64_t n = ir::WhileAttrs::of(node).counts[0];
  std::vector<Array> state(in.begin(), in.end());
  while (run_region(*regions[0], cond, state)[0].get_i(0) != 0) {
    std::vector<Array> res = run_region(*regions[1], body, state);
    for (int64_t k = 0; k < n; ++k) state[k] = std::move(res[k]);
  }
  for (int64_t k = 0; k < n; ++k) out[k] = std::move(state[k]);
}

}  // namespace

void register_control_flow_kernels(KernelTable& t) {
  t.set(ir::OpKind::Call, call_kernel);
  t.set(ir::OpKind::Scan, scan_kernel);
  t.set(ir::OpKind::While, while_kernel);
}

}  // namespace loom::detail::ref
