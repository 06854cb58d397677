// Kernel descriptions: describe_all (hash first, print each distinct text once) must give
// every kernel exactly what describe() gives it alone, text and buffer order, on random
// programs and on repeated layers (where most texts are reused).
#include <gtest/gtest.h>

#include <set>

#include "backend/cpu/codegen_impl.h"
#include "backend/program_gen.h"
#include "loom/loom.h"
#include "loom/passes/pass.h"

namespace loom::cpu {
namespace {

// Checks every kernel of g's plan; returns how many distinct texts the plan has.
size_t check_descriptions(const ir::Graph& traced) {
  ir::Graph g0 = traced;
  passes::default_pipeline().run(g0);
  std::vector<std::vector<NodeId>> results;
  ir::Graph g = split_results(g0, &results);
  Plan plan = make_plan(g, results, /*allow_views=*/true);
  std::vector<detail::KernelDescription> all = detail::describe_all(g, plan);
  EXPECT_EQ(all.size(), plan.kernels.size());
  std::set<std::string> distinct;
  for (size_t i = 0; i < all.size() && i < plan.kernels.size(); ++i) {
    detail::KernelDescription one = detail::describe(g, plan, plan.kernels[i]);
    EXPECT_EQ(all[i].text, one.text) << "kernel " << i;
    EXPECT_EQ(all[i].bufs, one.bufs) << "kernel " << i;
    distinct.insert(one.text);
  }
  return distinct.size();
}

TEST(CpuDescribe, DescribeAllEqualsDescribeOnRandomPrograms) {
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    SCOPED_TRACE(seed);
    manual_seed(seed);
    difftest::Outs outs;
    difftest::gen::ProgramGenerator gen(seed, /*bounds=*/false);
    gen.build(outs);
    std::vector<Tensor> ts;
    for (const difftest::Out& o : outs.items) ts.push_back(o.value);
    check_descriptions(ir::parse(pending_ir(ts)));
  }
}

TEST(CpuDescribe, RepeatedLayersShareTextsButKeepTheirBuffers) {
  Tensor h = randn({8, 16});
  for (int layer = 0; layer < 12; ++layer) {
    Tensor w = randn({16, 16}), b = randn({16});
    h = gelu(matmul(h, transpose(w, 0, 1)) + b) * (layer % 2 ? 0.5 : 0.25) + h;
  }
  size_t distinct = check_descriptions(ir::parse(pending_ir({softmax(h, -1)})));
  EXPECT_LE(distinct, 5u);  // 12 layers, two constants: few distinct kernels
}

}  // namespace
}  // namespace loom::cpu
