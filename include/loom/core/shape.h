// Shape and TensorType: small value types with ==, hashing and operator<<.
//
// A Shape is a list of non-negative extents, built from {4, 4} or a std::vector<int64_t> and
// compared with either. TensorType pairs a DType with a Shape and prints as "f32[4,4]".
// Value types, thread-safe.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/small_vector.h"

namespace loom {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  Shape(const std::vector<int64_t>& dims) : dims_(dims.begin(), dims.end()) {}  // NOLINT
  template <class It>
  Shape(It first, It last) : dims_(first, last) {}

  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  size_t size() const { return dims_.size(); }
  bool empty() const { return dims_.empty(); }
  int64_t operator[](size_t i) const { return dims_[i]; }
  int64_t& operator[](size_t i) { return dims_[i]; }
  const int64_t* begin() const { return dims_.begin(); }
  const int64_t* end() const { return dims_.end(); }
  int64_t* begin() { return dims_.begin(); }
  int64_t* end() { return dims_.end(); }
  const int64_t* data() const { return dims_.data(); }
  void push_back(int64_t d) { dims_.push_back(d); }
  void insert(size_t at, int64_t d) { dims_.insert(dims_.begin() + at, d); }
  void erase(size_t at) { dims_.erase(dims_.begin() + at); }
  void resize(size_t n, int64_t v = 1) { dims_.resize(n, v); }
  int64_t back() const { return dims_.back(); }
  // Product of the extents (1 for a 0-d shape).
  int64_t numel() const;
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  operator std::vector<int64_t>() const { return vec(); }  // NOLINT
  std::string str() const;                                 // "[4,8]"

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }
  friend bool operator==(const Shape& a, const std::vector<int64_t>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  SmallVector<int64_t, 6> dims_;
};

// Row-major strides of a contiguous tensor of this shape, in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);
// Normalizes a possibly negative axis for a tensor of rank `rank`; throws ShapeError naming
// `op` when it is out of range.
int64_t normalize_axis(const char* op, int64_t axis, int64_t rank);

struct TensorType {
  DType dtype = DType::Float32;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  int64_t nbytes() const { return numel() * itemsize(dtype); }
  std::string str() const;  // "f32[4,8]"
  friend bool operator==(const TensorType& a, const TensorType& b) {
    return a.dtype == b.dtype && a.shape == b.shape;
  }
};

// How a type changed, for recompile explanations: "changed shape: f32[4,8] -> f32[8,8]"
// (or "dtype", or "shape and dtype").
std::string type_change(const TensorType& before, const TensorType& after);

std::ostream& operator<<(std::ostream& os, const Shape& s);
std::ostream& operator<<(std::ostream& os, const TensorType& t);

// Throws ShapeError naming `op` unless every extent is >= 0, the rank is at most 16 and the
// element count is at most 2^48 (loom's limits on every tensor and IR value).
void check_shape(const char* op, const Shape& s);

}  // namespace loom
