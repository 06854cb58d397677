"""Lowerings of torch's data-addressed ops: gather, scatter_add, scatter with reduce=,
scatter_reduce, index_add, and advanced indexing (index, index_put with tensors of indices),
from loom's gather / index_select / index_add. A sum into addresses is one index_add at flat
positions; a reduction that is not a sum (prod, amax, amin) compares each target with the
index (a one-hot over the scattered dim), as loom has no scatter-max."""
import math

import numpy as np

import loom

from ._dispatch import _STATS, lowers


def _wrap(index, n):
    """Negative indices counted from the end, as torch's indexing."""
    return loom.where(index < 0, index + n, index)


def _fit(src, shape):
    """src cut to `shape` in every dim (torch reads only index's extent of src)."""
    for k, n in enumerate(shape):
        if src.shape[k] != n:
            src = loom.slice(src, k, 0, n, 1)
    return src


def _source(x, index, src):
    if isinstance(src, loom.Tensor):
        return loom.to(_fit(src, list(index.shape)) if src.ndim else src.expand(*index.shape),
                       x.dtype)
    return loom.full(list(index.shape), src, dtype=x.dtype)


def _positions(x, dim, index):
    """int64 of index's shape: the flat position in x of x[.., index[i], ..] along dim, the
    other coordinates index's own."""
    if x.ndim == 0:
        return loom.zeros(*index.shape, dtype=loom.int64)
    d = dim % x.ndim
    strides = [math.prod(x.shape[k + 1:]) for k in range(x.ndim)]
    pos = index * strides[d]
    for k in range(index.ndim):
        if k != d and index.shape[k] > 1:
            shape = [1] * index.ndim
            shape[k] = index.shape[k]
            pos = pos + loom.arange(index.shape[k], dtype=loom.int64).reshape(*shape) * strides[k]
    return pos


def _sum_into(x, dim, index, src):
    """(x's shape) the sum of src at index's positions along dim, and their number."""
    flat = _positions(x, dim, index).reshape(-1)
    n = x.numel()
    total = loom.index_add(loom.zeros(n, dtype=x.dtype), 0, flat, src.reshape(-1))
    count = loom.index_add(loom.zeros(n, dtype=x.dtype), 0, flat,
                           loom.ones(flat.shape[0], dtype=x.dtype))
    return total.reshape(*x.shape), count.reshape(*x.shape)


@lowers("gather")
def _gather(x, dim, index, sparse_grad=False):
    if x.ndim == 0:
        return x.expand(*index.shape) if index.ndim else x
    if index.ndim == 0:
        return loom.gather(x.reshape(-1), 0, index.reshape(1)).reshape([])
    return loom.gather(x, dim, index)


@lowers("scatter_add", "scatter_add_")
def _scatter_add(x, dim, index, src):
    if index.numel() == 0:
        return x
    flat = _positions(x, dim, index).reshape(-1)
    out = loom.index_add(x.reshape(-1), 0, flat, _source(x, index, src).reshape(-1))
    return out.reshape(*x.shape)


@lowers("index_add", "index_add_")
def _index_add(x, dim, index, source, alpha=1):
    if x.ndim == 0:
        return x + (source.reshape([]) * alpha if index.numel() else 0)
    source = source if alpha == 1 else source * alpha
    idx = index.reshape(-1) if index.ndim == 0 else index
    if source.ndim < x.ndim:
        source = source.reshape(*[len(idx) if k == dim % x.ndim else x.shape[k]
                                  for k in range(x.ndim)])
    return loom.index_add(x, dim, _wrap(idx, x.shape[dim]), loom.to(source, x.dtype))


def _tree_prod(t, d):
    """The product over dim d, by halves (loom has no product reduction)."""
    while t.shape[d] > 1:
        n = t.shape[d]
        if n % 2:
            shape = list(t.shape)
            shape[d] = 1
            t = loom.cat([t, loom.ones(*shape, dtype=t.dtype)], d)
            n += 1
        t = loom.slice(t, d, 0, n, 2) * loom.slice(t, d, 1, n, 2)
    return loom.squeeze(t, d)


def extreme(dtype, lowest):
    """dtype's lowest (or highest) value: -inf (inf) for floats, the integer bound else."""
    if dtype.is_floating_point:
        return -math.inf if lowest else math.inf
    bits = 63 if dtype == loom.int64 else 31
    return -(2 ** bits) if lowest else 2 ** bits - 1


def _identity(reduce, dtype):
    return 1 if reduce == "prod" else extreme(dtype, lowest=reduce == "amax")


def _reduce_into(x, dim, index, src, reduce):
    """(x's shape) src reduced by `reduce` (prod, amax, amin) at index's positions along dim,
    the identity elsewhere, and where any position was written (a one-hot of the index)."""
    d = dim % x.ndim
    extent = list(index.shape)
    pos = loom.arange(x.shape[d], dtype=loom.int64).reshape(
        *([1] * (d + 1) + [x.shape[d]] + [1] * (x.ndim - d - 1)))
    hit = loom.unsqueeze(index, d + 1) == pos  # index's dims with x's dim d after d
    ident = loom.full([], _identity(reduce, x.dtype), dtype=x.dtype)
    vals = loom.where(hit, loom.unsqueeze(src, d + 1), ident)
    if reduce == "prod":
        out = _tree_prod(vals, d)
    else:
        out = (loom.amax if reduce == "amax" else loom.amin)(vals, [d], False)
    written = loom.sum(loom.to(hit, loom.int64), [d]) > 0
    for k in range(x.ndim):  # index may cover less than x in the other dims
        if k != d and extent[k] != x.shape[k]:
            pad = list(out.shape)
            pad[k] = x.shape[k] - extent[k]
            out = loom.cat([out, ident.expand(*pad)], k)
            written = loom.cat([written, loom.zeros(*pad, dtype=loom.bool_)], k)
    return out, written


def _scatter_reduce(x, dim, index, src, reduce, include_self):
    if index.numel() == 0:
        return x
    if x.ndim == 0:
        x1 = _scatter_reduce(x.reshape(1), 0, index.reshape(1), src.reshape(1), reduce,
                             include_self)
        return x1.reshape([])
    src = _source(x, index, src)
    if reduce in ("sum", "mean"):
        total, count = _sum_into(x, dim, index, src)
        written = count > 0
        if reduce == "sum":
            return x + total if include_self else loom.where(written, total, x)
        if include_self:
            total, count = total + x, count + 1
        mean = total / count if x.dtype.is_floating_point else loom.floor_divide(total, count)
        return loom.where(written, loom.to(mean, x.dtype), x)
    if reduce not in ("prod", "amax", "amin"):
        raise loom.Error(f"[loom.torch] aten.scatter_reduce: reduce='{reduce}' is not one of "
                         f"torch's sum, prod, mean, amax, amin")
    out, written = _reduce_into(x, dim, index, src, reduce)
    if not include_self:
        return loom.where(written, out, x)
    if reduce == "prod":
        return x * out
    return (loom.maximum if reduce == "amax" else loom.minimum)(x, out)


@lowers("scatter_reduce", "scatter_reduce_", "scatter_reduce.two", "scatter_reduce_.two")
def _scatter_reduce_two(x, dim, index, src, reduce, *, include_self=True):
    return _scatter_reduce(x, dim, index, src, reduce, include_self)


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


def _scatter_with_reduce(x, dim, index, src, reduce):
    if reduce not in _SCATTER_REDUCE:
        raise loom.Error(f"[loom.torch] aten.scatter: reduce='{reduce}' is not one of torch's "
                         f"'add', 'multiply'")
    return _scatter_reduce(x, dim, index, src, _SCATTER_REDUCE[reduce], True)


@lowers("scatter.reduce", "scatter_.reduce", "scatter.value_reduce", "scatter_.value_reduce")
def _scatter_reduce_overloads(x, dim, index, src, *, reduce):
    return _scatter_with_reduce(x, dim, index, src, reduce)


# ---- advanced indexing ----------------------------------------------------------------------

def _advanced(x, indices, op):
    """x[indices] with tensors of indices (None: a whole dim), as torch's rule: the indexed
    dims' positions (int64, their broadcast shape B) over x's indexed dims flattened, the dims
    moved first (perm), and where B's dims stand in the result (`at`)."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
    used = [d for d, i in enumerate(indices) if i is not None]
    if not used or len(indices) > x.ndim:
        raise loom.Error(f"[loom.torch] aten.{op}: {len(indices)} indices for a tensor of "
                         f"shape {list(x.shape)}, none of them a tensor")
    for d in used:
        if indices[d].dtype == loom.bool_:
            raise loom.Error(f"[loom.torch] aten.{op} with a bool mask among several indices "
                             f"(a data-dependent shape) is not lowered; use torch.where")
    shapes = [list(indices[d].shape) for d in used]
    nb = max(len(s) for s in shapes)
    bshape = [max([s[k - nb + len(s)] for s in shapes if k - nb + len(s) >= 0] or [1])
              for k in range(nb)]
    sizes = [x.shape[d] for d in used]
    lin = None
    for j, d in enumerate(used):
        term = _wrap(loom.to(indices[d], loom.int64), x.shape[d]) * math.prod(sizes[j + 1:])
        lin = term if lin is None else lin + term
    lin = lin.expand(*bshape) if list(lin.shape) != bshape else lin
    rest = [d for d in range(x.ndim) if d not in used]
    consecutive = used == list(range(used[0], used[-1] + 1))
    at = used[0] if consecutive else 0
    return lin, bshape, used + rest, rest, at


def _move(t, src_at, n, dst_at):
    """t with its n dims at src_at moved to dst_at."""
    if src_at == dst_at or n == 0:
        return t
    dims = list(range(t.ndim))
    block = dims[src_at:src_at + n]
    others = dims[:src_at] + dims[src_at + n:]
    return loom.permute(t, others[:dst_at] + block + others[dst_at:])


# ---- data-dependent shapes: nonzero, boolean masks ------------------------------------------

def _nonzero_now(t):
    """The positions of t's nonzero entries, int64 [n, t.ndim], computed now: their count is
    data, so the pending work that makes t runs first (a graph cut, as torch_xla's nonzero);
    counted as a data-dependent cut in loom.torch's metrics_report."""
    _STATS["data_dependent_cuts"] = _STATS.get("data_dependent_cuts", 0) + 1
    a = np.asarray(t.numpy())
    return np.argwhere(a).astype(np.int64).reshape(-1, a.ndim)


@lowers("nonzero")
def _nonzero(x):
    return loom.tensor(_nonzero_now(x))


def _without_masks(indices):
    """indices with each bool mask replaced by the index tensors of its nonzero positions, one
    per dim it covers (torch's own meaning of a mask among indices)."""
    out = []
    for i in indices:
        if i is not None and i.dtype == loom.bool_:
            nz = _nonzero_now(i)
            out += [loom.tensor(np.ascontiguousarray(nz[:, d])) for d in range(max(i.ndim, 1))]
        else:
            out.append(i)
    return out


@lowers("masked_select")
def _masked_select(x, mask):
    """x's entries where mask (broadcast together) holds, in order: a data-dependent length."""
    shape = list(np.broadcast_shapes(tuple(x.shape), tuple(mask.shape)))
    m = np.broadcast_to(np.asarray(mask.numpy()), shape)
    _STATS["data_dependent_cuts"] = _STATS.get("data_dependent_cuts", 0) + 1
    flat = loom.tensor(np.flatnonzero(m).astype(np.int64))
    xs = x.expand(*shape) if list(x.shape) != shape else x
    return loom.index_select(xs.reshape(-1), 0, flat)


@lowers("masked_scatter", "masked_scatter_")
def _masked_scatter(x, mask, source):
    """x with its entries where mask holds (broadcast to x) taken from source's first ones, in
    order (masked_select's adjoint)."""
    m = np.broadcast_to(np.asarray(mask.numpy()), tuple(x.shape))
    _STATS["data_dependent_cuts"] = _STATS.get("data_dependent_cuts", 0) + 1
    at = np.flatnonzero(m).astype(np.int64)
    flat = x.reshape(-1)
    if at.size == 0:
        return loom.clone(x)
    src = loom.to(source.reshape(-1)[:at.size], x.dtype)
    placed = loom.index_add(loom.zeros_like(flat), 0, loom.tensor(at), src)
    keep = loom.tensor(np.ascontiguousarray(m.reshape(-1)))
    return loom.where(keep, placed, flat).reshape(*x.shape)


@lowers("index", "_unsafe_index")
def _index(x, indices):
    """x[i0, i1, ...] with tensors of indices (None: a whole dim), as torch's rule; a boolean
    mask stands for the index tensors of its nonzero positions (computed now: a data-dependent
    shape)."""
    if any(i is not None and i.dtype == loom.bool_ for i in indices):
        indices = _without_masks(indices)
    lin, bshape, perm, rest, at = _advanced(x, indices, "index")
    xp = loom.permute(x, perm) if perm != list(range(x.ndim)) else x
    nidx = x.ndim - len(rest)
    flat = xp.reshape(math.prod(xp.shape[:nidx]), *xp.shape[nidx:])
    out = loom.index_select(flat, 0, lin.reshape(-1))
    out = out.reshape(*bshape, *[x.shape[d] for d in rest])
    return _move(out, 0, len(bshape), at)


def _last_writers(lin):
    """bool [n]: whether each write is the last to its position (torch's CPU order), for n
    writes; None where n is too large to compare every pair (then duplicates average)."""
    n = lin.shape[0]
    if n > 2048:
        return None
    order = loom.arange(n, dtype=loom.int64)
    later_same = (lin.reshape(n, 1) == lin.reshape(1, n)) & \
        (order.reshape(1, n) > order.reshape(n, 1))
    return loom.sum(loom.to(later_same, loom.int64), [1]) == 0


@lowers("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put")
def _index_put(x, indices, values, accumulate=False, unsafe=False):
    """x[indices] = values (or += with accumulate) with tensors of indices (None: a whole dim)
    or boolean masks. One mask over x's leading dims with one value or row for every selected
    position is a where (no graph cut); other masks stand for their nonzero positions, computed
    now (a data-dependent shape). Repeated positions: accumulate sums them, a plain write keeps
    the last (as torch on the CPU; their mean past 2048 writes)."""
    used = [i for i in indices if i is not None]
    if len(used) == 1 and used[0].dtype == loom.bool_:
        mask = used[0]
        rest = list(x.shape[mask.ndim:]) if mask.ndim <= x.ndim else None
        v = values
        if rest is not None and v.ndim == len(rest) + 1 and v.shape[0] == 1:
            v = loom.squeeze(v, 0)  # one row for every selected position
        if rest is not None and v.ndim <= len(rest) and \
                not any(i is not None for i in indices[1:]):
            mask = mask.reshape(*mask.shape, *([1] * len(rest)))
            v = loom.to(v, x.dtype)
            return loom.where(mask, x + v if accumulate else v, x)
    if any(i is not None and i.dtype == loom.bool_ for i in indices):
        indices = _without_masks(indices)
    lin, bshape, perm, rest, at = _advanced(x, indices, "index_put")
    nidx = x.ndim - len(rest)
    target = [x.shape[d] for d in rest]
    shape = target[:at] + bshape + target[at:]  # x[indices]'s shape
    v = loom.to(values, x.dtype)
    try:
        np.broadcast_shapes(tuple(v.shape), tuple(shape))
    except ValueError:
        raise loom.ShapeError(f"[loom.torch] aten.index_put: shape mismatch: value tensor of "
                              f"shape {list(v.shape)} cannot be broadcast to indexing result of "
                              f"shape {shape}") from None
    v = v.expand(*shape) if list(v.shape) != shape else v
    v = _move(v, at, len(bshape), 0).reshape(math.prod(bshape), math.prod(target))
    xp = loom.permute(x, perm) if perm != list(range(x.ndim)) else x
    flat = xp.reshape(math.prod(xp.shape[:nidx]), math.prod(target))
    pos = lin.reshape(-1)
    if accumulate:
        flat = loom.index_add(flat, 0, pos, v)
    else:
        last = _last_writers(pos)
        ones = loom.ones(pos.shape[0], 1, dtype=x.dtype)
        if last is not None:
            keep = loom.to(last, x.dtype).reshape(-1, 1)
            v, ones = v * keep, ones * keep
        put = loom.index_add(loom.zeros(*flat.shape, dtype=x.dtype), 0, pos, v)
        count = loom.index_add(loom.zeros(flat.shape[0], 1, dtype=x.dtype), 0, pos, ones)
        if last is None:
            put = loom.to(put / loom.maximum(count, loom.ones(1, dtype=x.dtype)), x.dtype)
        flat = loom.where(count > 0, put, flat)
    out = flat.reshape(*xp.shape)
    if perm == list(range(x.ndim)):
        return out
    inv = [0] * x.ndim
    for i, d in enumerate(perm):
        inv[d] = i
    return loom.permute(out, inv)
