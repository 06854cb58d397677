// t[key]'s key parsed once, for reads (tensor.cpp's getitem) and writes (loom/_setitem.py, through
// _index_key): ints, slices with steps, None, one ..., int lists and one int index tensor, with
// torch's errors.
#pragma once

#include <vector>

#include "common.h"

namespace loom::py {

struct IndexItem {
  enum class Kind { Int, Range, Tensor, NewAxis } kind;
  int64_t index = 0;                               // Int: in [0, size)
  int64_t start = 0, stop = 0, step = 1, len = 0;  // Range: adjusted to the dim's size
  bool whole = false;                              // Range: the whole dim, in order
  bool filled = false;  // Range: a dim the key leaves out (under ... or after its last item)
  Tensor tensor;        // Tensor: int32 or int64
};

// One item per dim of a tensor of `shape` (ellipsis and the trailing dims as whole ranges),
// plus a NewAxis item per None, in key order. Lists become int64 index tensors.
std::vector<IndexItem> parse_index_key(const Shape& shape, nb::handle key);

void register_index_key(nb::module_& m);

}  // namespace loom::py
