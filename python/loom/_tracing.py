"""The seed's tracing tools with Python callables and pytrees (PYTHON_API.md "Tracing tools").

Pytrees: wherever a function takes or returns tensors it may use tensors, ``dict`` (string
keys), ``list``, ``tuple``, ``namedtuple`` and ``None``, nested freely. In the arguments of
``assume_pure`` and ``compile`` any other leaf (a number, a string, an enum, a module) is
static: part of the cache key, compared by type and value. Loop carries and scanned inputs hold
tensors only. The trees are flattened in C++ (python/src/tree.cpp): a cached call runs no
Python beyond that.
"""
import functools
import itertools
import threading

from . import _creation, _loom

__all__ = ["assume_pure", "compile", "scan", "while_loop", "fori_loop", "custom_vjp",
           "pure_callback", "profile"]


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
    argument, of the argument's structure, or ``None`` for zeros. ``defvjp`` must come before
    the first call (as in JAX; a call before it is a ``TypeError``). When an argument requires
    grad (or inside a traced body), each call traces ``fwd`` and ``bwd`` once (``bwd`` runs
    then, exactly once per use) into one call whose backward is ``bwd``'s trace: legal inside
    ``scan``, ``while_loop``, ``fori_loop``, ``assume_pure``, ``compile`` and other
    ``custom_vjp`` functions. Otherwise the function runs plainly. ``fwd`` may not read a
    tensor that requires grad from outside its arguments (a ``loom.TraceError`` says to pass
    it in).
    """

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"custom_vjp: argument 'fn' must be callable, got "
                            f"{type(fn).__name__}")
        self.fn = fn
        self.fwd = self.bwd = None
        self._seen = {}  # "fn" / "fwd": the output's structure at an earlier call
        functools.update_wrapper(self, fn)

    def defvjp(self, fwd, bwd):
        """Sets the forward (returning ``(output, residuals)``) and the backward."""
        if not callable(fwd) or not callable(bwd):
            raise TypeError("custom_vjp.defvjp: fwd and bwd must be callable")
        self.fwd, self.bwd = fwd, bwd
        self._seen.pop("fwd", None)
        return self

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError("custom_vjp: pass the arguments positionally (bwd returns one "
                            "gradient per positional argument)")
        if self.fwd is None:
            raise TypeError(f"custom_vjp: {getattr(self.fn, '__name__', 'the function')} has "
                            "no backward yet; call .defvjp(fwd, bwd) first")
        if id(self) in _fwd_tracing():  # fwd calling the function itself, as JAX's docs do
            return self.fn(*args)
        bwd, fwd = self.bwd, self.fwd
        name = getattr(self.fn, "__name__", "the function")
        used_fwd = []

        def forward(*a):
            active = _fwd_tracing()
            active.add(id(self))
            try:
                out = fwd(*a)
            finally:
                active.discard(id(self))
            if isinstance(out, tuple) and len(out) == 2:
                used_fwd.append(1)
                self._check_structure(_structure(out[0]), "fwd", name)
            return out

        def backward(res, g):
            grads = bwd(res, g)
            if not isinstance(grads, tuple) or len(grads) != len(args):
                return grads  # the core says what is wrong
            return tuple(_zeros_for_none(gk, ak) for gk, ak in zip(grads, args))

        out = _loom._custom_vjp_call(self.fn, forward, backward, *args)
        if not used_fwd:
            self._check_structure(_structure(out), "fn", name)
        return out

    def _check_structure(self, got, whose, name):
        """fwd's output and the function's have one structure (as JAX requires): else the
        result's structure would change with grad mode."""
        self._seen[whose] = got
        other = self._seen.get("fn" if whose == "fwd" else "fwd", got)
        if other != got:
            fwd_s, fn_s = (got, other) if whose == "fwd" else (other, got)
            del self._seen[whose]
            raise TypeError(f"custom_vjp: the fwd of {name} returns an output of structure "
                            f"{fwd_s}; expected the structure of {name}'s own output, {fn_s}")


_FWD = threading.local()


def _fwd_tracing():
    """The custom_vjp functions whose fwd this thread is running: inside its fwd, a function's
    own calls are its plain primal (fwd may compute the output by calling it)."""
    s = getattr(_FWD, "active", None)
    if s is None:
        s = _FWD.active = set()
    return s


def _structure(tree):
    """A pytree's structure, its leaves shown as 'Tensor' (comparable, printable)."""
    return _unflatten(_flatten(tree, lambda x, path: None)[1], itertools.repeat("Tensor"))


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


def _flatten(tree, leaf, path="args"):
    """The leaves of a pytree (tuple, list, dict, None) as ``leaf(x, path)`` makes them, and a
    hashable description of its structure."""
    if tree is None:
        return [], None
    # A ShapeDtypeStruct written as a namedtuple is a leaf, not a tuple.
    if isinstance(tree, (tuple, list)) and not (hasattr(tree, "_fields") and
                                                hasattr(tree, "shape") and hasattr(tree, "dtype")):
        leaves, parts = [], []
        for k, x in enumerate(tree):
            sub, d = _flatten(x, leaf, f"{path}[{k}]")
            leaves += sub
            parts.append(d)
        return leaves, (type(tree), tuple(parts))
    if isinstance(tree, dict):
        leaves, parts = [], []
        for k in tree:
            sub, d = _flatten(tree[k], leaf, f"{path}[{k!r}]")
            leaves += sub
            parts.append((k, d))
        return leaves, (dict, tuple(parts))
    return [leaf(tree, path)], "*"


def _unflatten(desc, leaves):
    """The pytree of ``desc`` (from _flatten) with the next leaves of the iterator ``leaves``."""
    if desc is None:
        return None
    if desc == "*":
        return next(leaves)
    kind, parts = desc
    if kind is dict:
        return {k: _unflatten(d, leaves) for k, d in parts}
    items = [_unflatten(d, leaves) for d in parts]
    return kind(*items) if hasattr(kind, "_fields") else kind(items)


_DTYPES = {"bool": "bool_", "int32": "int32", "int64": "int64", "float16": "float16",
           "float32": "float32", "float64": "float64", "bfloat16": "bfloat16"}


def _result_spec(x, path):
    """(shape, loom dtype) of a declared result: anything with .shape and .dtype."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"pure_callback: result_shape_dtypes{path} must have .shape and "
                        f".dtype (a numpy array, a loom Tensor, numpy.empty(shape, dtype)), got "
                        f"{type(x).__name__}")
    dt = x.dtype
    if not isinstance(dt, _loom.dtype):
        name = str(dt).replace("torch.", "")
        if name not in _DTYPES:
            import numpy as np
            name = np.dtype(dt).name
        if name not in _DTYPES:
            raise TypeError(f"pure_callback: result_shape_dtypes{path} has dtype {dt}; "
                            f"loom has {', '.join(_DTYPES)}")
        dt = getattr(_loom.dtype, _DTYPES[name])
    if dt == _loom.dtype.bfloat16:
        raise TypeError(f"pure_callback: result_shape_dtypes{path} is bfloat16, which "
                        "numpy has no type for; declare float32 and convert the result")
    return (tuple(int(d) for d in x.shape), dt)


def _arg_tensor(x, path):
    t = x if isinstance(x, _loom.Tensor) else _creation.tensor(x)
    if t.dtype == _loom.dtype.bfloat16:
        raise TypeError(f"pure_callback: {path} is bfloat16, which numpy has no type for; "
                        "pass it as float32")
    return t


_host_callbacks = {}


def _host_callback(fn, args_desc, results_desc, kind):
    """The registered host callback that calls fn on numpy arrays in the structure args_desc
    and returns the leaves of its result (in the structure results_desc). Registered once per
    function and structures: its id is part of every graph that calls it."""
    key = (id(fn), args_desc, results_desc, kind)
    hit = _host_callbacks.get(key)
    if hit is not None:
        return hit[1]
    import numpy as np
    name = getattr(fn, "__name__", None) or type(fn).__name__

    def host(arrays):
        out = fn(*_unflatten(args_desc, iter(arrays)))
        if kind == "vjp":  # one gradient per positional argument, None for zeros
            primal = _unflatten(args_desc, iter(arrays))[0]
            if not isinstance(out, tuple) or len(out) != len(primal):
                raise TypeError(f"pure_callback: the vjp {name} must return a tuple of one "
                                f"gradient (or None) per argument of the callback, "
                                f"{len(primal)}, got {type(out).__name__}")
            out = tuple(_zeros_tree(a) if g is None else g for g, a in zip(out, primal))
        leaves, _ = _flatten(out, lambda x, p: x)
        return [np.asarray(x) for x in leaves]

    cb = _loom._HostCallback(name, host)
    _host_callbacks[key] = (fn, cb)  # holds fn: its id stays its own
    return cb


def _zeros_tree(tree):
    import numpy as np
    leaves, desc = _flatten(tree, lambda x, p: np.zeros_like(np.asarray(x)))
    return _unflatten(desc, iter(leaves))


def _call_host(fn, result_shape_dtypes, args, kind="call"):
    specs, results_desc = _flatten(result_shape_dtypes, _result_spec, "")
    if not specs:
        raise TypeError("pure_callback: result_shape_dtypes declares no results; a callback "
                        "returns at least one array")
    leaves, args_desc = _flatten(tuple(args), _arg_tensor)
    cb = _host_callback(fn, args_desc, results_desc, kind)
    return _unflatten(results_desc, iter(_loom._pure_callback(cb, specs, leaves)))


def pure_callback(callback, result_shape_dtypes, *args, vjp=None):
    """Calls host code from loom programs, as ``jax.pure_callback``::

        def np_sort(x):                       # numpy arrays in, numpy arrays out
            return np.sort(x, axis=-1)
        y = loom.pure_callback(np_sort, x, x) # the result is declared like x

    ``result_shape_dtypes`` is a pytree (tuple, list, dict) of anything with ``.shape`` and
    ``.dtype`` (a numpy array, a loom Tensor, ``np.empty(shape, dtype)``); the result has its
    structure, and ``callback`` must return arrays of exactly those shapes and dtypes (else a
    ``loom.ExecError`` naming the callback and both types). ``args`` are pytrees of tensors
    (numpy arrays and numbers become tensors: a Python int arrives as an int64 array, which
    numpy 2 promotes float32 arrays with, so cast in the callback or pass a float); ``callback``
    gets numpy copies. The call is an op of the traced graph: legal inside ``scan``,
    ``while_loop``, ``assume_pure``, ``compile`` and ``custom_vjp`` bodies, run when the graph
    runs, on the thread that runs it, with the GIL. An exception ``callback`` raises propagates as itself, and the tensors
    that depend on the call raise it again when read; everything else stays usable.

    ``callback`` must be pure: loom may drop a call whose result is unused, merge two with the
    same arguments, or call it again (a ``scan``'s backward runs each step's callbacks
    again), and it must not use loom. Each function is registered once (the graph names it):
    pass the same function every step, not a new lambda, or every step compiles.

    ``vjp`` makes the call differentiable: ``vjp(args, out, out_grad)``, numpy in, returns a
    tuple with one gradient (or ``None`` for zeros) per positional argument; it runs as a
    second callback in the backward. Without it a gradient through the call is a
    ``loom.AutodiffError``.
    """
    if not callable(callback):
        raise TypeError(f"pure_callback: argument 'callback' must be callable, got "
                        f"{type(callback).__name__}")
    if vjp is None:
        return _call_host(callback, result_shape_dtypes, args)
    if not callable(vjp):
        raise TypeError(f"pure_callback: argument 'vjp' must be callable, got "
                        f"{type(vjp).__name__}")
    f = _vjp_functions.get((id(callback), id(vjp)))
    if f is None:
        f = _callback_with_vjp(callback, vjp)
        _vjp_functions[(id(callback), id(vjp))] = f
    return f(result_shape_dtypes, *args)


_vjp_functions = {}


def _callback_with_vjp(callback, vjp):
    def backward_host(args, out, g):
        return vjp(args, out, g)
    backward_host.__qualname__ = getattr(vjp, "__qualname__", "vjp")
    backward_host.__name__ = getattr(vjp, "__name__", "vjp")  # errors name the user's vjp

    def call(specs, *args):
        @custom_vjp
        def f(*a):
            return _call_host(callback, specs, a)

        def fwd(*a):
            out = _call_host(callback, specs, a)
            return out, (a, out)

        def bwd(res, g):
            a, out = res
            grads = _call_host(backward_host, tuple(a), (a, out, g), kind="vjp")
            return tuple(grads)

        f.defvjp(fwd, bwd)
        return f(*args)

    call._keep = (callback, vjp, backward_host)
    return call


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
