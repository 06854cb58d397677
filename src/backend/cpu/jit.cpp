// Jit: LLJIT setup, the IR pipeline and code generation settings, error translation.
#include "backend/cpu/jit.h"

#include <mutex>

#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/ExecutionEngine/Orc/ThreadSafeModule.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "loom/core/error.h"

namespace loom::cpu {

namespace {
std::string message(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return os.str();
}
template <class T>
T take(llvm::Expected<T> v, const char* what) {
  if (!v) throw CompileError(detail::str_cat("[cpu] ", what, ": ", message(v.takeError())));
  return std::move(*v);
}
}  // namespace

struct Jit::Impl {
  std::mutex mu;
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::unique_ptr<llvm::TargetMachine> tm;
  std::string triple;
  int counter = 0;
};

Jit& Jit::instance() {
  static Jit j;
  return j;
}

Jit::Jit() : impl_(std::make_unique<Impl>()) {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  auto jtmb = take(llvm::orc::JITTargetMachineBuilder::detectHost(), "detect host");
  jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::None);  // IR is optimized at O2 first
  impl_->triple = jtmb.getTargetTriple().str();
  impl_->tm = take(jtmb.createTargetMachine(), "create target machine");
  impl_->jit = take(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(jtmb)).create(),
                    "create LLJIT");
}

Jit::~Jit() = default;

std::unique_ptr<llvm::Module> Jit::new_module(llvm::LLVMContext& ctx, const std::string& name) {
  auto m = std::make_unique<llvm::Module>(name, ctx);
  m->setDataLayout(impl_->jit->getDataLayout());
  m->setTargetTriple(impl_->triple);
  return m;
}

std::vector<void*> Jit::compile(std::unique_ptr<llvm::LLVMContext> ctx,
                                std::unique_ptr<llvm::Module> module,
                                const std::vector<std::string>& names) {
  std::string err;
  llvm::raw_string_ostream es(err);
  if (llvm::verifyModule(*module, &es))
    throw CompileError("[cpu] generated invalid LLVM IR: " + es.str());
  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    // Vectorize, but do not unroll or interleave: generated loops are memory-bound or
    // polynomial-bound, and unrolled copies multiply compile time for little speed.
    llvm::PipelineTuningOptions pto;
    pto.LoopUnrolling = false;
    pto.LoopInterleaving = false;
    pto.SLPVectorization = false;
    pto.LoopVectorization = true;
    llvm::PassBuilder pb(impl_->tm.get(), pto);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
    mpm.run(*module, mam);
  }
  std::lock_guard lock(impl_->mu);
  auto rt = impl_->jit->getMainJITDylib().createResourceTracker();
  if (auto e = impl_->jit->addIRModule(rt, llvm::orc::ThreadSafeModule(std::move(module), std::move(ctx))))
    throw CompileError("[cpu] adding a module failed: " + message(std::move(e)));
  std::vector<void*> out;
  for (const std::string& n : names)
    out.push_back(take(impl_->jit->lookup(n), "lookup").toPtr<void*>());
  return out;
}

}  // namespace loom::cpu
