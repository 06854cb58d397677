// The step graph: the pool's threads run a small program's steps as a dependency graph
// (CpuExecutable::run_graph in cpu_backend.cpp), so a chain of small kernels leaves no thread idle.
// The mode switch (LOOM_STEP_GRAPH) is declared in program.h. No LLVM here.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "backend/cpu/program.h"

namespace loom::cpu {

struct StepGraph {
  std::vector<std::vector<int>> succ;  // per step: the steps that wait for it
  std::vector<int> preds;              // per step: how many it waits for
  std::vector<int64_t> tasks;          // per step

  // Empty (no graph) when the program does not qualify.
  static StepGraph make(const Program& prog);
  bool empty() const { return succ.empty(); }
};

namespace detail {

// A switch's value: as set, or on first use 0 when the environment sets `name` to "0", else 1.
int env_switch(std::atomic<int>& value, const char* name);
// Counts one run of a program as a step graph (step_graph_runs()).
void count_step_graph_run();

}  // namespace detail

}  // namespace loom::cpu
