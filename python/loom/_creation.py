"""Tensor creation with PyTorch's signatures and dtype inference."""
import numbers

import numpy as np

from . import _device, _loom
from ._loom import Tensor, dtype

_NP_OF = {
    dtype.bool_: np.bool_, dtype.int32: np.int32, dtype.int64: np.int64,
    dtype.float16: np.float16, dtype.float32: np.float32, dtype.float64: np.float64,
}


def _shape(size):
    """zeros(2, 3) and zeros((2, 3)) alike."""
    if len(size) == 1 and not isinstance(size[0], numbers.Integral):
        size = tuple(size[0])
    for s in size:
        if not isinstance(s, numbers.Integral):
            raise TypeError(f"size must be a tuple of ints, got an element of type "
                            f"{type(s).__name__}")
    return [int(s) for s in size]


def _check_dtype(d, arg="dtype"):
    if d is not None and not isinstance(d, dtype):
        raise TypeError(f"argument '{arg}' must be a loom.dtype, got {type(d).__name__}")


def _finish(t, requires_grad):
    return t.requires_grad_() if requires_grad else t


def _place(device, fn):
    """device= as torch takes it: None or the host ('cpu', loom.device('cpu'))."""
    if device is not None:
        _device.check(device, fn)


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data` (nested lists, numbers, numpy arrays, tensors).
    Python floats give float32, ints int64, bools bool_; a numpy array keeps its dtype."""
    _check_dtype(dtype)
    _place(device, "tensor")
    if isinstance(data, Tensor):
        t = data.detach().clone()
    elif isinstance(data, (np.ndarray, np.generic)):
        t = _loom._tensor_copy(np.asarray(data))  # keeps its dtype; strided arrays copy too
    elif hasattr(data, "__dlpack__"):
        t = _loom._tensor_copy(data)
    else:
        try:
            arr = np.asarray(data)
        except (ValueError, TypeError) as e:
            raise TypeError(f"tensor(): could not convert data of type {type(data).__name__} "
                            f"to a tensor: {e}") from None
        if arr.dtype == np.float64 or arr.dtype.kind == "f":
            arr = arr.astype(np.float32, copy=False)
        elif arr.dtype.kind in "iu":
            arr = arr.astype(np.int64, copy=False)
        elif arr.dtype.kind == "b":
            pass
        elif arr.dtype == object or arr.dtype.kind not in "biuf":
            raise TypeError(f"tensor(): could not infer a dtype for data of type "
                            f"{type(data).__name__} (numpy made {arr.dtype})")
        t = _loom._tensor_copy(arr)
    if dtype is not None and t.dtype != dtype:
        t = _loom.to(t, dtype)
    return _finish(t, requires_grad)


def as_tensor(data, dtype=None, device=None):
    """A tensor of `data`, sharing a numpy array's memory when its dtype fits (torch.as_tensor)."""
    _place(device, "as_tensor")
    if isinstance(data, Tensor) and (dtype is None or data.dtype == dtype):
        return data
    return tensor(data, dtype=dtype)


def _sized(make, size, dtype, requires_grad, device, fn):
    """make(shape, dtype) for a size given as ints or one sequence; float32 by default."""
    _check_dtype(dtype)
    _place(device, fn)
    return _finish(make(_shape(size), dtype or _loom.dtype.float32), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of zeros of the given size (ints or one sequence); float32 unless dtype= says."""
    return _sized(_loom._zeros, size, dtype, requires_grad, device, "zeros")


def ones(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of ones of the given size (ints or one sequence); float32 unless dtype= says."""
    return _sized(_loom._ones, size, dtype, requires_grad, device, "ones")


def _value_dtype(v):
    if isinstance(v, bool):
        return _loom.dtype.bool_
    if isinstance(v, numbers.Integral):
        return _loom.dtype.int64
    return _loom.dtype.float32


# The finite range of each dtype: a fill value outside it is torch's overflow error.
_RANGE = {
    dtype.int32: (-2**31, 2**31 - 1), dtype.int64: (-2**63, 2**63 - 1),
    dtype.float16: (-65504.0, 65504.0), dtype.bfloat16: (-3.3895313892515355e38,
                                                         3.3895313892515355e38),
    dtype.float32: (-3.4028234663852886e38, 3.4028234663852886e38),
}


def _check_fits(value, d, fn):
    lo_hi = _RANGE.get(d)
    if lo_hi is None or isinstance(value, bool):
        return
    v = value if isinstance(value, numbers.Integral) else float(value)
    integral = d in (dtype.int32, dtype.int64)
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        if not integral:
            return  # nan and infinities are values of every float dtype
    elif lo_hi[0] <= v <= lo_hi[1]:
        return
    raise _loom.DTypeError(f"[{fn}] value {value!r} cannot be converted to {d} without "
                           f"overflow (its range is [{lo_hi[0]:g}, {lo_hi[1]:g}]), as torch")


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    """A tensor of `size` filled with `fill_value`, its dtype inferred from the value as torch does.
    A value outside the dtype's range raises DTypeError (torch's overflow error)."""
    _check_dtype(dtype)
    _place(device, "full")
    if isinstance(size, numbers.Integral):
        size = (size,)
    if not isinstance(fill_value, numbers.Number):
        raise TypeError(f"full(): fill_value must be a number, got {type(fill_value).__name__}")
    d = dtype or _value_dtype(fill_value)
    _check_fits(fill_value, d, "full")
    return _finish(_loom._full(_shape((size,)), float(fill_value), d), requires_grad)


def zeros_like(t, dtype=None, device=None):
    """Zeros of t's shape and dtype (or dtype=)."""
    return zeros(t.shape, dtype=dtype or t.dtype, device=device)


def ones_like(t, dtype=None, device=None):
    """Ones of t's shape and dtype (or dtype=)."""
    return ones(t.shape, dtype=dtype or t.dtype, device=device)


def full_like(t, fill_value, dtype=None, device=None):
    """t's shape filled with fill_value, t's dtype (or dtype=)."""
    return full(t.shape, fill_value, dtype=dtype or t.dtype, device=device)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """torch.arange: ints give int64, any float gives float32. A zero step, or bounds the step
    moves away from (arange(5, 0)), raise ShapeError as torch raises."""
    _check_dtype(dtype)
    _place(device, "arange")
    if end is None:
        start, end = 0, start
    for name, v in (("start", start), ("end", end), ("step", step)):
        if not isinstance(v, numbers.Real):
            raise TypeError(f"arange(): argument '{name}' must be a number, "
                            f"got {type(v).__name__}")
    if step == 0:
        raise _loom.ShapeError("[arange] step must be nonzero")
    if any(v != v or v in (float("inf"), float("-inf")) for v in (start, end, step)):
        raise _loom.ShapeError(f"[arange] start, end and step must be finite, got start={start}, "
                               f"end={end}, step={step}")
    if (end - start) * step < 0:
        raise _loom.ShapeError(f"[arange] the step {step} moves away from the end: start={start}, "
                               f"end={end} (as torch: upper bound and larger bound inconsistent "
                               f"with step sign)")
    ints = all(isinstance(v, numbers.Integral) for v in (start, end, step))
    d = dtype or (_loom.dtype.int64 if ints else _loom.dtype.float32)
    n = max(0, -(-(end - start) // step)) if ints else max(0, int(np.ceil((end - start) / step)))
    if start == 0 and step == 1:
        t = _loom._arange(0.0, float(n), d)
    else:
        base = _loom._arange(0.0, float(n), _loom.dtype.int64 if ints else _loom.dtype.float64)
        t = _loom.to(base * step + start, d)
    return _finish(t, requires_grad)


def randn(*size, dtype=None, device=None, requires_grad=False):
    """Standard normal draws of the given size (loom.manual_seed seeds them)."""
    return _sized(_loom._randn, size, dtype, requires_grad, device, "randn")


def rand(*size, dtype=None, device=None, requires_grad=False):
    """Uniform [0, 1) draws of the given size (loom.manual_seed seeds them)."""
    return _sized(_loom._rand, size, dtype, requires_grad, device, "rand")


def randn_like(t, dtype=None, device=None):
    """Standard normal draws of t's shape and dtype (or dtype=)."""
    return randn(t.shape, dtype=dtype or t.dtype, device=device)


def rand_like(t, dtype=None, device=None):
    """Uniform [0, 1) draws of t's shape and dtype (or dtype=)."""
    return rand(t.shape, dtype=dtype or t.dtype, device=device)
