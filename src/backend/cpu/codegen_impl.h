// Private pieces of the code generator shared between its files.
#pragma once

#include <string>
#include <vector>

#include "backend/cpu/codegen.h"

namespace loom::cpu::detail {

struct KernelDescription {
  std::string text;       // canonical: equal texts mean interchangeable kernels
  std::vector<int> bufs;  // plan buffer ids by local argument index
};
KernelDescription describe(const ir::Graph& g, const Plan& p, const KernelSpec& k);
// describe() of every kernel of the plan, printing each distinct text once.
std::vector<KernelDescription> describe_all(const ir::Graph& g, const Plan& p);

}  // namespace loom::cpu::detail
