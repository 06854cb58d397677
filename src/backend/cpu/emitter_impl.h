// The emitter of one kernel's LLVM IR (emitter.cpp: the function, its loops, stages and
// expressions; emitter_elementwise.cpp: the value of one element). For the files that emit IR.
#pragma once

#include <array>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/codegen_impl.h"
#include "backend/cpu/math.h"
#include "backend/cpu/plan.h"
#include "llvm/IR/IRBuilder.h"

namespace loom::cpu::detail {

// Emits kernels into one module; not thread-safe (one per module being built).
class Emitter {
 public:
  using OpKind = ir::OpKind;
  using Value = llvm::Value;

  Emitter(const ir::Graph& g, const Plan& p, llvm::Module& m)
      : g_(g), p_(p), m_(m), ctx_(m.getContext()), b_(ctx_), math_(b_, m, &group_) {}

  void emit(const KernelSpec& k, const KernelDescription& d, const std::string& name,
            bool inlined = false);

 private:
  // A loop over [lo, hi). `parallel`: its iterations touch buffers independently (each
  // writes its own elements and reads nothing another one writes), which the loop metadata
  // tells the vectorizer, so it needs no runtime alias checks (and in-place updates of a
  // donated input vectorize too).
  template <class Body>
  void loop(Value* lo, Value* hi, Body&& body, bool parallel = false);
  llvm::AllocaInst* entry_alloca(llvm::Type* t);
  void outer_body(Value* o);
  void elementwise_stage(const Stage& s, const std::vector<Value*>& oc);
  void reduce_stage(const Stage& s, const std::vector<Value*>& oc);
  static bool is_reduced(const Stage& s, size_t d);
  Coords output_coords(const Stage& s) const;
  void column_stage(const Stage& s, const std::vector<Value*>& oc);
  Value* reduce_init(OpKind op, DType dt, llvm::Type* ct);
  Value* combine(OpKind op, DType dt, Value* a, Value* x);
  Value* float_extremum(bool mx, Value* a, Value* b);
  Value* argmax_hit(Value* x, Value* best, DType dt);
  Value* affine(const Affine& a);
  Value* address(int plan_buf, int64_t offset, const std::vector<int64_t>& strides, const Coords& c,
                 DType dt);
  llvm::Instruction* in_group(llvm::Instruction* i);
  void store(int plan_buf, int64_t offset, const std::vector<int64_t>& strides, const Coords& c,
             Value* v, DType dt);
  Value* load(int plan_buf, const std::vector<int64_t>& strides, const Coords& c, DType dt);
  std::string memo_key(NodeId n, const Coords& c);
  Value* eval(NodeId n, const Coords& c);
  Value* hoisted(NodeId n);

  // Runs `loops` (a stage's loop nest, emitted at the current block) with rank-0 values hoisted
  // in front of it.
  template <class Loops>
  void hoisting(Loops&& loops);

  // The loops just emitted raise to powers that are the same on every trip (a host number
  // is a graph input, so `x ** 2` and `x ** 3` share an executable); a second copy of them
  // squares instead, taken when every such exponent is 2 at run time: x * x is pow(x, 2)
  // correctly rounded, NaN, infinities and signed zeros included, and the general float32
  // pow costs a float64 log and exp an element (1.8 against 0.14 ms over 2^20 elements).
  template <class Loops>
  void squares_version(Loops&& loops);
  Value* square(Value* x, Value* y);
  Value* compute(NodeId n, const Coords& c);
  Value* compute_uncached(NodeId n, const Coords& c);
  std::array<Value*, 4> philox(std::array<Value*, 4> ctr, Value* k0, Value* k1);
  Value* lane(const std::array<Value*, 4>& r, Value* which);
  Value* normal_from_words(Value* w1, Value* w2);
  Value* random(const ir::Node& node, const Coords& c);
  Value* constant(const ir::Node& node, DType dt);
  Value* int_to(Value* i64v, DType dt);
  Value* elementwise(OpKind op, DType in, const std::vector<Value*>& x);
  Value* fop(llvm::Instruction::BinaryOps op, const std::vector<Value*>& x);
  Value* int_rem(Value* a, Value* d);
  Value* int_div(Value* a, Value* d);
  Value* convert(Value* v, DType from, DType to);
  Value* double_to_half(Value* d, DType to);
  Value* round_to(Value* v, DType dt);
  llvm::Type* compute_type(DType dt);
  llvm::Type* storage_type(DType dt);
  Value* from_storage(Value* v, DType dt);
  Value* to_storage(Value* v, DType dt);

  const ir::Graph& g_;
  const Plan& p_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  Math math_;
  const KernelSpec* k_ = nullptr;
  llvm::Function* fn_ = nullptr;
  llvm::BasicBlock* alloca_point_ = nullptr;
  llvm::MDNode* group_ = nullptr;  // access group of the innermost parallel loop
  std::map<int, int> local_;
  std::vector<Value*> ptrs_, vars_;
  std::unordered_map<std::string, Value*> memo_;
  std::map<NodeId, Value*> row_scalars_;
  llvm::BasicBlock* hoist_ = nullptr;  // set while a stage's loops are emitted (hoisted())
  std::map<NodeId, Value*> hoisted_;
  std::vector<Value*> square_exponents_;  // hoisted exponents of the loops' pows (square())
  bool squares_ = false;                  // emitting the squares copy (squares_version())
};

}  // namespace loom::cpu::detail
