"""loom.nn.utils: torch.nn.utils' gradient clipping, lazily: the norm and the scaling are ops of
the step's graph (no value is read on the host), so a clipped step stays one graph."""
import math

from .. import _loom
from .._loom import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _norm(x, p):
    """torch.norm(x, p) of the flattened x (p finite)."""
    a = _loom.abs(x)
    if p == 2.0:
        return _loom.sqrt(_loom._sum(a * a, None, False))
    if p == 1.0:
        return _loom._sum(a, None, False)
    if p == 0.0:
        return _loom._sum(_loom.to(a != 0, x.dtype), None, False)
    return _loom.pow(_loom._sum(_loom.pow(a, p), None, False), 1.0 / p)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scales the gradients of `parameters` (a tensor or an iterable of them) in place so that
    their norm_type-norm taken together is at most max_norm, as torch: coefficient
    max_norm / (total + 1e-6), clamped to 1. Returns the total norm (before clipping) as a 0-d
    tensor, pending: reading it (item()) is what runs it. error_if_nonfinite=True reads the
    norm on the host (a sync) to raise on nan or inf, as torch."""
    grads = _grads(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        return _loom._full([], 0.0, _loom.dtype.float32)
    with _loom.no_grad():
        if math.isinf(norm_type):
            norms = [_loom._amax(_loom.abs(g), None, False) for g in grads]
            total = norms[0] if len(norms) == 1 else _loom._amax(_loom.stack(norms), None, False)
        else:
            norms = [_norm(g, norm_type) for g in grads]
            total = _norm(_loom.stack(norms), norm_type)  # as torch, for one grad too
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise _loom.Error(f"[clip_grad_norm_] the total norm of order {norm_type} for "
                              f"gradients from `parameters` is non-finite, so it cannot be "
                              f"clipped. To disable this error and scale the gradients by the "
                              f"non-finite norm anyway, set `error_if_nonfinite=False`")
        coef = _loom.clamp(max_norm / (total + 1e-6), None, 1.0)
        for g in grads:
            g.mul_(coef if coef.dtype == g.dtype else _loom.to(coef, g.dtype))
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamps every gradient of `parameters` to [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    with _loom.no_grad():
        for g in _grads(parameters):
            g.copy_(_loom.clamp(g, -clip_value, clip_value))
