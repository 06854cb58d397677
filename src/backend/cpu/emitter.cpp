// Code generation: one LLVM function per kernel, all kernels of a plan in one module.
#include <algorithm>
#include <functional>

#include "backend/cpu/codegen_impl.h"
#include "backend/cpu/emitter_impl.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "loom/core/error.h"

namespace loom::cpu::detail {

using ir::OpKind;
using llvm::Value;

// `inlined`: an internal function always inlined into its caller (a native loop's body).
void Emitter::emit(const KernelSpec& k, const detail::KernelDescription& d, const std::string& name,
                   bool inlined) {
  k_ = &k;
  local_.clear();
  for (size_t j = 0; j < d.bufs.size(); ++j) local_[d.bufs[j]] = static_cast<int>(j);
  auto* i64 = b_.getInt64Ty();
  auto* ptr = b_.getPtrTy();
  auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i64, i64}, false);
  fn_ = llvm::Function::Create(
      fty, inlined ? llvm::Function::InternalLinkage : llvm::Function::ExternalLinkage, name, m_);
  fn_->addFnAttr(llvm::Attribute::NoUnwind);
  if (inlined) fn_->addFnAttr(llvm::Attribute::AlwaysInline);
  auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
  b_.SetInsertPoint(entry);
  ptrs_.clear();
  for (size_t j = 0; j < d.bufs.size(); ++j) {
    Value* slot = b_.CreateConstInBoundsGEP1_64(ptr, fn_->getArg(0), j);
    ptrs_.push_back(b_.CreateLoad(ptr, slot));
  }
  alloca_point_ = b_.GetInsertBlock();
  loop(fn_->getArg(1), fn_->getArg(2), [&](Value* o) { outer_body(o); });
  b_.CreateRetVoid();
}

template <class Body>
void Emitter::loop(Value* lo, Value* hi, Body&& body, bool parallel) {
  llvm::MDNode* saved_group = group_;
  if (parallel) group_ = llvm::MDNode::getDistinct(ctx_, {});
  detail::emit_counted_loop(b_, fn_, lo, hi, parallel ? group_ : nullptr, {}, body);
  group_ = saved_group;
}

llvm::AllocaInst* Emitter::entry_alloca(llvm::Type* t) {
  llvm::IRBuilder<> eb(alloca_point_, alloca_point_->begin());
  return eb.CreateAlloca(t);
}

// ---- the outer loop body: delinearize, then the stages ------------------------------
void Emitter::outer_body(Value* o) {
  const Shape& outer = k_->outer;
  std::vector<Value*> oc(outer.size());
  Value* rest = o;
  for (size_t d = outer.size(); d-- > 0;) {
    if (d == 0) {
      oc[d] = rest;
    } else {
      oc[d] = b_.CreateSRem(rest, b_.getInt64(outer[d]));
      rest = b_.CreateSDiv(rest, b_.getInt64(outer[d]));
    }
  }
  row_scalars_.clear();
  for (size_t si = 0; si < k_->stages.size(); ++si) {
    const Stage& s = k_->stages[si];
    if (s.columns > 0)
      column_stage(s, oc);
    else if (s.reduce)
      reduce_stage(s, oc);
    else
      elementwise_stage(s, oc);
  }
}

void Emitter::elementwise_stage(const Stage& s, const std::vector<Value*>& oc) {
  size_t r = s.shape.size();
  bool computes = p_.buf_of[s.node] == s.out_buf;
  if (r == 0) {
    vars_.clear();
    memo_.clear();
    Value* v = computes ? compute(s.node, {}) : eval(s.node, {});
    store(s.out_buf, s.out_offset, s.out_strides, {}, v, g_.node(s.node).type.dtype);
    return;
  }
  int64_t n = s.shape.back();
  Value *lo = b_.getInt64(0), *hi = b_.getInt64(n), *base = b_.getInt64(0);
  if (k_->chunk > 0) {  // the last outer coordinate numbers a chunk of the last axis
    base = b_.CreateMul(oc.back(), b_.getInt64(k_->chunk));
    hi = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.getInt64(k_->chunk),
                                  b_.CreateSub(b_.getInt64(n), base));
  }
  hoisting([&] {
    loop(
        lo, hi,
        [&](Value* i) {
          vars_.assign(oc.begin(), oc.begin() + static_cast<long>(r - 1));
          vars_.push_back(k_->chunk > 0 ? b_.CreateAdd(base, i) : i);
          memo_.clear();
          Coords c(r);
          for (size_t d = 0; d < r; ++d) c[d] = var(d, r);
          Value* v = computes ? compute(s.node, c) : eval(s.node, c);
          store(s.out_buf, s.out_offset, s.out_strides, c, v, g_.node(s.node).type.dtype);
        },
        /*parallel=*/true);
  });
}

// ---- reductions --------------------------------------------------------------------
namespace {
// Elements of a long innermost reduced loop summed on their own before joining the total.
constexpr int64_t kSumBlock = 65536;
// Reduced points of a column reduction's long loop summed on their own before joining.
constexpr int64_t kColumnBlock = 256;
}  // namespace

void Emitter::reduce_stage(const Stage& s, const std::vector<Value*>& oc) {
  const ir::Node& red = g_.node(s.node);
  NodeId in = red.operands[0].node;
  DType dt = g_.node(in).type.dtype;
  llvm::Type* ct = compute_type(dt);
  size_t r = s.shape.size();
  std::vector<size_t> order;  // stage coords as vars: outer dims, then reduced dims
  for (size_t d = 0; d < r; ++d)
    if (!is_reduced(s, d)) order.push_back(d);
  for (int64_t d : s.reduced) order.push_back(static_cast<size_t>(d));
  // argmax runs two passes that both vectorize: the maximum (NaN wins), then the first
  // index holding it, an integer min over a select (a running index and value compared
  // element by element kept the loop scalar: 14 ms over [2048,1000]).
  bool argmax = red.op == OpKind::ArgMax;
  auto* acc = entry_alloca(ct);
  auto* idx = argmax ? entry_alloca(b_.getInt64Ty()) : nullptr;
  b_.CreateStore(reduce_init(red.op, dt, ct), acc);
  if (argmax) b_.CreateStore(b_.getInt64(INT64_MAX), idx);
  const size_t nr = s.reduced.size();
  // A floating sum adds in levels: each reduced loop into its own partial, added to the one
  // around it when the loop ends (and a long innermost loop in blocks of kSumBlock), so the
  // rounding error grows with the sum of the extents, not their product: one running sum of
  // [16, 8, 26, 26] over [0, 2, 3] near 1000 was off by 50x torch's error.
  const bool levels = red.op == OpKind::ReduceSum && is_floating(dt) && nr > 0;
  std::vector<llvm::AllocaInst*> part(nr + 1, acc);  // part[l]: what level l's loop adds into
  llvm::AllocaInst* blocks = levels ? entry_alloca(ct) : nullptr;
  if (levels)
    for (size_t l = 1; l <= nr; ++l) part[l] = entry_alloca(ct);
  auto add_into = [&](llvm::AllocaInst* to, llvm::AllocaInst* from) {
    b_.CreateStore(combine(OpKind::ReduceSum, dt, b_.CreateLoad(ct, to), b_.CreateLoad(ct, from)),
                   to);
  };
  std::vector<Value*> rv(nr);
  Value* best = nullptr;  // argmax's second pass: the maximum
  std::function<void(size_t, Value*)> nest = [&](size_t level, Value* flat) {
    if (level == s.reduced.size()) {
      vars_.assign(oc.begin(), oc.begin() + static_cast<long>(r - s.reduced.size()));
      vars_.insert(vars_.end(), rv.begin(), rv.end());
      memo_.clear();
      Coords c(r);
      for (size_t j = 0; j < order.size(); ++j) c[order[j]] = var(j, r);
      Value* x = eval(in, c);
      if (best) {
        Value* at = b_.CreateSelect(argmax_hit(x, best, dt), flat ? flat : b_.getInt64(0),
                                    b_.getInt64(INT64_MAX));
        Value* i = b_.CreateLoad(b_.getInt64Ty(), idx);
        b_.CreateStore(b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, i, at), idx);
      } else {
        Value* a = b_.CreateLoad(ct, part[nr]);
        b_.CreateStore(combine(argmax ? OpKind::ReduceMax : red.op, dt, a, x), part[nr]);
      }
      return;
    }
    int64_t ext = s.shape[s.reduced[level]];
    auto run = [&](Value* lo, Value* hi) {
      if (levels) b_.CreateStore(reduce_init(red.op, dt, ct), part[level + 1]);
      loop(
          lo, hi,
          [&](Value* iv) {
            rv[level] = iv;
            Value* f = level ? b_.CreateAdd(b_.CreateMul(flat, b_.getInt64(ext)), iv) : iv;
            nest(level + 1, f);
          },
          /*parallel=*/level + 1 == nr);
    };
    if (!levels) return run(b_.getInt64(0), b_.getInt64(ext));
    if (level + 1 < nr || ext <= kSumBlock) {
      run(b_.getInt64(0), b_.getInt64(ext));
      return add_into(part[level], part[level + 1]);
    }
    b_.CreateStore(reduce_init(red.op, dt, ct), blocks);
    loop(b_.getInt64(0), b_.getInt64((ext + kSumBlock - 1) / kSumBlock), [&](Value* blk) {
      Value* lo = b_.CreateMul(blk, b_.getInt64(kSumBlock));
      run(lo, b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin,
                                       b_.CreateAdd(lo, b_.getInt64(kSumBlock)), b_.getInt64(ext)));
      add_into(blocks, part[level + 1]);
    });
    add_into(part[level], blocks);
  };
  hoisting([&] { nest(0, nullptr); });
  if (argmax) {
    best = b_.CreateLoad(ct, acc);
    hoisting([&] { nest(0, nullptr); });
  }
  Value* result = argmax ? b_.CreateLoad(b_.getInt64Ty(), idx) : b_.CreateLoad(ct, acc);
  if (!argmax) result = round_to(result, red.type.dtype);
  row_scalars_[s.node] = result;
  if (s.out_buf >= 0) {
    vars_.assign(oc.begin(), oc.begin() + static_cast<long>(r - s.reduced.size()));
    store(s.out_buf, 0, s.out_strides, output_coords(s), result, red.type.dtype);
  }
}

bool Emitter::is_reduced(const Stage& s, size_t d) {
  return std::find(s.reduced.begin(), s.reduced.end(), static_cast<int64_t>(d)) != s.reduced.end();
}

// A reduction's output coordinates over vars_ holding its kept dims in order: those vars,
// and 0 for reduced dims kept as size 1 (keepdim).
Coords Emitter::output_coords(const Stage& s) const {
  const size_t r = s.shape.size(), kept = r - s.reduced.size();
  Coords c;
  for (size_t d = 0, j = 0; d < r; ++d) {
    if (!is_reduced(s, d))
      c.push_back(var(j++, kept));
    else if (g_.node(s.node).attrs.flag)
      c.push_back(Affine{});
  }
  return c;
}

// A column reduction (Stage::columns): oc is the kept dims but the last, then the column
// block. An accumulator row of the block's columns (compute type, on the stack) takes each
// reduced point's contiguous block in turn, the column loop innermost; the row is stored
// once at the end. Each column adds in the reduced points' order, as the row walk did.
void Emitter::column_stage(const Stage& s, const std::vector<Value*>& oc) {
  const ir::Node& red = g_.node(s.node);
  NodeId in = red.operands[0].node;
  DType dt = g_.node(in).type.dtype;
  llvm::Type* ct = compute_type(dt);
  const size_t r = s.shape.size(), nr = s.reduced.size(), nk = r - nr;
  const int64_t n = s.shape[r - 1];
  llvm::Type* row_type = llvm::ArrayType::get(ct, static_cast<uint64_t>(s.columns));
  auto* acc = entry_alloca(row_type);
  Value* j0 = b_.CreateMul(oc.back(), b_.getInt64(s.columns));
  Value* width = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, b_.getInt64(s.columns),
                                          b_.CreateSub(b_.getInt64(n), j0));
  auto slot = [&](Value* row, Value* j) { return b_.CreateInBoundsGEP(ct, row, j); };
  auto get = [&](Value* row, Value* j) { return in_group(b_.CreateLoad(ct, slot(row, j))); };
  auto set = [&](Value* row, Value* j, Value* v) { in_group(b_.CreateStore(v, slot(row, j))); };
  auto fill = [&](Value* row) {
    loop(
        b_.getInt64(0), width, [&](Value* j) { set(row, j, reduce_init(red.op, dt, ct)); },
        /*parallel=*/true);
  };
  fill(acc);
  // A floating sum adds in levels, as reduce_stage's: a row of partials per reduced loop, and
  // a long loop in blocks of kColumnBlock points (a column's sum is otherwise one running sum
  // over every reduced point: [16384, 64] over axis 0 was off by 40x torch's error).
  const bool levels = red.op == OpKind::ReduceSum && is_floating(dt);
  std::vector<Value*> rows(nr + 1, acc), block_rows(nr, nullptr);
  for (size_t l = 0; levels && l < nr; ++l) {
    rows[l + 1] = entry_alloca(row_type);
    if (s.shape[s.reduced[l]] > kColumnBlock) block_rows[l] = entry_alloca(row_type);
  }
  auto add_rows = [&](Value* to, Value* from) {
    loop(
        b_.getInt64(0), width,
        [&](Value* j) { set(to, j, combine(OpKind::ReduceSum, dt, get(to, j), get(from, j))); },
        /*parallel=*/true);
  };
  // Loop variables: the kept dims but the last (outer), the reduced dims, the column.
  std::vector<size_t> var_of(r);
  for (size_t d = 0, kept = 0; d < r; ++d) {
    auto it = std::find(s.reduced.begin(), s.reduced.end(), static_cast<int64_t>(d));
    var_of[d] = it != s.reduced.end() ? nk - 1 + static_cast<size_t>(it - s.reduced.begin())
                : d + 1 == r          ? r - 1
                                      : kept++;
  }
  std::vector<Value*> rv(nr);
  std::function<void(size_t)> nest = [&](size_t level) {
    if (level < nr) {
      const int64_t ext = s.shape[s.reduced[level]];
      auto run = [&](Value* lo, Value* hi) {
        if (levels) fill(rows[level + 1]);
        loop(lo, hi, [&](Value* iv) {
          rv[level] = iv;
          nest(level + 1);
        });
      };
      if (!levels) return run(b_.getInt64(0), b_.getInt64(ext));
      if (!block_rows[level]) {
        run(b_.getInt64(0), b_.getInt64(ext));
        return add_rows(rows[level], rows[level + 1]);
      }
      fill(block_rows[level]);
      loop(b_.getInt64(0), b_.getInt64((ext + kColumnBlock - 1) / kColumnBlock), [&](Value* blk) {
        Value* lo = b_.CreateMul(blk, b_.getInt64(kColumnBlock));
        run(lo, b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin,
                                         b_.CreateAdd(lo, b_.getInt64(kColumnBlock)),
                                         b_.getInt64(ext)));
        add_rows(block_rows[level], rows[level + 1]);
      });
      return add_rows(rows[level], block_rows[level]);
    }
    loop(
        b_.getInt64(0), width,
        [&](Value* j) {
          vars_.assign(oc.begin(), oc.end() - 1);
          vars_.insert(vars_.end(), rv.begin(), rv.end());
          vars_.push_back(b_.CreateAdd(j0, j));
          memo_.clear();
          Coords c(r);
          for (size_t d = 0; d < r; ++d) c[d] = var(var_of[d], r);
          set(rows[nr], j, combine(red.op, dt, get(rows[nr], j), eval(in, c)));
        },
        /*parallel=*/true);
  };
  hoisting([&] { nest(0); });
  // The output row (the last dim is the last kept one).
  const Coords out = output_coords(s);
  loop(
      b_.getInt64(0), width,
      [&](Value* j) {
        vars_.assign(oc.begin(), oc.end() - 1);
        vars_.push_back(b_.CreateAdd(j0, j));
        store(s.out_buf, 0, s.out_strides, out, round_to(get(acc, j), red.type.dtype),
              red.type.dtype);
      },
      /*parallel=*/true);
}

Value* Emitter::reduce_init(OpKind op, DType dt, llvm::Type* ct) {
  bool fl = is_floating(dt);
  switch (op) {
    case OpKind::ReduceSum:
      return fl ? llvm::ConstantFP::get(ct, 0.0) : llvm::ConstantInt::get(ct, 0);
    case OpKind::ReduceMin:
      if (dt == DType::Bool) return b_.getTrue();
      return fl ? llvm::ConstantFP::getInfinity(ct, false)
                : llvm::ConstantInt::get(ct,
                                         llvm::APInt::getSignedMaxValue(ct->getIntegerBitWidth()));
    default:  // max, argmax
      if (dt == DType::Bool) return b_.getFalse();
      return fl ? llvm::ConstantFP::getInfinity(ct, true)
                : llvm::ConstantInt::get(ct,
                                         llvm::APInt::getSignedMinValue(ct->getIntegerBitWidth()));
  }
}

Value* Emitter::combine(OpKind op, DType dt, Value* a, Value* x) {
  bool fl = is_floating(dt);
  if (op == OpKind::ReduceSum) {
    if (!fl) return b_.CreateAdd(a, x);
    llvm::IRBuilder<>::FastMathFlagGuard guard(b_);
    llvm::FastMathFlags f;
    f.setAllowReassoc();  // lets the sum vectorize; the order of additions is unspecified
    f.setAllowContract();
    b_.setFastMathFlags(f);
    return b_.CreateFAdd(a, x);
  }
  bool mx = op == OpKind::ReduceMax;
  if (dt == DType::Bool) return mx ? b_.CreateOr(a, x) : b_.CreateAnd(a, x);
  // llvm.maximum / llvm.minimum: NaN wins, which the loop vectorizer reduces in vectors
  // (float_extremum's selects keep the loop scalar: log_softmax over [2048,1000] 6.8 ->
  // 3.1 ms). Unlike the reference it orders -0 below +0 (IEEE 754-2019), and a NaN result
  // need not be the first NaN's bits.
  if (fl)
    return b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::maximum : llvm::Intrinsic::minimum, a, x);
  return b_.CreateBinaryIntrinsic(mx ? llvm::Intrinsic::smax : llvm::Intrinsic::smin, a, x);
}

// The reference's maximum/minimum: a NaN operand wins (the first one), else the larger
// (smaller) value, else b. Selects, so it vectorizes and matches bit for bit.
Value* Emitter::float_extremum(bool mx, Value* a, Value* b) {
  Value* pick_a = mx ? b_.CreateFCmpOGT(a, b) : b_.CreateFCmpOLT(a, b);
  Value* r = b_.CreateSelect(pick_a, a, b);
  r = b_.CreateSelect(b_.CreateFCmpUNO(b, b), b, r);
  return b_.CreateSelect(b_.CreateFCmpUNO(a, a), a, r);
}

// argmax's second pass: x is the maximum `best` (the first such index wins). A NaN maximum
// is matched by any NaN, so the first NaN wins.
Value* Emitter::argmax_hit(Value* x, Value* best, DType dt) {
  if (!is_floating(dt)) return b_.CreateICmpEQ(x, best);
  Value* both_nan = b_.CreateAnd(b_.CreateFCmpUNO(x, x), b_.CreateFCmpUNO(best, best));
  return b_.CreateOr(b_.CreateFCmpOEQ(x, best), both_nan);
}

// ---- expressions -------------------------------------------------------------------
Value* Emitter::affine(const Affine& a) {
  Value* v = b_.getInt64(a.c);
  for (size_t j = 0; j < a.a.size(); ++j) {
    if (a.a[j] == 0) continue;
    Value* t = a.a[j] == 1 ? vars_[j] : b_.CreateMul(vars_[j], b_.getInt64(a.a[j]));
    v = a.c == 0 && v == b_.getInt64(0) ? t : b_.CreateAdd(v, t);
  }
  return v;
}

Value* Emitter::address(int plan_buf, int64_t offset, const std::vector<int64_t>& strides,
                        const Coords& c, DType dt) {
  return b_.CreateInBoundsGEP(storage_type(dt), ptrs_[local_.at(plan_buf)],
                              affine(linear(strides, c, offset)));
}

// A memory access of the innermost parallel loop's body joins its access group.
llvm::Instruction* Emitter::in_group(llvm::Instruction* i) {
  if (group_) i->setMetadata(llvm::LLVMContext::MD_access_group, group_);
  return i;
}

void Emitter::store(int plan_buf, int64_t offset, const std::vector<int64_t>& strides,
                    const Coords& c, Value* v, DType dt) {
  in_group(b_.CreateStore(to_storage(v, dt), address(plan_buf, offset, strides, c, dt)));
}

Value* Emitter::load(int plan_buf, const std::vector<int64_t>& strides, const Coords& c, DType dt) {
  return from_storage(
      in_group(b_.CreateLoad(storage_type(dt), address(plan_buf, 0, strides, c, dt))), dt);
}

std::string Emitter::memo_key(NodeId n, const Coords& c) {
  std::string k = std::to_string(n);
  for (const Affine& a : c) {
    k += ";" + std::to_string(a.c);
    for (int64_t x : a.a) k += "," + std::to_string(x);
  }
  return k;
}

// The value of node n at coordinates c (a load when n has a buffer).
Value* Emitter::eval(NodeId n, const Coords& c) {
  auto rs = row_scalars_.find(n);
  if (rs != row_scalars_.end()) return rs->second;
  if (hoist_ && g_.node(n).type.shape.empty() && g_.node(n).op != OpKind::Constant)
    return hoisted(n);
  if (p_.buf_of[n] >= 0)
    return load(p_.buf_of[n], contiguous_strides(g_.node(n).type.shape), c, g_.node(n).type.dtype);
  return compute(n, c);
}

// A rank-0 value read inside a stage's loops is the same on every trip: it is computed once,
// in hoist_ (the block before the stage's loops), with its rank-0 operands. LICM cannot do
// it: the loads it reads may alias the loop's stores as far as LLVM knows, so an AdamW's bias
// corrections (pow or exp of the step count) were evaluated per element.
Value* Emitter::hoisted(NodeId n) {
  auto it = hoisted_.find(n);
  if (it != hoisted_.end()) return it->second;
  llvm::IRBuilderBase::InsertPointGuard guard(b_);
  // Before the branch into the loops; with no loop yet (a reduction of no dims), right here.
  if (llvm::Instruction* end = hoist_->getTerminator()) b_.SetInsertPoint(end);
  llvm::BasicBlock* at = std::exchange(hoist_, nullptr);
  llvm::MDNode* group = std::exchange(group_, nullptr);
  const bool squares = std::exchange(squares_, false);  // runs whatever the exponents are
  std::unordered_map<std::string, Value*> memo;
  memo.swap(memo_);
  Value* v = eval(n, {});
  memo.swap(memo_);
  squares_ = squares;
  group_ = group;
  hoist_ = at;
  hoisted_[n] = v;
  return v;
}

template <class Loops>
void Emitter::hoisting(Loops&& loops) {
  hoist_ = b_.GetInsertBlock();
  hoisted_.clear();
  square_exponents_.clear();
  loops();
  // (A reduction of no dims emits no loop: its code is the hoist block's own.)
  if (!square_exponents_.empty() && hoist_->getTerminator()) squares_version(loops);
  hoist_ = nullptr;
  hoisted_.clear();
}

template <class Loops>
void Emitter::squares_version(Loops&& loops) {
  llvm::BasicBlock* general_exit = b_.GetInsertBlock();
  llvm::Instruction* into = hoist_->getTerminator();  // the branch into the general loops
  b_.SetInsertPoint(into);
  Value* all_two = b_.getTrue();
  for (Value* y : square_exponents_)
    all_two = b_.CreateAnd(all_two, b_.CreateFCmpOEQ(y, llvm::ConstantFP::get(y->getType(), 2.0)));
  auto* squares = llvm::BasicBlock::Create(ctx_, "squares", fn_);
  auto* join = llvm::BasicBlock::Create(ctx_, "joined", fn_);
  b_.CreateCondBr(all_two, squares, into->getSuccessor(0));
  into->eraseFromParent();
  b_.SetInsertPoint(squares);
  squares_ = true;
  loops();
  squares_ = false;
  b_.CreateBr(join);
  b_.SetInsertPoint(general_exit);
  b_.CreateBr(join);
  b_.SetInsertPoint(join);
}

// pow(x, y) as x * x where that is known to be it: y the constant 2, or, in the squares
// copy of a stage's loops, y hoisted (null otherwise, and the exponent noted for the copy).
Value* Emitter::square(Value* x, Value* y) {
  if (auto* k = llvm::dyn_cast<llvm::ConstantFP>(y))
    return k->isExactlyValue(2.0) ? b_.CreateFMul(x, x) : nullptr;
  if (!hoist_ ||
      std::none_of(hoisted_.begin(), hoisted_.end(), [y](const auto& h) { return h.second == y; }))
    return nullptr;
  if (std::find(square_exponents_.begin(), square_exponents_.end(), y) == square_exponents_.end())
    square_exponents_.push_back(y);
  return squares_ ? b_.CreateFMul(x, x) : nullptr;
}

Value* Emitter::compute(NodeId n, const Coords& c) {
  std::string key = memo_key(n, c);
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  Value* v = compute_uncached(n, c);
  memo_[key] = v;
  return v;
}

Value* Emitter::compute_uncached(NodeId n, const Coords& c) {
  const ir::Node& node = g_.node(n);
  DType dt = node.type.dtype;
  switch (node.op) {
    case OpKind::Constant: return constant(node, dt);
    case OpKind::Iota: return int_to(affine(c.empty() ? Affine{} : c[node.attrs.i]), dt);
    case OpKind::Reshape:
      if (!trivial_reshape(g_, n)) {  // a contiguous buffer read in the new shape's order
        NodeId src = node.operands[0].node;
        return load(p_.buf_of[src], contiguous_strides(node.type.shape), c, dt);
      }
      return eval(node.operands[0].node, operand_coords(g_, n, 0, c));
    case OpKind::Permute:
    case OpKind::Expand:
    case OpKind::Slice: return eval(node.operands[0].node, operand_coords(g_, n, 0, c));
    case OpKind::RandUniform:
    case OpKind::RandNormal: return random(node, c);
    default: break;
  }
  std::vector<Value*> xs;
  for (size_t k = 0; k < node.operands.size(); ++k)
    xs.push_back(eval(node.operands[k].node, operand_coords(g_, n, k, c)));
  if (node.op == OpKind::Convert) return convert(xs[0], g_.type(node.operands[0]).dtype, dt);
  DType in = g_.type(node.operands[node.op == OpKind::Where ? 1 : 0]).dtype;
  if (node.op == OpKind::Pow && is_floating(in))
    if (Value* sq = square(xs[0], xs[1])) return round_to(sq, dt);
  return round_to(elementwise(node.op, in, xs), dt);
}

void emit_kernels(llvm::Module& m, const ir::Graph& g, const Plan& p,
                  const std::vector<KernelDescription>& descs, const std::vector<size_t>& kernels,
                  const std::vector<std::string>& names) {
  Emitter e(g, p, m);
  for (size_t k = 0; k < kernels.size(); ++k)
    e.emit(p.kernels[kernels[k]], descs[kernels[k]], names[k]);
}

void emit_counted_loop(llvm::IRBuilderBase& b, llvm::Function* fn, llvm::Value* lo, llvm::Value* hi,
                       llvm::MDNode* group, std::span<llvm::Metadata* const> extra,
                       const std::function<void(llvm::Value*)>& body) {
  emit_counted_loop(b, fn, lo, hi, group, extra, {}, [&](Value* iv, std::span<Value* const>) {
    body(iv);
    return std::vector<Value*>{};
  });
}

void emit_counted_loop(llvm::IRBuilderBase& b, llvm::Function* fn, llvm::Value* lo, llvm::Value* hi,
                       llvm::MDNode* group, std::span<llvm::Metadata* const> extra,
                       std::span<llvm::Value* const> init, const CarriedLoopBody& body) {
  llvm::LLVMContext& ctx = b.getContext();
  auto* pre = b.GetInsertBlock();
  auto* head = llvm::BasicBlock::Create(ctx, "head", fn);
  auto* bodyb = llvm::BasicBlock::Create(ctx, "body", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  b.CreateBr(head);
  b.SetInsertPoint(head);
  auto* iv = b.CreatePHI(b.getInt64Ty(), 2);
  iv->addIncoming(lo, pre);
  std::vector<llvm::PHINode*> carried(init.size());
  for (size_t k = 0; k < init.size(); ++k) {
    carried[k] = b.CreatePHI(init[k]->getType(), 2);
    carried[k]->addIncoming(init[k], pre);
  }
  b.CreateCondBr(b.CreateICmpSLT(iv, hi), bodyb, exit);
  b.SetInsertPoint(bodyb);
  const std::vector<Value*> next_carried =
      body(iv, std::vector<Value*>(carried.begin(), carried.end()));
  Value* next = b.CreateAdd(iv, b.getInt64(1), "", true, true);
  iv->addIncoming(next, b.GetInsertBlock());
  for (size_t k = 0; k < carried.size(); ++k)
    carried[k]->addIncoming(next_carried[k], b.GetInsertBlock());
  llvm::BranchInst* latch = b.CreateBr(head);
  if (group) {
    llvm::Metadata* pa[] = {llvm::MDString::get(ctx, "llvm.loop.parallel_accesses"), group};
    std::vector<llvm::Metadata*> ops = {nullptr, llvm::MDNode::get(ctx, pa)};
    ops.insert(ops.end(), extra.begin(), extra.end());
    llvm::MDNode* id = llvm::MDNode::getDistinct(ctx, ops);
    id->replaceOperandWith(0, id);
    latch->setMetadata(llvm::LLVMContext::MD_loop, id);
  }
  b.SetInsertPoint(exit);
}

void emit_inlined_kernel(llvm::Module& m, const ir::Graph& g, const Plan& p, const KernelSpec& k,
                         const KernelDescription& d, const std::string& name) {
  Emitter(g, p, m).emit(k, d, name, /*inlined=*/true);
}

}  // namespace loom::cpu::detail
