"""grad and value_and_grad of functions of tensors (pytrees of dict, list, tuple, namedtuple,
None), after the C++ loom::value_and_grad: fresh leaves, no .grad touched."""
import functools

from . import _loom
from ._loom import Tensor


def tree_flatten(tree):
    """(leaves, rebuild): the tensors of `tree` in order and a function that refills it."""
    leaves = []

    def walk(t):
        if isinstance(t, Tensor):
            leaves.append(t)
            return lambda it: next(it)
        if isinstance(t, dict):
            keys = list(t)
            subs = [walk(t[k]) for k in keys]
            return lambda it: type(t)((k, s(it)) for k, s in zip(keys, subs))
        if isinstance(t, tuple) and hasattr(t, "_fields"):
            subs = [walk(v) for v in t]
            return lambda it: type(t)(*(s(it) for s in subs))
        if isinstance(t, (list, tuple)):
            subs = [walk(v) for v in t]
            return lambda it: type(t)(s(it) for s in subs)
        return lambda it: t  # None and other leaves are static

    build = walk(tree)
    return leaves, lambda new: build(iter(new))


def value_and_grad(fn, argnums=0):
    """value_and_grad(fn)(*args) -> (fn(*args), d fn / d args[argnums]) with the gradient
    shaped as args[argnums] (a pytree of tensors); fn returns a one-element tensor."""
    if not callable(fn):
        raise TypeError(f"value_and_grad: argument 'fn' must be callable, got "
                        f"{type(fn).__name__}")
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        args = list(args)
        fresh, rebuilds, leaves_of = [], [], []
        for n in nums:
            leaves, rebuild = tree_flatten(args[n])
            new = [_loom._fresh_leaf(x) for x in leaves]
            args[n] = rebuild(new)
            fresh += new
            leaves_of.append((leaves, rebuild, len(new)))
        value = fn(*args, **kwargs)
        if not isinstance(value, Tensor):
            raise TypeError(f"value_and_grad: fn must return a Tensor, got "
                            f"{type(value).__name__}")
        grads = _loom._functional_gradients(value, fresh)
        out, k = [], 0
        for leaves, rebuild, count in leaves_of:
            g = [grads[k + i] if grads[k + i] is not None else _zeros_like(leaves[i])
                 for i in range(count)]
            out.append(rebuild(g))
            k += count
        return value, (out[0] if isinstance(argnums, int) else tuple(out))

    return wrapped


def _zeros_like(t):
    return _loom._zeros(list(t._shape()), t.dtype)


def grad(fn, argnums=0):
    """grad(fn)(*args): the gradient of value_and_grad(fn, argnums)."""
    vg = value_and_grad(fn, argnums)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    return wrapped
