"""torch's tensor habits on loom.Tensor: numpy operands (`t + ndarray`, `ndarray + t`), the
ops nanoGPT-style code uses (tril, masked_fill, split, chunk, cumsum, topk, multinomial),
iteration, `.device` and `.cpu()`, `.data`, `fill_`/`zero_` with torch's leaf rule, pickling."""
import collections
import numbers

import numpy as np

from . import _loom
from . import _device
from ._loom import Tensor, dtype

_topk_result = collections.namedtuple("topk", ["values", "indices"])
_sort_result = collections.namedtuple("sort", ["values", "indices"])


def _clone(t):
    return t + 0 if t.dtype != dtype.bool_ else _loom.logical_or(t, t)


# ---- numpy operands ------------------------------------------------------------------------

def _operand(x):
    if isinstance(x, np.ndarray):
        return _loom._tensor_copy(x)
    return x


def _binary(fn):
    return lambda a, b: fn(_operand(a), _operand(b))


_UFUNCS = {
    np.add: _binary(_loom.add), np.subtract: _binary(_loom.sub),
    np.multiply: _binary(_loom.mul), np.true_divide: _binary(_loom.div),
    np.floor_divide: _binary(_loom.floor_divide), np.remainder: _binary(_loom.remainder),
    np.power: _binary(_loom.pow), np.maximum: _binary(_loom.maximum),
    np.minimum: _binary(_loom.minimum), np.less: _binary(_loom.lt),
    np.less_equal: _binary(_loom.le), np.greater: _binary(_loom.gt),
    np.greater_equal: _binary(_loom.ge), np.equal: _binary(_loom.eq),
    np.not_equal: _binary(_loom.ne), np.logical_and: _binary(_loom.logical_and),
    np.logical_or: _binary(_loom.logical_or),
    np.matmul: lambda a, b: _loom.matmul(_loom_tensor(a), _loom_tensor(b)),
    np.negative: _loom.neg, np.absolute: _loom.abs, np.exp: _loom.exp, np.log: _loom.log,
    np.sqrt: _loom.sqrt, np.tanh: _loom.tanh, np.sin: _loom.sin, np.cos: _loom.cos,
    np.floor: _loom.floor, np.logical_not: _loom.logical_not,
}


def _loom_tensor(x):
    if isinstance(x, Tensor):
        return x
    return _loom._tensor_copy(np.asarray(x))


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    """numpy's operators and ufuncs with a loom tensor among the operands: the ufuncs that are
    loom ops (arithmetic, comparisons, matmul, exp, ...) give loom tensors, with autograd, as
    torch's operators do (`ndarray + t` is a Tensor); others, and those with out= (`a += t`
    on an ndarray), run in numpy on the tensors' values."""
    fn = _UFUNCS.get(ufunc)
    if method == "__call__" and not kwargs and fn is not None:
        return fn(*inputs)
    out = kwargs.get("out", ())
    if any(isinstance(o, Tensor) for o in (out if isinstance(out, tuple) else (out,))):
        return NotImplemented
    inputs = [np.asarray(x) if isinstance(x, Tensor) else x for x in inputs]
    return getattr(ufunc, method)(*inputs, **kwargs)


# ---- ops ---------------------------------------------------------------------------------------

def tril(input, diagonal=0):
    """The lower triangle of the last two dims (entries with j - i <= diagonal), others 0."""
    return _loom.tril(input, diagonal)


def triu(input, diagonal=0):
    """The upper triangle of the last two dims (entries with j - i >= diagonal), others 0."""
    return _loom.triu(input, diagonal)


def masked_fill(input, mask, value):
    """input with `value` where the bool `mask` (broadcast) is true."""
    return _loom._masked_fill(input, mask, value)


def split(tensor, split_size_or_sections, dim=0):
    """A tuple of pieces along dim: of split_size each (the last smaller), or of the listed
    sizes (which must add up to the dim's size)."""
    if isinstance(split_size_or_sections, numbers.Integral):
        return tuple(_loom._split_size(tensor, int(split_size_or_sections), dim))
    return tuple(_loom._split_sizes(tensor, [int(s) for s in split_size_or_sections], dim))


def chunk(input, chunks, dim=0):
    """A tuple of ceil(n / chunks)-sized pieces along dim (maybe fewer than chunks)."""
    return tuple(_loom._chunk(input, chunks, dim))


def cumsum(input, dim, *, dtype=None):
    """The running sum along dim; bool and integer inputs give int64 (dtype= converts the input
    first, as torch)."""
    if dtype is not None:
        input = _loom.to(input, dtype)
    return _loom._cumsum(input, dim)


def sort(input, dim=-1, descending=False, stable=False):
    """(values, indices): input sorted along dim, as torch.sort(stable=True) (loom's sort is
    always stable: equal entries keep their order; nan after every number ascending, before
    descending). Gradients reach input through the values."""
    v, i = _loom._sort(input, -1 if dim is None else dim, descending)
    return _sort_result(v, i)


def argsort(input, dim=-1, descending=False, stable=False):
    """The int64 indices that sort input along dim (stable, as sort)."""
    return _loom._argsort(input, -1 if dim is None else dim, descending)


def topk(input, k, dim=-1, largest=True, sorted=True):
    """(values, indices): the k largest (smallest) entries along dim, in order, nan counting
    as the largest; ties in index order (torch leaves their order unspecified)."""
    v, i = _loom._topk(input, k, -1 if dim is None else dim, largest, sorted)
    return _topk_result(v, i)


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """int64 indices drawn from the rows of `input` (non-negative weights over the last dim) by
    Gumbel-max on loom.rand (loom.manual_seed makes draws repeatable)."""
    if generator is not None:
        raise _loom.Error("[multinomial] generator= is not supported: loom has one random stream "
                          "per thread (loom.manual_seed)")
    return _loom._multinomial(input, num_samples, bool(replacement))


def gelu(input, approximate="none"):
    """GELU: exact (erf) by default, torch's tanh form with approximate='tanh'."""
    if approximate == "none":
        return _loom._gelu(input)
    if approximate == "tanh":
        return _loom._gelu_approx(input, "tanh")
    raise ValueError(f"gelu(): approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu_backward(grad_output, input, approximate="none"):
    """torch's aten.gelu_backward: grad_output * gelu'(input), built from the nodes gelu(input)
    builds, so a graph holding both computes the erf (tanh) once."""
    return _loom.gelu_backward(grad_output, input, approximate)


def from_dlpack(ext_tensor):
    """A tensor over a CPU DLPack producer's memory, without copying (torch's bool tensors,
    which torch will not export through DLPack, through their numpy view)."""
    try:
        return _loom.from_dlpack(ext_tensor)
    except TypeError:
        t = ext_tensor
        if type(t).__module__.startswith("torch") and str(getattr(t, "dtype", "")) == \
                "torch.bool" and str(getattr(t, "device", "")) == "cpu":
            return _loom.from_numpy(t.detach().numpy())
        raise


# ---- in-place ----------------------------------------------------------------------------------

def _checked_inplace(name, fn):
    def method(self, *args, **kwargs):
        if self.requires_grad and _loom.is_grad_enabled() and _loom._is_leaf(self):
            raise _loom.AutodiffError(
                f"[{name}] a leaf tensor {_type_str(self)} that requires grad cannot be updated "
                f"in place outside no_grad (its gradient would refer to the old value); update "
                f"it under `with loom.no_grad():`")
        value = fn(self, *args, **kwargs)
        if tuple(value._shape()) != tuple(self._shape()):
            raise _loom.ShapeError(f"[{name}] the result's shape {list(value._shape())} differs "
                                   f"from the destination's {list(self._shape())}")
        self.copy_(value)
        return self
    return method


def _type_str(t):
    return f"{t.dtype}{list(t._shape())}"


# ---- .data -----------------------------------------------------------------------------------

_DATA_INPLACE = ("copy_", "zero_", "fill_", "add_", "sub_", "mul_", "div_", "masked_fill_",
                 "tril_", "triu_", "__setitem__", "__iadd__", "__isub__", "__imul__",
                 "__itruediv__")


class _Data(Tensor):
    """t.data: a detached tensor with t's value; in-place ops on it (p.data.copy_(x),
    p.data.mul_(s)) write through to t, as torch's shared storage does. It reads t's value
    when taken (an update of t made later is seen by the next in-place op through it, not by
    reads of this handle)."""

    def __init__(self, owner):
        super().__init__(owner.detach())
        self._owner = owner


def _through(name):
    base = getattr(Tensor, name)

    def method(self, *args, **kwargs):
        owner = self._owner
        with _loom.no_grad():
            Tensor.copy_(self, owner.detach())
        r = base(self, *args, **kwargs)
        with _loom.no_grad():
            Tensor.copy_(owner, self)
        return r

    return method


def _get_data(self):
    return _Data(self)


def _set_data(self, value):
    if not isinstance(value, Tensor):
        raise TypeError(f"data: a Tensor's data has to be a Tensor, but got "
                        f"{type(value).__name__}")
    if tuple(value._shape()) != tuple(self._shape()):
        raise _loom.ShapeError(f"[data] cannot assign a tensor of shape {list(value._shape())} "
                               f"to the data of a tensor of shape {list(self._shape())}: a loom "
                               f"tensor keeps its shape (make a new Parameter instead)")
    if value.dtype != self.dtype:
        raise _loom.DTypeError(f"[data] cannot assign a {value.dtype} tensor to the data of a "
                               f"{self.dtype} tensor: a loom tensor keeps its dtype "
                               f"(convert it with .to() first)")
    with _loom.no_grad():
        self.copy_(value)


# ---- pickling ----------------------------------------------------------------------------------

_DTYPES = {d: n for n, d in (("bool_", dtype.bool_), ("int32", dtype.int32),
                             ("int64", dtype.int64), ("bfloat16", dtype.bfloat16),
                             ("float16", dtype.float16), ("float32", dtype.float32),
                             ("float64", dtype.float64))}


def _host_array(t):
    """t's value (materialized) as a numpy array of its own (bfloat16 widened to float32)."""
    t = t.detach()
    if t.dtype == dtype.bfloat16:
        t = _loom.to(t, dtype.float32)
    return np.array(t.numpy(), copy=True)


def _rebuild_tensor(array, dtype_name, requires_grad):
    dt = getattr(dtype, dtype_name)
    t = _loom._tensor_copy(np.asarray(array, order="C"))  # (ascontiguousarray makes 0-d 1-d)
    if t.dtype != dt:
        t = _loom.to(t, dt)
        _loom.sync()  # a materialized tensor, as one read from a file
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce(self):
    return (_rebuild_tensor, (_host_array(self), _DTYPES[self.dtype], self.requires_grad))


# ---- install -----------------------------------------------------------------------------------

def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self._shape()[0]))


def _normal(self, mean=0.0, std=1.0):
    return _loom._randn(list(self._shape()), self.dtype) * std + mean


def _uniform(self, *bounds, **kw):
    """torch's uniform_(from=0, to=1)."""
    lo = bounds[0] if len(bounds) > 0 else kw.pop("from", 0.0)
    hi = bounds[1] if len(bounds) > 1 else kw.pop("to", 1.0)
    if kw:
        raise TypeError(f"uniform_() got an unexpected keyword argument '{next(iter(kw))}'")
    return _loom._rand(list(self._shape()), self.dtype) * (hi - lo) + lo


def _install():
    T = Tensor
    T.__array_ufunc__ = _array_ufunc
    T.__iter__ = _iter
    T.device = property(lambda self: _device.CPU, doc="Always loom.device('cpu'): host memory.")
    T.is_leaf = property(lambda self: _loom._is_leaf(self),
                         doc="torch's is_leaf: requires no grad, or a leaf made by "
                             "requires_grad_().")
    T.data = property(_get_data, _set_data,
                      doc="A detached tensor with this value; in-place ops on it update this "
                          "tensor (p.data.copy_(x)); assigning p.data = x copies x in.")
    T.cpu = lambda self: self
    T.zero_ = lambda self: _loom._zero_(self)
    T.fill_ = lambda self, value: _loom._fill_(self, value)
    T.__reduce__ = _reduce
    T.tril = tril
    T.triu = triu
    T.tril_ = _checked_inplace("tril_", tril)
    T.triu_ = _checked_inplace("triu_", triu)
    T.masked_fill = masked_fill
    T.masked_fill_ = _checked_inplace("masked_fill_", masked_fill)
    T.normal_ = _checked_inplace("normal_", _normal)
    T.uniform_ = _checked_inplace("uniform_", _uniform)
    T.split = split
    T.chunk = chunk
    T.cumsum = cumsum
    T.topk = topk
    T.sort = sort
    T.argsort = argsort
    T.multinomial = multinomial
    T.gelu = gelu
    for name in _DATA_INPLACE:
        setattr(_Data, name, _through(name))


_install()
