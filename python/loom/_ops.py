"""The ops of API.md with PyTorch's argument conventions, as functions and Tensor methods."""
import collections
import numbers

import numpy as np

from . import _device, _loom, _repr
from ._loom import Tensor, dtype

_max_result = collections.namedtuple("max", ["values", "indices"])
_min_result = collections.namedtuple("min", ["values", "indices"])


class Size(tuple):
    """A tensor's shape: a tuple (t.shape == (2, 3)) printed as loom.Size([2, 3])."""

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return f"loom.Size({list(self)})"


def _dims_arg(shape):
    """reshape(2, 3) and reshape((2, 3)) alike."""
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    return [int(s) for s in shape]


def sum(input, dim=None, keepdim=False):
    """The sum over dim (an int, a sequence, or None for all), keeping reduced dims when keepdim."""
    return _loom._sum(input, dim, keepdim)


def mean(input, dim=None, keepdim=False):
    """The mean over dim (an int, a sequence, or None for all), keeping reduced dims when keepdim."""
    return _loom._mean(input, dim, keepdim)


def amax(input, dim=None, keepdim=False):
    """The maximum over dim (an int, a sequence, or None for all)."""
    return _loom._amax(input, dim, keepdim)


def amin(input, dim=None, keepdim=False):
    """The minimum over dim (an int, a sequence, or None for all)."""
    return _loom._amin(input, dim, keepdim)


def argmax(input, dim=None, keepdim=False):
    """The index of the maximum along dim (None: of the flattened tensor), int64."""
    return _loom._argmax(input, dim, keepdim)


def argmin(input, dim=None, keepdim=False):
    """The index of the minimum along dim (None: of the flattened tensor), int64."""
    return _loom._argmax(-input if input.dtype != dtype.bool_ else ~input, dim, keepdim)


def max(input, dim=None, keepdim=False, *, other=None):
    """max(t), max(t, dim) -> (values, indices), max(a, b) -> maximum."""
    if isinstance(dim, Tensor):
        return _loom.maximum(input, dim)
    if other is not None:
        return _loom.maximum(input, other)
    if dim is None:
        return _loom._amax(input, None, False)
    return _max_result(_loom._amax(input, dim, keepdim), _loom._argmax(input, dim, keepdim))


def min(input, dim=None, keepdim=False, *, other=None):
    """min(t): the minimum; min(t, dim): (values, indices); min(t, other): elementwise minimum."""
    if isinstance(dim, Tensor):
        return _loom.minimum(input, dim)
    if other is not None:
        return _loom.minimum(input, other)
    if dim is None:
        return _loom._amin(input, None, False)
    return _min_result(_loom._amin(input, dim, keepdim), argmin(input, dim, keepdim))


def reshape(input, *shape):
    """The tensor with a new shape (ints or one sequence; one -1 is inferred)."""
    return _loom._reshape(input, _dims_arg(shape))


def view(input, *shape):
    """reshape where torch could view the storage; a ShapeError where it could not."""
    return _loom._view(input, _dims_arg(shape))


def permute(input, *dims):
    """The dims reordered (ints or one sequence)."""
    return _loom._permute(input, _dims_arg(dims))


def expand(input, *sizes):
    """The tensor broadcast to sizes (-1 keeps a dim)."""
    return _loom._expand(input, _dims_arg(sizes))


def squeeze(input, dim=None):
    """Size-1 dims removed (all, or dim)."""
    return _loom._squeeze(input, dim)


def clone(input):
    """A copy that no longer aliases the input (gradients flow through)."""
    return input + 0 if input.dtype != dtype.bool_ else _loom.logical_or(input, input)


def _to(self, *args, dtype=None, device=None, non_blocking=False, copy=False,
        memory_format=None):
    """to(dtype), to(device), to(device, dtype), to(other) and the keyword forms, as torch;
    the device is always 'cpu' (checked), so only dtype and copy change anything."""
    args = list(args)
    if args and isinstance(args[0], Tensor):
        if dtype is not None or device is not None or len(args) > 1:
            raise TypeError("to(): to(other) takes no other dtype or device")
        dtype = args.pop(0).dtype
    elif args and isinstance(args[0], (str, _device.device)):
        if device is not None:
            raise TypeError("to(): argument 'device' given twice")
        device = args.pop(0)
    if args and not isinstance(args[0], bool):
        if dtype is not None:
            raise TypeError("to(): argument 'dtype' given twice")
        dtype = args.pop(0)
    if args and isinstance(args[0], bool):  # to(dtype, non_blocking, copy)
        non_blocking = args.pop(0)
        if args and isinstance(args[0], bool):
            copy = args.pop(0)
    if args:
        raise TypeError(f"to(): unexpected arguments {tuple(args)!r}")
    if device is not None:
        _device.check(device, "to")
    if dtype is not None and not isinstance(dtype, _loom.dtype):
        raise TypeError(f"to(): argument 'dtype' must be a loom.dtype, got "
                        f"{type(dtype).__name__}")
    if dtype is None or dtype == self.dtype:
        return clone(self) if copy else self
    return _loom.to(self, dtype)


def _tolist(self):
    if self.dtype == dtype.bfloat16:
        self = _loom.to(self, dtype.float32)
    return self.numpy().tolist()


def _size(self, dim=None):
    s = Size(self._shape())
    return s if dim is None else s[dim]


def _inplace(op):
    def method(self, other):
        r = op(self, other)
        self.copy_(r)
        return self
    return method


def _add_(self, other, alpha=1):
    out = self.__iadd__(other if alpha == 1 else other * alpha)
    return self if out is NotImplemented else out


_METHODS = {
    "sum": sum, "mean": mean, "amax": amax, "amin": amin, "max": max, "min": min,
    "argmax": argmax, "argmin": argmin, "reshape": reshape, "view": view, "permute": permute,
    "expand": expand, "squeeze": squeeze, "clone": clone, "to": _to, "tolist": _tolist,
    "size": _size, "add_": _add_,
    "sub_": lambda s, o: s.__isub__(o), "mul_": lambda s, o: s.__imul__(o),
    "div_": lambda s, o: s.__itruediv__(o),
    "float": lambda s: _to(s, dtype.float32), "double": lambda s: _to(s, dtype.float64),
    "half": lambda s: _to(s, dtype.float16), "bfloat16": lambda s: _to(s, dtype.bfloat16),
    "long": lambda s: _to(s, dtype.int64), "int": lambda s: _to(s, dtype.int32),
    "bool": lambda s: _to(s, dtype.bool_),
    "is_floating_point": lambda s: s.dtype.is_floating_point,
    "contiguous": lambda s: _loom.contiguous(s),
    "type_as": lambda s, o: _to(s, o.dtype),
}
_DIRECT = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "sin", "cos",
           "erf", "logical_not", "floor", "add", "sub", "mul", "div", "true_divide", "pow",
           "maximum", "minimum", "floor_divide", "remainder", "fmod", "logical_and", "logical_or",
           "eq", "ne", "lt", "le", "gt", "ge", "clamp", "softmax", "log_softmax", "matmul",
           "transpose", "unsqueeze", "flatten", "index_select", "index_add", "gather", "select"]


def _method(fn):
    """A bound C++ function is no descriptor: wrap it so that t.exp() passes t. __wrapped__ lets
    the stub show fn's signature, its first parameter as self."""
    def method(self, *a, **k):
        return fn(self, *a, **k)
    method.__wrapped__, method.__doc__, method.__name__ = fn, fn.__doc__, fn.__name__
    return method


def _install():
    from ._setitem import setitem
    Tensor.__setitem__ = setitem
    for name, fn in _METHODS.items():
        setattr(Tensor, name, fn)
    for name in _DIRECT:
        setattr(Tensor, name, _method(getattr(_loom, name)))
    Tensor.shape = property(lambda self: Size(self._shape()),
                            doc="The shape as a tuple subclass (loom.Size).")
    Tensor.T = property(lambda self: _loom._permute(self, list(range(self.ndim))[::-1]))
    Tensor.mT = property(lambda self: _loom.transpose(self, -2, -1))
    Tensor.__repr__ = _repr.tensor_repr
    Tensor.__str__ = _repr.tensor_repr
    Tensor.__array_priority__ = 1000  # numpy scalars on the left defer to Tensor's operators


_install()
