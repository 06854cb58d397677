// mark_sharding and the partitioner: every sharded program's values and gradients equal the
// single-process program's (the same program with no annotations, run on one rank), and the
// collectives it inserts are the closed-form ones (a column-parallel product none, a row-
// parallel one one all_reduce of the output's size). Ranks as threads, 2 and 4.
#include <gtest/gtest.h>

#include <cmath>

#include "dist/dist_util.h"
#include "loom/ir/graph.h"
#include "loom/loom.h"
#include "loom/passes/partition.h"

namespace loom {
namespace {

using testing::expect_close;
using testing::host;

using dist::Mesh;
using dist::ShardSpec;

// Runs fn on n in-process ranks; fails the test with each rank's exception.
void ranks(int n, const std::function<void(int)>& fn) {
  auto errors = dist::run_in_process(n, fn);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

// An MLP with its weights annotated Megatron-style: up split by rows (column parallel), down
// by columns (row parallel); x [batch, d].
struct Mlp {
  Tensor up, down, bu, bd;
  Mlp(int64_t d, double seed) {
    up = host({4 * d, d}, seed);
    down = host({d, 4 * d}, seed + 1);
    bu = host({4 * d}, seed + 2);
    bd = host({d}, seed + 3);
    for (Tensor* t : {&up, &down, &bu, &bd}) t->requires_grad_(true);
  }
  Tensor operator()(const Tensor& x) const {
    return matmul(gelu(matmul(x, transpose(up, 0, 1)) + bu), transpose(down, 0, 1)) + bd;
  }
};

TEST(ShardingTest, MegatronMlpMatchesTheUnshardedProgram) {
  const int64_t d = 8;
  Tensor x = host({6, d}, 0.3);
  Mlp ref(d, 1.0);
  Tensor y_ref = ref(x);
  Tensor loss_ref = sum(y_ref * y_ref);
  loss_ref.backward();
  loom::sync();
  for (int n : {2, 4}) {
    ranks(n, [&](int) {
      Mlp m(d, 1.0);
      Mesh mesh({n}, {"model"});
      dist::mark_sharding(m.up, mesh, {{"model"}, {}});
      dist::mark_sharding(m.bu, mesh, {{"model"}});
      dist::mark_sharding(m.down, mesh, {{}, {"model"}});
      EXPECT_EQ(dist::sharding_of(m.up).value_or(""), "mesh=[" + std::to_string(n) + "] (0, None)");
      Tensor xl = host({6, d}, 0.3);
      Tensor y = m(xl);
      Tensor loss = sum(y * y);
      loss.backward();
      expect_close(y, y_ref, "y");
      expect_close(m.up.grad(), ref.up.grad(), "up.grad");
      expect_close(m.down.grad(), ref.down.grad(), "down.grad");
      expect_close(m.bu.grad(), ref.bu.grad(), "bu.grad");
      expect_close(m.bd.grad(), ref.bd.grad(), "bd.grad");
      // Gradients take their parameters' layouts.
      EXPECT_EQ(dist::sharding_of(m.up.grad()), dist::sharding_of(m.up));
      EXPECT_EQ(dist::sharding_of(m.down.grad()), dist::sharding_of(m.down));
    });
  }
}

TEST(ShardingTest, SgdStepsKeepTheLayoutAndMatch) {
  const int64_t d = 8;
  auto train = [&](Mlp& m, const std::function<void()>& annotate) {
    annotate();
    std::vector<float> losses;
    for (int step = 0; step < 3; ++step) {
      Tensor x = host({4, d}, 0.1 * step);
      Tensor y = m(x);
      Tensor loss = mean(y * y);
      loss.backward();
      {
        NoGradGuard g;
        for (Tensor* p : {&m.up, &m.down, &m.bu, &m.bd}) {
          p->copy_(*p - p->grad() * 0.05);
          p->reset_grad();
        }
      }
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  Mlp ref(d, 2.0);
  const std::vector<float> want = train(ref, [] {});
  loom::sync();
  ranks(2, [&](int) {
    Mlp m(d, 2.0);
    Mesh mesh({2}, {"model"});
    std::vector<float> got = train(m, [&] {
      dist::mark_sharding(m.up, mesh, {{"model"}, {}});
      dist::mark_sharding(m.down, mesh, {{}, {"model"}});
    });
    for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-5 * (1 + want[k]));
    EXPECT_EQ(dist::sharding_of(m.up).value_or(""), "mesh=[2] (0, None)");
    EXPECT_EQ(dist::sharding_of(m.down).value_or(""), "mesh=[2] (None, 0)");
    expect_close(dist::full(m.up), ref.up, "up after 3 steps");
    expect_close(m.down, ref.down, "down after 3 steps (read whole)");
  });
}

TEST(ShardingTest, TwoDimensionalMeshAndPartialReplication) {
  Tensor a = host({8, 12}, 0.5), b = host({12, 4}, 1.5);
  Tensor want = relu(matmul(a, b)) * 2.0;
  loom::sync();
  ranks(4, [&](int) {
    Mesh mesh({2, 2}, {"data", "model"});
    Tensor al = host({8, 12}, 0.5), bl = host({12, 4}, 1.5);
    dist::mark_sharding(al, mesh, {{"data"}, {"model"}});  // rows over data, contraction over model
    dist::mark_sharding(bl, mesh, {{"model"}, {}});        // replicated over data
    Tensor y = relu(matmul(al, bl)) * 2.0;
    expect_close(y, want, "2-d mesh product");
    Tensor c = host({8, 12}, 0.7);
    dist::mark_sharding(c, mesh, {{"data", "model"}, {}});  // one dim over both axes
    expect_close(c * 3.0, host({8, 12}, 0.7) * 3.0, "dim over (data, model)");
    Tensor e = host({4, 6, 8}, 0.9);
    dist::mark_sharding(e, mesh, {{}, {"model"}, {"data"}});
    const Tensor eh = host({4, 6, 8}, 0.9);
    expect_close(sum(e, {2}) + sum(unsqueeze(mean(e, {1}), 1), {2}),
                 sum(eh, {2}) + sum(unsqueeze(mean(eh, {1}), 1), {2}),
                 "3-d reductions over split dims");
  });
}

TEST(ShardingTest, InPlaceAddOnAShardedTensor) {
  ranks(2, [&](int) {
    Mesh mesh({2});
    Tensor w = host({4, 6}, 0.2);
    dist::mark_sharding(w, mesh, {{0}, {}});
    w.add_(host({4, 6}, 0.4));
    expect_close(w, host({4, 6}, 0.2) + host({4, 6}, 0.4), "add_");
    EXPECT_EQ(dist::sharding_of(w).value_or(""), "mesh=[2] (0, None)");
  });
}

TEST(ShardingTest, ReshapesAndPermutesKeepWholeSplitDims) {
  Tensor x = host({4, 6, 8}, 0.6);
  Tensor want =
      sum(permute(reshape(transpose(reshape(x, {4, 48}), 0, 1), {6, 8, 4}), {2, 0, 1}), {1});
  loom::sync();
  ranks(2, [&](int) {
    Tensor xl = host({4, 6, 8}, 0.6);
    dist::mark_sharding(xl, Mesh({2}), {{0}, {}, {}});
    expect_close(
        sum(permute(reshape(transpose(reshape(xl, {4, 48}), 0, 1), {6, 8, 4}), {2, 0, 1}), {1}),
        want, "reshape/permute chain");
  });
}

// Megatron-annotated layers stacked for a scan (the body is partitioned: one all_reduce per
// layer, no gather of the weights) and an assume_pure function over sharded operands.
TEST(ShardingTest, AnnotatedWeightsInsideScanAndAssumePure) {
  using Dict = std::map<std::string, Tensor>;
  const int64_t d = 4, layers = 3;
  auto run = [&](const std::function<void(Tensor&, Tensor&, Tensor&)>& annotate) {
    Tensor up = host({layers, 4 * d, d}, 0.2), down = host({layers, d, 4 * d}, 0.4);
    Tensor a = host({4, 6}, 0.1);
    for (Tensor* t : {&up, &down}) t->requires_grad_(true);
    annotate(up, down, a);
    Tensor x = host({5, d}, 0.9);
    auto [y, ys] = loom::scan(
        [](const Tensor& h, const Dict& w) {
          Tensor u = relu(matmul(h, transpose(w.at("up"), 0, 1)));
          Tensor out = h + matmul(u, transpose(w.at("down"), 0, 1));
          return std::pair{out, sum(out)};
        },
        x, Dict{{"up", up}, {"down", down}});
    Tensor loss = sum(y * y) + sum(ys);
    loss.backward();
    auto f = loom::assume_pure([](const Tensor& a, const Tensor& b) { return tanh(matmul(a, b)); });
    Tensor z = f(a, host({6, 8}, 0.3));
    return std::vector<Tensor>{y, up.grad(), down.grad(), z};
  };
  std::vector<Tensor> want = run([](Tensor&, Tensor&, Tensor&) {});
  loom::sync();
  ranks(2, [&](int) {
    Mesh mesh({2}, {"model"});
    std::vector<Tensor> got = run([&](Tensor& up, Tensor& down, Tensor& a) {
      dist::mark_sharding(up, mesh, {{}, {"model"}, {}});
      dist::mark_sharding(down, mesh, {{}, {}, {"model"}});
      dist::mark_sharding(a, mesh, {{"model"}, {}});  // assume_pure's rows split
    });
    const char* names[] = {"y", "up.grad", "down.grad", "assume_pure"};
    for (size_t k = 0; k < want.size(); ++k) expect_close(got[k], want[k], names[k]);
    EXPECT_EQ(dist::sharding_of(got[1]).value_or(""), "mesh=[2] (None, 0, None)");
    EXPECT_EQ(dist::sharding_of(got[3]).value_or(""), "mesh=[2] (0, None)");  // rows stay split
  });
  // The forward scan alone: its body holds one all_reduce and gathers nothing.
  ranks(2, [&](int) {
    Mesh mesh({2}, {"model"});
    Tensor up = host({layers, 4 * d, d}, 0.2), down = host({layers, d, 4 * d}, 0.4);
    dist::mark_sharding(up, mesh, {{}, {"model"}, {}});
    dist::mark_sharding(down, mesh, {{}, {}, {"model"}});
    auto [y, ys] = loom::scan(
        [](const Tensor& h, const Dict& w) {
          Tensor u = relu(matmul(h, transpose(w.at("up"), 0, 1)));
          return std::pair{h + matmul(u, transpose(w.at("down"), 0, 1)), std::tuple<>{}};
        },
        host({5, d}, 0.9), Dict{{"up", up}, {"down", down}});
    loom::sync();
    const std::string report = dist::sharding_report();
    size_t reduces = 0;
    for (size_t at = 0; (at = report.find("mesh_all_reduce", at)) != std::string::npos; ++at)
      ++reduces;
    EXPECT_EQ(reduces, 1u) << report;
    EXPECT_EQ(report.find("mesh_all_gather"), std::string::npos) << report;
  });
}

// Two backward passes accumulate into the sharded gradient as into the unsharded one.
TEST(ShardingTest, GradientAccumulationEqualsTheUnshardedRun) {
  const int64_t d = 8;
  auto run = [&](Mlp& m) {
    for (int k = 0; k < 2; ++k) {
      Tensor y = m(host({4, d}, 0.5 + k));
      sum(y * y).backward();
    }
  };
  Mlp ref(d, 3.0);
  run(ref);
  loom::sync();
  ranks(2, [&](int) {
    Mlp m(d, 3.0);
    Mesh mesh({2}, {"model"});
    dist::mark_sharding(m.up, mesh, {{"model"}, {}});
    dist::mark_sharding(m.down, mesh, {{}, {"model"}});
    run(m);
    expect_close(m.up.grad(), ref.up.grad(), "accumulated up.grad");
    expect_close(m.down.grad(), ref.down.grad(), "accumulated down.grad");
    expect_close(m.bd.grad(), ref.bd.grad(), "accumulated bd.grad");
    EXPECT_EQ(dist::sharding_of(m.up.grad()), dist::sharding_of(m.up));
  });
}

// mark_sharding on values inside a scan body and an assume_pure body: the bodies are
// partitioned with them, and the results equal the unannotated program's.
TEST(ShardingTest, AnnotationsInsideBodies) {
  const Tensor x0 = host({8, 6}, 0.4), w0 = host({6, 6}, 0.8), xs0 = host({3, 8, 6}, 1.1);
  auto program = [&](const std::function<void(const Tensor&)>& annotate) {
    auto [c, ys] = loom::scan(
        [&](const Tensor& h, const Tensor& x) {
          Tensor z = tanh(matmul(h + x, w0));
          annotate(z);
          return std::pair{z, sum(z, {1})};
        },
        x0, xs0);
    auto f = loom::assume_pure([&](const Tensor& a) {
      Tensor b = a * 2.0;
      annotate(b);
      return sum(exp(b), {0});
    });
    return std::vector<Tensor>{c, ys, f(x0)};
  };
  std::vector<Tensor> want = program([](const Tensor&) {});
  loom::sync();
  ranks(2, [&](int) {
    Mesh mesh({2}, {"rows"});
    std::vector<Tensor> got =
        program([&](const Tensor& t) { dist::mark_sharding(t, mesh, {{"rows"}, {}}); });
    loom::sync();
    EXPECT_NE(dist::sharding_report().find("mesh_"), std::string::npos);
    const char* names[] = {"scan carry", "scan ys", "assume_pure"};
    for (size_t k = 0; k < want.size(); ++k) expect_close(got[k], want[k], names[k]);
  });
}

// The closed-form collective counts, on the partitioner alone.
TEST(ShardingTest, InsertedCollectivesHaveTheClosedFormCounts) {
  auto count = [](const std::string& text, ir::OpKind op) {
    passes::Partitioned p = passes::partition(ir::parse(text));
    int64_t n = 0, bytes = 0;
    for (const passes::InsertedCollective& c : p.collectives)
      if (c.op == op) ++n, bytes += c.bytes;
    return std::pair<int64_t, int64_t>{n, bytes};
  };
  // Column parallel: x replicated, w [out, in] split by rows: y's columns split, no collective.
  const std::string column =
      "graph(%0: f32[6,8], %1: f32[32,8]) {\n"
      "  %2 = shard(%1) {sharding=[1,2,1,0], stored=true} : f32[32,8]\n"
      "  %3 = permute(%2) {perm=[1,0]} : f32[8,32]\n"
      "  %4 = matmul(%0, %3) : f32[6,32]\n"
      "  return %4\n}";
  passes::Partitioned p = passes::partition(ir::parse(column));
  EXPECT_TRUE(p.collectives.empty());
  ASSERT_TRUE(p.outputs[0].has_value());
  EXPECT_EQ(ir::to_string(*p.outputs[0]), "mesh=[2] (None, 0)");
  // Row parallel: w [out, in] split by columns: one all_reduce of the output's size.
  const std::string row =
      "graph(%0: f32[6,32], %1: f32[8,32]) {\n"
      "  %2 = shard(%1) {sharding=[1,2,0,1], stored=true} : f32[8,32]\n"
      "  %3 = permute(%2) {perm=[1,0]} : f32[32,8]\n"
      "  %4 = matmul(%0, %3) : f32[6,8]\n"
      "  return %4\n}";
  EXPECT_EQ(count(row, ir::OpKind::MeshAllReduce), (std::pair<int64_t, int64_t>{1, 6 * 8 * 4}));
  EXPECT_EQ(count(row, ir::OpKind::MeshAllGather).first, 0);
  EXPECT_EQ(count(row, ir::OpKind::MeshSlice).first, 1);  // x's columns: a local slice
  // The row-parallel output scaled by a row-split tensor: the partial sums are resolved into
  // the split rows by one reduce_scatter (no all_reduce, no slice of the output).
  const std::string scattered =
      "graph(%0: f32[6,32], %1: f32[8,32], %2: f32[6,8]) {\n"
      "  %3 = shard(%1) {sharding=[1,2,0,1], stored=true} : f32[8,32]\n"
      "  %4 = shard(%2) {sharding=[1,2,1,0], stored=true} : f32[6,8]\n"
      "  %5 = permute(%3) {perm=[1,0]} : f32[32,8]\n"
      "  %6 = matmul(%0, %5) : f32[6,8]\n"
      "  %7 = mul(%4, %6) : f32[6,8]\n"
      "  return %7\n}";
  EXPECT_EQ(count(scattered, ir::OpKind::MeshReduceScatter),
            (std::pair<int64_t, int64_t>{1, 6 * 8 * 4}));
  EXPECT_EQ(count(scattered, ir::OpKind::MeshAllReduce).first, 0);
}

// A dim moving between mesh axes: one all_to_all of the local block, no gather, no slice; on
// the whole world, on a group of a 2-d mesh, and with a dim that keeps a major axis.
TEST(ShardingTest, ADimMovingBetweenAxesIsOneAllToAll) {
  passes::Partitioned p =
      passes::partition(ir::parse("graph(%0: f32[8,6]) {\n"
                                  "  %1 = shard(%0) {sharding=[1,2,1,0], stored=true} : f32[8,6]\n"
                                  "  %2 = shard(%1) {sharding=[1,2,0,1], stored=false} : f32[8,6]\n"
                                  "  return %2\n}"));
  ASSERT_EQ(p.collectives.size(), 1u);
  EXPECT_EQ(p.collectives[0].op, ir::OpKind::MeshAllToAll);
  EXPECT_EQ(p.collectives[0].bytes, 4 * 6 * 4);  // the local block, sent once
  EXPECT_EQ(ir::to_string(*p.outputs[0]), "mesh=[2] (None, 0)");
  const Tensor want = host({8, 12, 4}, 0.4) * 3.0;
  loom::sync();
  for (int n : {2, 4}) {
    ranks(n, [&](int) {
      Mesh mesh = n == 2 ? Mesh({2}, {"m"}) : Mesh({2, 2}, {"a", "m"});
      Tensor x = host({8, 12, 4}, 0.4);
      dist::mark_sharding(x, mesh, {{"m"}, {}, {}});
      Tensor y = x * 3.0;
      dist::mark_sharding(y, mesh, {{}, {"m"}, {}});
      expect_close(y, want, "rows to columns");
      loom::sync();
      EXPECT_NE(dist::sharding_report().find("mesh_all_to_all"), std::string::npos)
          << dist::sharding_report();
      EXPECT_EQ(dist::sharding_report().find("mesh_all_gather"), std::string::npos)
          << dist::sharding_report();
      if (n != 4) return;
      // dim 0 over (a, m) keeps a and gives m to dim 2.
      Tensor z = host({8, 12, 4}, 0.4);
      dist::mark_sharding(z, mesh, {{"a", "m"}, {}, {}});
      Tensor u = z * 3.0;
      dist::mark_sharding(u, mesh, {{"a"}, {}, {"m"}});
      expect_close(u, want, "(a, m) to a and m");
      loom::sync();
      EXPECT_NE(dist::sharding_report().find("mesh_all_to_all"), std::string::npos)
          << dist::sharding_report();
    });
  }
}

// Backward propagation: an annotation of tanh(w * 2) slices w, so the product and the tanh run
// on blocks (the slice is made for the mul, not for the annotation).
TEST(ShardingTest, AnAnnotationSlicesTheValuesBeforeIt) {
  ir::Graph g = ir::parse(
      "graph(%0: f32[8,6]) {\n"
      "  %1 = constant() {value=2} : f32[]\n"
      "  %2 = mul(%0, %1) : f32[8,6]\n"
      "  %3 = tanh(%2) : f32[8,6]\n"
      "  %4 = shard(%3) {sharding=[1,2,1,0], stored=false} : f32[8,6]\n"
      "  return %4\n}");
  passes::Partitioned p = passes::partition(g);
  ASSERT_EQ(p.collectives.size(), 1u);
  EXPECT_EQ(p.collectives[0].op, ir::OpKind::MeshSlice);
  EXPECT_EQ(p.collectives[0].node, 2u);  // w sliced for the mul
  EXPECT_EQ(ir::to_string(*p.values[2]), "mesh=[2] (0, None)");
  EXPECT_EQ(ir::to_string(*p.values[3]), "mesh=[2] (0, None)");
  ranks(2, [&](int) {
    Tensor w = host({8, 6}, 0.7);
    Tensor y = tanh(w * 2.0);
    dist::mark_sharding(y, Mesh({2}), {{0}, {}});
    expect_close(y, tanh(host({8, 6}, 0.7) * 2.0), "tanh(w * 2) annotated");
  });
}

// Values through reduce_scatter (the whole world, and a group of a 2-d mesh).
TEST(ShardingTest, PartialSumsScatteredIntoSplitRows) {
  const Tensor x = host({8, 12}, 0.3), w = host({6, 12}, 0.6), s = host({8, 6}, 0.9);
  const Tensor want = s * matmul(x, transpose(w, 0, 1));
  loom::sync();
  for (int n : {2, 4}) {
    ranks(n, [&](int) {
      Mesh mesh = n == 2 ? Mesh({2}, {"m"}) : Mesh({2, 2}, {"a", "m"});
      Tensor wl = host({6, 12}, 0.6), sl = host({8, 6}, 0.9);
      dist::mark_sharding(wl, mesh, {{}, {"m"}});  // row parallel over "m"
      dist::mark_sharding(sl, mesh, {{"m"}, {}});  // rows over "m"
      Tensor y = sl * matmul(host({8, 12}, 0.3), transpose(wl, 0, 1));
      loom::sync();
      EXPECT_NE(dist::sharding_report().find("mesh_reduce_scatter"), std::string::npos)
          << dist::sharding_report();
      expect_close(y, want, "scattered partial sums");
    });
  }
}

// from_local: the ranks' blocks make the global value; pieces of different shapes are a
// DistError on every rank.
TEST(ShardingTest, FromLocalJoinsTheRanksBlocksAndRefusesDifferentPieces) {
  ranks(2, [&](int r) {
    Mesh mesh({2}, {"m"});
    Tensor piece = full({2, 3}, static_cast<double>(r + 1));
    Tensor t = dist::from_local(piece, mesh, {{"m"}, {}});
    EXPECT_EQ(t.shape(), (Shape{4, 3}));
    expect_close(dist::full(t), cat({full({2, 3}, 1.0), full({2, 3}, 2.0)}, 0), "joined");
    Tensor odd = full({r + 1, 3}, 1.0);
    EXPECT_THROW(dist::from_local(odd, mesh, {{"m"}, {}}), DistError);
  });
}

// Attributes from outside (parsed IR): a mesh of 2^48 ranks is an Error, not an overflow.
TEST(ShardingTest, HugeMeshesInIrAreErrors) {
  EXPECT_THROW(
      ir::parse("graph(%0: f32[4]) {\n"
                "  %1 = shard(%0) {sharding=[2,16777216,16777216,0], stored=false} : f32[4]\n"
                "  return %1\n}"),
      Error);
  EXPECT_THROW(
      ir::parse("graph(%0: f32[4]) {\n"
                "  %1 = mesh_all_reduce(%0) {mesh=[0,16777216,16777216], group=1} : f32[4]\n"
                "  return %1\n}"),
      Error);
  EXPECT_THROW(Mesh({1 << 20, 1 << 20}), ShapeError);
}

TEST(ShardingTest, BadSpecsAreClearErrors) {
  ranks(2, [&](int) {
    Tensor w = host({4, 6}, 0.2);
    Mesh mesh({2}, {"model"});
    EXPECT_THROW(dist::mark_sharding(w, mesh, {{"model"}}), ShapeError);             // rank
    EXPECT_THROW(dist::mark_sharding(w, mesh, {{"data"}, {}}), ShapeError);          // axis
    EXPECT_THROW(dist::mark_sharding(w, mesh, {{"model"}, {"model"}}), ShapeError);  // twice
    Tensor odd = host({3, 6}, 0.2);
    EXPECT_THROW(dist::mark_sharding(odd, mesh, {{"model"}, {}}), ShapeError);  // divides
    EXPECT_THROW(dist::mark_sharding(w, Mesh({4}), {{0}, {}}), DistError);      // world
    try {
      dist::mark_sharding(odd, mesh, {{"model"}, {}});
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("does not split evenly into 2"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace loom
