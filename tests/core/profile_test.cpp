// The Chrome trace is JSON that Python's json module reads (an independent parser), whatever
// bytes the event and thread names hold: quotes, backslashes, control characters, UTF-8, and
// bytes that are not UTF-8 (replaced by U+FFFD).
#include "loom/core/profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace loom;

std::string hex(const std::string& s) {
  std::string r;
  char b[3];
  for (unsigned char c : s) {
    std::snprintf(b, sizeof b, "%02x", c);
    r += b;
  }
  return r;
}

std::vector<std::string> run_lines(const std::string& cmd) {
  std::vector<std::string> out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  std::string line;
  while (std::fgets(buf, sizeof buf, p)) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      out.push_back(line);
      line.clear();
    }
  }
  ::pclose(p);
  return out;
}

TEST(ProfileJsonTest, NamesNeedingEscapesGiveATracePythonParses) {
  const std::string file =
      (fs::temp_directory_path() / ("loom_profile_json_" + std::to_string(::getpid()) + ".json"))
          .string();
  const std::string odd = "q\"uote b\\ack tab\t nl\n ctl\x01 caf\xc3\xa9 \xf0\x9f\x99\x82";
  const std::string invalid = std::string("bad\xff") + "end";
  profile::start(file);
  double t = profile::now_us();
  profile::record("test", odd, t, t + 1, "\"k\": \"v\\\"w\", \"n\": 3");
  profile::record("test", invalid, t, t + 2);
  std::thread([&] {
    profile::name_thread("worker \"x\"\n");
    profile::record("test", "w", t, t + 1);
  }).join();
  ASSERT_TRUE(profile::flush());
  profile::stop();
  // One line per test event: hex(name) hex(args.k or '-') args.n; and the thread names.
  const std::string py =
      "import json,sys\n"
      "d=json.load(open(sys.argv[1],encoding='utf-8'))\n"
      "for e in d['traceEvents']:\n"
      "  a=e.get('args',{})\n"
      "  if e.get('cat')=='test': print('E',e['name'].encode().hex(),a.get('k','-').encode().hex(),"
      "a.get('n','-'))\n"
      "  if e.get('name')=='thread_name': print('T',a['name'].encode().hex())\n";
  const std::string script = file + ".py";
  {
    FILE* f = std::fopen(script.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(py.c_str(), f);
    std::fclose(f);
  }
  std::vector<std::string> lines = run_lines("python3 '" + script + "' '" + file + "' 2>&1");
  fs::remove(file);
  fs::remove(script);
  auto has = [&](const std::string& l) {
    return std::find(lines.begin(), lines.end(), l) != lines.end();
  };
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  EXPECT_TRUE(has("E " + hex(odd) + " " + hex("v\"w") + " 3")) << all;
  EXPECT_TRUE(has("E " + hex(std::string("bad\xef\xbf\xbd") + "end") + " " + hex("-") + " -"))
      << all;
  EXPECT_TRUE(has("T " + hex("worker \"x\"\n"))) << all;
}

TEST(ProfileJsonTest, JsonQuoteEscapesAndReplacesInvalidUtf8) {
  EXPECT_EQ(profile::json_quote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  EXPECT_EQ(profile::json_quote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");
  EXPECT_EQ(profile::json_quote("x\xff"), "\"x\xef\xbf\xbd\"");
}

}  // namespace
