// Pipeline: runs passes in order with verification in between, and the LOOM_DUMP_IR dump.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/profile.h"
#include "passes/passes_impl.h"

namespace loom::passes {

namespace {

// Without a prefix, dump files are numbered across the whole process, so that the dumps of
// several compiles into one directory neither overwrite each other nor lose their order.
std::atomic<int> g_dump_counter{0};

void dump(const std::string& dir, const std::string& prefix, int step, std::string_view pass,
          const ir::Graph& g, bool changed) {
  if (dir.empty()) return;
  char file[200];
  if (prefix.empty())
    std::snprintf(file, sizeof file, "%02d_%.*s.ir", g_dump_counter.fetch_add(1),
                  static_cast<int>(pass.size()), pass.data());
  else
    std::snprintf(file, sizeof file, "%s.%02d_%.*s.ir", prefix.c_str(), step,
                  static_cast<int>(pass.size()), pass.data());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::filesystem::path path = std::filesystem::path(dir) / file;
  std::ofstream os(path);
  if (pass == "input")
    os << "# loom IR before the first pass\n";
  else
    os << "# loom IR after pass '" << pass << "'" << (changed ? "" : " (unchanged)") << "\n";
  os << ir::to_text(g);
  // A failed debug dump must not fail the compile; say so once per file and go on.
  if (!os) std::fprintf(stderr, "loom: cannot write IR dump %s\n", path.string().c_str());
}

}  // namespace

Pipeline& Pipeline::add(std::unique_ptr<Pass> pass) {
  LOOM_CHECK(pass != nullptr, "[pipeline] cannot add a null pass");
  passes_.push_back(std::move(pass));
  return *this;
}

std::string Pipeline::config_dump_dir() { return config().dump_ir_dir; }

Pipeline& Pipeline::set_dump(std::string dir, std::string prefix) {
  dump_dir_ = std::move(dir);
  dump_prefix_ = std::move(prefix);
  return *this;
}

bool Pipeline::run(ir::Graph& g) {
  ir::verify(g);
  int step = 0;
  dump(dump_dir_, dump_prefix_, step++, "input", g, false);
  bool changed = false;
  for (auto& pass : passes_) {
    bool c;
    {
      profile::Scope ps("compile", [&] { return "pass " + std::string(pass->name()); });
      c = pass->run(g);
    }
    changed = changed || c;
    try {
      if (c) ir::verify(g);  // an unchanged graph is the verified one
    } catch (const Error& e) {
      throw Error(loom::detail::str_cat("[pipeline] the graph fails to verify after pass '",
                                        pass->name(), "': ", e.what()));
    }
    dump(dump_dir_, dump_prefix_, step++, pass->name(), g, c);
  }
  return changed;
}

std::unique_ptr<Pass> make_pass(std::string_view name) {
  if (name == "dce") return detail::make_dce();
  if (name == "cse") return detail::make_cse();
  if (name == "simplify") return detail::make_simplify();
  if (name == "inline") return detail::make_inline();
  throw Error(loom::detail::str_cat("[passes] unknown pass '", name,
                                    "'; expected one of dce, cse, simplify, inline"));
}

Pipeline default_pipeline() {
  Pipeline p;
  p.add(make_pass("inline")).add(make_pass("simplify")).add(make_pass("cse")).add(make_pass("dce"));
  return p;
}

}  // namespace loom::passes
