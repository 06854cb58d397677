"""The seed's tracing tools with Python callables and pytrees (PYTHON_API.md "Tracing tools").

Pytrees: wherever a function takes or returns tensors it may use tensors, ``dict`` (string
keys), ``list``, ``tuple``, ``namedtuple`` and ``None``, nested freely. In the arguments of
``assume_pure`` and ``compile`` any other leaf (a number, a string, an enum, a module) is
static: part of the cache key, compared by type and value. Loop carries and scanned inputs hold
tensors only. The trees are flattened in C++ (python/src/tree.cpp): a cached call runs no
Python beyond that.
"""
import functools

from . import _creation, _loom

__all__ = ["assume_pure", "compile", "scan", "while_loop", "fori_loop", "profile"]


def _wrap(wrapper, fn):
    functools.update_wrapper(wrapper, fn, updated=())
    return wrapper


def assume_pure(fn=None, *, check_purity=False):
    """Traces ``fn`` once per signature; a later call with the same signature inserts the
    cached trace as one call node without running ``fn``.

    The signature is the arguments' tree structure, each tensor's shape, dtype and
    requires_grad, and the values of the static (non-tensor) leaves, keyword and default
    arguments included. ``fn`` must be pure: a trace that depends on state it does not take
    as an argument gives stale results on hits; ``check_purity=True`` (or
    ``LOOM_CHECK_PURITY=1``) traces again on every hit and raises ``loom.TraceError`` naming
    the first op that differs. Gradients flow through the call to its tensor arguments and
    to the tensors ``fn`` reads from outside.

    Use as ``@loom.assume_pure``, ``@loom.assume_pure(check_purity=True)`` or
    ``loom.assume_pure(fn)``; a decorated method gets ``self`` as a static argument.
    """
    if fn is None:
        return lambda f: assume_pure(f, check_purity=check_purity)
    if not callable(fn):
        raise TypeError(f"assume_pure: argument 'fn' must be callable, got {type(fn).__name__}")
    return _wrap(_loom._assume_pure(fn, check_purity=check_purity), fn)


def compile(fn=None, *, name=None, full_graph=False, max_different_graphs=None,
            trace_once=False):
    """Compiles each call of the step ``fn`` as one graph, cut before and after, and runs it.

    ``name`` labels the step's graphs in metrics and errors. ``full_graph=True`` raises a
    ``loom.TraceError`` when anything inside reads a value (``item()``, printing, ``sync()``).
    ``max_different_graphs=N`` raises, naming the first differing op against the closest
    earlier graph, when the step produces more than N distinct graphs. ``trace_once=True``
    traces the step once per signature (as assume_pure): later calls run the compiled graph
    on the arguments and on the current values of the tensors it read, and write its in-place
    updates (parameters, optimizer state) back; Python code inside does not run again, so host
    numbers read inside are fixed at their first value and updates must be in place.

    Use as ``loom.compile(fn, ...)`` or as a decorator, ``@loom.compile(trace_once=True)``.
    """
    if fn is None:
        return lambda f: compile(f, name=name, full_graph=full_graph,
                                 max_different_graphs=max_different_graphs,
                                 trace_once=trace_once)
    if not callable(fn):
        raise TypeError(f"compile: argument 'fn' must be callable, got {type(fn).__name__}")
    if name is None and "<lambda>" not in getattr(fn, "__qualname__", "<lambda>"):
        name = fn.__qualname__  # else loom names the step by the Python line that made it
    return _wrap(_loom._compile(fn, name=name, full_graph=full_graph,
                                max_different_graphs=max_different_graphs,
                                trace_once=trace_once), fn)


def scan(fn, init, xs, reverse=False, length=None, remat=False):
    """``carry, y = fn(carry, x)`` over the leading dim of every tensor of ``xs``; returns
    ``(final_carry, ys)`` with each y stacked along a new dim 0.

    ``fn`` is traced once into one loop node, whatever the trip count. ``init`` and ``xs`` are
    pytrees of tensors (``xs`` may be ``None`` or ``()`` with ``length`` the trip count);
    ``reverse=True`` runs from the last slice to the first (``ys[t]`` still pairs with
    ``xs[t]``); ``remat=True`` recomputes each step in the backward instead of saving it.
    """
    if not callable(fn):
        raise TypeError(f"scan: argument 'fn' must be callable, got {type(fn).__name__}")
    if length is not None and not isinstance(length, int):
        raise TypeError(f"scan: argument 'length' must be an int or None, got "
                        f"{type(length).__name__}")
    return _loom._scan(fn, init, xs, reverse=bool(reverse), length=length, remat=bool(remat))


def while_loop(cond_fn, body_fn, carried):
    """``while cond_fn(*carried): carried = body_fn(*carried)``; returns the carried tuple.

    ``carried`` is a tuple of pytrees of tensors; ``cond_fn`` returns a bool scalar tensor,
    ``body_fn`` the new carried values with the same structure, shapes and dtypes (a lone
    value when one is carried). Both are traced once; the loop runs in the compiled graph.
    Not differentiable (a gradient through it raises ``loom.AutodiffError``; use ``scan`` or
    ``fori_loop`` with int bounds).
    """
    for name, f in (("cond_fn", cond_fn), ("body_fn", body_fn)):
        if not callable(f):
            raise TypeError(f"while_loop: argument '{name}' must be callable, got "
                            f"{type(f).__name__}")
    return _loom._while_loop(cond_fn, body_fn, carried)


def fori_loop(lower, upper, body_fn, *carried):
    """``for i in range(lower, upper): carried = body_fn(i, *carried)``; ``i`` is an int64
    scalar tensor. Returns the carried values (the value itself when one is carried).

    Int bounds make it a scan (differentiable); integer scalar tensor bounds a while loop.
    """
    if not callable(body_fn):
        raise TypeError(f"fori_loop: argument 'body_fn' must be callable, got "
                        f"{type(body_fn).__name__}")
    return _loom._fori_loop(lower, upper, body_fn, *carried)


class custom_vjp:
    """A function with a user-defined backward, as ``jax.custom_vjp``::

        @loom.custom_vjp
        def clip_gradient(x):
            return x
        def fwd(x):
            return x, None                  # (output, residuals for bwd)
        def bwd(res, g):
            return (loom.clamp(g, -1, 1),)  # one gradient (or None) per positional argument
        clip_gradient.defvjp(fwd, bwd)

    ``fwd`` computes what the function does and returns ``(output, residuals)``, pytrees of
    tensors; ``bwd(residuals, output_grad)`` returns a tuple with one gradient per positional
    argument, of the argument's structure, or ``None`` for zeros. When an argument requires
    grad (or inside a traced body), each call traces ``fwd`` and ``bwd`` once (``bwd`` runs then,
    exactly once per use)
    into one call whose backward is ``bwd``'s trace: legal inside ``scan``, ``while_loop``,
    ``fori_loop``, ``assume_pure``, ``compile`` and other ``custom_vjp`` functions. Otherwise
    the function runs plainly. ``fwd`` may not read a tensor that requires grad from outside
    its arguments (a ``loom.TraceError`` says to pass it in).
    """

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"custom_vjp: argument 'fn' must be callable, got "
                            f"{type(fn).__name__}")
        self.fn = fn
        self.fwd = self.bwd = None
        functools.update_wrapper(self, fn)

    def defvjp(self, fwd, bwd):
        """Sets the forward (returning ``(output, residuals)``) and the backward."""
        if not callable(fwd) or not callable(bwd):
            raise TypeError("custom_vjp.defvjp: fwd and bwd must be callable")
        self.fwd, self.bwd = fwd, bwd
        return self

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError("custom_vjp: pass the arguments positionally (bwd returns one "
                            "gradient per positional argument)")
        if self.fwd is None:
            raise TypeError(f"custom_vjp: {getattr(self.fn, '__name__', 'the function')} has "
                            "no backward yet; call .defvjp(fwd, bwd) first")
        bwd = self.bwd

        def backward(res, g):
            grads = bwd(res, g)
            if not isinstance(grads, tuple) or len(grads) != len(args):
                return grads  # the core says what is wrong
            return tuple(_zeros_for_none(gk, ak) for gk, ak in zip(grads, args))

        return _loom._custom_vjp_call(self.fn, self.fwd, backward, *args)


def _zeros_for_none(grad, arg):
    """``grad`` with a None in place of a tensor of ``arg`` replaced by zeros of its type."""
    if isinstance(arg, _loom.Tensor):
        return _creation.zeros(*arg.shape, dtype=arg.dtype) if grad is None else grad
    if grad is None or isinstance(arg, (int, float, bool, str)):
        return grad
    if isinstance(arg, dict) and isinstance(grad, dict):
        return {k: _zeros_for_none(grad.get(k), v) for k, v in arg.items()}
    if isinstance(arg, (list, tuple)) and isinstance(grad, (list, tuple)) and \
            len(arg) == len(grad):
        return type(grad)(_zeros_for_none(g, a) for g, a in zip(grad, arg))
    return grad


class profile:
    """Records a Chrome trace (Perfetto, chrome://tracing) of tracing, compiling, executing
    and every kernel into ``path``: ``with loom.profile("run.json"): ...``; also
    ``loom.profile.start(path)`` / ``loom.profile.stop()``. ``LOOM_PROFILE=path`` records
    a whole run."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        _loom._profile_start(self.path)
        return self

    def __exit__(self, *exc):
        _loom._profile_stop()
        return False

    start = staticmethod(_loom._profile_start)
    flush = staticmethod(_loom._profile_flush)
    stop = staticmethod(_loom._profile_stop)
