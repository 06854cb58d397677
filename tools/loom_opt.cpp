// loom-opt: runs passes over IR text, for pass development and tests by hand.
//
//   loom-opt [--passes=dce,cse,simplify] [--fingerprint] [--dot] [FILE|-]
//
// Reads IR text (docs/ir.md) from FILE or stdin, runs the named passes in order (verifying
// between them), and prints the resulting IR; --fingerprint adds a "# fingerprint: <hex>"
// comment line, so the output still parses; --dot prints a Graphviz picture of the result
// instead of its text (`loom-opt --dot g.ir | dot -Tsvg > g.svg`). Parse errors print
// "file:line:col: message".
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include "loom/core/error.h"
#include "loom/ir/graph.h"
#include "loom/passes/pass.h"

namespace {

constexpr const char* kUsage =
    "usage: loom-opt [--passes=dce,cse,simplify] [--fingerprint] [--dot] [FILE|-]\n";

struct Options {
  std::string passes;
  bool fingerprint = false;
  bool dot = false;
  std::string file = "-";
};

bool parse_args(int argc, char** argv, Options* o) {
  bool have_file = false;
  for (int k = 1; k < argc; ++k) {
    std::string_view a = argv[k];
    if (a.substr(0, 9) == "--passes=") {
      o->passes = std::string(a.substr(9));
    } else if (a == "--fingerprint") {
      o->fingerprint = true;
    } else if (a == "--dot") {
      o->dot = true;
    } else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if ((a == "-" || a.substr(0, 1) != "-") && !have_file) {
      o->file = std::string(a);
      have_file = true;
    } else {
      return false;
    }
  }
  return true;
}

bool read_input(const std::string& file, std::string* text) {
  std::ostringstream ss;
  if (file == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) return false;
    ss << in.rdbuf();
  }
  *text = ss.str();
  return true;
}

loom::passes::Pipeline make_pipeline(const std::string& list) {
  loom::passes::Pipeline p;
  size_t start = 0;
  while (start <= list.size() && !list.empty()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    p.add(loom::passes::make_pass(std::string_view(list).substr(start, comma - start)));
    start = comma + 1;
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse_args(argc, argv, &opt)) {
    std::cerr << kUsage;
    return 2;
  }
  std::string text;
  const std::string shown = opt.file == "-" ? "<stdin>" : opt.file;
  if (!read_input(opt.file, &text)) {
    std::cerr << "loom-opt: cannot read " << shown << "\n";
    return 1;
  }
  try {
    loom::passes::Pipeline pipeline = make_pipeline(opt.passes);
    loom::ir::Graph g = loom::ir::parse(text);
    pipeline.run(g);
    if (opt.dot) {
      std::cout << loom::ir::to_dot(g);
      return 0;
    }
    std::cout << loom::ir::to_text(g);
    if (opt.fingerprint) std::cout << "# fingerprint: " << loom::ir::fingerprint(g).hex() << "\n";
  } catch (const loom::ParseError& e) {
    std::cerr << shown << ":" << e.what() << "\n";
    return 1;
  } catch (const loom::Error& e) {
    std::cerr << "loom-opt: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
