// The safetensors format: u64 little-endian header length, a JSON object
// {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...} (offsets into
// the data after the header), then the data, row-major, little-endian. The header is read and
// written with nlohmann/json; a load maps the file (mmap) and checks what the Python
// `safetensors` package checks: valid UTF-8 JSON, nesting at most 128 deep (serde_json's
// limit), no duplicate names, integer extents and offsets, and data covered exactly by the
// tensors, in order, without overlap.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/core/half.h"
#include "loom/core/shape.h"
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

DType parse_dtype(const std::string& s, const std::string& path, const std::string& name) {
  for (DType d : {DType::Bool, DType::Int32, DType::Int64, DType::BFloat16, DType::Float16,
                  DType::Float32, DType::Float64})
    if (s == st_dtype(d)) return d;
  throw Error(loom::detail::str_cat("[load_safetensors] ", path, ": '", name, "' has dtype '", s,
                                    "', which loom does not support (it reads BOOL, I32, I64, "
                                    "BF16, F16, F32 and F64)"));
}

// The tensor's elements as T, appended to out as raw bytes.
template <class T>
void append_values(const Tensor& t, std::string* out) {
  std::vector<T> v = t.to_vector<T>();
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Raw little-endian bytes of a tensor (this machine is little-endian).
std::string bytes_of(const Tensor& t) {
  const int64_t n = t.numel();
  std::string out;
  auto put = [&](const void* p, size_t k) { out.append(static_cast<const char*>(p), k); };
  switch (t.dtype()) {
    case DType::Float32: append_values<float>(t, &out); break;
    case DType::Float64: append_values<double>(t, &out); break;
    case DType::Int32: append_values<int32_t>(t, &out); break;
    case DType::Int64: append_values<int64_t>(t, &out); break;
    case DType::Bool: {
      for (bool b : t.to_vector<bool>()) out.push_back(b ? 1 : 0);
      break;
    }
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

// A tensor of shape s whose elements of type T are copied from p (null when s is empty).
template <class T>
Tensor copied(const Shape& s, const char* p) {
  std::vector<T> v(static_cast<size_t>(s.numel()));
  if (!v.empty()) std::memcpy(v.data(), p, v.size() * sizeof(T));
  return loom::tensor(v, s);
}

Tensor tensor_of(DType d, const Shape& s, const char* p) {
  const int64_t n = s.numel();
  switch (d) {
    case DType::Float32: return copied<float>(s, p);
    case DType::Float64: return copied<double>(s, p);
    case DType::Int32: return copied<int32_t>(s, p);
    case DType::Int64: return copied<int64_t>(s, p);
    case DType::Bool: {
      std::vector<bool> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = p[i] != 0;
      return loom::tensor(v, s);
    }
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

using Json = nlohmann::json;

constexpr int kMaxDepth = 128;                // serde_json's recursion limit
constexpr uint64_t kMaxHeader = 100'000'000;  // the Python package's limit
constexpr char kOp[] = "load_safetensors";
constexpr std::string_view kMetadata = "__metadata__";

template <class... A>
[[noreturn]] void fail(const std::string& path, const A&... what) {
  throw Error(loom::detail::str_cat("[", kOp, "] ", path, ": ", what...));
}

// A read-only mapping of a whole file, unmapped on scope exit.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, "cannot open: ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(path, "not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        fail(path, "cannot map ", size_, " bytes: ", std::strerror(errno));
      }
      data_ = static_cast<const char*>(p);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// Parses the header, refusing nesting deeper than kMaxDepth (before it is built: nlohmann's
// parser is iterative, so this bounds memory, not the stack) and duplicate keys in the top
// object and in each tensor's object (nlohmann would keep the last).
Json parse_header(std::string_view text, const std::string& path) {
  int depth = 0;
  std::vector<std::set<std::string>> keys;  // per open object at depth 1 and 2
  std::vector<bool> is_object;
  auto cb = [&](int, Json::parse_event_t ev, Json& parsed) {
    switch (ev) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (++depth > kMaxDepth)
          fail(path, "malformed header: nesting deeper than ", kMaxDepth, " levels");
        is_object.push_back(ev == Json::parse_event_t::object_start);
        if (is_object.back() && depth <= 2) keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (is_object.back() && depth <= 2) keys.pop_back();
        is_object.pop_back();
        --depth;
        break;
      case Json::parse_event_t::key:
        if (depth <= 2 && !keys.back().insert(parsed.get<std::string>()).second)
          fail(path, depth == 1 ? "duplicate tensor name '" : "duplicate field '",
               parsed.get<std::string>(), "' in the header");
        break;
      case Json::parse_event_t::value: break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), cb);
  } catch (const Json::exception& e) {
    fail(path, "malformed header (", e.what(), ")");
  }
}

// A non-negative integer that fits int64 (JSON numbers like 1.5, -1 or 1e20 do not).
int64_t as_extent(const Json& v, const std::string& path, const std::string& name,
                  const char* field) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{INT64_MAX})
    fail(path, "'", name, "' has ", field, " ", v.dump(),
         ": expected non-negative integers below 2^63");
  return static_cast<int64_t>(v.get<uint64_t>());
}

std::vector<int64_t> int_list(const Json& entry, const char* field, const std::string& path,
                              const std::string& name) {
  auto it = entry.find(field);
  if (it == entry.end() || !it->is_array()) fail(path, "'", name, "' has no '", field, "' list");
  std::vector<int64_t> out;
  for (const Json& v : *it) out.push_back(as_extent(v, path, name, field));
  return out;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin, end;
};

Entry read_entry(const std::string& name, const Json& e, const std::string& path) {
  if (!e.is_object()) fail(path, "'", name, "' is not an object {dtype, shape, data_offsets}");
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) fail(path, "'", name, "' has no 'dtype' string");
  DType d = parse_dtype(dt->get<std::string>(), path, name);
  Shape shape(int_list(e, "shape", path, name));
  try {
    check_shape(kOp, shape);  // loom's limits on every tensor
  } catch (const ShapeError& err) {
    // "[load_safetensors] rank 17 exceeds ..." -> the same, naming the file and the entry.
    const std::string_view why = std::string_view(err.what()).substr(std::size(kOp) + 2);
    throw ShapeError(loom::detail::str_cat("[", kOp, "] ", path, ": '", name, "' ", why));
  }
  const int64_t n = shape.numel();
  std::vector<int64_t> off = int_list(e, "data_offsets", path, name);
  if (off.size() != 2 || off[0] > off[1])
    fail(path, "'", name, "' has data_offsets ", e["data_offsets"].dump(),
         ": expected [begin, end] with begin <= end");
  Entry out{name, d, shape, off[0], off[1]};
  if (off[1] - off[0] != n * static_cast<int64_t>(itemsize(d)))
    fail(path, "'", name, "' has data offsets that do not fit ", TensorType{d, out.shape}, ": [",
         off[0], ", ", off[1], ") holds ", off[1] - off[0], " bytes, ", TensorType{d, out.shape},
         " needs ", n * static_cast<int64_t>(itemsize(d)));
  return out;
}

struct Header {
  std::vector<Entry> entries;  // by data offset
  std::map<std::string, std::string> metadata;
  const char* data;
};

// Maps nothing itself: reads and checks `file`'s header and lays out its tensors.
Header read_header(const MappedFile& file, const std::string& path) {
  if (file.size() < 8) fail(path, "too short for a header (", file.size(), " bytes)");
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  if (n > file.size() - 8)
    fail(path, "header length ", n, " exceeds the file (", file.size(), " bytes)");
  if (n > kMaxHeader) fail(path, "header length ", n, " exceeds the limit of ", kMaxHeader);
  std::string_view text(file.data() + 8, n);
  if (text.empty() || text[0] != '{') fail(path, "malformed header (expected a JSON object)");
  Json j = parse_header(text, path);
  if (!j.is_object()) fail(path, "malformed header (expected a JSON object)");
  Header h;
  h.data = file.data() + 8 + n;
  const int64_t data_size = static_cast<int64_t>(file.size() - 8 - n);
  for (const auto& [name, e] : j.items()) {
    if (name == kMetadata) {
      if (!e.is_object()) fail(path, "__metadata__ is ", e.type_name(), ", expected an object");
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string())
          fail(path, "__metadata__ maps strings to strings, but '", k, "' is ", v.type_name());
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(read_entry(name, e, path));
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t at = 0;
  for (const Entry& e : h.entries) {
    if (e.begin != at)
      fail(path, "'", e.name, "' has data_offsets [", e.begin, ", ", e.end, ") but the data ",
           e.begin < at ? "before it ends at " : "is not covered from ", at,
           e.begin < at ? " (overlapping tensors)" : "");
    at = e.end;
  }
  if (at > data_size)
    fail(path, "'", h.entries.back().name, "' ends at byte ", at,
         " of the data but the file holds ", data_size, " bytes of data (truncated)");
  if (at < data_size)
    fail(path, "the tensors cover ", at, " bytes of data but the file holds ", data_size,
         " (trailing bytes)");
  return h;
}

// Validates a name for the header: JSON strings are UTF-8.
void check_utf8_name(const std::string& name, const std::string& path) {
  try {
    (void)Json(name).dump();
  } catch (const Json::exception&) {
    throw Error(loom::detail::str_cat("[save_safetensors] ", path, ": the string '", name,
                                      "' is not valid UTF-8"));
  }
}

}  // namespace

void save_safetensors(const std::map<std::string, Tensor>& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata, CallSite loc) {
  // Ordered as the Python package writes it: __metadata__, then {dtype, shape, data_offsets}.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    for (const auto& [k, v] : metadata) {
      check_utf8_name(k, path);
      check_utf8_name(v, path);
    }
    header[std::string(kMetadata)] = metadata;
  }
  std::vector<Tensor> all;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(t.defined(), "[save_safetensors] ", path, ": '", name, "' is an undefined Tensor");
    all.push_back(t);
  }
  materialize(all, loc);  // one run for the whole tree
  std::string data;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(name != kMetadata, "[save_safetensors] ", path,
               ": '__metadata__' is reserved for the metadata; name the tensor otherwise");
    check_utf8_name(name, path);
    std::string b = bytes_of(t);
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    header[std::string(name)] = {{"dtype", st_dtype(t.dtype())},
                                 {"shape", shape},
                                 {"data_offsets", {data.size(), data.size() + b.size()}}};
    data += b;
  }
  std::string h = header.dump();          // escapes quotes, backslashes and control characters
  while (h.size() % 8) h.push_back(' ');  // the format pads the header with spaces
  std::ofstream f(path, std::ios::binary);
  LOOM_CHECK(f, "[save_safetensors] cannot write '", path, "'");
  uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << h << data;
  LOOM_CHECK(f.good(), "[save_safetensors] writing '", path, "' failed");
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  MappedFile file(path);
  Header h = read_header(file, path);
  std::map<std::string, Tensor> out;
  for (const Entry& e : h.entries) out[e.name] = tensor_of(e.dtype, e.shape, h.data + e.begin);
  return out;
}

std::map<std::string, std::string> load_safetensors_metadata(const std::string& path) {
  MappedFile file(path);
  return read_header(file, path).metadata;
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
    LOOM_CHECK_T(ShapeError, want.shape == got.shape, "[nn::load] '", name, "' is ", got, " in ",
                 path, " but ", want, " in the module");
    Tensor dst = t;
    dst.copy_(it->second);
    file.erase(it);
  }
  LOOM_CHECK(file.empty(), "[nn::load] ", path, " has '", file.begin()->first,
             "', which the module does not have");
}

}  // namespace loom::nn
