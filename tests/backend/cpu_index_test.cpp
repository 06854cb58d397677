// The CPU backend's index steps (src/backend/cpu/index.cpp: gather, index_select and float
// index_add on planned memory, split across the pool when big; an index_add over a base it
// reads last adds in place) against the reference interpreter: sizes that take several tasks, every
// axis, repeated indices, int32 and int64 indices, index_add inside a scan body and under autodiff
// (embedding's gradient), and the reference's own error for an index out of range.
#include <gtest/gtest.h>

#include "backend/cpu/plan.h"
#include "backend/cpu/program.h"
#include "diff_util.h"
#include "loom/passes/pass.h"

namespace loom {
namespace {

using namespace difftest;

class CpuIndex : public DiffTest {};

// Outputs of 128 KiB and more: two tasks or more wherever the pool has two threads.
TEST_F(CpuIndex, StepsSplitAcrossThreadsMatchTheReference) {
  for (DType it : {DType::Int32, DType::Int64}) {
    SCOPED_TRACE(name(it));
    expect_same([&](Outs& o) {
      Tensor table = input(DType::Float32, {3000, 64}, 1);
      Tensor rows = indices(it, {2048}, 3000, 2);  // repeats: 2048 draws of 3000
      o.exact("index_select rows", index_select(table, 0, rows));
      o.exact("embedding", embedding(reshape(rows, {4, 512}), table));
      Tensor cube = input(DType::Float64, {64, 300, 8}, 3);
      o.exact("index_select middle", index_select(cube, 1, indices(it, {500}, 300, 4)));
      o.exact("index_select last", index_select(cube, 2, indices(it, {40}, 8, 5)));
      Tensor wide = input(DType::Float32, {512, 300}, 6);
      o.exact("gather 1", gather(wide, 1, indices(it, {512, 200}, 300, 7)));
      o.exact("gather 0 smaller", gather(wide, 0, indices(it, {400, 250}, 512, 8)));
      Tensor halves = input(DType::BFloat16, {256, 600}, 9);
      o.exact("gather bf16", gather(halves, 1, indices(it, {256, 600}, 600, 10)));
      Tensor flags = input(DType::Bool, {300, 700}, 11);
      o.exact("index_select bool", index_select(flags, 0, indices(it, {400}, 300, 12)));
      // Repeated indices add in order of j: each destination element sums in the
      // reference's order, whichever task owns it.
      for (DType dt : {DType::Float32, DType::Float64}) {
        Tensor base = input(dt, {1000, 100}, 13);  // ragged: 100 columns, tasks of 16
        o.exact("index_add columns " + std::string(name(dt)),
                index_add(base, 0, indices(it, {3000}, 1000, 14), input(dt, {3000, 100}, 15)));
        Tensor tall = input(dt, {4096, 50}, 16);
        o.exact("index_add last axis " + std::string(name(dt)),
                index_add(tall, 1, indices(it, {90}, 50, 17), input(dt, {4096, 90}, 18)));
        Tensor mid = input(dt, {16, 100, 40}, 19);
        o.exact("index_add middle " + std::string(name(dt)),
                index_add(mid, 1, indices(it, {300}, 100, 20), input(dt, {16, 300, 40}, 21)));
        // A computed base read last by the index_add: added into in place. One read after it
        // too: copied first, and that reader still sees the base.
        Tensor ids = indices(it, {700}, 500, 22);
        Tensor src = input(dt, {700, 96}, 23);
        o.exact("index_add into zeros " + std::string(name(dt)),
                index_add(zeros({500, 96}, dt), 0, ids, src));
        Tensor twice = base * 2.0;
        o.exact("index_add into a computed base " + std::string(name(dt)),
                index_add(twice, 0, indices(it, {3000}, 1000, 14), input(dt, {3000, 100}, 15)));
        Tensor shared = mid * 3.0;
        o.exact("index_add into a base read later " + std::string(name(dt)),
                index_add(shared, 1, indices(it, {300}, 100, 20), input(dt, {16, 300, 40}, 21)));
        o.exact("the base read later " + std::string(name(dt)), shared + 1.0);
      }
    });
  }
}

// Index steps run on the step graph too (a small program, every step one task): the same
// values as the reference, and a gather feeding a loss's gradient (cross entropy).
TEST_F(CpuIndex, SmallProgramsOnTheStepGraphMatchTheReference) {
  const cpu::StepGraphMode saved = cpu::step_graph_mode();
  cpu::set_step_graph(cpu::StepGraphMode::Always);
  expect_same([&](Outs& o) {
    Tensor logits = input(DType::Float32, {64, 10}, 30).requires_grad_();
    Tensor labels = indices(DType::Int64, {64}, 10, 31);
    Tensor loss = cross_entropy(logits, labels);
    loss.backward();
    o.trans("loss", loss);
    o.trans("grad", logits.grad());
    Tensor table = input(DType::Float64, {20, 8}, 32).requires_grad_();
    Tensor ids = indices(DType::Int32, {5, 3}, 20, 33);
    sum(embedding(ids, table) * input(DType::Float64, {5, 3, 8}, 34)).backward();
    o.exact("embedding grad", table.grad());
  });
  cpu::set_step_graph(saved);
}

// index_add inside a scan body (the native loop's region runs the index step on its frame),
// with a carry and repeated indices.
TEST_F(CpuIndex, IndexAddInAScanBodyMatchesTheReference) {
  expect_same([&](Outs& o) {
    Tensor rows = input(DType::Float32, {6, 4, 16}, 40);
    Tensor ids = indices(DType::Int64, {6, 4}, 10, 41);
    auto [acc, seen] = scan(
        [](const Tensor& c, const std::vector<Tensor>& x) {
          Tensor next = index_add(c, 0, x[1], x[0]);
          return std::pair{next, index_select(next, 0, x[1])};
        },
        zeros({10, 16}), std::vector<Tensor>{rows, ids});
    o.exact("acc", acc);
    o.exact("seen", seen);
  });
}

// A bad index raises the reference's ExecError, word for word, on the CPU backend, whatever
// the index dtype, the op and the step's size.
TEST_F(CpuIndex, AnIndexOutOfRangeRaisesTheReferencesError) {
  auto message = [](const std::string& backend, const std::function<Tensor()>& f) {
    runtime::set_backend(backend);
    std::string what;
    try {
      f().to_vector<double>();
    } catch (const ExecError& e) {
      what = e.what();
    }
    sync();
    return what;
  };
  const std::vector<std::pair<std::string, std::function<Tensor()>>> cases = {
      {"gather negative int32",
       [] { return gather(zeros({3, 4}), 1, from_ints(DType::Int32, {3, 1}, {0, -1, 2})); }},
      {"index_select past the end",
       [] { return index_select(zeros({300, 512}), 0, from_ints(DType::Int64, {2}, {5, 300})); }},
      {"index_add big",
       [] {
         return index_add(zeros({1000, 128}), 0, from_ints(DType::Int64, {3}, {1, 999, 1000}),
                          ones({3, 128}));
       }},
      {"index_add float64 negative",
       [] {
         return index_add(zeros({4, 2}, DType::Float64), 1, from_ints(DType::Int32, {1}, {-7}),
                          ones({4, 1}, DType::Float64));
       }},
  };
  for (const auto& [what, f] : cases) {
    SCOPED_TRACE(what);
    const std::string want = message("ref", f), got = message("cpu", f);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(got, want);
  }
  runtime::set_backend("ref");
}

// The plan: float index_add, gather and index_select are index steps; an integer index_add
// stays on the reference kernel.
TEST_F(CpuIndex, IndexOpsPlanAsIndexStepsWhereNative) {
  runtime::set_backend("cpu");
  Tensor x = zeros({4, 3}), xi = zeros({4, 3}, DType::Int64);
  Tensor idx = from_ints(DType::Int64, {2}, {1, 3});
  sync();
  auto kinds = [](const std::vector<Tensor>& outs) {
    ir::Graph g = ir::parse(pending_ir(outs));
    passes::default_pipeline().run(g);
    const cpu::Program p = cpu::compile_program(g, /*region=*/false);
    std::vector<cpu::Step::Kind> k;
    for (const cpu::Step& st : p.plan.steps)
      if (st.kind == cpu::Step::Native || st.kind == cpu::Step::Ref) k.push_back(st.kind);
    return k;
  };
  using K = std::vector<cpu::Step::Kind>;
  EXPECT_EQ(kinds({index_select(x, 0, idx) + 1}), K{cpu::Step::Native});
  EXPECT_EQ(kinds({gather(x, 0, reshape(idx, {2, 1})) + 1}), K{cpu::Step::Native});
  EXPECT_EQ(kinds({index_add(x, 0, idx, ones({2, 3})) + 1}), K{cpu::Step::Native});
  EXPECT_EQ(kinds({index_add(xi, 0, idx, ones({2, 3}, DType::Int64)) + 1}), K{cpu::Step::Ref});
  sync();
}

}  // namespace
}  // namespace loom
