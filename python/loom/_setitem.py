"""t[key] = value for basic keys (ints, negative ints, slices with any step, None, ...), one
int64 index tensor or list of ints, or a bool mask over t's leading dims (t[mask] = v, v one
element's value), as torch: the value broadcasts to the selection and converts to t's dtype; t is updated in
place (copy_), so gradients flow to both the untouched part of t and the value.
An index tensor that names a position twice writes the last of its values there (what torch's
CPU index_put_ does; torch leaves the order unspecified).

Composed from loom's ops: the value is spread over t's shape with one index_select per
indexed dim and written with where(mask, spread, t). The index lists are graph data, so a
loop that assigns the same key shape does not recompile. An index tensor's positions are
found on the graph (a one-hot [len(index), size] compare), so its values may be pending."""
from . import _loom
from ._loom import Tensor


def _selectors(shape, key):
    """Per dim of t: ("int", i), ("range", range) or ("tensor", index); and the selection's
    shape with None dims. The key is parsed by the binding's one parser (getitem's)."""
    sels, sel_shape = [], []
    for item in _loom._index_key(list(shape), key):
        if item[0] == "none":
            sel_shape.append(1)
            continue
        sels.append(item)
        if item[0] == "tensor":
            sel_shape.extend(item[1].shape)
        elif item[0] == "range":
            sel_shape.append(len(item[1]))
    return sels, tuple(sel_shape)


def _mask_setitem(self, mask, value):
    """t[mask] = v for a bool mask over t's leading dims: where(mask, v, t). The selection's
    length depends on the data, so v must broadcast to one selected element (a number, a 0-d
    tensor, or a tensor of t's trailing shape), as the lazy graph has no data-dependent shapes."""
    shape, m = tuple(self.shape), mask.ndim
    if m == 0 or m > len(shape) or tuple(mask.shape) != shape[:m]:
        bad = next((i for i in range(min(m, len(shape))) if mask.shape[i] != shape[i]),
                   min(m, len(shape)))
        raise IndexError(f"The shape of the mask {list(mask.shape)} at index {bad} does not "
                         f"match the shape of the indexed tensor {list(shape)} at index {bad}")
    if not isinstance(value, Tensor):
        from ._creation import tensor
        value = tensor(value, dtype=self.dtype)
    v = _loom.to(value, self.dtype)
    rest = shape[m:]
    if v.numel() != 1:
        try:
            v = v.expand(*rest) if rest else v.reshape(())
        except _loom.ShapeError:
            raise _loom.ShapeError(
                f"[index] t[mask] = v: v of shape {list(value.shape)} must broadcast to one "
                f"selected element of shape {list(rest)} (the number of selected elements is "
                f"known only when the graph runs); write where(mask, v, t) for a v of t's "
                f"shape") from None
    else:
        v = v.reshape(())
    self.copy_(_loom.where(mask.reshape(*mask.shape, *([1] * len(rest))), v, self))
    return self


def setitem(self, key, value):
    shape = tuple(self.shape)
    mask = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    if isinstance(mask, Tensor) and mask.dtype == _loom.dtype.bool_:
        return _mask_setitem(self, mask, value)
    sels, sel_shape = _selectors(shape, key)
    if not isinstance(value, Tensor):
        from ._creation import tensor
        value = tensor(value, dtype=self.dtype)  # numbers, nested lists, numpy arrays
    v = _loom.to(value, self.dtype)
    try:
        v = v.expand(*sel_shape) if sel_shape else v.reshape(())
    except _loom.ShapeError as e:
        raise _loom.ShapeError(f"shape mismatch: value tensor of shape {list(value.shape)} cannot "
                               f"be broadcast to indexing result of shape "
                               f"{list(sel_shape)}") from e
    # back to t's rank: None dims dropped, int dims as size 1, an index tensor's dims as one
    v = v.reshape(*[1 if kind == "int" else _extent(kind, s) for kind, s in sels]) if sels else v
    if any(_extent(kind, s) == 0 for kind, s in sels if kind != "int"):
        return self  # an empty selection writes nothing
    mask = None
    for d, (kind, s) in enumerate(sels):
        n = shape[d]
        if kind == "tensor":
            source, hit = _tensor_positions(s, n)
            v = _loom.index_select(v, d, source)
            m = hit.reshape(*[n if e == d else 1 for e in range(len(shape))])
            mask = m if mask is None else _loom.logical_and(mask, m)
            continue
        positions = [s] if kind == "int" else list(s)
        if kind == "range" and s == range(n):
            continue  # the whole dim, in order: nothing to spread or mask
        index = [0] * n
        hit = [False] * n
        for j, p in enumerate(positions):
            index[p] = j
            hit[p] = True
        v = _loom.index_select(v, d, _as_index(index))
        m = _as_bool(hit).reshape(*[n if e == d else 1 for e in range(len(shape))])
        mask = m if mask is None else _loom.logical_and(mask, m)
    result = v.expand(*shape) if mask is None else _loom.where(mask, v, self)
    self.copy_(result)
    return self


def _extent(kind, s):
    return s.numel() if kind == "tensor" else len(s)


def _tensor_positions(index, n):
    """For each of a dim's n positions: which entry of `index` (flattened, negative entries
    counted from the back) writes there, the last one when several do, and whether any does.
    The indices pass through an index_select of arange(n), which raises loom's out-of-range
    ExecError at run time, as reading t[index] does."""
    from ._creation import arange
    flat = index.reshape(-1).to(_loom.dtype.int64)
    m = flat.shape[0]
    flat = _loom.where(flat < 0, _loom.where(flat >= -n, flat + n, flat), flat)
    checked = _loom.index_select(arange(n), 0, flat)
    hot = checked.reshape(m, 1) == arange(n).reshape(1, n)          # [m, n]
    entry = _loom.where(hot, arange(m).reshape(m, 1), -1)
    last = _loom._amax(entry, [0], False)                           # [n]
    hit = last >= 0
    return _loom.where(hit, last, 0), hit


def _as_index(values):
    from ._creation import tensor
    return tensor(values, dtype=_loom.dtype.int64)


def _as_bool(values):
    from ._creation import tensor
    return tensor(values, dtype=_loom.dtype.bool_)
