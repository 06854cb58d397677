// Diagnostics: recompile explanations, per-name metrics, IR dumps, DOT pictures and the
// Chrome-trace profile.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "loom/core/profile.h"
#include "loom/loom.h"
#include "loom/runtime/engine.h"

namespace {

using namespace loom;
namespace fs = std::filesystem;

Tensor filled(int64_t rows, int64_t cols, double v = 1.0) {
  return tensor(std::vector<float>(static_cast<size_t>(rows * cols), static_cast<float>(v)),
                {rows, cols});
}

// The explanations recorded since `before` for graph `name`.
std::vector<RecompileReason> reasons_for(const std::string& name) {
  std::vector<RecompileReason> out;
  for (auto& r : recompile_reasons())
    if (r.graph == name) out.push_back(r);
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("loom_diag_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

class DiagnosticsTest : public ::testing::Test {
 protected:
  void SetUp() override { reset_metrics(); }
};

TEST_F(DiagnosticsTest, ChangedBatchSizeNamesTheInputAndBothShapes) {
  GraphName name("diag_batch");
  for (int64_t batch : {4, 4, 8}) {
    Tensor y = relu(filled(batch, 8)) * 2.0;
    loom::sync();
  }
  auto rs = reasons_for("diag_batch");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, RecompileReason::Kind::InputType);
  EXPECT_EQ(rs[0].input, 0);
  EXPECT_EQ(rs[0].before, "f32[4,8]");
  EXPECT_EQ(rs[0].after, "f32[8,8]");
  EXPECT_EQ(rs[0].compile, 2);
  EXPECT_NE(rs[0].message.find("input 0 changed shape: f32[4,8] -> f32[8,8]"), std::string::npos)
      << rs[0].message;
}

TEST_F(DiagnosticsTest, ChangedDtypeSaysDtype) {
  GraphName name("diag_dtype");
  {
    Tensor y = exp(filled(2, 3));
    loom::sync();
  }
  {
    Tensor y = exp(tensor(std::vector<double>(6, 1.0), {2, 3}));
    loom::sync();
  }
  auto rs = reasons_for("diag_dtype");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, RecompileReason::Kind::InputType);
  EXPECT_NE(rs[0].message.find("input 0 changed dtype: f32[2,3] -> f64[2,3]"), std::string::npos)
      << rs[0].message;
}

TEST_F(DiagnosticsTest, ChangedStaticArgumentOfAssumePure) {
  auto scale = assume_pure([](const Tensor& a, double c) { return a * c; });
  GraphName name("diag_static");
  Tensor x = filled(3, 3);
  for (double c : {2.0, 2.0, 3.0}) {
    Tensor y = scale(x, c);
    loom::sync();
  }
  auto rs = reasons_for("diag_static");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, RecompileReason::Kind::StaticArgument);
  EXPECT_EQ(rs[0].before, "2");
  EXPECT_EQ(rs[0].after, "3");
  EXPECT_NE(rs[0].message.find("static argument 1 changed: 2 -> 3"), std::string::npos)
      << rs[0].message;
  EXPECT_NE(rs[0].message.find("diagnostics_test.cpp"), std::string::npos) << rs[0].message;
}

// A compiled step's arguments are trees: the explanation names the leaf by its tree path.
TEST_F(DiagnosticsTest, ChangedBatchOfACompiledStepNamesTheTreePath) {
  for (bool trace_once : {false, true}) {
    SCOPED_TRACE(trace_once);
    const std::string name = trace_once ? "diag_step_once" : "diag_step";
    auto step = loom::compile(
        [](const std::map<std::string, Tensor>& batch, const Tensor& w) {
          return loom::sum(matmul(batch.at("x"), w)) + loom::sum(batch.at("y"));
        },
        {.name = name, .trace_once = trace_once});
    Tensor w = filled(8, trace_once ? 3 : 2);  // graphs the other run has not compiled
    for (int64_t b : {4, 4, 6}) {
      Tensor loss =
          step(std::map<std::string, Tensor>{{"x", filled(b, 8)}, {"y", filled(3, 1)}}, w);
      loom::sync();
    }
    auto rs = reasons_for(name);
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_EQ(rs[0].kind, RecompileReason::Kind::InputType);
    EXPECT_EQ(rs[0].path, "args[0]['x']");
    EXPECT_EQ(rs[0].before, "f32[4,8]");
    EXPECT_EQ(rs[0].after, "f32[6,8]");
    EXPECT_NE(rs[0].message.find("step '" + name +
                                 "' re-traced: args[0]['x'] changed shape: f32[4,8] -> f32[6,8]"),
              std::string::npos)
        << rs[0].message;
  }
}

TEST_F(DiagnosticsTest, AssumePureNamesTheTreePathAndRequiresGrad) {
  auto f =
      assume_pure([](const Tensor& a, const std::vector<Tensor>& bs) { return a + bs[0] + bs[1]; });
  GraphName name("diag_pure_path");
  Tensor a = filled(2, 2);
  {
    Tensor y = f(a, std::vector<Tensor>{filled(2, 2), filled(2, 2)});
    loom::sync();
  }
  {
    Tensor y = f(a, std::vector<Tensor>{filled(2, 2), tensor(std::vector<double>(4, 1.0), {2, 2})});
    loom::sync();
  }
  {
    Tensor g = filled(2, 2);
    g.requires_grad_();
    loom::sum(f(g, std::vector<Tensor>{filled(2, 2), filled(2, 2)})).backward();
    loom::sync();
  }
  auto rs = reasons_for("diag_pure_path");
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].path, "args[1][1]");
  EXPECT_NE(rs[0].message.find("args[1][1] changed dtype: f32[2,2] -> f64[2,2]"), std::string::npos)
      << rs[0].message;
  EXPECT_NE(rs[1].message.find("args[0] changed requires_grad: false -> true"), std::string::npos)
      << rs[1].message;
}

TEST_F(DiagnosticsTest, ExtraOpNamesTheFirstDifferingOp) {
  GraphName name("diag_extra");
  Tensor x = filled(4, 4);
  {
    Tensor y = relu(x);
    loom::sync();
  }
  {
    Tensor y = exp(relu(x));
    loom::sync();
  }
  auto rs = reasons_for("diag_extra");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, RecompileReason::Kind::Graph);
  EXPECT_NE(rs[0].message.find("first differing op"), std::string::npos) << rs[0].message;
  EXPECT_NE(rs[0].after.find("exp("), std::string::npos) << rs[0].after;
  EXPECT_NE(rs[0].before.find("return"), std::string::npos) << rs[0].before;
}

TEST_F(DiagnosticsTest, SameGraphAfterClearingTheCacheSaysEvicted) {
  GraphName name("diag_evicted");
  Tensor x = filled(2, 2);
  for (int i = 0; i < 2; ++i) {
    Tensor y = sin(x);
    loom::sync();
    runtime::clear_compile_cache();
  }
  auto rs = reasons_for("diag_evicted");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, RecompileReason::Kind::Evicted);
  EXPECT_NE(rs[0].message.find("left the compile cache"), std::string::npos) << rs[0].message;
}

TEST_F(DiagnosticsTest, CallSiteNamesTheGraphWithoutGraphName) {
  Tensor x = filled(5, 2);
  Tensor y = sqrt(x);
  loom::sync();
  const int line = __LINE__ - 1;
  bool found = false;
  for (const auto& g : graph_metrics())
    found |= g.name == "diagnostics_test.cpp:" + std::to_string(line);
  EXPECT_TRUE(found);
}

TEST_F(DiagnosticsTest, MetricsPerGraphNameCountsAndBytes) {
  Tensor x = filled(4, 8);
  GraphName name("diag_metrics2");
  for (int i = 0; i < 5; ++i) {
    Tensor y = relu(x);
    loom::sync();
  }
  GraphMetrics m;
  for (const auto& g : graph_metrics())
    if (g.name == "diag_metrics2") m = g;
  EXPECT_EQ(m.syncs, 5);
  EXPECT_EQ(m.compiles + m.disk_hits, 1);
  EXPECT_EQ(m.cache_hits, 4);
  EXPECT_EQ(m.bytes_in, 5 * 4 * 8 * 4);
  EXPECT_EQ(m.bytes_out, 5 * 4 * 8 * 4);
  EXPECT_GT(m.compile_seconds, 0);
  EXPECT_GT(m.execute_seconds, 0);
  EXPECT_FALSE(m.recompiling);
  std::string report = metrics_report();
  EXPECT_NE(report.find("diag_metrics2"), std::string::npos) << report;
}

TEST_F(DiagnosticsTest, WarnsWhenANameCompilesAgainAndAgain) {
  GraphName name("diag_storm");
  for (int i = 0; i < 12; ++i) {
    Tensor y = relu(filled(1 + i, 3));
    loom::sync();
  }
  GraphMetrics m;
  for (const auto& g : graph_metrics())
    if (g.name == "diag_storm") m = g;
  EXPECT_EQ(m.syncs, 12);
  EXPECT_TRUE(m.recompiling);
  std::string report = metrics_report();
  EXPECT_NE(report.find("WARNING: graph 'diag_storm'"), std::string::npos) << report;
  EXPECT_NE(report.find("input type"), std::string::npos) << report;
  EXPECT_EQ(metrics().recompiles, 11);
}

TEST_F(DiagnosticsTest, GraphNameRejectsAnEmptyName) { EXPECT_THROW(GraphName(""), Error); }

// DOT: a digraph with one node per IR node and one edge per operand.
TEST(DotTest, OneNodePerIrNodeAndOneEdgePerOperand) {
  ir::Graph g = ir::parse(R"(graph(%0: f32[4,8], %1: f32[8]) {
  %2 = expand(%1) {shape=[4,8]} : f32[4,8]
  %3 = add(%0, %2) : f32[4,8]
  %4 = reduce_sum(%3) {axes=[1], keepdim=false} : f32[4]
  return %4, %3
}
)");
  std::string dot = ir::to_dot(g);
  ASSERT_EQ(dot.rfind("digraph loom {", 0), 0u) << dot;
  EXPECT_EQ(dot.substr(dot.size() - 2), "}\n");
  std::regex node_re(R"(^\s*n(\d+) \[label="[^"]*")");
  std::regex edge_re(R"(^\s*n(\d+) -> n(\d+))");
  std::set<int> nodes;
  int edges = 0;
  std::istringstream lines(dot);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, edge_re)) {
      ++edges;
      EXPECT_LT(std::stoi(m[1]), std::stoi(m[2])) << line;  // operands come first
    } else if (std::regex_search(line, m, node_re)) {
      EXPECT_TRUE(nodes.insert(std::stoi(m[1])).second) << "node twice: " << line;
    }
  }
  EXPECT_EQ(nodes.size(), g.size());
  size_t operands = 0;
  for (const auto& n : g.nodes()) operands += n.operands.size();
  EXPECT_EQ(static_cast<size_t>(edges), operands);
  EXPECT_NE(dot.find("reduce_sum {axes=[1], keepdim=false}\\nf32[4]"), std::string::npos) << dot;
  EXPECT_EQ(std::count(dot.begin(), dot.end(), '{'), std::count(dot.begin(), dot.end(), '}'));
}

TEST(DumpTest, EachCompiledGraphGetsItsFiles) {
  fs::path dir = fresh_dir("dump");
  runtime::set_dump_ir_dir(dir.string());
  {
    GraphName name("diag_dump");
    Tensor y = tanh(filled(3, 7)) * 3.0;
    loom::sync();
  }
  runtime::set_dump_ir_dir("");
  std::map<std::string, fs::path> by_suffix;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string f = e.path().filename().string();
    by_suffix[f.substr(f.find('.'))] = e.path();
  }
  ASSERT_TRUE(by_suffix.count(".before.ir")) << dir;
  ASSERT_TRUE(by_suffix.count(".after.ir"));
  ASSERT_TRUE(by_suffix.count(".dot"));
  ASSERT_TRUE(by_suffix.count(".00_input.ir"));
  ir::Graph before = ir::parse(read_file(by_suffix[".before.ir"]));  // '#' lines are comments
  EXPECT_NO_THROW(ir::parse(read_file(by_suffix[".after.ir"])));
  std::string dot = read_file(by_suffix[".dot"]);
  EXPECT_EQ(dot.rfind("digraph loom {", 0), 0u);
  size_t labels = 0;  // node lines: `  n<id> [label=...`; edges read `n<a> -> n<b>`
  std::istringstream lines(dot);
  for (std::string line; std::getline(lines, line);)
    labels += std::regex_search(line, std::regex(R"(^\s*n\d+ \[label=)"));
  EXPECT_EQ(labels, before.size());  // one picture node per node of the graph as cut
  EXPECT_NE(dot.find("tanh"), std::string::npos);
  fs::remove_all(dir);
}

// ---- a minimal JSON reader for the profile --------------------------------------------------

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;
  const Json* get(const std::string& k) const {
    for (const auto& [key, v] : fields)
      if (key == k) return &v;
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Json parse_document() {
    Json v = value();
    ws();
    if (p_ != s_.size()) throw std::runtime_error("trailing characters at " + std::to_string(p_));
    return v;
  }

 private:
  void ws() {
    while (p_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[p_]))) ++p_;
  }
  void expect(char c) {
    ws();
    if (p_ >= s_.size() || s_[p_] != c)
      throw std::runtime_error(std::string("expected '") + c + "' at " + std::to_string(p_));
    ++p_;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (p_ < s_.size() && s_[p_] != '"') {
      if (s_[p_] == '\\') {
        ++p_;
        if (s_[p_] == 'u')
          p_ += 4, out += '?';
        else
          out += s_[p_];
        ++p_;
      } else {
        out += s_[p_++];
      }
    }
    expect('"');
    return out;
  }
  Json value() {
    ws();
    Json v;
    if (p_ >= s_.size()) throw std::runtime_error("unexpected end");
    char c = s_[p_];
    if (c == '{') {
      v.kind = Json::Object;
      ++p_;
      ws();
      if (s_[p_] == '}') return ++p_, v;
      for (;;) {
        std::string k = string();
        expect(':');
        v.fields.emplace_back(k, value());
        ws();
        if (s_[p_] == ',') {
          ++p_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      ++p_;
      ws();
      if (s_[p_] == ']') return ++p_, v;
      for (;;) {
        v.items.push_back(value());
        ws();
        if (s_[p_] == ',') {
          ++p_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Json::String;
      v.str = string();
      return v;
    }
    if (s_.compare(p_, 4, "true") == 0) return p_ += 4, v.kind = Json::Bool, v.num = 1, v;
    if (s_.compare(p_, 5, "false") == 0) return p_ += 5, v.kind = Json::Bool, v;
    if (s_.compare(p_, 4, "null") == 0) return p_ += 4, v;
    size_t used = 0;
    v.kind = Json::Number;
    v.num = std::stod(s_.substr(p_, 40), &used);
    p_ += used;
    return v;
  }
  const std::string& s_;
  size_t p_ = 0;
};

TEST(ProfileTest, ChromeTraceHasCompileExecuteKernelAndMatmulEventsAcrossThreads) {
  if (runtime::current_backend().name() != "cpu") GTEST_SKIP() << "kernel events come from cpu";
  fs::path file = fresh_dir("profile").string() + ".json";
  profile::start(file.string());
  {
    GraphName name("diag_profile");
    Tensor a = filled(256, 512, 0.5), b = filled(512, 256, 0.25);
    Tensor y = softmax(matmul(a, b) * 0.125, 1) + tanh(filled(256, 256, 0.3));
    // A kernel long enough (about 4M elements) that the pool's workers take part, however slow
    // the build (sanitizers): the caller alone would otherwise finish short ones. Run eight
    // times: with another test process busy on the other core (ctest -j), a worker can be
    // scheduled only after the caller has taken every chunk of one run.
    loom::sync();
    for (int i = 0; i < 8; ++i) {
      Tensor big = tanh(filled(2048, 2048, 0.3)) * 2.0;
      loom::sync();
      EXPECT_GT(sum(big).item<float>(), 0);
    }
    EXPECT_GT(sum(y).item<float>(), 0);
  }
  ASSERT_TRUE(profile::flush());
  profile::stop();
  EXPECT_FALSE(profile::enabled());
  Json doc = JsonParser(read_file(file)).parse_document();
  ASSERT_EQ(doc.kind, Json::Object);
  const Json* events = doc.get("traceEvents");
  ASSERT_NE(events, nullptr);
  ASSERT_EQ(events->kind, Json::Array);
  std::map<std::string, int> by_cat;
  std::set<double> kernel_tids;
  bool compile_named = false;
  for (const Json& e : events->items) {
    ASSERT_EQ(e.kind, Json::Object);
    const Json* ph = e.get("ph");
    ASSERT_NE(ph, nullptr);
    ASSERT_NE(e.get("pid"), nullptr);
    ASSERT_NE(e.get("tid"), nullptr);
    if (ph->str != "X") continue;
    ASSERT_NE(e.get("ts"), nullptr);
    ASSERT_NE(e.get("dur"), nullptr);
    EXPECT_GE(e.get("dur")->num, 0);
    std::string cat = e.get("cat")->str;
    by_cat[cat]++;
    if (cat == "kernel" || cat == "matmul") kernel_tids.insert(e.get("tid")->num);
    if (cat == "compile" && e.get("name")->str == "compile diag_profile") compile_named = true;
  }
  EXPECT_TRUE(compile_named);
  EXPECT_GE(by_cat["kernel"], 1);
  EXPECT_GE(by_cat["matmul"], 1);
  EXPECT_GE(by_cat["execute"], 2);
  EXPECT_GE(by_cat["sync"], 2);
  EXPECT_GE(by_cat["trace"], 1);
  const char* threads = std::getenv("LOOM_NUM_THREADS");
  if (std::thread::hardware_concurrency() > 1 && !(threads && std::atoi(threads) == 1)) {
    EXPECT_GE(kernel_tids.size(), 2u) << "kernels and products run on the pool's threads too";
  }
  fs::remove(file);
}

}  // namespace

namespace {

// A dict key with ':' and ',' in it: the path comes from the arguments, not from parsing the
// signature's structure text back (which gave up and numbered the leaves).
TEST_F(DiagnosticsTest, TreePathOfAnOddDictKey) {
  auto step = loom::compile(
      [](const std::map<std::string, Tensor>& batch) { return loom::sum(batch.at("x:1,2")); },
      {.name = "diag_odd_key"});
  for (int64_t b : {4, 6}) {
    Tensor loss = step(std::map<std::string, Tensor>{{"x:1,2", filled(b, 8)}});
    loom::sync();
  }
  auto rs = reasons_for("diag_odd_key");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].path, "args[0]['x:1,2']");
  EXPECT_NE(rs[0].message.find("args[0]['x:1,2'] changed shape: f32[4,8] -> f32[6,8]"),
            std::string::npos)
      << rs[0].message;
}

// A graph with 1400 inputs that gains one: the explanation names the first differing input,
// not the 30 KB header line.
TEST_F(DiagnosticsTest, HeaderDifferenceNamesTheFirstDifferingInput) {
  GraphName name("diag_many_inputs");
  Tensor x = filled(1, 4);
  for (int n : {1400, 1401}) {
    Tensor y = x;
    for (int i = 0; i < n; ++i) y = y + static_cast<double>(i);
    loom::sync();
  }
  auto rs = reasons_for("diag_many_inputs");
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].kind, RecompileReason::Kind::Graph);
  EXPECT_LT(rs[0].message.size(), 300u) << rs[0].message.substr(0, 300);
  EXPECT_NE(rs[0].message.find("first differing input 1401 `(none)` became `%1401: f32[]`"),
            std::string::npos)
      << rs[0].message.substr(0, 300);
  EXPECT_EQ(rs[0].input, 1401);
  EXPECT_EQ(rs[0].before, "(none)");
  EXPECT_EQ(rs[0].after, "%1401: f32[]");
}

TEST(FirstDifference, StructuredResult) {
  ir::Graph a = ir::parse(R"(graph(%0: f32[4], %1: f32[4]) {
  %2 = add(%0, %1) : f32[4]
  return %2
})");
  ir::Graph b = ir::parse(R"(graph(%0: f32[4], %1: f32[4]) {
  %2 = mul(%0, %1) : f32[4]
  return %2
})");
  ir::Graph c = ir::parse(R"(graph(%0: f32[4], %1: f32[8]) {
  %2 = reduce_sum(%1) {axes=[0], keepdim=false} : f32[]
  return %2
})");
  EXPECT_FALSE(ir::first_difference(a, a));
  EXPECT_EQ(ir::first_difference(a, a).str(), "");
  ir::GraphDifference d = ir::first_difference(a, b);
  EXPECT_EQ(d.kind, ir::GraphDifference::Kind::Node);
  EXPECT_EQ(d.index, 2);
  EXPECT_EQ(d.before, "%2 = add(%0, %1) : f32[4]");
  EXPECT_EQ(d.after, "%2 = mul(%0, %1) : f32[4]");
  EXPECT_EQ(d.str(), "`%2 = add(%0, %1) : f32[4]` became `%2 = mul(%0, %1) : f32[4]`");
  d = ir::first_difference(a, c);
  EXPECT_EQ(d.kind, ir::GraphDifference::Kind::Parameter);
  EXPECT_EQ(d.index, 1);
  EXPECT_EQ(d.before, "%1: f32[4]");
  EXPECT_EQ(d.after, "%1: f32[8]");
}

}  // namespace
