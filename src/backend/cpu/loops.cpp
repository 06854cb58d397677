// Native control flow: call, scan and while run their regions as nested Programs compiled
// once per executable. A loop run sets up each region's frame once (temporaries, captured
// operands); an iteration only rebinds the pointers of its parameters and outputs and runs
// the region's steps. Carries ping-pong between the node's result buffers and one scratch
// set, so a step's outputs never overwrite the values it reads. The reference kernels in
// src/backend/ref/control_flow.cpp are the specification.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/program.h"
#include "loom/backend/ref_backend.h"
#include "loom/core/config.h"
#include "loom/core/error.h"

namespace loom::cpu {

namespace {

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

void copy_bytes(void* dst, const void* src, int64_t n) {
  if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(n));
}

// Points the frame's table at its temporaries; parameters and outputs are bound by the loop.
void** init_frame(const Program& p, char* frame) {
  void** ptr = reinterpret_cast<void**>(frame);
  for (size_t b = 0; b < p.temp_offset.size(); ++b)
    ptr[b] = p.temp_offset[b] >= 0 ? frame + p.temp_offset[b] : nullptr;
  return ptr;
}

// A reference fallback inside a region (a collective, an integer pow): its operands are copied into
// fresh Buffers and its result copied out (a fallback costs allocations anyway).
void run_ref_copying(const Program& p, const Step& st, void* const* ptr) {
  const ir::Node& n = p.graph.node(st.node);
  std::vector<Buffer> operands;
  operands.reserve(n.operands.size());
  for (const ir::Value& v : n.operands) {
    const int64_t bytes = p.graph.type(v).nbytes();
    operands.push_back(Buffer::allocate_uninitialized(static_cast<size_t>(bytes)));
    copy_bytes(operands.back().data(), ptr[p.plan.buf_of[v.node]], bytes);
  }
  Buffer r = backend::ref_eval_node(p.graph, st.node, operands);
  copy_bytes(ptr[st.outs[0]], r.data(), n.type.nbytes());
}

// Runs a region's steps on its frame (the table holds every buffer's address).
void run_region(const Program& p, void** ptr, char* frame) {
  const std::vector<Step>& steps = p.plan.steps;
  for (size_t si = 0; si < steps.size(); ++si) {
    const Step& st = steps[si];
    switch (st.kind) {
      case Step::Kernel: run_kernel(p.kernels[st.kernel], ptr); break;
      case Step::MatMul: run_matmul(p, st, ptr); break;
      case Step::Ref: run_ref_copying(p, st, ptr); break;
      case Step::Native: run_native(p, st, ptr, /*parallel=*/true); break;
      case Step::Loop: run_loop(*p.loops[si], ptr, frame + p.loop_offset[si]); break;
    }
  }
}

void run_call(const LoopProgram& l, void* const* ptr, char* scratch) {
  const Program& body = l.regions[0];
  char* frame = scratch + l.region_offset[0];
  void** f = init_frame(body, frame);
  for (size_t k = 0; k < l.operands.size(); ++k) f[body.param_bufs[k]] = ptr[l.operands[k]];
  for (size_t k = 0; k < l.results.size(); ++k) f[body.plan.output_bufs[k]] = ptr[l.results[k]];
  run_region(body, f, frame);
}

// Step s (t = s, or length-1-s reversed) reads the carries step s-1 wrote (the operands at
// s = 0) and writes the other set; the parity makes the last step write the result buffers.
void run_scan(const LoopProgram& l, void* const* ptr, char* scratch) {
  const Program& body = l.regions[0];
  const int64_t c = l.carries, x = static_cast<int64_t>(l.slice_bytes.size()), n = l.length;
  if (n == 0) {
    for (int64_t k = 0; k < c; ++k)
      copy_bytes(ptr[l.results[k]], ptr[l.operands[k]], l.result_bytes[k]);
    return;
  }
  char* frame = scratch + l.region_offset[0];
  void** f = init_frame(body, frame);
  const int* in = body.param_bufs.data();
  const int* out = body.plan.output_bufs.data();
  int64_t t = 0;
  f[in[0]] = &t;
  for (size_t k = c + x; k < l.operands.size(); ++k) f[in[1 + k]] = ptr[l.operands[k]];
  for (int64_t s = 0; s < n; ++s) {
    t = l.reverse ? n - 1 - s : s;
    const bool to_result = (n - 1 - s) % 2 == 0;
    for (int64_t k = 0; k < c; ++k) {
      void* result = ptr[l.results[k]];
      void* other = scratch + l.carry_offset[k];
      f[in[1 + k]] = s == 0 ? ptr[l.operands[k]] : (to_result ? other : result);
      f[out[k]] = to_result ? result : other;
    }
    for (int64_t j = 0; j < x; ++j)
      f[in[1 + c + j]] = static_cast<char*>(ptr[l.operands[c + j]]) + t * l.slice_bytes[j];
    for (size_t j = 0; j < l.y_bytes.size(); ++j)
      f[out[c + j]] = static_cast<char*>(ptr[l.results[c + j]]) + t * l.y_bytes[j];
    run_region(body, f, frame);
  }
}

// while cond(state) { state = body(state) }: the state moves from the operands to the result
// buffers and then alternates with the scratch set; it ends up in the results either way.
void run_while(const LoopProgram& l, void* const* ptr, char* scratch) {
  const Program& cond = l.regions[0];
  const Program& body = l.regions[1];
  const int64_t n = l.carries;
  char* cond_frame = scratch + l.region_offset[0];
  char* body_frame = scratch + l.region_offset[1];
  void** cf = init_frame(cond, cond_frame);
  void** bf = init_frame(body, body_frame);
  for (size_t k = n; k < l.operands.size(); ++k) {  // captured: bound once
    cf[cond.param_bufs[k]] = ptr[l.operands[k]];
    bf[body.param_bufs[k]] = ptr[l.operands[k]];
  }
  uint8_t go = 0;  // bool[]: one byte
  cf[cond.plan.output_bufs[0]] = &go;
  auto state = [&](int set, int64_t k) -> void* {
    return set < 0    ? ptr[l.operands[k]]
           : set == 0 ? ptr[l.results[k]]
                      : scratch + l.carry_offset[k];
  };
  int cur = -1;  // -1: the operands, 0: the result buffers, 1: the scratch set
  for (;;) {
    for (int64_t k = 0; k < n; ++k) cf[cond.param_bufs[k]] = state(cur, k);
    run_region(cond, cf, cond_frame);
    if (go == 0) break;
    const int next = cur == 0 ? 1 : 0;
    for (int64_t k = 0; k < n; ++k) {
      bf[body.param_bufs[k]] = state(cur, k);
      bf[body.plan.output_bufs[k]] = state(next, k);
    }
    run_region(body, bf, body_frame);
    cur = next;
  }
  if (cur != 0)
    for (int64_t k = 0; k < n; ++k) copy_bytes(ptr[l.results[k]], state(cur, k), l.result_bytes[k]);
}

// Scratch: each carry's second buffer, then each region's frame.
void lay_out_scratch(LoopProgram& l) {
  int64_t at = 0;
  l.carry_offset.clear();
  l.region_offset.clear();
  for (int64_t k = 0; k < l.carries; ++k) {
    l.carry_offset.push_back(at);
    at += align64(l.result_bytes[k]);
  }
  for (const Program& r : l.regions) {
    l.region_offset.push_back(at);
    at += align64(r.frame_bytes);
  }
  l.scratch_bytes = at;
}

// ---- native loops ------------------------------------------------------------------------
// A loop goes native when one iteration's data (both carry sets, a slice of each xs and y, frames,
// captures) fits in half an L1d, which keeps body kernels single-threaded anyway (kParallelWork),
// with few kernels, each inlined (docs/architecture.md, "Measurements": kNativeBytes).
constexpr int64_t kNativeBytes = 16 << 10;
constexpr size_t kNativeKernels = 16;

std::atomic<int> g_native{-1};  // -1: not read from the environment yet
std::atomic<int64_t> g_native_count{0}, g_general_count{0};

// Why l cannot go native, or nullptr when it can.
const char* general_reason(const LoopProgram& l, const Plan& outer) {
  if (!native_loops_enabled()) return "LOOM_NATIVE_LOOPS=0";
  size_t kernels = 0;
  int64_t bytes = 0;
  for (const Program& r : l.regions) {
    for (const Step& st : r.plan.steps) {
      if (st.kind == Step::MatMul) return "a matrix product in the body";
      if (st.kind == Step::Ref) return "a reference fallback in the body";
      if (st.kind == Step::Native) return "an indexing or attention op in the body";
      if (st.kind == Step::Loop) return "a nested loop in the body";
      ++kernels;
    }
    bytes += r.frame_bytes;
  }
  if (kernels > kNativeKernels) return "more than 16 kernels";
  for (int64_t k = 0; k < l.carries; ++k) bytes += 2 * l.result_bytes[k];
  for (int64_t b : l.slice_bytes) bytes += b;
  for (int64_t b : l.y_bytes) bytes += b;
  const size_t captured = static_cast<size_t>(l.carries) + l.slice_bytes.size();
  for (size_t k = captured; k < l.operands.size(); ++k)
    bytes += outer.bufs[l.operands[k]].type.nbytes();
  if (bytes > kNativeBytes) return "an iteration touches more than 16 KiB";
  return nullptr;
}

}  // namespace

bool native_loops_enabled() {
  int v = g_native.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("LOOM_NATIVE_LOOPS");
    v = e && std::strcmp(e, "0") == 0 ? 0 : 1;
    int expected = -1;
    if (!g_native.compare_exchange_strong(expected, v)) v = expected;
  }
  return v != 0;
}

void set_native_loops(bool on) { g_native.store(on ? 1 : 0); }

LoopStats loop_stats() { return {g_native_count.load(), g_general_count.load()}; }

std::unique_ptr<LoopProgram> compile_loop(const Program& p, size_t si) {
  const Step& st = p.plan.steps[si];
  const ir::Node& n = p.graph.node(st.node);
  auto l = std::make_unique<LoopProgram>();
  l->op = n.op;
  for (const ir::Value& v : n.operands) l->operands.push_back(p.plan.buf_of[v.node]);
  l->results = st.outs;
  for (int b : st.outs) l->result_bytes.push_back(p.plan.bufs[b].type.nbytes());
  for (const auto& r : n.regions) l->regions.push_back(plan_program(*r, /*region=*/true));
  const Program& first = l->regions[0];
  if (n.op == ir::OpKind::Scan) {
    const ir::ScanAttrs a = ir::ScanAttrs::of(n);
    l->carries = a.counts[0];
    l->length = a.length;
    l->reverse = a.reverse;
    for (int64_t j = 0; j < a.counts[1]; ++j) {
      const ir::NodeId param = first.graph.params()[1 + l->carries + j];
      l->slice_bytes.push_back(first.graph.node(param).type.nbytes());
    }
    for (size_t k = l->carries; k < first.graph.outputs().size(); ++k)
      l->y_bytes.push_back(first.graph.type(first.graph.outputs()[k]).nbytes());
  } else if (n.op == ir::OpKind::While) {
    l->carries = ir::WhileAttrs::of(n).counts[0];
  }
  lay_out_scratch(*l);
  if (n.op != ir::OpKind::Scan && n.op != ir::OpKind::While) {
    for (Program& r : l->regions) compile_steps(r, /*region=*/true);
    lay_out_scratch(*l);
    return l;
  }
  const char* why = general_reason(*l, p.plan);
  if (config().debug >= 2)
    std::fprintf(stderr, "[loom]   %s loop %s\n", std::string(ir::op_name(n.op)).c_str(),
                 why ? (std::string("general: ") + why).c_str() : "native");
  if (why) {
    g_general_count++;
    for (Program& r : l->regions) compile_steps(r, /*region=*/true);
    lay_out_scratch(*l);  // again: the frames grew by the nested loops' scratch
    return l;
  }
  g_native_count++;
  l->native = compile_native_loop(*l);
  return l;
}

void run_loop(const LoopProgram& l, void* const* ptr, char* scratch) {
  if (l.native) {
    constexpr size_t kInline = 32;
    const size_t n = l.operands.size() + l.results.size() + 1;
    void* inline_args[kInline];
    std::vector<void*> heap;
    void** args = inline_args;
    if (n > kInline) {
      heap.resize(n);
      args = heap.data();
    }
    size_t j = 0;
    for (int b : l.operands) args[j++] = ptr[b];
    for (int b : l.results) args[j++] = ptr[b];
    args[j] = scratch;
    l.native(args, 0, l.length);
    return;
  }
  switch (l.op) {
    case ir::OpKind::Scan: run_scan(l, ptr, scratch); break;
    case ir::OpKind::While: run_while(l, ptr, scratch); break;
    case ir::OpKind::Call: run_call(l, ptr, scratch); break;
    default: LOOM_ASSERT(false && "not a control-flow op");
  }
}

}  // namespace loom::cpu
