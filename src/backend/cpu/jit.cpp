// Jit: a pool of target machines, the IR pipeline and code generation settings, linking with
// RuntimeDyld, error translation.
#include "backend/cpu/jit.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>

#include "codegen_hash.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/Bitcode/BitcodeWriter.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/ExecutionEngine/Orc/CompileUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/RuntimeDyld.h"
#include "llvm/ExecutionEngine/SectionMemoryManager.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Object/ObjectFile.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"
#include "loom/backend/disk_cache.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"

#ifndef LOOM_VERSION
#define LOOM_VERSION "unknown"
#endif

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

// The IR pipeline: what generated loops need. Kernels are straight loops over raw pointers, so O2's
// inliner, GVN, loop idioms, second function pass and indvars (loops count from 0 by 1) mostly cost
// time (docs/architecture.md, "Measurements": kIrPipeline). always-inline: for native_loop.cpp.
constexpr const char* kIrPipeline =
    "always-inline,function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,loop-"
    "simplify,lcssa,"
    "loop-mssa(licm),loop-rotate,loop-vectorize,instcombine<no-verify-fixpoint>,"
    "simplifycfg)";

// Every setting below that changes the object code; part of the persistent-cache key (with the
// module's Codegen level, added per module).
constexpr const char* kPipeline = "object-format=1";

// Contracted `fadd (fmul a, b), c` (fsub likewise), the product used only there, becomes
// llvm.fmuladd: FastISel forms no FMA. The full selector (Codegen::Optimized), too slow for every
// compile, serves hot kernels' tier-up (codegen.h; docs/architecture.md, "Measurements": fmuladd).
void fuse_multiply_adds(llvm::Module& module) {
  for (llvm::Function& f : module)
    for (llvm::BasicBlock& bb : f)
      for (auto it = bb.begin(); it != bb.end();) {
        llvm::Instruction& i = *it++;
        const unsigned opc = i.getOpcode();
        if ((opc != llvm::Instruction::FAdd && opc != llvm::Instruction::FSub) ||
            !i.hasAllowContract())
          continue;
        for (unsigned side = 0; side < 2; ++side) {
          auto* mul = llvm::dyn_cast<llvm::BinaryOperator>(i.getOperand(side));
          if (!mul || mul->getOpcode() != llvm::Instruction::FMul || !mul->hasAllowContract() ||
              !mul->hasOneUse())
            continue;
          llvm::IRBuilder<> b(&i);
          b.setFastMathFlags(i.getFastMathFlags());
          llvm::Value* a = mul->getOperand(0);
          llvm::Value* x = mul->getOperand(1);
          llvm::Value* c = i.getOperand(1 - side);
          if (opc == llvm::Instruction::FSub) {  // a*b - c = fma(a, b, -c); c - a*b = fma(-a, b, c)
            if (side == 0)
              c = b.CreateFNeg(c);
            else
              a = b.CreateFNeg(a);
          }
          llvm::Value* r = b.CreateIntrinsic(llvm::Intrinsic::fmuladd, {i.getType()}, {a, x, c});
          i.replaceAllUsesWith(r);
          i.eraseFromParent();
          mul->eraseFromParent();
          break;
        }
      }
}

// 512-bit vectors with AVX-512 (F, BW, VL), else LLVM's host model (""): its Intel server models
// prefer 256 bits against Skylake-X's clock drop, but products run 512-bit brgemm anyway
// (docs/architecture.md, "Measurements": vector width). The persistent cache's key holds the width.
std::string preferred_vector_width(const std::vector<std::string>& features) {
  if (const char* w = std::getenv("LOOM_VECTOR_WIDTH")) {
    if (std::strcmp(w, "512") == 0 || std::strcmp(w, "256") == 0) return w;
    throw Error(std::string("LOOM_VECTOR_WIDTH must be 256 or 512, got '") + w + "'");
  }
  auto has = [&](const char* f) {
    return std::find(features.begin(), features.end(), f) != features.end();
  };
  return has("+avx512f") && has("+avx512bw") && has("+avx512vl") ? "512" : "";
}

void optimize(llvm::Module& module, llvm::TargetMachine* tm) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm;
  if (auto e = pb.parsePassPipeline(mpm, kIrPipeline))
    throw CompileError("[cpu] the IR pipeline does not parse: " + message(std::move(e)));
  mpm.run(module, mam);
  fuse_multiply_adds(module);
}

// The persistent-cache key of a module: the canonical descriptions of its kernels (what the
// code generator is asked for) and the environment, which holds the hash of the generator's
// sources. Computed before any IR exists, so a hit skips emitting it (0.3 ms and an
// LLVMContext for the 50-layer decoder's forward).
Hash128 module_key(std::string_view what, const std::string& environment) {
  Hasher128 h;
  h.add_string(environment);
  h.add(what.size());
  size_t k = 0;
  for (; k + 8 <= what.size(); k += 8) {
    uint64_t w;
    std::memcpy(&w, what.data() + k, 8);
    h.add(w);
  }
  for (; k < what.size(); ++k) h.add(static_cast<unsigned char>(what[k]));
  return h.finish();
}

}  // namespace

struct Jit::Impl {
  // Target machines per Codegen level: not safe to share, so a compiling thread holds one for its
  // whole compile; idle ones wait here, so the pool grows to the most concurrent compiles and new
  // threads need not build one (docs/architecture.md, "Measurements": idle_machines).
  std::optional<llvm::orc::JITTargetMachineBuilder> jtmb[2];
  std::mutex machines_mu;
  std::vector<std::unique_ptr<llvm::TargetMachine>> idle_machines[2];
  std::string triple, environment;
  llvm::DataLayout layout{""};
  // The generated functions' preferred vector width in bits ("" leaves it to LLVM): see
  // preferred_vector_width().
  std::string vector_width;
  // The memory of every linked object: code stays loaded for the life of the process.
  std::mutex memory_mu;
  std::vector<std::unique_ptr<llvm::SectionMemoryManager>> memory;
  // Objects of the persistent cache linked ahead of use by the start-up thread, by key; a
  // compile takes its entry (under memory_mu).
  std::map<Hash128, std::vector<void*>> preloaded;

  // A target machine for this thread's compile; give it back with release_machine.
  std::unique_ptr<llvm::TargetMachine> acquire_machine(Codegen c) {
    auto& idle = idle_machines[static_cast<int>(c)];
    {
      std::lock_guard lock(machines_mu);
      if (!idle.empty()) {
        auto tm = std::move(idle.back());
        idle.pop_back();
        return tm;
      }
    }
    return take(jtmb[static_cast<int>(c)]->createTargetMachine(), "create target machine");
  }
  void release_machine(Codegen c, std::unique_ptr<llvm::TargetMachine> tm) {
    std::lock_guard lock(machines_mu);
    idle_machines[static_cast<int>(c)].push_back(std::move(tm));
  }

  // A fresh module configured for the host.
  std::unique_ptr<llvm::Module> new_module(llvm::LLVMContext& ctx) {
    auto m = std::make_unique<llvm::Module>("loom", ctx);
    m->setDataLayout(layout);
    m->setTargetTriple(triple);
    return m;
  }

  // Loads `object` with RuntimeDyld (libm, libc from the process), returns the addresses of `names`
  // (none: the functions k0, k1, ... in order) or an llvm::Error. No ORC session: it costs more
  // than linking a small cached object (docs/architecture.md, "Measurements": Jit::link).
  llvm::Expected<std::vector<void*>> link(std::unique_ptr<llvm::MemoryBuffer> object,
                                          const std::vector<std::string>& names) {
    auto file = llvm::object::ObjectFile::createObjectFile(object->getMemBufferRef());
    if (!file) return file.takeError();
    auto mm = std::make_unique<llvm::SectionMemoryManager>();
    llvm::RuntimeDyld dyld(*mm, *mm);
    dyld.loadObject(**file);
    if (!dyld.hasError()) dyld.resolveRelocations();
    if (dyld.hasError())
      return llvm::make_error<llvm::StringError>(dyld.getErrorString().str(),
                                                 llvm::inconvertibleErrorCode());
    std::vector<void*> out;
    for (size_t k = 0; names.empty() || k < names.size(); ++k) {
      const std::string n = names.empty() ? "k" + std::to_string(k) : names[k];
      llvm::JITEvaluatedSymbol sym = dyld.getSymbol(n);
      if (!sym.getAddress() && names.empty()) break;
      if (!sym.getAddress())
        return llvm::make_error<llvm::StringError>("no symbol '" + n + "' in the object",
                                                   llvm::inconvertibleErrorCode());
      out.push_back(reinterpret_cast<void*>(static_cast<uintptr_t>(sym.getAddress())));
    }
    std::string err;
    if (mm->finalizeMemory(&err))
      return llvm::make_error<llvm::StringError>("finalizing code memory: " + err,
                                                 llvm::inconvertibleErrorCode());
    std::lock_guard lock(memory_mu);
    memory.push_back(std::move(mm));
    return out;
  }
};

namespace {
// What the start-up thread preloads from the persistent cache: the newest entries, at most.
constexpr size_t kPreloadCount = 64;
constexpr size_t kPreloadBytes = 16 << 20;

std::future<void>& start_up() {
  static std::future<void> f;
  return f;
}
std::once_flag start_once;
}  // namespace

void Jit::start() {
  std::call_once(start_once, [] {
    start_up() = std::async(std::launch::async, [] {
      Jit& jit = instance();
      // A process that restarts a program asks for the code it asked for last time: link the
      // persistent cache's most recently used objects here, while the program starts and
      // traces, so that its compiles find them linked (a load and a link cost 0.1-0.2 ms
      // each on the compiling thread, the process's first link twice that).
      auto entries = backend::DiskCache::instance().newest_entries(kPreloadCount, kPreloadBytes);
      if (entries.empty()) return;
      profile::Scope ps("compile", "llvm preload cached objects");
      for (auto& [key, bytes] : entries) {
        auto fns =
            jit.impl_->link(llvm::MemoryBuffer::getMemBuffer(bytes, "loom-preload", false), {});
        if (!fns) {
          llvm::consumeError(fns.takeError());  // a compile loads it (and rejects it) itself
          continue;
        }
        std::lock_guard lock(jit.impl_->memory_mu);
        jit.impl_->preloaded.emplace(key, std::move(*fns));
      }
    });
  });
}

void Jit::wait_for_start() {
  start();  // call_once: the future below is set, and visible here
  start_up().wait();
}

// Never destroyed: the start-up thread may still be linking when the process exits, and
// code must stay loaded while any thread can run a kernel.
Jit& Jit::instance() {
  static Jit* j = [] {
    profile::Scope ps("compile", "llvm start-up");
    return new Jit();
  }();
  return *j;
}

Jit::Jit() : impl_(std::make_unique<Impl>()) {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  // External symbols of generated code (libm, libc) resolve against the whole process.
  llvm::sys::DynamicLibrary::LoadLibraryPermanently(nullptr);
  auto jtmb = take(llvm::orc::JITTargetMachineBuilder::detectHost(), "detect host");
  jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::None);  // IR is optimized first (kIrPipeline)
  impl_->triple = jtmb.getTargetTriple().str();
  impl_->vector_width = preferred_vector_width(jtmb.getFeatures().getFeatures());
  impl_->environment = std::string("loom ") + LOOM_VERSION + " codegen " + LOOM_CODEGEN_HASH +
                       "; llvm " + LLVM_VERSION_STRING + "; triple " + impl_->triple + "; cpu " +
                       jtmb.getCPU() + "; features " + jtmb.getFeatures().getString() + "; ir " +
                       kIrPipeline + "; " + kPipeline + "; vector width " +
                       (impl_->vector_width.empty() ? "llvm's" : impl_->vector_width);
  auto tm = take(jtmb.createTargetMachine(), "create target machine");
  impl_->layout = tm->createDataLayout();
  impl_->jtmb[static_cast<int>(Codegen::Fast)].emplace(jtmb);
  jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::Default);
  impl_->jtmb[static_cast<int>(Codegen::Optimized)].emplace(std::move(jtmb));
  impl_->idle_machines[static_cast<int>(Codegen::Fast)].push_back(std::move(tm));
}

Jit::~Jit() = default;

const std::string& Jit::environment() const { return impl_->environment; }

// This thread's own target machine for optimization and code generation, so concurrent
// compiles run in parallel and never share one.
struct Jit::Lease {
  Impl& impl;
  Codegen codegen;
  std::unique_ptr<llvm::TargetMachine> tm;
  ~Lease() { impl.release_machine(codegen, std::move(tm)); }
};

namespace {
std::atomic<int64_t> g_tiered_loads{0};
}  // namespace

int64_t Jit::tiered_loads() { return g_tiered_loads.load(std::memory_order_relaxed); }

std::vector<void*> Jit::codegen_optimized(const std::string& bitcode,
                                          const std::vector<std::string>& names,
                                          const std::optional<Hash128>& key) {
  llvm::LLVMContext ctx;  // declared first: the module dies before it
  std::unique_ptr<llvm::Module> module;
  {
    profile::Scope ps("compile", "tier-up read bitcode");
    auto buf = llvm::MemoryBuffer::getMemBuffer(bitcode, "loom-tier-up", false);
    module = take(llvm::parseBitcodeFile(buf->getMemBufferRef(), ctx), "reading bitcode");
  }
  Lease lease{*impl_, Codegen::Optimized, impl_->acquire_machine(Codegen::Optimized)};
  std::unique_ptr<llvm::MemoryBuffer> object;
  {
    profile::Scope ps("compile", "tier-up codegen");
    llvm::orc::SimpleCompiler compiler(*lease.tm);
    object = take(compiler(*module), "code generation");
  }
  if (key && backend::DiskCache::instance().enabled()) {
    profile::Scope ps("compile", "tier-up disk cache store");
    backend::DiskCache::instance().store(
        *key, std::string_view(object->getBufferStart(), object->getBufferSize()));
  }
  auto fns = impl_->link(std::move(object), names);
  if (!fns) throw CompileError("[cpu] linking a module failed: " + message(fns.takeError()));
  return std::move(*fns);
}

// compile()'s first step: the object under `key`, preloaded or from disk; nullopt when there is
// none (a miss counted when count_miss) or it does not link.
std::optional<std::vector<void*>> Jit::load_object(const Hash128& key,
                                                   const std::vector<std::string>& names,
                                                   bool count_miss) {
  backend::DiskCache& disk = backend::DiskCache::instance();
  {
    std::unique_lock lock(impl_->memory_mu);
    auto it = impl_->preloaded.find(key);
    if (it != impl_->preloaded.end() && it->second.size() == names.size()) {
      std::vector<void*> fns = std::move(it->second);
      impl_->preloaded.erase(it);
      lock.unlock();
      disk.note_hit(key);
      return fns;
    }
  }
  std::optional<std::string> bytes;
  {
    profile::Scope ps("compile", "disk cache load");
    bytes = disk.load(key, count_miss);
  }
  if (!bytes) return std::nullopt;
  profile::Scope ps("compile", "link cached object");
  auto fns = impl_->link(llvm::MemoryBuffer::getMemBufferCopy(*bytes, "loom-cached"), names);
  if (fns) return std::move(*fns);
  llvm::consumeError(fns.takeError());  // verified but refused: drop it, compile afresh
  disk.reject(key);
  return std::nullopt;
}

// compile() with the persistent cache on: sets *key, then loads the tiered-up code or the
// object under *key when the cache holds one.
std::optional<std::vector<void*>> Jit::load_cached(std::string_view what,
                                                   const std::vector<std::string>& names,
                                                   Codegen codegen, TierUpSource* tier_up,
                                                   Hash128* key) {
  // The key of `what` generated by the full selector: an Optimized compile's, and where a Fast
  // module's tier-up stores its code.
  auto optimized_key = [&] {
    profile::Scope pk("compile", "disk cache key");
    return module_key(what, impl_->environment + "; codegen=Default");
  };
  if (codegen == Codegen::Fast) {
    profile::Scope pk("compile", "disk cache key");
    *key = module_key(what, impl_->environment + "; codegen=None");
  } else {
    *key = optimized_key();
  }
  if (codegen == Codegen::Fast && tier_up) {
    tier_up->key = optimized_key();
    if (auto fns = load_object(*tier_up->key, names, /*count_miss=*/false)) {
      g_tiered_loads.fetch_add(1, std::memory_order_relaxed);
      return fns;
    }
  }
  return load_object(*key, names, /*count_miss=*/true);
}

// compile()'s code generation: the verified module optimized with the leased machine (its
// bitcode kept for a tier-up) and compiled to an object.
std::unique_ptr<llvm::MemoryBuffer> Jit::generate(llvm::Module& module, Lease& lease,
                                                  Codegen codegen, TierUpSource* tier_up) {
  if (!impl_->vector_width.empty())
    for (llvm::Function& f : module)
      if (!f.isDeclaration()) f.addFnAttr("prefer-vector-width", impl_->vector_width);
  {
    profile::Scope ps("compile", "llvm optimize");
    optimize(module, lease.tm.get());
  }
  if (tier_up && tier_up->want_bitcode && codegen == Codegen::Fast) {
    profile::Scope ps("compile", "keep bitcode");
    llvm::raw_string_ostream os(tier_up->bitcode);
    llvm::WriteBitcodeToFile(module, os);
  }
  std::unique_ptr<llvm::MemoryBuffer> object;
  {
    profile::Scope ps("compile", "llvm codegen");
    llvm::orc::SimpleCompiler compiler(*lease.tm);
    object = take(compiler(module), "code generation");
  }
  return object;
}

std::vector<void*> Jit::compile(std::string_view what, const std::vector<std::string>& names,
                                const std::function<void(llvm::Module&)>& emit, bool* loaded,
                                Codegen codegen, TierUpSource* tier_up) {
  if (loaded) *loaded = false;
  backend::DiskCache& disk = backend::DiskCache::instance();
  const bool use_disk = disk.enabled();
  Hash128 key;
  if (use_disk) {
    if (auto fns = load_cached(what, names, codegen, tier_up, &key)) {
      if (loaded) *loaded = true;
      return std::move(*fns);
    }
  }
  llvm::LLVMContext ctx;  // declared first: the module dies before it
  auto module = impl_->new_module(ctx);
  {
    profile::Scope ps("compile", "llvm emit IR");
    emit(*module);
  }
  // Only code that is about to be generated needs checking: a stored object was checked
  // before it was generated.
  {
    profile::Scope pv("compile", "llvm verify");
    std::string err;
    llvm::raw_string_ostream es(err);
    if (llvm::verifyModule(*module, &es))
      throw CompileError("[cpu] generated invalid LLVM IR: " + es.str());
  }
  Lease lease{*impl_, codegen, impl_->acquire_machine(codegen)};
  std::unique_ptr<llvm::MemoryBuffer> object = generate(*module, lease, codegen, tier_up);
  if (use_disk) {
    profile::Scope ps("compile", "disk cache store");
    disk.store(key, std::string_view(object->getBufferStart(), object->getBufferSize()));
  }
  profile::Scope ps("compile", "link");
  auto fns = impl_->link(std::move(object), names);
  if (!fns) throw CompileError("[cpu] linking a module failed: " + message(fns.takeError()));
  return std::move(*fns);
}

}  // namespace loom::cpu
