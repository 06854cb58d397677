// The kernel cache: compiled kernels by their canonical description, shared process-wide,
// compiled in one or two modules per plan (new ones) and waited for when another call compiles
// them.
#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "backend/cpu/codegen.h"
#include "backend/cpu/codegen_impl.h"
#include "backend/cpu/jit.h"
#include "backend/cpu/thread_pool.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"

namespace loom::cpu {

thread_local backend::CodeInfo* t_code_info = nullptr;

namespace {

struct Cache {
  std::mutex mu;
  // Entries are never removed: programs hold their addresses.
  std::unordered_map<std::string, std::unique_ptr<KernelCode>> fns;
  // Kernels another compile_kernels call is compiling now (a loop's regions compile beside
  // their program's kernels, and separate threads trace at once): a call that needs one
  // waits for it after compiling its own, rather than compiling it a second time.
  std::unordered_map<std::string, std::shared_future<KernelCode*>> in_flight;
  KernelCacheStats stats;
  // The entry for `text` holding `fn`, unless another compile stored one first (then its entry;
  // `fresh` tells which). Called with `mu` held.
  KernelCode* enter(const std::string& text, void* fn, bool* fresh) {
    auto [it, added] = fns.try_emplace(text, nullptr);
    if (added) {
      it->second = std::make_unique<KernelCode>();
      it->second->fn.store(reinterpret_cast<KernelFn>(fn), std::memory_order_release);
    }
    (added ? stats.compiled : stats.raced)++;
    *fresh = added;
    return it->second.get();
  }
};
Cache& cache() {
  static Cache c;
  return c;
}

int64_t work_per_outer(const KernelSpec& k) {
  int64_t w = 0;
  for (const Stage& s : k.stages) {
    int64_t per = s.shape.empty() ? 1 : s.shape.numel() / std::max<int64_t>(1, k.outer.numel());
    w += std::max<int64_t>(per, 1);
  }
  return k.chunk > 0 ? k.chunk : w;
}

// From this many new functions a module is compiled in two parts at once: even two kernels
// of a graph are worth two modules (a fwd+bwd module holds 5-7, 40 ms of LLVM).
constexpr size_t kSplitFunctions = 2;

// A compiled fast module's optimized IR (empty when loaded or not kept) with its persistent-cache
// key for tiered-up code, and the functions it defines: `of[j]` (an index into `first`) is
// function names[j].
struct ModuleIr {
  Jit::TierUpSource source;
  std::vector<std::string> names;
  std::vector<size_t> of;
};

// Compiles kernels first[f] of `plan` (distinct descriptions), returns their functions in order;
// new ones as two modules at once (two cache entries), as LLVM's time grows with a module's
// functions (docs/architecture.md, "Measurements": kSplitFunctions). `irs` gets their IR.
std::vector<void*> compile_functions(const ir::Graph& g, const Plan& plan,
                                     const std::vector<detail::KernelDescription>& descs,
                                     const std::vector<size_t>& first, std::vector<ModuleIr>* irs) {
  const int parts = first.size() >= kSplitFunctions && ThreadPool::instance().size() > 1 ? 2 : 1;
  // Balanced by description length (a proxy for the IR each function expands to): the
  // longest first, each to the lighter part; each part keeps its functions in order.
  std::vector<int> part_of(first.size(), 0);
  if (parts == 2) {
    std::vector<size_t> by_size(first.size());
    for (size_t f = 0; f < by_size.size(); ++f) by_size[f] = f;
    std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
      return descs[first[a]].text.size() > descs[first[b]].text.size();
    });
    size_t load[2] = {0, 0};
    for (size_t f : by_size) {
      const int p = load[1] < load[0] ? 1 : 0;
      part_of[f] = p;
      load[p] += descs[first[f]].text.size();
    }
  }
  std::vector<void*> fns(first.size());
  std::vector<int> loaded(static_cast<size_t>(parts), 0);
  irs->assign(static_cast<size_t>(parts), {});
  const bool keep = detail::may_keep_bitcode();
  auto compile_part = [&](int part) {
    // Names only need to be unique within a module (each object is linked on its own), so
    // the same kernels give the same module text in every process: the persistent-cache key.
    std::vector<size_t> mine;
    for (size_t f = 0; f < first.size(); ++f)
      if (part_of[f] == part) mine.push_back(f);
    std::vector<std::string> names;
    std::string what;
    for (size_t f : mine) {
      names.push_back("k" + std::to_string(names.size()));
      (what += descs[first[f]].text) += '\n';
    }
    bool hit = false;
    ModuleIr& ir = (*irs)[static_cast<size_t>(part)];
    ir.source.want_bitcode = keep;
    std::vector<void*> got = Jit::instance().compile(
        what, names,
        [&](llvm::Module& module) {
          std::vector<size_t> kernels;
          for (size_t f : mine) kernels.push_back(first[f]);
          detail::emit_kernels(module, g, plan, descs, kernels, names);
        },
        &hit, Codegen::Fast, tier_up_after_us() > 0 ? &ir.source : nullptr);
    for (size_t k = 0; k < mine.size(); ++k) fns[mine[k]] = got[k];
    loaded[static_cast<size_t>(part)] = hit;
    ir.names = std::move(names);
    ir.of = std::move(mine);
  };
  if (parts == 1) {
    compile_part(0);
  } else {
    std::exception_ptr err;
    std::thread other([&] {
      try {
        compile_part(1);
      } catch (...) {
        err = std::current_exception();
      }
    });
    try {
      compile_part(0);
    } catch (...) {
      other.join();
      throw;
    }
    other.join();
    if (err) std::rethrow_exception(err);
  }
  if (t_code_info)
    for (int hit : loaded) (hit ? t_code_info->modules_loaded : t_code_info->modules_compiled)++;
  return fns;
}

// The distinct descriptions this call compiles, in order of first use (concat pieces of
// one shape share one): the kernel that defines each, and the promise other calls wait on.
struct Claim {
  size_t kernel;
  std::promise<KernelCode*> done;
  bool listed = false;         // entered in the in-flight table (all but after an error)
  KernelCode* code = nullptr;  // once compiled: the cache's entry for it
  bool fresh = false;          // the entry is this call's (not another's that raced it)
};

// The claims leave the in-flight table however this call ends: with their functions, or
// with the error that a waiting call then rethrows.
void settle_claims(std::vector<Claim>& claims, const std::vector<detail::KernelDescription>& descs,
                   const std::vector<void*>* fns, std::exception_ptr err) {
  std::lock_guard lock(cache().mu);
  for (size_t c = 0; c < claims.size(); ++c) {
    const std::string& text = descs[claims[c].kernel].text;
    if (claims[c].listed) cache().in_flight.erase(text);
    if (err) {
      claims[c].done.set_exception(err);
      continue;
    }
    claims[c].code = cache().enter(text, (*fns)[c], &claims[c].fresh);
    claims[c].done.set_value(claims[c].code);
  }
}

// Kernel i's entry but its code: its buffers, outer points, work, output shift and name.
CompiledKernel kernel_entry(const Plan& plan, size_t i, const detail::KernelDescription& d) {
  CompiledKernel e;
  e.bufs = d.bufs;
  e.outer = plan.kernels[i].outer.numel();
  e.work = work_per_outer(plan.kernels[i]);
  if (const KernelSpec& k = plan.kernels[i]; k.out_shift != 0) {
    const int b = k.stages[0].out_buf;
    for (size_t j = 0; j < e.bufs.size(); ++j)
      if (e.bufs[j] == b) e.out_arg = static_cast<int>(j);
    LOOM_ASSERT(e.out_arg >= 0);
    e.out_shift_bytes = k.out_shift * static_cast<int64_t>(itemsize(plan.bufs[b].type.dtype));
  }
  e.name = plan.kernels[i].name;
  return e;
}

// Each fast module's kernels that are this call's entries may tier up (KernelCode).
void keep_for_tier_ups(std::vector<ModuleIr>& irs, std::vector<Claim>& claims) {
  for (ModuleIr& ir : irs) {
    if (ir.source.bitcode.empty()) continue;
    auto t = std::make_unique<TierUp>();
    for (size_t j = 0; j < ir.of.size(); ++j) {
      if (!claims[ir.of[j]].fresh) continue;
      t->names.push_back(ir.names[j]);
      t->codes.push_back(claims[ir.of[j]].code);
    }
    if (t->codes.empty()) continue;
    detail::keep_for_tier_up(std::move(t), std::move(ir.source));
  }
}

}  // namespace

std::vector<CompiledKernel> compile_kernels(const ir::Graph& g, const Plan& plan) {
  std::vector<CompiledKernel> out(plan.kernels.size());
  std::vector<detail::KernelDescription> descs;
  {
    profile::Scope ps("compile", "describe kernels");
    descs = detail::describe_all(g, plan);
  }
  // Kernels that another call is compiling: (kernel, its future), waited for at the end.
  std::vector<std::pair<size_t, std::shared_future<KernelCode*>>> waits;
  std::vector<Claim> claims;
  std::map<std::string_view, size_t> claim_of;  // description -> claim
  std::vector<std::pair<size_t, size_t>> mine;  // (kernel, its claim)
  auto settle = [&](const std::vector<void*>* fns, std::exception_ptr err) {
    settle_claims(claims, descs, fns, err);
  };
  try {
    std::lock_guard lock(cache().mu);
    for (size_t i = 0; i < plan.kernels.size(); ++i) {
      out[i] = kernel_entry(plan, i, descs[i]);
      const std::string& text = descs[i].text;
      if (auto it = cache().fns.find(text); it != cache().fns.end()) {
        out[i].code = it->second.get();
        cache().stats.hits++;
      } else if (auto c = claim_of.find(text); c != claim_of.end()) {
        mine.emplace_back(i, c->second);
      } else if (auto f = cache().in_flight.find(text); f != cache().in_flight.end()) {
        waits.emplace_back(i, f->second);
      } else {
        claims.push_back({i, {}});
        claim_of.emplace(text, claims.size() - 1);
        mine.emplace_back(i, claims.size() - 1);
        cache().in_flight.emplace(text, claims.back().done.get_future().share());
        claims.back().listed = true;
      }
    }
  } catch (...) {
    settle(nullptr, std::current_exception());
    throw;
  }
  if (!claims.empty()) {
    std::vector<size_t> first;
    for (const Claim& c : claims) first.push_back(c.kernel);
    std::vector<void*> fns;
    std::vector<ModuleIr> irs;
    try {
      fns = compile_functions(g, plan, descs, first, &irs);
      settle(&fns, nullptr);
    } catch (...) {
      settle(nullptr, std::current_exception());
      throw;
    }
    for (auto [i, c] : mine) out[i].code = claims[c].code;
    keep_for_tier_ups(irs, claims);
  }
  for (auto& [i, fut] : waits) out[i].code = fut.get();  // rethrows the other call's error
  if (!waits.empty()) {
    std::lock_guard lock(cache().mu);
    cache().stats.hits += static_cast<int64_t>(waits.size());
  }
  return out;
}

KernelFn detail::cached_function(const std::string& text,
                                 const std::function<void(llvm::Module&)>& emit, Codegen codegen) {
  {
    std::lock_guard lock(cache().mu);
    auto it = cache().fns.find(text);
    if (it != cache().fns.end()) {
      cache().stats.hits++;
      return it->second->get();
    }
  }
  bool loaded = false;
  std::vector<void*> fns = Jit::instance().compile(text + '\n', {"k0"}, emit, &loaded, codegen);
  if (t_code_info) (loaded ? t_code_info->modules_loaded : t_code_info->modules_compiled)++;
  std::lock_guard lock(cache().mu);
  bool fresh = false;
  return cache().enter(text, fns[0], &fresh)->get();
}

KernelCacheStats kernel_cache_stats() {
  std::lock_guard lock(cache().mu);
  return cache().stats;
}

}  // namespace loom::cpu
