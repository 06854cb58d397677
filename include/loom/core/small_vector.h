// SmallVector<T, N>: a vector of trivially copyable T that keeps up to N elements inline, so
// that shapes and operand lists of graph nodes cost no heap allocation in the common case.
// Value type; not thread-safe for concurrent mutation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <type_traits>

namespace loom {

template <class T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVector() = default;
  SmallVector(std::initializer_list<T> init) { assign(init.begin(), init.end()); }
  template <class It>
  SmallVector(It first, It last) {
    assign(first, last);
  }
  SmallVector(size_t n, const T& value) { resize(n, value); }
  SmallVector(const SmallVector& o) { assign(o.begin(), o.end()); }
  SmallVector(SmallVector&& o) noexcept { move_from(std::move(o)); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) move_from(std::move(o));
    return *this;
  }
  ~SmallVector() = default;

  template <class It>
  void assign(It first, It last) {
    size_ = 0;
    reserve(static_cast<size_t>(std::distance(first, last)));
    for (; first != last; ++first) data()[size_++] = static_cast<T>(*first);
  }
  void reserve(size_t n) {
    if (n <= capacity()) return;
    size_t cap = std::max(n, capacity() * 2);
    auto fresh = std::make_unique<T[]>(cap);
    if (size_) std::memcpy(fresh.get(), data(), size_ * sizeof(T));
    heap_ = std::move(fresh);
    heap_cap_ = cap;
  }
  void push_back(const T& v) {
    if (size_ == capacity()) reserve(size_ + 1);
    data()[size_++] = v;
  }
  void pop_back() { --size_; }
  void resize(size_t n, const T& value = T()) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = value;
    size_ = n;
  }
  void clear() { size_ = 0; }
  iterator insert(const_iterator pos, const T& v) {
    size_t at = static_cast<size_t>(pos - begin());
    push_back(v);
    std::rotate(begin() + at, end() - 1, end());
    return begin() + at;
  }
  iterator erase(const_iterator pos) {
    size_t at = static_cast<size_t>(pos - begin());
    std::rotate(begin() + at, begin() + at + 1, end());
    --size_;
    return begin() + at;
  }

  T* data() { return heap_ ? heap_.get() : inline_; }
  const T* data() const { return heap_ ? heap_.get() : inline_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return heap_ ? heap_cap_ : N; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  void move_from(SmallVector&& o) {
    if (o.heap_) {
      heap_ = std::move(o.heap_);
      heap_cap_ = o.heap_cap_;
      size_ = o.size_;
    } else {
      heap_.reset();
      size_ = o.size_;
      std::memcpy(inline_, o.inline_, size_ * sizeof(T));
    }
    o.size_ = 0;
  }

  T inline_[N];
  size_t size_ = 0;
  std::unique_ptr<T[]> heap_;
  size_t heap_cap_ = 0;
};

}  // namespace loom
