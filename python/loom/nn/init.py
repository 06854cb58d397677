"""loom.nn.init: torch.nn.init's initializers. Each fills its tensor in place, without
recording a gradient (as torch's run under no_grad), from loom's seeded generator
(loom.manual_seed), and returns it; the draws are loom's, not torch's."""
import math
import numbers

from .. import _loom
from .._grad_mode import no_grad

__all__ = ["calculate_gain", "uniform_", "normal_", "constant_", "ones_", "zeros_",
           "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"]


def _check(tensor, fn):
    if not isinstance(tensor, _loom.Tensor):
        raise TypeError(f"nn.init.{fn}(): expected a loom tensor, got {type(tensor).__name__}")
    if not tensor.dtype.is_floating_point:
        raise _loom.DTypeError(f"[nn.init.{fn}] expected a floating-point tensor, got "
                               f"{tensor.dtype}")


def _fill(tensor, value):
    with no_grad():
        tensor.copy_(value)
    return tensor


def calculate_gain(nonlinearity, param=None):
    """torch's recommended gain for a nonlinearity ('linear', 'conv*', 'sigmoid', 'tanh',
    'relu', 'leaky_relu' (param: the negative slope, 0.01 by default), 'selu')."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                        "conv_transpose2d", "conv_transpose3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, numbers.Real) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _fans(tensor, fn):
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise _loom.ShapeError(f"[nn.init.{fn}] fan in and fan out can not be computed for a "
                               f"tensor with fewer than 2 dimensions, got shape {list(shape)}")
    field = math.prod(shape[2:])
    return shape[1] * field, shape[0] * field


def uniform_(tensor, a=0.0, b=1.0):
    """Fills `tensor` with draws from U(a, b)."""
    _check(tensor, "uniform_")
    u = _loom._rand(list(tensor.shape), tensor.dtype)
    return _fill(tensor, u * (b - a) + a)


def normal_(tensor, mean=0.0, std=1.0):
    """Fills `tensor` with draws from N(mean, std^2)."""
    _check(tensor, "normal_")
    return _fill(tensor, _loom._randn(list(tensor.shape), tensor.dtype) * std + mean)


def constant_(tensor, val):
    """Fills `tensor` with `val`."""
    _check(tensor, "constant_")
    return _fill(tensor, _loom._full([], float(val), tensor.dtype))


def ones_(tensor):
    """Fills `tensor` with ones."""
    return constant_(tensor, 1.0)


def zeros_(tensor):
    """Fills `tensor` with zeros."""
    return constant_(tensor, 0.0)


def xavier_uniform_(tensor, gain=1.0):
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot and Bengio)."""
    fan_in, fan_out = _fans(tensor, "xavier_uniform_")
    a = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -a, a)


def xavier_normal_(tensor, gain=1.0):
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _fans(tensor, "xavier_normal_")
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def _kaiming_std(tensor, a, mode, nonlinearity, fn):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _fans(tensor, fn)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al.)."""
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_uniform_")
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    """N(0, std^2) with std = gain / sqrt(fan) (He et al.)."""
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity, "kaiming_normal_"))
