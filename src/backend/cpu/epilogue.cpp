// loom's epilogue for oneDNN products (epilogue.h): a loop over the block's rows and, inside,
// a loop over its columns marked parallel (each column reads and writes only its own elements),
// which the vectorizer turns into AVX-512 code, its tail folded into masked vectors so the
// math is generated once. Code generation is Codegen::Optimized: the decoder's GELU epilogue
// on a [1024,512] block took 350-390 us with fast instruction selection against 223-258 us
// (LOOM_PROFILE, both cores busy); with the vectorizer's own remainder loops (three copies of
// the math) 193-209 us, but 16 ms of code generation against 6 ms.
#include "backend/cpu/epilogue.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/codegen_impl.h"
#include "backend/cpu/jit.h"
#include "backend/cpu/math.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"

namespace loom::cpu {

namespace {

using llvm::Value;

// How binary operand j's column stride is compiled.
char column_class(int64_t sc) { return sc == 0 ? 'b' : sc == 1 ? 'd' : 's'; }

std::string hex_float(float f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(f));
  return buf;
}

std::string describe_epilogue(std::span<const PostOp> post, std::span<const int64_t> sc) {
  std::string s = "epilogue f32";
  size_t j = 0;
  for (const PostOp& po : post) {
    (s += ' ') += post_op_name(po.kind);
    if (po.kind == PostOp::Linear) s += "(" + hex_float(po.alpha) + "," + hex_float(po.beta) + ")";
    if (po.binary()) (s += ':') += column_class(sc[j++]);
  }
  return s;
}

class EpilogueEmitter {
 public:
  EpilogueEmitter(llvm::Module& m, std::span<const PostOp> post, std::span<const int64_t> sc)
      : m_(m), ctx_(m.getContext()), b_(ctx_), math_(b_, m, &group_), post_(post), sc_(sc) {}

  void emit() {
    auto* i64 = b_.getInt64Ty();
    auto* ptr = b_.getPtrTy();
    auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i64, i64}, false);
    fn_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, "k0", m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    Value* bufs = fn_->getArg(0);
    auto arg = [&](uint64_t i) {
      return b_.CreateLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, bufs, i));
    };
    Value* c = arg(0);
    Value* params = arg(1);
    auto param = [&](uint64_t i) {
      return b_.CreateLoad(i64, b_.CreateConstInBoundsGEP1_64(i64, params, i));
    };
    Value* cols = param(0);
    Value* ldc = param(1);
    std::vector<Value*> ys, sr, sc;
    for (size_t j = 0; j < sc_.size(); ++j) {
      ys.push_back(arg(2 + j));
      sr.push_back(param(2 + 2 * j));
      sc.push_back(sc_[j] == 0 || sc_[j] == 1 ? static_cast<Value*>(b_.getInt64(sc_[j]))
                                              : param(3 + 2 * j));
    }
    auto* f32 = b_.getFloatTy();
    loop(fn_->getArg(1), fn_->getArg(2), false, [&](Value* i) {
      Value* crow = b_.CreateInBoundsGEP(f32, c, b_.CreateMul(i, ldc));
      std::vector<Value*> yrow;
      for (size_t j = 0; j < ys.size(); ++j)
        yrow.push_back(b_.CreateInBoundsGEP(f32, ys[j], b_.CreateMul(i, sr[j])));
      loop(b_.getInt64(0), cols, true, [&](Value* col) {
        Value* at = b_.CreateInBoundsGEP(f32, crow, col);
        Value* x = grouped(b_.CreateLoad(f32, at));
        size_t j = 0;
        for (const PostOp& po : post_) {
          if (!po.binary()) {
            x = eltwise(po, x);
            continue;
          }
          Value* y = grouped(
              b_.CreateLoad(f32, b_.CreateInBoundsGEP(f32, yrow[j], b_.CreateMul(col, sc[j]))));
          x = binary(po.kind, x, y);
          ++j;
        }
        grouped(b_.CreateStore(x, at));
      });
    });
    b_.CreateRetVoid();
  }

 private:
  template <class I>
  I* grouped(I* inst) {
    if (group_) inst->setMetadata(llvm::LLVMContext::MD_access_group, group_);
    return inst;
  }

  // A loop over [lo, hi); `parallel`: its iterations are independent (loop metadata for the
  // vectorizer, and group_ for the accesses inside it), and its tail is folded into masked
  // vectors (one copy of the math).
  template <class Body>
  void loop(Value* lo, Value* hi, bool parallel, Body&& body) {
    llvm::MDNode* saved = group_;
    if (parallel) group_ = llvm::MDNode::getDistinct(ctx_, {});
    llvm::Metadata* pred[] = {llvm::MDString::get(ctx_, "llvm.loop.vectorize.predicate.enable"),
                              llvm::ConstantAsMetadata::get(b_.getTrue())};
    llvm::Metadata* extra[] = {llvm::MDNode::get(ctx_, pred)};
    detail::emit_counted_loop(b_, fn_, lo, hi, parallel ? group_ : nullptr, extra, body);
    group_ = saved;
  }

  Value* f(double v) { return llvm::ConstantFP::get(b_.getFloatTy(), v); }

  // As the ops the post-op stands for compute it (composite.cpp's forms, emitter_elementwise.cpp's
  // ops).
  Value* eltwise(const PostOp& po, Value* x) {
    switch (po.kind) {
      case PostOp::Relu:  // where(le(x, 0), 0, x)
        return b_.CreateSelect(b_.CreateFCmpOLE(x, f(0)), f(0), x);
      case PostOp::Tanh: return math_.tanh(x);
      case PostOp::Sigmoid:  // div(1, add(exp(neg(x)), 1))
        return b_.CreateFDiv(f(1), b_.CreateFAdd(math_.exp(b_.CreateFNeg(x)), f(1)));
      case PostOp::Gelu: {  // mul(mul(x, 0.5), add(erf(mul(x, 1/sqrt(2))), 1))
        Value* e = math_.erf(b_.CreateFMul(x, f(static_cast<float>(M_SQRT1_2))));
        return b_.CreateFMul(b_.CreateFMul(x, f(0.5)), b_.CreateFAdd(e, f(1)));
      }
      default:  // Linear
        return b_.CreateFAdd(b_.CreateFMul(f(po.alpha), x), f(po.beta));
    }
  }

  Value* binary(PostOp::Kind k, Value* x, Value* y) {
    switch (k) {
      case PostOp::Add: return b_.CreateFAdd(x, y);
      case PostOp::Sub: return b_.CreateFSub(x, y);
      case PostOp::Mul: return b_.CreateFMul(x, y);
      case PostOp::Div: return b_.CreateFDiv(x, y);
      default: {  // Max, Min: the reference's (a NaN operand wins, the first one)
        const bool mx = k == PostOp::Max;
        Value* r = b_.CreateSelect(mx ? b_.CreateFCmpOGT(x, y) : b_.CreateFCmpOLT(x, y), x, y);
        r = b_.CreateSelect(b_.CreateFCmpUNO(y, y), y, r);
        return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, r);
      }
    }
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  llvm::MDNode* group_ = nullptr;
  Math math_;
  std::span<const PostOp> post_;
  std::span<const int64_t> sc_;
  llvm::Function* fn_ = nullptr;
};

}  // namespace

void build_code_generator_tables() {
  const PostOp post[] = {{PostOp::Gelu}, {PostOp::Add}};
  const int64_t col_strides[] = {1};
  Jit::instance().compile(
      describe_epilogue(post, col_strides) + " (code generator warm-up)\n", {"k0"},
      [&](llvm::Module& m) { EpilogueEmitter(m, post, col_strides).emit(); }, nullptr,
      Codegen::Optimized);
}

KernelFn epilogue_function(std::span<const PostOp> post, std::span<const int64_t> col_strides) {
  return detail::cached_function(
      describe_epilogue(post, col_strides),
      [&](llvm::Module& m) { EpilogueEmitter(m, post, col_strides).emit(); }, Codegen::Optimized);
}

}  // namespace loom::cpu
