// Native loops: a scan or while whose regions are a few fused kernels on small data becomes one
// generated function `void loop(void* const* args, int64_t, int64_t length)`, args = the
// loop's operands, its results, then its scratch block (a while ignores the length). The function
// runs every trip itself: the regions' kernels are emitted as always-inline functions and called
// with argument tables on its stack, which inlining and SROA turn into plain pointers, so an
// iteration is the kernels' loads, arithmetic and stores with no dispatch. Small carries live in
// locals of the function (registers, see local_carries); larger ones ping-pong between the result
// buffers and the scratch set exactly as run_scan / run_while do (loops.cpp, the general path and
// this function's specification), the regions' temporaries live in the scratch (in
// cache: can_go_native bounds them), xs slices are read and ys written in place, a while's
// condition is evaluated inline. The function is cached like a kernel, by a canonical text of
// everything that shapes its code: the loop's layout and each kernel's describe() text and buffers.
#include <string>
#include <vector>

#include "backend/cpu/codegen_impl.h"
#include "backend/cpu/program.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"

namespace loom::cpu {

namespace {

using llvm::Value;

void put_list(std::string& s, const char* tag, const std::vector<int64_t>& v) {
  s += tag;
  for (int64_t x : v) (s += ',') += std::to_string(x);
}
void put_list(std::string& s, const char* tag, const std::vector<int>& v) {
  s += tag;
  for (int x : v) (s += ',') += std::to_string(x);
}

// The cache key of a native loop. Buffer ids and offsets are deterministic functions of the
// regions' structure, so equal texts mean interchangeable functions.
std::string describe_native(const LoopProgram& l,
                            const std::vector<std::vector<detail::KernelDescription>>& descs) {
  std::string s = "native ";
  s += ir::op_name(l.op);
  s += l.reverse ? " rev" : " fwd";  // a scan's length is an argument: not in the key
  s += " carries" + std::to_string(l.carries);
  s += " ops" + std::to_string(l.operands.size()) + " res" + std::to_string(l.results.size());
  // The carries' bytes (copied on zero trips); the ys' depend on the length, which is not here.
  put_list(s, " cb",
           std::vector<int64_t>(l.result_bytes.begin(), l.result_bytes.begin() + l.carries));
  put_list(s, " xb", l.slice_bytes);
  put_list(s, " yb", l.y_bytes);
  put_list(s, " co", l.carry_offset);
  put_list(s, " ro", l.region_offset);
  for (size_t r = 0; r < l.regions.size(); ++r) {
    const Program& p = l.regions[r];
    s += "\n region" + std::to_string(r);
    put_list(s, " in", p.param_bufs);
    put_list(s, " out", p.plan.output_bufs);
    put_list(s, " temp", p.temp_offset);
    for (const Step& st : p.plan.steps) {
      const KernelSpec& k = p.plan.kernels[st.kernel];
      const detail::KernelDescription& d = descs[r][st.kernel];
      s += "\n  kernel";
      put_list(s, " bufs", d.bufs);
      s += " n" + std::to_string(k.outer.numel());
      if (k.out_shift != 0)
        s += " shift" + std::to_string(k.out_shift) + "@" + std::to_string(k.stages[0].out_buf);
      (s += " ") += d.text;
    }
  }
  return s;
}

class Driver {
 public:
  Driver(const LoopProgram& l, const std::vector<std::vector<detail::KernelDescription>>& descs,
         llvm::Module& m)
      : l_(l), descs_(descs), m_(m), ctx_(m.getContext()), b_(ctx_) {}

  void emit() {
    kernels_.resize(l_.regions.size());
    for (size_t r = 0; r < l_.regions.size(); ++r) {
      const Program& p = l_.regions[r];
      for (size_t k = 0; k < p.plan.kernels.size(); ++k) {
        std::string name = "r" + std::to_string(r) + "k" + std::to_string(k);
        detail::emit_inlined_kernel(m_, p.graph, p.plan, p.plan.kernels[k], descs_[r][k], name);
        kernels_[r].push_back(m_.getFunction(name));
      }
    }
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i64, i64}, false);
    fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, "k0", m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    entry_ = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry_);
    size_t a = 0;
    for (size_t k = 0; k < l_.operands.size(); ++k) ops_.push_back(arg(a++));
    for (size_t k = 0; k < l_.results.size(); ++k) res_.push_back(arg(a++));
    scratch_ = arg(a);
    for (int64_t k = 0; k < l_.carries; ++k) other_.push_back(at(scratch_, l_.carry_offset[k]));
    if (l_.op == ir::OpKind::Scan)
      scan();
    else
      while_loop();
    b_.CreateRetVoid();
  }

 private:
  Value* arg(size_t j) {
    return b_.CreateLoad(b_.getPtrTy(),
                         b_.CreateConstInBoundsGEP1_64(b_.getPtrTy(), fn_->getArg(0), j));
  }
  Value* at(Value* base, int64_t bytes) {
    return b_.CreateConstInBoundsGEP1_64(b_.getInt8Ty(), base, static_cast<uint64_t>(bytes));
  }
  Value* at(Value* base, Value* bytes) { return b_.CreateInBoundsGEP(b_.getInt8Ty(), base, bytes); }
  // An alloca of n elements as one array-typed object: SROA skips array allocations (a count
  // operand), so an argument table made that way stayed in memory through the first SROA.
  llvm::AllocaInst* entry_alloca(llvm::Type* t, uint64_t n = 1) {
    llvm::IRBuilder<> eb(entry_, entry_->begin());
    return eb.CreateAlloca(n == 1 ? t : llvm::ArrayType::get(t, n));
  }
  void copy(Value* dst, Value* src, int64_t bytes) {
    if (bytes > 0) b_.CreateMemMove(dst, llvm::MaybeAlign(1), src, llvm::MaybeAlign(1), bytes);
  }

  // Small carries live on the stack (the body reads `cur`, writes `next`, copied back each trip)
  // rather than ping-ponging between buffers: at constant addresses SROA keeps a scalar carry in a
  // register, where through memory each trip waited on store-to-load forwarding.
  static constexpr int64_t kLocalCarryBytes = 64;
  struct Local {
    Value* cur = nullptr;  // null: the carry ping-pongs
    Value* next = nullptr;
  };
  std::vector<Local> local_carries() {
    std::vector<Local> loc(static_cast<size_t>(l_.carries));
    for (int64_t k = 0; k < l_.carries; ++k) {
      const int64_t bytes = l_.result_bytes[k];
      if (bytes <= 0 || bytes > kLocalCarryBytes) continue;
      for (Value** v : {&loc[k].cur, &loc[k].next}) {
        llvm::AllocaInst* a = entry_alloca(b_.getInt8Ty(), static_cast<uint64_t>(bytes));
        a->setAlignment(llvm::Align(64));
        *v = a;
      }
      local_copy(loc[k].cur, ops_[k], bytes);
    }
    return loc;
  }
  // A memcpy, where copy() emits a memmove (operands may overlap there): through memmove the
  // local carry stayed slower (cumsum 1.5-1.7 against 1.2-1.6 ns a trip, alternated runs).
  void local_copy(Value* dst, Value* src, int64_t bytes) {
    b_.CreateMemCpy(dst, llvm::MaybeAlign(1), src, llvm::MaybeAlign(1), bytes);
  }

  // Region r's pointer table, its temporaries bound (parameters and outputs are set per trip).
  std::vector<Value*> frame(size_t r) {
    const Program& p = l_.regions[r];
    std::vector<Value*> t(p.plan.bufs.size(), nullptr);
    for (size_t b = 0; b < t.size(); ++b)
      if (p.temp_offset[b] >= 0) t[b] = at(scratch_, l_.region_offset[r] + p.temp_offset[b]);
    return t;
  }

  // Region r's steps (all kernels) on the pointers t: each kernel gets its argument table.
  void run_region(size_t r, const std::vector<Value*>& t) {
    const Program& p = l_.regions[r];
    for (const Step& st : p.plan.steps) {
      const KernelSpec& k = p.plan.kernels[st.kernel];
      const int64_t outer = k.outer.numel();
      if (outer == 0) continue;
      const std::vector<int>& bufs = descs_[r][st.kernel].bufs;
      llvm::AllocaInst* table = entry_alloca(b_.getPtrTy(), bufs.size());
      for (size_t j = 0; j < bufs.size(); ++j) {
        Value* v = t[bufs[j]];
        LOOM_ASSERT(v != nullptr);
        if (k.out_shift != 0 && bufs[j] == k.stages[0].out_buf)
          v = at(v, k.out_shift * static_cast<int64_t>(itemsize(p.plan.bufs[bufs[j]].type.dtype)));
        b_.CreateStore(v, b_.CreateConstInBoundsGEP1_64(b_.getPtrTy(), table, j));
      }
      b_.CreateCall(kernels_[r][st.kernel], {table, b_.getInt64(0), b_.getInt64(outer)});
    }
  }

  // As run_scan: step s reads the carries step s-1 wrote (the operands at s = 0) and writes
  // the other set, the parity chosen so that the last step writes the result buffers.
  void scan() {
    const int64_t c = l_.carries, x = static_cast<int64_t>(l_.slice_bytes.size());
    Value* n = fn_->getArg(2);  // the length: scans of any length share the function
    auto* empty = llvm::BasicBlock::Create(ctx_, "empty", fn_);
    auto* start = llvm::BasicBlock::Create(ctx_, "start", fn_);
    // The local carries are filled before the branch, so that both ways out copy them from the
    // same place (simplifycfg merges the two copies; from different sources it would select the
    // source pointer, and the alloca would stay in memory).
    const std::vector<Local> loc = local_carries();
    b_.CreateCondBr(b_.CreateICmpEQ(n, b_.getInt64(0)), empty, start);
    b_.SetInsertPoint(empty);
    for (int64_t k = 0; k < c; ++k)
      copy(res_[k], loc[k].cur ? loc[k].cur : ops_[k], l_.result_bytes[k]);
    b_.CreateRetVoid();
    b_.SetInsertPoint(start);
    const Program& body = l_.regions[0];
    const std::vector<int>& in = body.param_bufs;
    const std::vector<int>& out = body.plan.output_bufs;
    std::vector<Value*> t = frame(0);
    llvm::AllocaInst* index = entry_alloca(b_.getInt64Ty());
    t[in[0]] = index;
    for (size_t k = c + x; k < l_.operands.size(); ++k) t[in[1 + k]] = ops_[k];
    // Trip s: the carries step s-1 wrote (the operands at s = 0) come around as prev.
    const std::vector<Value*> init(ops_.begin(), ops_.begin() + c);
    auto trip = [&](Value* s, std::span<Value* const> prev) {
      Value* left = b_.CreateSub(b_.CreateSub(n, b_.getInt64(1)), s);  // steps after this one
      Value* ti = l_.reverse ? left : s;
      b_.CreateStore(ti, index);
      Value* to_result = b_.CreateICmpEQ(b_.CreateAnd(left, b_.getInt64(1)), b_.getInt64(0));
      std::vector<Value*> wrote(c);
      for (int64_t k = 0; k < c; ++k) {
        wrote[k] = loc[k].cur ? prev[k] : b_.CreateSelect(to_result, res_[k], other_[k]);
        t[in[1 + k]] = loc[k].cur ? loc[k].cur : prev[k];
        t[out[k]] = loc[k].cur ? loc[k].next : wrote[k];
      }
      for (int64_t j = 0; j < x; ++j)
        t[in[1 + c + j]] = at(ops_[c + j], b_.CreateMul(ti, b_.getInt64(l_.slice_bytes[j])));
      for (size_t j = 0; j < l_.y_bytes.size(); ++j)
        t[out[c + j]] = at(res_[c + j], b_.CreateMul(ti, b_.getInt64(l_.y_bytes[j])));
      run_region(0, t);
      for (int64_t k = 0; k < c; ++k)
        if (loc[k].cur) local_copy(loc[k].cur, loc[k].next, l_.result_bytes[k]);
      return wrote;
    };
    detail::emit_counted_loop(b_, fn_, b_.getInt64(0), n, nullptr, {}, init, trip);
    for (int64_t k = 0; k < c; ++k)
      if (loc[k].cur) local_copy(res_[k], loc[k].cur, l_.result_bytes[k]);
  }

  // As run_while: the state moves from the operands to the result buffers, then alternates
  // with the scratch set, and is copied to the results at the end when it is not there.
  void while_loop() {
    const int64_t n = l_.carries;
    const Program& cond = l_.regions[0];
    const Program& body = l_.regions[1];
    std::vector<Value*> ct = frame(0), bt = frame(1);
    for (size_t k = n; k < l_.operands.size(); ++k) {
      ct[cond.param_bufs[k]] = ops_[k];
      bt[body.param_bufs[k]] = ops_[k];
    }
    llvm::AllocaInst* go = entry_alloca(b_.getInt8Ty());
    ct[cond.plan.output_bufs[0]] = go;
    const std::vector<Local> loc = local_carries();
    auto* pre = b_.GetInsertBlock();
    auto* head = llvm::BasicBlock::Create(ctx_, "trip", fn_);
    auto* bodyb = llvm::BasicBlock::Create(ctx_, "trip_body", fn_);
    auto* exit = llvm::BasicBlock::Create(ctx_, "trip_exit", fn_);
    auto* copyb = llvm::BasicBlock::Create(ctx_, "copy_out", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "done", fn_);
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    llvm::PHINode* in_result = b_.CreatePHI(b_.getInt1Ty(), 2);  // the state is in the results
    in_result->addIncoming(b_.getFalse(), pre);
    std::vector<llvm::PHINode*> cur(n);
    for (int64_t k = 0; k < n; ++k) {
      cur[k] = b_.CreatePHI(b_.getPtrTy(), 2);
      cur[k]->addIncoming(ops_[k], pre);
      ct[cond.param_bufs[k]] = loc[k].cur ? loc[k].cur : cur[k];
    }
    run_region(0, ct);
    Value* g = b_.CreateLoad(b_.getInt8Ty(), go);
    b_.CreateCondBr(b_.CreateICmpNE(g, b_.getInt8(0)), bodyb, exit);
    b_.SetInsertPoint(bodyb);
    std::vector<Value*> next(n);
    for (int64_t k = 0; k < n; ++k) {
      next[k] = loc[k].cur ? cur[k] : b_.CreateSelect(in_result, other_[k], res_[k]);
      bt[body.param_bufs[k]] = loc[k].cur ? loc[k].cur : cur[k];
      bt[body.plan.output_bufs[k]] = loc[k].cur ? loc[k].next : next[k];
    }
    run_region(1, bt);
    for (int64_t k = 0; k < n; ++k)
      if (loc[k].cur) local_copy(loc[k].cur, loc[k].next, l_.result_bytes[k]);
    in_result->addIncoming(b_.CreateNot(in_result), b_.GetInsertBlock());
    for (int64_t k = 0; k < n; ++k) cur[k]->addIncoming(next[k], b_.GetInsertBlock());
    b_.CreateBr(head);
    b_.SetInsertPoint(exit);
    for (int64_t k = 0; k < n; ++k)
      if (loc[k].cur) local_copy(res_[k], loc[k].cur, l_.result_bytes[k]);
    b_.CreateCondBr(in_result, done, copyb);
    b_.SetInsertPoint(copyb);
    for (int64_t k = 0; k < n; ++k)
      if (!loc[k].cur) copy(res_[k], cur[k], l_.result_bytes[k]);
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  const LoopProgram& l_;
  const std::vector<std::vector<detail::KernelDescription>>& descs_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  llvm::Function* fn_ = nullptr;
  llvm::BasicBlock* entry_ = nullptr;
  std::vector<std::vector<llvm::Function*>> kernels_;  // per region, per plan kernel
  std::vector<Value*> ops_, res_, other_;
  Value* scratch_ = nullptr;
};

}  // namespace

KernelFn compile_native_loop(const LoopProgram& l) {
  std::vector<std::vector<detail::KernelDescription>> descs;
  for (const Program& r : l.regions) descs.push_back(detail::describe_all(r.graph, r.plan));
  return detail::cached_function(describe_native(l, descs),
                                 [&](llvm::Module& m) { Driver(l, descs, m).emit(); });
}

}  // namespace loom::cpu
