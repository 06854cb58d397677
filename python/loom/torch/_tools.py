"""The seed's tools for torch callables (torch_xla's signatures): assume_pure, scan, fori_loop,
while_loop and compile. Each traces its torch function into loom's IR (the function runs on
LoomTensors, so its aten ops become loom ops): assume_pure once per signature, the loops once
per call into one loop node whatever the trip count. assume_pure and the loops are differentiable
through torch's autograd: a torch.autograd.Function whose backward is loom's VJP of the
traced region, recorded lazily into the same graph (where loom's CSE shares the forward)."""
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import loom
from loom import _loom

from ._tensor import LoomTensor, to_loom, wrap

_FLOATS = (loom.float16, loom.bfloat16, loom.float32, loom.float64)
_grad_enabled = torch.is_grad_enabled


def _any_requires_grad_py(*xs):
    return any(type(x) is LoomTensor and x.requires_grad for x in xs)


# Whether any of the arguments is a tensor that requires grad (grad mode aside): one C call on
# torch >= 2.x, where reading requires_grad from Python costs ~0.2 us a tensor.
_any_requires_grad = getattr(torch._C, "_any_requires_grad", _any_requires_grad_py)
_PLAIN = (int, float, bool, str)  # pytree leaves on every torch version (None is not on 2.x)


def _as_loom_tensor(x):
    return x if isinstance(x, LoomTensor) else to_loom(x)


def _torch_view(x):
    return LoomTensor(x) if isinstance(x, loom.Tensor) else x


def _loom_view(x):
    if isinstance(x, LoomTensor):
        return x._elem
    if isinstance(x, torch.Tensor):
        raise loom.TraceError(f"[loom.torch] a traced function returned a CPU tensor "
                              f"{x.dtype}{list(x.shape)}; return tensors on loom's device")
    return x


class _Region(torch.autograd.Function):
    """outputs = run(*inputs) on loom tensors; backward: loom's VJP of run at the inputs."""

    @staticmethod
    def forward(ctx, run, n_static, *flat):
        statics, tensors = flat[:n_static], flat[n_static:]
        ctx.run, ctx.statics = run, statics
        ctx.save_for_backward(*tensors)
        outs = run(statics, [t._elem for t in tensors])
        return tuple(LoomTensor(o) for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        leaves = [t._elem.detach().requires_grad_() if t._elem.dtype in _FLOATS and
                  ctx.needs_input_grad[2 + len(ctx.statics) + i] else t._elem.detach()
                  for i, t in enumerate(tensors)]
        with loom.enable_grad():
            outs = ctx.run(ctx.statics, leaves)
            terms = [(o * g._elem).sum() for o, g in zip(outs, grads)
                     if g is not None and o.dtype in _FLOATS]
            if terms:
                total = terms[0]
                for t in terms[1:]:
                    total = total + t
                total.backward()
        back = [LoomTensor(x.grad) if x.requires_grad and x.grad is not None else None
                for x in leaves]
        return (None, None) + (None,) * len(ctx.statics) + tuple(back)


def _call_region(run, statics, tensors):
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _Region.apply(run, len(statics), *statics, *tensors)
    return tuple(LoomTensor(o) for o in run(statics, [t._elem for t in tensors]))


class _Drawn(torch.autograd.Function):
    """out = fn(*inputs) for an fn that draws random numbers (attention's dropout), recorded
    with loom's autograd; backward: loom's gradients of that recording, so the draw is the
    forward's (_Region runs fn again, which would draw again)."""

    @staticmethod
    def forward(ctx, fn, name, *tensors):
        leaves = [loom._loom._fresh_leaf(t._elem) if t._elem.dtype in _FLOATS and
                  ctx.needs_input_grad[2 + i] else t._elem for i, t in enumerate(tensors)]
        with loom.enable_grad():
            out = fn(*leaves)
        # Saved as torch saves tensors, so freed after the backward unless retain_graph: held
        # longer, the recording's pending values would keep a loop that reads only
        # loss.item() from ever dropping its pending graph.
        ctx.save_for_backward(LoomTensor(out), *(LoomTensor(x) for x in leaves))
        ctx.name = name
        return LoomTensor(out.detach())

    @staticmethod
    def backward(ctx, grad):
        out, *leaves = (t._elem for t in ctx.saved_tensors)
        wrt = [x for x in leaves if x.requires_grad]
        if not out.requires_grad:  # a sync ran loom's recording
            raise loom.AutodiffError(f"[loom.torch] {ctx.name}: lt.sync() between the forward "
                                     f"and the backward freed loom's record of its random "
                                     f"draw; call backward before syncing")
        with loom.enable_grad():
            got = iter(loom._loom._functional_gradients((out * grad._elem).sum(), wrt))
        back = [(lambda g: None if g is None else LoomTensor(g))(next(got))
                if x.requires_grad else None for x in leaves]
        return (None, None) + tuple(back)


def fused(fn, *tensors, draws=None):
    """fn (loom tensors -> one loom tensor), a torch call loom runs as one op, on LoomTensors,
    differentiable through torch's autograd by loom's gradients of fn. draws: fn's name when
    it draws random numbers (then a sync must not come between forward and backward)."""
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return LoomTensor(fn(*(t._elem for t in tensors)))
    if draws:
        return _Drawn.apply(fn, draws, *tensors)
    return _Region.apply(lambda _, elems: [fn(*elems)], 0, *tensors)[0]


def _split(flat):
    """The positions of the tensors among flat leaves, the tensors (moved to loom) and the
    other leaves."""
    where = [isinstance(x, torch.Tensor) for x in flat]
    tensors = [_as_loom_tensor(x) for x, w in zip(flat, where) if w]
    statics = tuple(x for x, w in zip(flat, where) if not w)
    return where, tensors, statics


def _merge(where, statics, tensors):
    it_s, it_t = iter(statics), iter(tensors)
    return [next(it_t) if w else next(it_s) for w in where]


def assume_pure(fn):
    """torch_xla's assume_pure: fn (torch tensors in, a pytree of tensors out; pure, and with
    every tensor it reads passed as an argument, e.g. over torch.func.functional_call or, on
    torch 1.13, torch.nn.utils.stateless.functional_call) is traced once per signature into
    loom's IR; later calls insert the cached trace without running fn. Differentiable."""
    out_specs, pures = {}, {}

    def traced(key, spec):
        """loom's pure function of one argument structure (the structure is then no static
        argument loom hashes per call)."""
        pure = pures.get(key)
        if pure is None:
            def body(*flat):
                args, kwargs = tree_unflatten([_torch_view(x) for x in flat], spec)
                with torch.no_grad():
                    out = fn(*args, **kwargs)
                leaves, out_specs[key] = tree_flatten(out)
                return [_loom_view(x) for x in leaves]
            pure = pures[key] = loom.assume_pure(body)
        return pure

    # Calls whose arguments are LoomTensors and numbers or strings only (no containers): their
    # leaves are the arguments, so (positional count, keyword names, argument types) finds the
    # loom function without torch's pytree, which cost most of a cached call.
    fast = {}

    def call(*args, **kwargs):
        flat = (*args, *kwargs.values()) if kwargs else args
        sig = (len(args), *kwargs, *map(type, flat))
        hit = fast.get(sig)
        if hit is not None:
            pure, single, at_tensors, key, where = hit
            if not (_grad_enabled() and _any_requires_grad(*flat)):
                # nothing to differentiate: loom's call, no autograd.Function
                outs = pure(*[x._elem if type(x) is LoomTensor else x for x in flat])
                return wrap(outs[0]) if single else \
                    tree_unflatten([wrap(o) for o in outs], out_specs[key])
            tensors = [flat[i] for i in at_tensors]
            statics = tuple(x for x in flat if type(x) is not LoomTensor)
        else:
            leaves, spec = tree_flatten((args, kwargs))
            where, tensors, statics = _split(leaves)
            key = (str(spec), tuple(where))
            pure = traced(key, spec)
        outs = _call_region(lambda statics_, elems: pure(*_merge(where, statics_, elems)),
                            statics, tensors)
        out = tree_unflatten(list(outs), out_specs[key])
        if hit is None and all(type(x) is LoomTensor or type(x) in _PLAIN for x in flat) and \
                len(leaves) == len(flat) and all(a is b for a, b in zip(leaves, flat)):
            single = len(outs) == 1 and out is outs[0]
            fast[sig] = (pure, single, [i for i, x in enumerate(flat) if type(x) is LoomTensor],
                         key, where)
            if single:  # the C++ path takes these calls from now on
                learned.append((pure, len(args), tuple(kwargs), tuple(map(type, flat))))
        return out

    learned = []
    cached = _loom._TorchPure(call, LoomTensor, wrap, _grad_enabled, _any_requires_grad, learned)
    cached.__wrapped__ = fn
    return cached


def scan(fn, init, xs):
    """torch_xla's scan: carry, y = fn(carry, x) over the leading dim of xs; returns
    (final carry, ys stacked). fn is traced once into one loop; differentiable."""
    flat, spec = tree_flatten((init, xs))
    where, tensors, statics = _split(flat)
    if statics:
        raise loom.TraceError("[loom.torch.scan] init and xs must hold tensors only, got "
                              + ", ".join(type(s).__name__ for s in statics))
    n_init = len(tree_flatten(init)[0])
    out_spec = []

    def step(carry, x):
        c = tree_unflatten([_torch_view(v) for v in carry], tree_flatten(init)[1])
        xv = tree_unflatten([_torch_view(v) for v in x], tree_flatten(xs)[1])
        with torch.no_grad():
            new_c, y = fn(c, xv)
        cl, _ = tree_flatten(new_c)
        yl, yspec = ([], None) if y is None else tree_flatten(y)
        out_spec[:] = [yspec]
        return [_loom_view(v) for v in cl], [_loom_view(v) for v in yl]

    def run(_, elems):
        final, ys = loom.scan(step, list(elems[:n_init]), list(elems[n_init:]))
        return list(final) + list(ys)

    outs = _call_region(run, (), tensors)
    final = tree_unflatten(list(outs[:n_init]), tree_flatten(init)[1])
    ys = None if out_spec[0] is None else tree_unflatten(list(outs[n_init:]), out_spec[0])
    return final, ys


def while_loop(cond_fn, body_fn, carried):
    """torch's while_loop (torch._higher_order_ops): while cond_fn(*carried): carried =
    body_fn(*carried); both traced once, the loop runs in the compiled graph. Not
    differentiable, as loom.while_loop."""
    carried = tuple(_as_loom_tensor(c) for c in carried)

    def cond(*c):
        with torch.no_grad():
            return _loom_view(cond_fn(*[_torch_view(v) for v in c]))

    def body(*c):
        with torch.no_grad():
            out = body_fn(*[_torch_view(v) for v in c])
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(_loom_view(v) for v in out)

    res = loom.while_loop(cond, body, tuple(c._elem for c in carried))
    res = res if isinstance(res, (tuple, list)) else (res,)
    return tuple(LoomTensor(r) for r in res)


def fori_loop(lower, upper, body_fn, *carried):
    """torch_xla's fori_loop: for i in range(lower, upper): carried = body_fn(i, *carried);
    returns the carried values (the value itself when one is carried)."""
    carried = tuple(_as_loom_tensor(c) for c in carried)

    def body(i, *c):
        with torch.no_grad():
            out = body_fn(LoomTensor(i), *[_torch_view(v) for v in c])
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(_loom_view(v) for v in out)

    res = loom.fori_loop(lower, upper, body, *(c._elem for c in carried))
    res = res if isinstance(res, (tuple, list)) else (res,)
    out = tuple(LoomTensor(r) for r in res)
    return out[0] if len(out) == 1 else out


def compile(fn):
    """torch_xla.compile: each call of fn is one graph, cut before and after (the pending work
    is synced first, fn's results are computed when it returns)."""
    def step(*args, **kwargs):
        loom.sync()
        out = fn(*args, **kwargs)
        loom.sync()
        return out
    step.__wrapped__ = fn
    return step


def _functional_call():
    func = getattr(torch, "func", None)
    if func is not None and hasattr(func, "functional_call"):
        return func.functional_call
    from torch.nn.utils.stateless import functional_call
    return functional_call


def scan_layers(layers, x, is_layer_pure=False):
    """torch_xla's scan_layers: x through every layer of `layers` (a ModuleList of layers of one
    structure: the same parameter and buffer names, shapes and dtypes), as one loop over the
    layers' stacked tensors, the layer traced once per call whatever the depth; differentiable
    (each layer's parameters get their gradients). is_layer_pure is accepted for torch_xla's
    signature: the layer is traced once per call either way."""
    layers = list(layers)
    if not layers:
        raise loom.TraceError("[loom.torch.scan_layers] expected at least one layer, got none")
    first = layers[0]

    def state(m):
        return dict(m.named_parameters()), dict(m.named_buffers())

    p0, b0 = state(first)
    for i, layer in enumerate(layers[1:], 1):
        p, b = state(layer)
        for kind, want, got in (("parameter", p0, p), ("buffer", b0, b)):
            if list(want) != list(got) or any(
                    want[n].shape != got[n].shape or want[n].dtype != got[n].dtype for n in want):
                raise loom.TraceError(
                    f"[loom.torch.scan_layers] layer {i} ({type(layer).__name__}) differs from "
                    f"layer 0 ({type(first).__name__}) in its {kind}s: expected "
                    f"{[(n, tuple(t.shape)) for n, t in want.items()]}, got "
                    f"{[(n, tuple(t.shape)) for n, t in got.items()]}")
    stacked = {n: torch.stack([state(m)[0][n] for m in layers]) for n in p0}
    stacked.update({n: torch.stack([state(m)[1][n] for m in layers]) for n in b0})
    call = _functional_call()

    def step(h, tensors):
        return call(first, tensors, (h,)), None

    out, _ = scan(step, x, stacked)
    return out
