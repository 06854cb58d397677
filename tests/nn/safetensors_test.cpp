// safetensors against files made byte by byte here (the layout of the format's spec, and the
// headers the Python `safetensors` package writes), and against Python's json module reading
// the headers loom writes: the cases of the newcomer trial (rows 4-11, defect 4).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "expect_error.h"
#include "loom/loom.h"

namespace {

namespace fs = std::filesystem;
using namespace loom;
using loom::testing::expect_error;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_st_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // u64 little-endian header length, the header bytes, the data bytes.
  std::string raw(const std::string& name, const std::string& header, const std::string& data = "",
                  std::optional<uint64_t> length = std::nullopt) const {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = length.value_or(header.size());
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    f.write(len, 8);
    f << header << data;
    return p;
  }
  // A load that must fail with a loom::Error naming the file and saying `what`.
  void rejects(const std::string& file, const std::vector<std::string>& what) {
    SCOPED_TRACE(file);
    std::vector<std::string> parts{"[load_safetensors]", file};
    parts.insert(parts.end(), what.begin(), what.end());
    expect_error<loom::Error>([&] { nn::load_safetensors(file); }, parts);
  }
  fs::path dir_;
};

std::string f32_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::string entry(const std::string& dtype, const std::string& shape, int64_t b, int64_t e) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

// Row 4 and 5: a header as torch's save_file writes it (serde_json: `"` and `\` escaped,
// control characters as \n or \u0001, other UTF-8 raw), with metadata.
TEST_F(SafetensorsTest, LoadsAPythonWrittenHeaderWithEscapesMetadataAndEveryDtype) {
  std::string h =
      "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"has \\\"quotes\\\" and \\\\ and "
      "\xc3\xa9\",\"nested\":\"{\\\"a\\\": [1,2]}\"},";
  std::string data;
  auto add = [&](const std::string& key, const std::string& dtype, const std::string& shape,
                 const std::string& bytes) {
    h += "\"" + key + "\":" + entry(dtype, shape, data.size(), data.size() + bytes.size()) + ",";
    data += bytes;
  };
  const uint16_t f16[] = {0x7bff, 0x8000, 0x0001, 0xfc00};  // 65504, -0, 2^-24, -inf
  add("f16", "F16", "[4]", std::string(reinterpret_cast<const char*>(f16), 8));
  const uint16_t bf16[] = {0x3f80, 0xc020, 0x7f80};  // 1, -2.5, inf
  add("bf16", "BF16", "[3]", std::string(reinterpret_cast<const char*>(bf16), 6));
  const int64_t i64[] = {INT64_MIN, INT64_MAX, (int64_t{1} << 53) + 1};
  add("i64", "I64", "[3]", std::string(reinterpret_cast<const char*>(i64), 24));
  const int32_t i32[] = {INT32_MIN, 5};
  add("i32", "I32", "[2]", std::string(reinterpret_cast<const char*>(i32), 8));
  add("bool", "BOOL", "[3]", std::string("\x01\x00\x01", 3));
  const double f64 = 1.0 / 3;
  add("f64", "F64", "[1]", std::string(reinterpret_cast<const char*>(&f64), 8));
  add("scalar", "F32", "[]", f32_bytes({4}));
  add("empty", "F32", "[0,3]", "");
  add("quote\\\"inside", "F32", "[1]", f32_bytes({1}));
  add("back\\\\slash", "F32", "[1]", f32_bytes({2}));
  add("new\\nline", "F32", "[1]", f32_bytes({3}));
  add("esc\\u0001ctl", "F32", "[1]", f32_bytes({4}));
  add("unicode \xc3\xa9\xe2\x9c\x93 \xe5\x90\x8d\xe5\x89\x8d \xf0\x9f\x99\x82", "F32", "[1]",
      f32_bytes({5}));
  h.back() = '}';
  while (h.size() % 8) h += ' ';
  std::string file = raw("py_mixed.safetensors", h, data);
  auto m = nn::load_safetensors(file);
  ASSERT_EQ(m.size(), 13u);
  std::vector<double> f16v = m.at("f16").to_vector<double>();
  EXPECT_EQ(f16v[0], 65504.0);
  EXPECT_TRUE(f16v[1] == 0 && std::signbit(f16v[1]));
  EXPECT_EQ(f16v[2], std::ldexp(1.0, -24));
  EXPECT_EQ(f16v[3], -INFINITY);
  EXPECT_EQ(m.at("bf16").to_vector<double>(), (std::vector<double>{1, -2.5, INFINITY}));
  EXPECT_EQ(m.at("i64").to_vector<int64_t>(), (std::vector<int64_t>(i64, i64 + 3)));
  EXPECT_EQ(m.at("i32").to_vector<int32_t>(), (std::vector<int32_t>{INT32_MIN, 5}));
  EXPECT_EQ(m.at("bool").to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(m.at("f64").to_vector<double>()[0], 1.0 / 3);
  EXPECT_EQ(m.at("scalar").dim(), 0);
  EXPECT_EQ(m.at("empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(m.at("quote\"inside").item<float>(), 1);
  EXPECT_EQ(m.at("back\\slash").item<float>(), 2);
  EXPECT_EQ(m.at("new\nline").item<float>(), 3);
  EXPECT_EQ(m.at("esc\x01"
                 "ctl")
                .item<float>(),
            4);
  EXPECT_EQ(
      m.at("unicode \xc3\xa9\xe2\x9c\x93 \xe5\x90\x8d\xe5\x89\x8d \xf0\x9f\x99\x82").item<float>(),
      5);
  auto meta = nn::load_safetensors_metadata(file);
  EXPECT_EQ(meta,
            (std::map<std::string, std::string>{{"format", "pt"},
                                                {"note", "has \"quotes\" and \\ and \xc3\xa9"},
                                                {"nested", "{\"a\": [1,2]}"}}));
}

// Row 5, defect 4(d): every JSON escape is decoded, \uXXXX with surrogate pairs.
TEST_F(SafetensorsTest, DecodesEveryJsonEscapeInNames) {
  std::string names[] = {"caf\\u00e9", "smile \\ud83d\\ude42", "s\\/l", "c\\b\\f\\r\\t"};
  std::string want[] = {"caf\xc3\xa9", "smile \xf0\x9f\x99\x82", "s/l", "c\b\f\r\t"};
  std::string h = "{";
  for (int i = 0; i < 4; ++i)
    h += (i ? "," : "") + std::string("\"") + names[i] +
         "\":" + entry("F32", "[1]", 4 * i, 4 * i + 4);
  h += "}";
  auto m = nn::load_safetensors(raw("esc.safetensors", h, f32_bytes({0, 1, 2, 3})));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(m.count(want[i])) << names[i];
    EXPECT_EQ(m.at(want[i]).item<float>(), i);
  }
  rejects(
      raw("lone.safetensors", "{\"\\ud83d\":" + entry("F32", "[1]", 0, 4) + "}", f32_bytes({0})),
      {"malformed header"});
}

// Row 6, defect 4(c): names with `"`, `\`, TAB, newline, \u0001, UTF-8 round-trip, and
// Python's json module reads the header loom writes (with the metadata).
TEST_F(SafetensorsTest, SavedNamesAreEscapedAndRoundTripThroughLoomAndPython) {
  const std::vector<std::string> names = {"say \"hi\"",
                                          "a\\b",
                                          "tab\there",
                                          "new\nline",
                                          "ctl\x01",
                                          "caf\xc3\xa9",
                                          "emoji \xf0\x9f\x99\x82"};
  std::map<std::string, Tensor> m;
  for (size_t i = 0; i < names.size(); ++i)
    m[names[i]] = loom::tensor(std::vector<float>{static_cast<float>(i)}, {1});
  const std::map<std::string, std::string> meta{{"note", "q\"b\\n\n"}, {"format", "pt"}};
  std::string file = path("names.safetensors");
  nn::save_safetensors(m, file, meta);
  auto back = nn::load_safetensors(file);
  ASSERT_EQ(back.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(back.count(names[i])) << names[i];
    EXPECT_EQ(back.at(names[i]).item<float>(), static_cast<float>(i));
  }
  EXPECT_EQ(nn::load_safetensors_metadata(file), meta);
  // Python: the header is JSON (8-byte aligned, space padded); names and offsets as saved.
  std::string py = path("check.py");
  std::ofstream(py)
      << "import json,struct,sys\n"
         "b=open(sys.argv[1],'rb').read()\n"
         "n=struct.unpack('<Q',b[:8])[0]\n"
         "assert n%8==0\n"
         "h=json.loads(b[8:8+n].decode('utf-8'))\n"
         "for k in sorted(h):\n"
         "  v=h[k]\n"
         "  if k=='__metadata__':\n"
         "    for mk in sorted(v): print('M',mk.encode().hex(),v[mk].encode().hex())\n"
         "  else:\n"
         "    s,e=v['data_offsets']\n"
         "    "
         "print('T',k.encode().hex(),v['dtype'],v['shape'],struct.unpack('<f',b[8+n+s:8+n+e])[0])"
         "\n";
  std::string out;
  FILE* p = ::popen(("python3 '" + py + "' '" + file + "' 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ASSERT_EQ(::pclose(p), 0) << out;
  auto hex = [](const std::string& s) {
    std::string r;
    char b[3];
    for (unsigned char c : s) std::snprintf(b, sizeof b, "%02x", c), r += b;
    return r;
  };
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_NE(out.find("T " + hex(names[i]) + " F32 [1] " + std::to_string(i) + ".0\n"),
              std::string::npos)
        << names[i] << "\n"
        << out;
  for (const auto& [k, v] : meta)
    EXPECT_NE(out.find("M " + hex(k) + " " + hex(v) + "\n"), std::string::npos) << out;
  // A name that is not UTF-8 cannot be written as JSON: refused, naming the file.
  expect_error<loom::Error>([&] { nn::save_safetensors({{"bad\xff", loom::ones({1})}}, file); },
                            {"[save_safetensors]", file, "UTF-8"});
}

// Row 7, defect 4(a): deep nesting is a loom::Error (serde_json's limit, 128), never a
// stack overflow; just under the limit the header is read (and fails on the metadata's type).
TEST_F(SafetensorsTest, DeepNestingIsBoundedWithAClearError) {
  rejects(raw("n1.safetensors",
              "{\"__metadata__\":" + std::string(100000, '[') + std::string(100000, ']') + "}"),
          {"nesting deeper than 128"});
  std::string obj;
  for (int i = 0; i < 100000; ++i) obj += "{\"a\":";
  obj += "\"x\"" + std::string(100000, '}');
  rejects(raw("n2.safetensors", "{\"__metadata__\":" + obj + "}"), {"nesting deeper than 128"});
  rejects(raw("n3.safetensors", "{\"__metadata__\":" + std::string(1000000, '[')),
          {"nesting deeper than 128"});
  // 128 levels in all (the top object is the first): not the nesting error.
  rejects(raw("n4.safetensors",
              "{\"__metadata__\":" + std::string(127, '[') + std::string(127, ']') + "}"),
          {"__metadata__ is array", "expected an object"});
  rejects(raw("n5.safetensors",
              "{\"__metadata__\":" + std::string(128, '[') + std::string(128, ']') + "}"),
          {"nesting deeper than 128"});
}

// Rows 8 and 9, defect 4(b): numbers that are not extents, and every hostile file of the
// trial, each a loom::Error naming the file.
TEST_F(SafetensorsTest, BadNumbersAndHostileFilesAreLoomErrorsNamingTheFile) {
  const std::string f4 = f32_bytes({0}), f8 = f32_bytes({0, 0});
  rejects(raw("ov.safetensors", "{\"x\":" + entry("F32", "[99999999999999999999]", 0, 4) + "}", f4),
          {"'x'", "shape", "non-negative integers"});
  rejects(raw("neg.safetensors", "{\"x\":" + entry("F32", "[-1]", 0, 4) + "}", f4),
          {"'x'", "shape -1"});
  rejects(raw("flt.safetensors", "{\"x\":" + entry("F32", "[1.5]", 0, 4) + "}", f4),
          {"'x'", "shape 1.5"});
  rejects(raw("offneg.safetensors",
              "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", f4),
          {"'x'", "data_offsets -4"});
  rejects(raw("huge.safetensors", "{\"x\":" + entry("F32", "[4294967296,4294967296]", 0, 0) + "}"),
          {"'x'", "2^48"});
  std::string rank100 = "[1";
  for (int i = 1; i < 100; ++i) rank100 += ",1";
  rejects(raw("rank.safetensors", "{\"x\":" + entry("F32", rank100 + "]", 0, 4) + "}", f4),
          {"'x'", "rank 100", "16"});
  // Shapes past loom's limits are the core's ShapeError (check_shape), naming the file.
  for (const char* file : {"huge.safetensors", "rank.safetensors"})
    expect_error<loom::ShapeError>([&] { nn::load_safetensors(path(file)); },
                                   {"[load_safetensors]", file, "'x'"});
  rejects(raw("oob.safetensors", "{\"x\":" + entry("F32", "[4]", 0, 16) + "}", f8), {"'x'"});
  rejects(raw("mism.safetensors", "{\"x\":" + entry("F32", "[2]", 0, 4) + "}", f8),
          {"'x'", "do not fit f32[2]"});
  rejects(raw("nodt.safetensors", "{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", f4),
          {"'x'", "dtype"});
  rejects(raw("noshape.safetensors", "{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", f4),
          {"'x'", "shape"});
  rejects(raw("meta.safetensors",
              "{\"__metadata__\":{\"a\":1.5,\"b\":true,\"c\":null},\"x\":" +
                  entry("F32", "[1]", 0, 4) + "}",
              f4),
          {"__metadata__", "strings to strings"});
  rejects(raw("notjson.safetensors", "hello world"), {"malformed header"});
  rejects(raw("notobj.safetensors", "[1,2]   "), {"JSON object"});
  rejects(raw("hlen_huge.safetensors", "{}", "", UINT64_MAX),
          {"header length 18446744073709551615"});
  rejects(raw("hlen_2p63.safetensors", "{}", "", uint64_t{1} << 63), {"header length"});
  rejects(raw("hlen_small.safetensors", "{\"x\":" + entry("F32", "[1]", 0, 4) + "}", f4, 5),
          {"malformed header"});
  rejects(raw("hlen_zero.safetensors", "{\"x\":" + entry("F32", "[1]", 0, 4) + "}", f4, 0),
          {"JSON object"});
  std::string good = raw("good.safetensors", "{\"x\":" + entry("F32", "[2]", 0, 8) + "}", f8);
  EXPECT_EQ(nn::load_safetensors(good).at("x").numel(), 2);
  fs::resize_file(good, fs::file_size(good) - 3);
  rejects(good, {"truncated"});
  std::string trunc_header = raw("th.safetensors", "{\"x\":" + entry("F32", "[2]", 0, 8) + "}", f8);
  fs::resize_file(trunc_header, 20);
  rejects(trunc_header, {"header length"});
  std::ofstream(path("empty.safetensors"), std::ios::binary);
  rejects(path("empty.safetensors"), {"too short"});
  std::ofstream(path("three.safetensors"), std::ios::binary) << "\x01\x02\x03";
  rejects(path("three.safetensors"), {"too short"});
  rejects(path("missing.safetensors"), {"cannot open"});
}

// Row 10: what the Python package rejects and loom accepted.
TEST_F(SafetensorsTest, DuplicatesOverlapsGapsTrailingBytesAndInvalidUtf8AreRejected) {
  const std::string f4 = f32_bytes({1}), f8 = f32_bytes({1, 2});
  rejects(
      raw("dup.safetensors",
          "{\"x\":" + entry("F32", "[1]", 0, 4) + ",\"x\":" + entry("F32", "[1]", 4, 8) + "}", f8),
      {"duplicate tensor name 'x'"});
  rejects(raw("dupfield.safetensors",
              "{\"x\":{\"dtype\":\"F32\",\"dtype\":\"F64\",\"shape\":[1],"
              "\"data_offsets\":[0,4]}}",
              f4),
          {"duplicate field 'dtype'"});
  rejects(
      raw("overlap.safetensors",
          "{\"x\":" + entry("F32", "[2]", 0, 8) + ",\"y\":" + entry("F32", "[2]", 0, 8) + "}", f8),
      {"overlapping"});
  rejects(raw("gap.safetensors", "{\"x\":" + entry("F32", "[1]", 4, 8) + "}", f8),
          {"'x'", "not covered"});
  rejects(raw("extra.safetensors", "{\"x\":" + entry("F32", "[1]", 0, 4) + "}", f8),
          {"trailing bytes"});
  rejects(raw("garbage.safetensors", "{\"x\":" + entry("F32", "[1]", 0, 4) + "} garbage", f4),
          {"malformed header"});
  rejects(raw("utf8.safetensors", "{\"\xff\xfe\":" + entry("F32", "[1]", 0, 4) + "}", f4),
          {"malformed header"});
  // Out of order in the header but contiguous in the data: fine (offsets, not key order).
  auto m = nn::load_safetensors(raw(
      "order.safetensors",
      "{\"a\":" + entry("F32", "[1]", 4, 8) + ",\"b\":" + entry("F32", "[1]", 0, 4) + "}   ", f8));
  EXPECT_EQ(m.at("a").item<float>(), 2);
  EXPECT_EQ(m.at("b").item<float>(), 1);
  // Spaces after the JSON (the format's padding) are not trailing garbage.
  EXPECT_EQ(nn::load_safetensors(raw("pad.safetensors", "{}      ")).size(), 0u);
}

// Row 11: a dtype loom lacks names the tensor and what loom reads; metadata-only files load.
TEST_F(SafetensorsTest, UnsupportedDtypesNameTheTensorAndMetadataOnlyFilesLoad) {
  for (const char* dt : {"U8", "I16", "F8_E4M3"}) {
    rejects(raw(std::string("dt_") + dt + ".safetensors",
                "{\"weights\":" + entry(dt, "[2]", 0, 2) + "}", "\x01\x01"),
            {"'weights'", std::string("dtype '") + dt + "'", "F32"});
  }
  std::string meta_only = raw("meta_only.safetensors", "{\"__metadata__\":{\"a\":\"b\"}}");
  EXPECT_TRUE(nn::load_safetensors(meta_only).empty());
  EXPECT_EQ(nn::load_safetensors_metadata(meta_only),
            (std::map<std::string, std::string>{{"a", "b"}}));
}

}  // namespace
