"""The dispatch of aten ops on LoomTensors to the lowering table (_lowering.py).

dispatch() unwraps LoomTensors to their loom tensors (a 0-d CPU tensor becomes a host
number, a graph input; another CPU tensor is a loom.Error), runs the lowering and wraps loom
results back. In-place ops (a trailing `_`) write their result into the first argument with
loom's copy_, so loom sees the tensor as updated in place. A view is a loom tensor of its own,
linked to its base: a write into the view is written back into the base, and a write into the base is
carried to its live views (graph ops), as torch's aliasing shows them; a write into a view
that cannot be written back (expand, split, ...) raises loom.Error."""
import weakref

import torch
from torch.utils._mode_utils import no_dispatch

import loom

from ._tensor import (DEVICE, LoomTensor, contiguous_strides, from_cpu, loom_dtype,
                      to_torch_tensor, wrap)

TABLE = {}
_STATS = {"lowered": 0}


def lowers(*names):
    def put(fn):
        for n in names:
            TABLE[n] = fn
        _PLANS.clear()
        return fn
    return put


def _describe(args):
    def one(a):
        if isinstance(a, LoomTensor):
            return f"{a.dtype}{list(a.shape)} on {DEVICE}"
        if isinstance(a, torch.Tensor):
            return f"{a.dtype}{list(a.shape)} on {a.device}"
        return type(a).__name__
    return ", ".join(one(a) for a in args)


def _unwrap(x):
    if isinstance(x, LoomTensor):
        return x._elem
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and x.device.type == "cpu":
            return x.item()  # a CPU scalar beside device tensors, as torch allows
        raise loom.Error(f"[loom.torch] expected all tensors on loom's device, got a "
                         f"{x.device.type} tensor {x.dtype}{list(x.shape)} (move it with "
                         f".to(lt.device()))")
    return x


def _unwrap_all(args):
    """_unwrap over the arguments and one level of lists in them (aten's argument forms),
    without torch's pytree machinery, which cost most of a dispatch."""
    out = []
    for a in args:
        if type(a) is LoomTensor:
            out.append(a._elem)
        elif isinstance(a, (list, tuple)):
            out.append([_unwrap(x) for x in a])
        else:
            out.append(_unwrap(a))
    return out


def _wrap_out(x):
    if isinstance(x, loom.Tensor):
        return wrap(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_wrap_out(v) for v in x)
    return x


# id(aten overload) -> (overload, name, lowering or None, writes its first argument, a view
# op): looked up once per overload, as the name and table lookups cost a tenth of a dispatch.
# Keyed by id, since an overload hashes in Python; torch keeps its overloads for good.
_PLANS = {}


def _plan(func):
    name = func.overloadpacket.__name__
    fn = None if name.startswith("_foreach_") else \
        TABLE.get(f"{name}.{func._overloadname}") or TABLE.get(name)
    plan = _PLANS[id(func)] = (func, name, fn, name.endswith("_") and fn not in _NO_WRITE,
                               name in _VIEWS)
    return plan


def dispatch(func, args, kwargs):
    plan = _PLANS.get(id(func))
    if plan is None or plan[0] is not func:
        plan = _plan(func)
    _, name, fn, inplace, view = plan
    if fn is None:
        if name.startswith("_foreach_"):
            return _foreach(func, name, args, kwargs)
        if name in _RESHAPE_IN_PLACE and isinstance(args[0], LoomTensor):
            return _reshape_in_place(func, name, args, kwargs)
        raise loom.Error(f"[loom.torch] aten.{name}.{func._overloadname} has no lowering to "
                         f"loom (arguments: {_describe(args)}); loom.torch lowers "
                         f"{len(TABLE)} aten names")
    if kwargs and type(kwargs.get("out")) is LoomTensor and not inplace:
        return _out_variant(func, name, fn, args, kwargs)
    if inplace and type(args[0]) is not LoomTensor and isinstance(args[0], torch.Tensor):
        return _write_cpu(func, name, args, kwargs)
    if name == "copy_" and isinstance(args[1], torch.Tensor) and \
            not isinstance(args[1], LoomTensor) and args[1].dim() > 0:
        args = (args[0], LoomTensor(from_cpu(args[1]))) + tuple(args[2:])  # CPU -> loom
    _STATS["lowered"] += 1
    if inplace and isinstance(args[0], LoomTensor) and args[0]._overlaps:
        raise loom.Error(f"[loom.torch] aten.{name}.{func._overloadname}: unsupported operation: "
                         f"more than one element of the written-to tensor "
                         f"({_describe(args[:1])}, expanded) refers to a single memory location "
                         f"(as torch says); clone() it first")
    rest = _unwrap_all(args)
    kw = {k: _unwrap(v) for k, v in kwargs.items()} if kwargs else {}
    out = fn(*rest, **kw)
    if inplace and isinstance(args[0], LoomTensor):
        if out is not None and out is not args[0]._elem:
            _assign(args[0], out, func)
        return args[0]
    if name == "expand" and isinstance(args[0], LoomTensor):
        return _expanded(args[0], out)
    wrapped = _wrap_out(out)
    if view and isinstance(args[0], LoomTensor):
        _link_views(args[0], wrapped, name, fn, rest[1:], kw, func)
    return wrapped


_FILLED = {"zeros": loom.zeros, "new_zeros": loom.zeros, "empty": loom.zeros,
           "new_empty": loom.zeros, "empty_strided": loom.zeros, "ones": loom.ones,
           "new_ones": loom.ones, "randn": loom.randn, "rand": loom.rand}
_FACTORIES = {"scalar_tensor", "full", "arange", *_FILLED}


def factory_op(func, args, kwargs):
    """An aten factory (scalar_tensor, zeros, empty, ones, full, arange, randn, rand and the
    new_ forms) made on loom with torch's dtype rules, no data moved; None for other ops and for
    draws from a torch generator (made by torch, then moved)."""
    name = func.overloadpacket.__name__
    if name not in _FACTORIES or kwargs.get("generator") is not None:
        return None
    if name == "arange" and not all(isinstance(v, (int, float)) for v in args):
        return None
    dt = kwargs.get("dtype")
    if dt is None and name == "full":  # the fill decides, by the running torch's rule
        dt = func([0], args[1]).dtype
    elif dt is None and name == "arange":
        dt = torch.get_default_dtype() if any(isinstance(v, float) for v in args) else torch.int64
    elif dt is None:
        dt = args[0].dtype if name.startswith("new_") else torch.get_default_dtype()
    dt = loom_dtype(dt)
    if name == "scalar_tensor":
        return LoomTensor(loom.full([], args[0], dtype=dt))
    if name == "full":
        return LoomTensor(loom.full(list(args[0]), args[1], dtype=dt))
    if name == "arange":
        return LoomTensor(loom.arange(*args, dtype=dt))
    return LoomTensor(_FILLED[name](*(args[1] if name.startswith("new_") else args[0]), dtype=dt))


def _write_cpu(func, name, args, kwargs):
    """An in-place op whose destination is a CPU tensor and whose other operands are on loom:
    copy_ materializes its source and writes it into the CPU tensor (the same object), as
    torch's copy_ moves data across devices (model_on_cpu.load_state_dict of a state dict on
    loom); any other op is refused, as torch refuses mixing devices."""
    dst = args[0]
    if name != "copy_":
        raise loom.Error(f"[loom.torch] aten.{name}.{func._overloadname} writes into a "
                         f"{dst.device.type} tensor {dst.dtype}{list(dst.shape)} from tensors on "
                         f"loom's device (arguments: {_describe(args)}): expected the written-to "
                         f"tensor on loom's device too; move it with .to(lt.device()), or bring "
                         f"the others to the CPU with .cpu() (copy_ moves values either way)")
    src = args[1]
    _STATS["lowered"] += 1
    with no_dispatch():
        dst.copy_(to_torch_tensor(src) if isinstance(src, LoomTensor) else src)
    return dst


def _out_variant(func, name, fn, args, kwargs):
    """An op's out= overload (torch.maximum(a, b, out=a): Adam's amsgrad; torch.add(x, y,
    out=z)): the functional lowering's result written into `out` as an in-place op writes
    its argument (carried to its base and views), cast to out's dtype as torch casts."""
    kw = dict(kwargs)
    dst = kw.pop("out")
    _STATS["lowered"] += 1
    val = fn(*_unwrap_all(args), **{k: _unwrap(v) for k, v in kw.items()})
    if not isinstance(val, loom.Tensor):
        raise loom.Error(f"[loom.torch] aten.{name}.{func._overloadname}: out= of an op with "
                         f"several results is not lowered; call it without out=")
    if tuple(val.shape) != tuple(dst.shape):
        raise loom.Error(f"[loom.torch] aten.{name}.{func._overloadname}: out= of shape "
                         f"{list(dst.shape)} for a result of shape {list(val.shape)}: loom.torch "
                         f"cannot resize out; pass a tensor of the result's shape")
    if val.dtype != dst._elem.dtype:
        val = val.to(dst._elem.dtype)
    _assign(dst, val, func)
    return dst


# In-place view ops (GRU's and RNN's `input.transpose_(0, 1)` on torch's own code path): the
# out-of-place lowering's result becomes the tensor's value and its wrapper takes the new shape.
_RESHAPE_IN_PLACE = {"transpose_": "transpose", "swapaxes_": "transpose", "swapdims_": "transpose",
                     "t_": "t", "squeeze_": "squeeze", "unsqueeze_": "unsqueeze"}


def _reshape_in_place(func, name, args, kwargs):
    x = args[0]
    if getattr(x, "_view_base", None) is not None or len(getattr(x, "_views", ())):
        raise loom.Error(f"[loom.torch] aten.{name}.{func._overloadname} on a tensor that shares "
                         f"memory with views ({_describe(args[:1])}): loom.torch cannot reshape "
                         f"it in place; use the out-of-place {_RESHAPE_IN_PLACE[name]}")
    _STATS["lowered"] += 1
    out = TABLE[_RESHAPE_IN_PLACE[name]](*_unwrap_all(args),
                                         **{k: _unwrap(v) for k, v in kwargs.items()})
    x._elem = out
    with no_dispatch():  # the wrapper's own sizes: torch's meta kernel sets them
        torch.Tensor.as_strided_(x, tuple(out.shape), contiguous_strides(out.shape))
    return x


def _expanded(x, out):
    """expand's result with torch's strides (0 where it broadcasts), so torch's autograd copies
    it before accumulating into it and a write into it is refused, as on torch's devices."""
    shape, lead = list(out.shape), out.ndim - x.ndim
    inner = list(x.stride())
    strides = [0] * lead + [0 if x.shape[d] == 1 and shape[lead + d] != 1 else inner[d]
                            for d in range(x.ndim)]
    return LoomTensor(out, strides=strides)


def _foreach(func, name, args, kwargs):
    """aten._foreach_<op>(list, ...): the op on each element (lists in the other arguments
    paired by position), in place where the name ends with '_'."""
    base = name[len("_foreach_"):]
    fn = TABLE.get(base)
    if fn is None:
        raise loom.Error(f"[loom.torch] aten.{name}.{func._overloadname} has no lowering to "
                         f"loom (aten.{base} has none); pass foreach=False to the optimizer")
    n = len(args[0])
    outs = []
    for i in range(n):
        a = [x[i] if isinstance(x, (list, tuple)) and len(x) == n else x for x in args]
        k = {key: (v[i] if isinstance(v, (list, tuple)) and len(v) == n else v)
             for key, v in kwargs.items()}
        out = fn(*_unwrap_all(a), **{key: _unwrap(v) for key, v in k.items()})
        if base.endswith("_"):
            if out is not None and out is not a[0]._elem:
                _assign(a[0], out, func)
        else:
            outs.append(_wrap_out(out))
    return None if base.endswith("_") else outs


# aten's view ops, whose results alias their input in torch. Here a view is its own loom
# tensor, linked to its base: a write into either is carried to the other (as graph ops).
# An expanded tensor is not linked: torch refuses writes into one that overlap, and copies
# one before accumulating into it (a gradient), which its contiguous-looking wrapper hides.
_VIEWS = {"view", "_unsafe_view", "_reshape_alias", "t", "transpose", "permute", "unsqueeze",
          "squeeze", "select", "slice", "split", "split_with_sizes", "as_strided", "diagonal",
          "unbind", "unfold", "narrow", "alias", "detach"}
_RESHAPES = {"view", "_unsafe_view", "_reshape_alias", "unsqueeze", "squeeze",
             "as_strided"}  # as_strided: only its identity geometry is lowered


def _region(base, dim, index):
    """base with `index` (an int or a slice) along dim written by `new`: a function of new."""
    def put(new):
        key = [slice(None)] * (dim % base.ndim) + [index]
        out = loom.clone(base)
        out[tuple(key)] = new
        return out
    return put


def _piece_inverse(name, args, i):
    """The write-back of piece i of split / split_with_sizes / unbind."""
    dim = args[1] if len(args) > 1 else 0
    if name == "unbind":
        dim = args[0] if args else 0
        return lambda base, new: _region(base, dim, i)(new)
    sizes = args[0]
    if isinstance(sizes, int):
        start, stop = i * sizes, (i + 1) * sizes
    else:
        start, stop = sum(sizes[:i]), sum(sizes[:i + 1])
    return lambda base, new: _region(base, dim, slice(start, stop))(new)


def _inverse(name, args):
    """base, new view value -> the base's new value; None where loom.torch cannot write back."""
    if name in _RESHAPES:
        return lambda base, new: new.reshape(*base.shape)
    if name in ("t", "transpose"):
        return lambda base, new: _t_like(new, *args)
    if name == "permute":
        inv = [0] * len(args[0])
        for i, d in enumerate(args[0]):
            inv[d % len(inv)] = i
        return lambda base, new: loom.permute(new, inv)
    if name in ("select", "slice"):
        def put(base, new):
            dim = args[0] if args else 0
            key = [slice(None)] * (dim % base.ndim)
            if name == "select":
                key.append(args[1])
            else:
                start, end = (list(args[1:3]) + [None, None])[:2]
                key.append(slice(start, end, args[3] if len(args) > 3 else 1))
            out = loom.clone(base)
            out[tuple(key)] = new
            return out
        return put
    return None


def _t_like(new, *args):
    """aten.t / transpose's inverse: itself."""
    if not args:
        return new if new.ndim < 2 else loom.transpose(new, 0, 1)
    return loom.transpose(new, args[0], args[1])


def _link_views(base, wrapped, name, fn, rest, kw, func):
    """Links each view to its base, with the recipe its write-back and refresh are made from
    when a write needs them (most views are never written: closures per view cost ~1 us)."""
    if name in ("alias", "detach"):  # the same loom tensor: writes are shared already
        return
    views = wrapped if isinstance(wrapped, (list, tuple)) else [wrapped]
    piece = len(views) > 1  # split, split_with_sizes, unbind: piece i
    for i, v in enumerate(views):
        if not isinstance(v, LoomTensor):
            continue
        v._view_base = base  # held: a view of a temporary view still reaches the root
        v._view_of = (func, piece and i, rest, kw, name, fn)
        if not hasattr(base, "_views"):
            base._views = weakref.WeakSet()
        base._views.add(v)


def _view_inverse(v):
    """base, new view value -> the base's new value; None where it cannot be written back."""
    _, i, rest, _, name, _ = v._view_of
    return _inverse(name, rest) if i is False else _piece_inverse(name, rest, i)


def _view_forward(v, base):
    """The view's value from its base's."""
    _, i, rest, kw, _, fn = v._view_of
    out = fn(base, *rest, **kw)
    return out if i is False else out[i]


def _assign(t, value, func, skip=None):
    """t's loom tensor := value, carried to t's base (if t is a view whose base lives) and to
    t's live views, as torch's aliasing would show them."""
    t._elem.copy_(value)
    base = getattr(t, "_view_base", None)
    if base is not None and base is not skip:
        inverse = _view_inverse(t)
        if inverse is None:
            raise loom.Error(f"[loom.torch] aten.{func.overloadpacket.__name__}."
                             f"{func._overloadname} writes into a view made by "
                             f"aten.{t._view_of[0].overloadpacket.__name__}, which loom.torch "
                             f"cannot write back to its base ({_describe([base])})")
        _assign(base, inverse(base._elem, t._elem), func, skip=t)
    for v in list(getattr(t, "_views", ())):
        if v is not skip:
            _assign(v, _view_forward(v, t._elem), func, skip=t)


_NO_WRITE = set()


def _no_write(fn):  # an in-place name whose lowering already updated its argument
    _NO_WRITE.add(fn)
    return fn


# the lowering modules fill TABLE
from . import _lowering, _lowering_conv, _lowering_index  # noqa: E402,F401
