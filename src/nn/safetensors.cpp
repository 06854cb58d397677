// The safetensors format: u64 little-endian header length, a JSON object
// {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...} (offsets into
// the data after the header), then the data, row-major, little-endian.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "loom/core/half.h"
#include "loom/ir/builder.h"
#include "loom/nn/nn.h"
#include "loom/trace/autograd.h"

namespace loom::nn {

namespace {

const char* st_dtype(DType d) {
  switch (d) {
    case DType::Bool: return "BOOL";
    case DType::Int32: return "I32";
    case DType::Int64: return "I64";
    case DType::BFloat16: return "BF16";
    case DType::Float16: return "F16";
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
  }
  return "?";
}

DType parse_dtype(const std::string& s, const std::string& path) {
  for (DType d : {DType::Bool, DType::Int32, DType::Int64, DType::BFloat16, DType::Float16,
                  DType::Float32, DType::Float64})
    if (s == st_dtype(d)) return d;
  throw Error(loom::detail::str_cat("[load_safetensors] ", path, ": unsupported dtype '", s, "'"));
}

// Raw little-endian bytes of a tensor (this machine is little-endian).
std::string bytes_of(const Tensor& t) {
  const int64_t n = t.numel();
  std::string out;
  auto put = [&](const void* p, size_t k) { out.append(static_cast<const char*>(p), k); };
  switch (t.dtype()) {
    case DType::Float32: { auto v = t.to_vector<float>(); put(v.data(), v.size() * 4); break; }
    case DType::Float64: { auto v = t.to_vector<double>(); put(v.data(), v.size() * 8); break; }
    case DType::Int32: { auto v = t.to_vector<int32_t>(); put(v.data(), v.size() * 4); break; }
    case DType::Int64: { auto v = t.to_vector<int64_t>(); put(v.data(), v.size() * 8); break; }
    case DType::Bool: { for (bool b : t.to_vector<bool>()) out.push_back(b ? 1 : 0); break; }
    case DType::BFloat16:
    case DType::Float16: {
      auto v = t.to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = t.dtype() == DType::BFloat16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
        put(&h, 2);
      }
      break;
    }
  }
  return out;
}

Tensor tensor_of(DType d, const Shape& s, const char* p) {
  const int64_t n = s.numel();
  switch (d) {
    case DType::Float32: { std::vector<float> v(n); std::memcpy(v.data(), p, n * 4); return loom::tensor(v, s); }
    case DType::Float64: { std::vector<double> v(n); std::memcpy(v.data(), p, n * 8); return loom::tensor(v, s); }
    case DType::Int32: { std::vector<int32_t> v(n); std::memcpy(v.data(), p, n * 4); return loom::tensor(v, s); }
    case DType::Int64: { std::vector<int64_t> v(n); std::memcpy(v.data(), p, n * 8); return loom::tensor(v, s); }
    case DType::Bool: { std::vector<bool> v(n); for (int64_t i = 0; i < n; ++i) v[i] = p[i] != 0; return loom::tensor(v, s); }
    case DType::BFloat16:
    case DType::Float16: {
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        v[i] = d == DType::BFloat16 ? bf16_to_float(h) : f16_to_float(h);
      }
      return loom::to(loom::tensor(v, s), d);
    }
  }
  return Tensor();
}

// A small JSON reader for the header: objects, arrays, strings, integers.
struct Json {
  const std::string& s;
  const std::string& path;
  size_t i = 0;
  [[noreturn]] void fail(const char* what) {
    throw Error(loom::detail::str_cat("[load_safetensors] ", path, ": malformed header (", what,
                                      " at byte ", i, ")"));
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  }
  void expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c) fail("unexpected character");
    ++i;
  }
  bool peek(char c) {
    ws();
    return i < s.size() && s[i] == c;
  }
  std::string str() {
    expect('"');
    std::string r;
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      r.push_back(s[i++]);
    }
    if (i >= s.size()) fail("unterminated string");
    ++i;
    return r;
  }
  int64_t integer() {
    ws();
    size_t start = i;
    if (i < s.size() && s[i] == '-') ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    if (start == i) fail("expected an integer");
    return std::stoll(s.substr(start, i - start));
  }
  std::vector<int64_t> ints() {
    std::vector<int64_t> r;
    expect('[');
    if (peek(']')) return ++i, r;
    do r.push_back(integer()); while (peek(',') && ++i);
    expect(']');
    return r;
  }
  void skip() {  // any value (the __metadata__ object)
    ws();
    if (peek('"')) return (void)str();
    if (peek('{')) {
      ++i;
      if (peek('}')) return (void)++i;
      do { str(); expect(':'); skip(); } while (peek(',') && ++i);
      return expect('}');
    }
    if (peek('[')) {
      ++i;
      if (peek(']')) return (void)++i;
      do skip(); while (peek(',') && ++i);
      return expect(']');
    }
    integer();
  }
};

}  // namespace

void save_safetensors(const std::map<std::string, Tensor>& tensors, const std::string& path) {
  std::ostringstream header;
  std::string data;
  header << "{";
  bool first = true;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(t.defined(), "[save_safetensors] '", name, "' is an undefined Tensor");
    std::string b = bytes_of(t);
    header << (first ? "" : ",") << "\"" << name << "\":{\"dtype\":\"" << st_dtype(t.dtype())
           << "\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) header << (d ? "," : "") << t.size(d);
    header << "],\"data_offsets\":[" << data.size() << "," << data.size() + b.size() << "]}";
    data += b;
    first = false;
  }
  header << "}";
  std::string h = header.str();
  while (h.size() % 8) h.push_back(' ');  // the format pads the header with spaces
  std::ofstream f(path, std::ios::binary);
  LOOM_CHECK(f, "[save_safetensors] cannot write '", path, "'");
  uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << h << data;
  LOOM_CHECK(f.good(), "[save_safetensors] writing '", path, "' failed");
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LOOM_CHECK(f, "[load_safetensors] cannot read '", path, "'");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  LOOM_CHECK(all.size() >= 8, "[load_safetensors] ", path, ": too short for a header");
  uint64_t n;
  std::memcpy(&n, all.data(), 8);
  LOOM_CHECK(n <= all.size() - 8, "[load_safetensors] ", path, ": header length ", n,
             " exceeds the file (", all.size(), " bytes)");
  std::string header = all.substr(8, n);
  const char* data = all.data() + 8 + n;
  const uint64_t data_size = all.size() - 8 - n;
  Json j{header, path};
  std::map<std::string, Tensor> out;
  j.expect('{');
  if (j.peek('}')) return out;
  do {
    std::string name = j.str();
    j.expect(':');
    if (name == "__metadata__") {
      j.skip();
      continue;
    }
    std::string dtype;
    std::vector<int64_t> shape, offsets;
    j.expect('{');
    do {
      std::string key = j.str();
      j.expect(':');
      if (key == "dtype") dtype = j.str();
      else if (key == "shape") shape = j.ints();
      else if (key == "data_offsets") offsets = j.ints();
      else j.skip();
    } while (j.peek(',') && ++j.i);
    j.expect('}');
    DType d = parse_dtype(dtype, path);
    Shape s(shape);
    for (int64_t e : shape) LOOM_CHECK(e >= 0, "[load_safetensors] ", path, ": '", name, "' has a negative extent");
    ir::check_shape("load_safetensors", s);  // rank and element count within loom's limits
    LOOM_CHECK(offsets.size() == 2 && offsets[0] >= 0 && offsets[0] <= offsets[1] &&
                   static_cast<uint64_t>(offsets[1]) <= data_size &&
                   offsets[1] - offsets[0] == s.numel() * static_cast<int64_t>(itemsize(d)),
               "[load_safetensors] ", path, ": '", name, "' has data offsets that do not fit ",
               TensorType{d, s}, " in ", data_size, " bytes of data");
    out[name] = tensor_of(d, s, data + offsets[0]);
  } while (j.peek(',') && ++j.i);
  j.expect('}');
  return out;
}

void save(const Module& module, const std::string& path) {
  std::map<std::string, Tensor> all;
  for (auto& [n, t] : module.named_parameters()) all[n] = t;
  for (auto& [n, t] : module.named_buffers()) all[n] = t;
  save_safetensors(all, path);
}

void load(Module& module, const std::string& path) {
  std::map<std::string, Tensor> file = load_safetensors(path);
  std::vector<std::pair<std::string, Tensor>> mine = module.named_parameters();
  for (auto& b : module.named_buffers()) mine.push_back(b);
  NoGradGuard guard;
  for (auto& [name, t] : mine) {
    auto it = file.find(name);
    LOOM_CHECK(it != file.end(), "[nn::load] ", path, " has no '", name, "'");
    TensorType want{t.dtype(), t.shape()}, got{it->second.dtype(), it->second.shape()};
    LOOM_CHECK_T(ShapeError, want.shape == got.shape, "[nn::load] '", name, "' is ", got, " in ", path,
                 " but ", want, " in the module");
    Tensor dst = t;
    dst.copy_(it->second);
    file.erase(it);
  }
  LOOM_CHECK(file.empty(), "[nn::load] ", path, " has '", file.begin()->first,
             "', which the module does not have");
}

}  // namespace loom::nn
