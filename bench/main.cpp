// loom-bench: one CLI for every benchmark of the project.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench.h"

namespace loom::bench {

std::vector<Benchmark>& registry() {
  static std::vector<Benchmark> r;
  return r;
}

std::vector<std::pair<std::string, std::function<int(int, char**)>>>& children() {
  static std::vector<std::pair<std::string, std::function<int(int, char**)>>> c;
  return c;
}

double median_seconds(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = seconds();
    f();
    t.push_back(seconds() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace loom::bench

namespace {

std::string json_string(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;  // notes are one line
    r += c;
  }
  return r + "\"";
}

void print_json(const loom::bench::Benchmark& b, const std::vector<loom::bench::Figure>& figs) {
  std::printf("{\"benchmark\": %s, \"figures\": [", json_string(b.name).c_str());
  for (size_t i = 0; i < figs.size(); ++i) {
    // JSON has no inf or nan: those values print as null.
    char value[32] = "null";
    if (std::isfinite(figs[i].value)) std::snprintf(value, sizeof value, "%.6g", figs[i].value);
    std::printf("%s{\"name\": %s, \"value\": %s, \"unit\": %s, \"note\": %s}", i ? ", " : "",
                json_string(figs[i].name).c_str(), value, json_string(figs[i].unit).c_str(),
                json_string(figs[i].note).c_str());
  }
  std::printf("]}\n");
}

void print_table(const loom::bench::Benchmark& b, const std::vector<loom::bench::Figure>& figs) {
  std::printf("%s: %s\n", b.name.c_str(), b.description.c_str());
  for (const auto& f : figs)
    std::printf("  %-34s %12.4g %-6s %s\n", f.name.c_str(), f.value, f.unit.c_str(), f.note.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && !std::strcmp(argv[1], "--child")) {
    for (auto& [name, run] : loom::bench::children())
      if (name == argv[2]) return run(argc - 3, argv + 3);
    std::fprintf(stderr, "loom-bench: unknown child '%s'\n", argv[2]);
    return 2;
  }
  bool json = false, list = false;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--list")) list = true;
    else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::printf("usage: loom-bench [--list] [--json] NAME... | all\n");
      return 0;
    } else names.push_back(argv[i]);
  }
  auto& reg = loom::bench::registry();
  if (list || names.empty()) {
    for (const auto& b : reg) std::printf("%-20s %s\n", b.name.c_str(), b.description.c_str());
    return list ? 0 : 1;
  }
  for (const std::string& n : names) {
    bool found = false;
    for (const auto& b : reg) {
      if (n != "all" && b.name != n) continue;
      found = true;
      auto figs = b.run();
      if (json) print_json(b, figs);
      else print_table(b, figs);
    }
    if (!found) {
      std::fprintf(stderr, "loom-bench: unknown benchmark '%s' (see --list)\n", n.c_str());
      return 1;
    }
  }
  return 0;
}
