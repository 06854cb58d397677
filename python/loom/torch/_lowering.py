"""The lowering table: aten ops (torch 1.13's and 2.x's overload names) to loom ops, registered
with _dispatch.lowers. Each lowering takes the aten op's arguments with loom tensors in place
of LoomTensors; Python defaults must equal the schema's, since aten leaves out arguments equal
to their defaults."""
import math

import loom
import loom.nn.functional as LF

from ._dispatch import TABLE, _no_write, lowers
from ._tensor import (LoomTensor, contiguous_strides, is_loom_device, loom_dtype,
                      to_torch_tensor)


def _lt(dt):
    return None if dt is None else loom_dtype(dt)


# ---- creation and copies --------------------------------------------------------------------

@lowers("zeros_like", "empty_like")
def _zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return loom.zeros(*x.shape, dtype=_lt(dtype) or x.dtype)


@lowers("ones_like")
def _ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return loom.ones(*x.shape, dtype=_lt(dtype) or x.dtype)


@lowers("full_like")
def _full_like(x, value, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return loom.full(list(x.shape), value, dtype=_lt(dtype) or x.dtype)


@lowers("new_zeros", "new_empty")
def _new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return loom.zeros(*size, dtype=_lt(dtype) or x.dtype)


@lowers("new_empty_strided")
def _new_empty_strided(x, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return loom.zeros(*size, dtype=_lt(dtype) or x.dtype)


@lowers("new_ones")
def _new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return loom.ones(*size, dtype=_lt(dtype) or x.dtype)


@lowers("new_full")
def _new_full(x, size, value, dtype=None, layout=None, device=None, pin_memory=None):
    return loom.full(list(size), value, dtype=_lt(dtype) or x.dtype)


@lowers("zero_")
def _zero_(x):
    return loom.zeros(*x.shape, dtype=x.dtype)


@lowers("fill_")
def _fill_(x, value):
    return loom.full(list(x.shape), value, dtype=x.dtype) if not isinstance(value, loom.Tensor) \
        else loom.to(value, x.dtype).expand(*x.shape)


@lowers("copy_")
def _copy_(dst, src, non_blocking=False):
    if not isinstance(src, loom.Tensor):
        src = loom.tensor(src, dtype=dst.dtype)
    return loom.to(src, dst.dtype).expand(*dst.shape)


@lowers("clone")
def _clone(x, memory_format=None):
    return loom.clone(x)


@lowers("detach", "alias", "lift_fresh", "_conj", "conj", "resolve_conj", "resolve_neg",
        "contiguous")
def _same(x, *a, **k):
    return x


@lowers("detach_")
@_no_write
def _detach_(x):
    return x


@lowers("_to_copy")
def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and not is_loom_device(device):
        out = to_torch_tensor(LoomTensor(x))
        return out if dtype is None else out.to(dtype)
    return loom.to(x, _lt(dtype)) if dtype is not None else loom.clone(x)


@lowers("_local_scalar_dense")
def _local_scalar_dense(x):
    return x.item()


# ---- elementwise ----------------------------------------------------------------------------

def _scaled(b, alpha):
    return b if alpha == 1 else b * alpha


@lowers("add", "add_")
def _add(a, b, alpha=1):
    return a + _scaled(b, alpha)


@lowers("sub", "sub_", "rsub")
def _sub(a, b, alpha=1):
    return a - _scaled(b, alpha)


TABLE["rsub"] = lambda a, b, alpha=1: b - _scaled(a, alpha)


@lowers("mul", "mul_")
def _mul(a, b):
    return a * b


@lowers("div", "div_")
def _div(a, b, rounding_mode=None):
    if rounding_mode == "floor":
        return loom.floor_divide(a, b)
    q = a / b
    return loom.to(q, q.dtype) if rounding_mode is None else _trunc(q)


def _trunc(q):
    return loom.where(q < 0, -loom.floor(-q), loom.floor(q))


for _n, _f in {"neg": loom.neg, "exp": loom.exp, "log": loom.log, "sqrt": loom.sqrt,
               "rsqrt": loom.rsqrt, "tanh": loom.tanh, "sigmoid": loom.sigmoid,
               "relu": loom.relu, "abs": loom.abs, "sin": loom.sin, "cos": loom.cos,
               "erf": loom.erf, "logical_not": loom.logical_not, "floor": loom.floor}.items():
    TABLE[_n] = TABLE[_n + "_"] = (lambda f: lambda x: f(x))(_f)
TABLE["reciprocal"] = TABLE["reciprocal_"] = lambda x: 1.0 / x
TABLE["square"] = lambda x: x * x


@lowers("pow", "pow_")
def _pow(a, b):
    return loom.pow(a, b)


@lowers("gelu", "gelu_")
def _gelu(x, approximate="none"):
    return LF.gelu(x, approximate=approximate)


@lowers("maximum")
def _maximum(a, b):
    return loom.maximum(a, b)


@lowers("minimum")
def _minimum(a, b):
    return loom.minimum(a, b)


@lowers("clamp", "clamp_")
def _clamp(x, min=None, max=None):
    if isinstance(min, loom.Tensor) or isinstance(max, loom.Tensor):
        if min is not None:
            x = loom.maximum(x, loom.to(min, x.dtype) if isinstance(min, loom.Tensor) else
                             loom.full([], min, dtype=x.dtype))
        if max is not None:
            x = loom.minimum(x, loom.to(max, x.dtype) if isinstance(max, loom.Tensor) else
                             loom.full([], max, dtype=x.dtype))
        return x
    return loom.clamp(x, min, max)


@lowers("clamp_min", "clamp_min_")
def _clamp_min(x, min):
    return _clamp(x, min=min)


@lowers("clamp_max", "clamp_max_")
def _clamp_max(x, max):
    return _clamp(x, max=max)


@lowers("where")
def _where(c, a, b):
    return loom.where(c, a, b)


for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    TABLE[_n] = (lambda n: lambda a, b: getattr(loom, n)(a, b))(_n)


@lowers("masked_fill", "masked_fill_")
def _masked_fill(x, mask, value):
    return loom.masked_fill(x, mask, value)


@lowers("lerp_", "lerp")
def _lerp(a, b, w):
    return a + (b - a) * w


@lowers("addcdiv_", "addcdiv")
def _addcdiv(x, t1, t2, value=1):
    return x + (t1 / t2) * value


@lowers("addcmul_", "addcmul")
def _addcmul(x, t1, t2, value=1):
    return x + (t1 * t2) * value


# ---- backward formulas of torch's autograd --------------------------------------------------

@lowers("threshold_backward")
def _threshold_backward(grad, x, threshold):
    return loom.where(x <= threshold, loom.zeros_like(grad), grad)


@lowers("gelu_backward")
def _gelu_backward(grad, x, approximate="none"):
    return loom.gelu_backward(grad, x, approximate)  # shares the forward's erf


@lowers("tanh_backward")
def _tanh_backward(grad, out):
    return grad * (1 - out * out)


@lowers("sigmoid_backward")
def _sigmoid_backward(grad, out):
    return grad * out * (1 - out)


# ---- reductions -----------------------------------------------------------------------------

def _dims(dim):
    return None if dim is None or dim == [] else ([dim] if isinstance(dim, int) else list(dim))


def _reduction(f):
    def lowering(x, dim=None, keepdim=False, dtype=None):
        if dtype is not None:
            x = loom.to(x, _lt(dtype))
        d = _dims(dim)
        return f(x) if d is None else f(x, d, keepdim)
    return lowering


TABLE["sum"], TABLE["mean"] = _reduction(loom.sum), _reduction(loom.mean)


@lowers("amax")
def _amax(x, dim=(), keepdim=False):
    return loom.amax(x, _dims(dim), keepdim)


@lowers("argmax")
def _argmax(x, dim=None, keepdim=False):
    return loom.argmax(x, dim, keepdim)


def _variance(x, dim, unbiased, keepdim, correction):
    """aten's var/std overloads: .default(x, unbiased), .dim(x, dim, unbiased, keepdim),
    .correction(x, dim, *, correction, keepdim); the mean too (var_mean, std_mean)."""
    if isinstance(dim, bool):  # .default: the second argument is `unbiased`
        unbiased, dim = dim, None
    if correction is None:
        correction = 1 if unbiased else 0
    d = _dims(dim)
    dims = list(range(x.ndim)) if d is None else [k % max(x.ndim, 1) for k in d]
    n = 1
    for k in dims:
        n *= x.shape[k] if x.ndim else 1
    mean = loom.mean(x, dims, True) if dims else x
    xc = x - mean
    total = loom.sum(xc * xc, dims, keepdim) if dims else xc * xc
    var = total / float(max(n - correction, 0))
    return var, (mean if keepdim or not dims else loom.reshape(mean, list(var.shape)))


def _extreme(reduce, arg, pairwise):
    """aten's max/min overloads: .default(x) (over every element), .dim(x, dim, keepdim) ->
    (values, indices), .other(x, y) (elementwise, as maximum/minimum)."""
    def lowering(x, dim=None, keepdim=False):
        if isinstance(dim, loom.Tensor):
            return pairwise(x, dim)
        if dim is None:
            return reduce(x)
        return reduce(x, [dim], keepdim), arg(x, dim, keepdim)
    return lowering


TABLE["max"] = _extreme(loom.amax, loom.argmax, loom.maximum)
TABLE["min"] = _extreme(loom.amin, loom.argmin, loom.minimum)


@lowers("var")
def _var(x, dim=None, unbiased=True, keepdim=False, *, correction=None):
    return _variance(x, dim, unbiased, keepdim, correction)[0]


@lowers("std")
def _std(x, dim=None, unbiased=True, keepdim=False, *, correction=None):
    return loom.sqrt(_variance(x, dim, unbiased, keepdim, correction)[0])


@lowers("var_mean")
def _var_mean(x, dim=None, unbiased=True, keepdim=False, *, correction=None):
    return _variance(x, dim, unbiased, keepdim, correction)


@lowers("std_mean")
def _std_mean(x, dim=None, unbiased=True, keepdim=False, *, correction=None):
    var, mean = _variance(x, dim, unbiased, keepdim, correction)
    return loom.sqrt(var), mean


def _count_true(x, dim, keepdim):
    """The number of nonzero elements over `dim` (all dims for None), as int64."""
    nz = loom.to(x != 0, loom.int64)
    d = _dims(dim)
    if d is None or x.ndim == 0:  # a 0-d tensor takes dim 0 or -1 as torch does
        return loom.sum(nz)
    return loom.sum(nz, d, keepdim)


@lowers("any")
def _any(x, dim=None, keepdim=False):
    return _count_true(x, dim, keepdim) > 0


@lowers("all")
def _all(x, dim=None, keepdim=False):
    d = _dims(dim)
    n = 1
    for k in (range(x.ndim) if d is None or x.ndim == 0 else d):
        n *= x.shape[k]
    return _count_true(x, dim, keepdim) == n


# ---- shapes and views -----------------------------------------------------------------------

@lowers("view", "_unsafe_view", "reshape", "_reshape_alias")
def _view(x, shape, *strides):
    return loom.reshape(x, list(shape))


@lowers("t")
def _t(x):
    return x if x.ndim < 2 else loom.transpose(x, 0, 1)


@lowers("transpose")
def _transpose(x, d0, d1):
    return loom.transpose(x, d0, d1)


@lowers("permute")
def _permute(x, dims):
    return loom.permute(x, list(dims))


@lowers("expand")
def _expand(x, size, implicit=False):
    return x.expand(*size)


@lowers("unsqueeze")
def _unsqueeze(x, dim):
    return loom.unsqueeze(x, dim)


@lowers("squeeze")
def _squeeze(x, dim=None):
    if dim is None:
        return loom.squeeze(x)
    for d in sorted((dim if isinstance(dim, (list, tuple)) else [dim]), reverse=True):
        x = loom.squeeze(x, d % max(x.ndim, 1)) if x.ndim and x.shape[d] == 1 else x
    return x


@lowers("select")
def _select(x, dim, index):
    # batches[i] of data on the device: the index a host scalar (see _window)
    if index and not x.is_pending and -x.shape[dim] <= index < x.shape[dim]:
        d = dim % x.ndim
        i = index + x.shape[d] if index < 0 else index
        return loom.squeeze(_window(x, d, i, i + 1), d)
    return loom.select(x, dim, index)


@lowers("slice")
def _slice(x, dim=0, start=None, end=None, step=1):
    n = x.shape[dim]
    start = 0 if start is None else start
    end = n if end is None else min(end, n)
    if start and step == 1 and not x.is_pending:
        return _window(x, dim, start, end)
    return loom.slice(x, dim, start, end, step)


def _window(x, dim, start, end):
    """x[start:end] along dim for an x that holds data (not a pending op) at a nonzero start:
    a loop's moving window over a dataset on the device (`source[i:i + bptt]`,
    `data[k * bs:(k + 1) * bs]`). A static slice would put the offset into the graph, one
    graph (and compile) per offset; gathering rows start + arange(length) passes the offset
    as a host scalar instead, so every window of a length shares one graph. A zero start (the
    `buf[:, :T]` of a buffer) stays a static slice."""
    n = x.shape[dim]
    start = max(start + n, 0) if start < 0 else min(start, n)
    end = max(end + n, 0) if end < 0 else end
    length = max(end - start, 0)
    if length == 0 or length == n:
        return loom.slice(x, dim, start, end, 1)
    return loom.index_select(x, dim % x.ndim, loom.arange(length, dtype=loom.int64) + start)


@lowers("cat")
def _cat(xs, dim=0):
    return loom.cat(list(xs), dim)


@lowers("stack")
def _stack(xs, dim=0):
    return loom.stack(list(xs), dim)


@lowers("unbind")
def _unbind(x, dim=0):
    return [loom.select(x, dim, i) for i in range(x.shape[dim])]


@lowers("split", "split_with_sizes")
def _split(x, size, dim=0):
    return list(loom.split(x, size, dim))


# ---- products, nn ---------------------------------------------------------------------------

@lowers("mm", "bmm", "matmul")
def _mm(a, b):
    return loom.matmul(a, b)


@lowers("addmm")
def _addmm(bias, a, b, beta=1, alpha=1):
    return _scaled(bias, beta) + _scaled(loom.matmul(a, b), alpha)


@lowers("_softmax")
def _softmax(x, dim, half_to_float=False):
    return loom.softmax(x, dim)


@lowers("_safe_softmax")
def _safe_softmax(x, dim, dtype=None):
    """softmax whose rows of -inf only give 0 (torch >= 2.5's SDPA decomposition, with dropout)."""
    if dtype is not None:
        x = loom.to(x, _lt(dtype))
    y = loom.softmax(x, dim)
    empty = loom.amax(x, [dim], True) == float("-inf")
    return loom.where(empty, loom.zeros_like(y), y)


@lowers("_log_softmax")
def _log_softmax(x, dim, half_to_float=False):
    return loom.log_softmax(x, dim)


@lowers("_softmax_backward_data")
def _softmax_backward(grad, out, dim, input_dtype=None):
    return out * (grad - loom.sum(grad * out, [dim], True))


@lowers("_log_softmax_backward_data")
def _log_softmax_backward(grad, out, dim, input_dtype=None):
    return grad - loom.exp(out) * loom.sum(grad, [dim], True)


def _check_nll(fn, weight, reduction):
    if reduction not in (0, 1, 2):
        raise loom.Error(f"[loom.torch] aten.{fn}: reduction {reduction} unknown")


@lowers("nll_loss_forward")
def _nll_loss_forward(logp, target, weight, reduction, ignore_index):
    _check_nll("nll_loss_forward", weight, reduction)
    squeeze = logp.ndim == 1
    if squeeze:
        logp, target = logp.reshape(1, -1), target.reshape(1)
    keep = target != ignore_index
    safe = loom.where(keep, target, loom.zeros_like(target))
    picked = -loom.gather(logp, 1, safe.reshape(-1, 1)).reshape(-1)
    w = loom.to(keep, logp.dtype)
    if weight is not None:
        w = w * loom.index_select(weight, 0, safe)
    picked = loom.where(keep, picked * w, loom.zeros_like(picked))
    total = w.sum()
    if reduction == 0:
        out = picked[0] if squeeze else picked
    elif reduction == 1:
        out = picked.sum() / total
    else:
        out = picked.sum()
    return out, total


@lowers("nll_loss_backward")
def _nll_loss_backward(grad, logp, target, weight, reduction, ignore_index, total_weight):
    _check_nll("nll_loss_backward", weight, reduction)
    squeeze = logp.ndim == 1
    lp = logp.reshape(1, -1) if squeeze else logp
    tg = target.reshape(1) if squeeze else target
    keep = loom.to(tg != ignore_index, lp.dtype)
    if weight is not None:
        keep = keep * loom.index_select(weight, 0, loom.where(tg != ignore_index, tg,
                                                              loom.zeros_like(tg)))
    classes = loom.arange(lp.shape[1], dtype=tg.dtype).reshape(1, -1)
    onehot = loom.to(classes == tg.reshape(-1, 1), lp.dtype)
    g = grad if reduction == 0 else (grad / total_weight if reduction == 1 else grad)
    g = g.reshape(-1, 1) if reduction == 0 else g
    out = -onehot * keep.reshape(-1, 1) * g
    return out.reshape(*logp.shape)


@lowers("mse_loss")
def _mse_loss(x, y, reduction=1):
    d = (x - y) * (x - y)
    return d if reduction == 0 else (d.mean() if reduction == 1 else d.sum())


@lowers("mse_loss_backward")
def _mse_loss_backward(grad, x, y, reduction):
    g = 2 * (x - y) * grad
    return g / x.numel() if reduction == 1 else g


@lowers("embedding")
def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return loom.embedding(indices, weight)


@lowers("embedding_dense_backward")
def _embedding_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    g = grad.reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        g = loom.where((flat != padding_idx).reshape(-1, 1), g, loom.zeros_like(g))
    return loom.index_add(loom.zeros(num_weights, g.shape[1], dtype=g.dtype), 0, flat, g)


@lowers("native_layer_norm")
def _native_layer_norm(x, shape, weight, bias, eps):
    dims = list(range(x.ndim - len(shape), x.ndim))
    mean = loom.mean(x, dims, True)
    xc = x - mean
    rstd = loom.rsqrt(loom.mean(xc * xc, dims, True) + eps)
    y = xc * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


@lowers("native_layer_norm_backward")
def _native_layer_norm_backward(grad, x, shape, mean, rstd, weight, bias, mask):
    dims = list(range(x.ndim - len(shape), x.ndim))
    n = 1
    for s in shape:
        n *= s
    xhat = (x - mean) * rstd
    gw = grad * weight if weight is not None else grad
    gx = rstd * (gw - loom.mean(gw, dims, True) - xhat * loom.mean(gw * xhat, dims, True))
    lead = list(range(x.ndim - len(shape)))
    gweight = loom.sum(grad * xhat, lead) if weight is not None and mask[1] else None
    gbias = loom.sum(grad, lead) if bias is not None and mask[2] else None
    return gx if mask[0] else None, gweight, gbias


@lowers("native_dropout")
def _native_dropout(x, p, train):
    if not train or p == 0:
        return x, loom.ones(*x.shape, dtype=loom.bool_)
    keep = loom.rand(*x.shape, dtype=x.dtype) >= p
    return loom.where(keep, x * (1.0 / (1.0 - p)), loom.zeros_like(x)), keep


@lowers("native_dropout_backward")
def _native_dropout_backward(grad, mask, scale):
    return loom.where(mask, grad * scale, loom.zeros_like(grad))


@lowers("scaled_dot_product_attention")
def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    return LF.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                           enable_gqa)


# torch.compile of a CPU model: aot_autograd's graph names the CPU's flash kernel (forward and
# backward) for F.scaled_dot_product_attention without dropout; here loom's attention op.

@lowers("_scaled_dot_product_flash_attention_for_cpu")
def _sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    out = LF.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)
    # logsumexp: only the backward below reads it, and it recomputes the attention instead
    return out, loom.zeros(*q.shape[:-1], dtype=loom.float32)


@lowers("_scaled_dot_product_flash_attention_for_cpu_backward")
def _sdpa_flash_cpu_backward(grad, q, k, v, out, logsumexp, dropout_p, is_causal,
                             attn_mask=None, scale=None):
    if dropout_p:
        raise loom.Error("[loom.torch] aten._scaled_dot_product_flash_attention_for_cpu_backward "
                         f"with dropout_p={dropout_p}: loom cannot redraw the forward's dropout; "
                         "expected dropout_p=0 (torch's CPU flash kernel has none)")
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with loom.enable_grad():
        o = LF.scaled_dot_product_attention(*leaves, attn_mask, 0.0, is_causal, scale)
        (o * grad).sum().backward()
    return tuple(x.grad if x.grad is not None else loom.zeros_like(x) for x in leaves)


@lowers("tril", "tril_")
def _tril(x, diagonal=0):
    return loom.tril(x, diagonal)


@lowers("triu", "triu_")
def _triu(x, diagonal=0):
    return loom.triu(x, diagonal)


@lowers("linalg_vector_norm")
def _vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = loom.to(x, _lt(dtype))
    d = _dims(dim)

    def reduce(f, v):
        if d is None:
            out = f(v)
            return out.reshape(*([1] * x.ndim)) if keepdim else out
        return f(v, d, keepdim)

    a = loom.abs(x)
    if ord == math.inf:
        return reduce(loom.amax, a)
    if ord == -math.inf:
        return reduce(loom.amin, a)
    if ord == 0:
        return reduce(loom.sum, loom.to(a != 0, x.dtype))
    if ord == 1:
        return reduce(loom.sum, a)
    if ord == 2:
        return loom.sqrt(reduce(loom.sum, x * x))
    return loom.pow(reduce(loom.sum, loom.pow(a, float(ord))), 1.0 / ord)


@lowers("norm")
def _norm(x, p=2, dim=None, keepdim=False, dtype=None):
    return _vector_norm(x, p, dim, keepdim)


@lowers("sgn", "sign")
def _sign(x):
    return loom.to(x > 0, x.dtype) - loom.to(x < 0, x.dtype)


@lowers("slice_backward")
def _slice_backward(grad, input_sizes, dim, start, end, step):
    dim %= len(input_sizes)
    n = input_sizes[dim]
    start = 0 if start is None else (start + n if start < 0 else min(start, n))
    end = n if end is None else (end + n if end < 0 else min(end, n))
    out = loom.zeros(*input_sizes, dtype=grad.dtype)
    key = [slice(None)] * dim + [slice(start, end, step)]
    out[tuple(key)] = grad
    return out


@lowers("select_backward")
def _select_backward(grad, input_sizes, dim, index):
    out = loom.zeros(*input_sizes, dtype=grad.dtype)
    out[tuple([slice(None)] * (dim % len(input_sizes)) + [index])] = grad
    return out


@lowers("as_strided")
def _as_strided(x, size, stride, storage_offset=None):
    """Only the identity geometry (x's own shape, contiguous strides): what torch 1.13's
    autograd makes of a whole tensor when a write into a view of it is differentiated."""
    contiguous = contiguous_strides(size)
    if list(size) != list(x.shape) or any(n > 1 and s != c for n, s, c in
                                           zip(size, stride, contiguous)) or storage_offset:
        raise loom.Error(f"[loom.torch] aten.as_strided has no lowering to loom for sizes "
                         f"{list(size)}, strides {list(stride)}, offset {storage_offset} of a "
                         f"tensor of shape {list(x.shape)} (only the identity is lowered)")
    return x


@lowers("narrow")
def _narrow_op(x, dim, start, length):
    if start and not x.is_pending:
        return _window(x, dim, start, start + length)
    return loom.slice(x, dim, start, start + length, 1)


@lowers("softplus")
def _softplus(x, beta=1, threshold=20):
    bx = x * beta
    return loom.where(bx > threshold, x, loom.log(1 + loom.exp(bx)) / beta)


@lowers("topk")
def _topk(x, k, dim=-1, largest=True, sorted=True):
    return tuple(loom.topk(x, k, dim, largest, sorted))


@lowers("sort", "sort.stable")
def _sort(x, dim=-1, descending=False, stable=None):
    return tuple(loom.sort(x, dim, descending))  # always stable, so also for stable=False


@lowers("argsort", "argsort.stable")
def _argsort(x, dim=-1, descending=False, stable=None):
    return loom.argsort(x, dim, descending)


@lowers("msort")
def _msort(x):
    return loom.sort(x, 0).values


@lowers("multinomial")
def _multinomial(probs, num_samples, replacement=False, generator=None):
    return loom.multinomial(probs, num_samples, replacement)


# aten leaves out arguments equal to their schema default, so each overload gets its own.
@lowers("bernoulli.default", "bernoulli")
def _bernoulli(probs, generator=None):
    return loom.to(loom.rand(*probs.shape, dtype=probs.dtype) < probs, probs.dtype)


@lowers("bernoulli.p", "bernoulli_.float", "bernoulli_.Tensor", "bernoulli_")
def _bernoulli_p(x, p=0.5, generator=None):
    return loom.to(loom.rand(*x.shape, dtype=x.dtype) < p, x.dtype)


# ---- more of torch's everyday ops (composites of loom's) ---------------------------------------

@lowers("unsafe_split", "unsafe_split_with_sizes")
def _unsafe_split(x, size, dim=0):
    return list(loom.split(x, size, dim))


@lowers("baddbmm")
def _baddbmm(x, b1, b2, beta=1, alpha=1):
    return _scaled(x, beta) + _scaled(loom.matmul(b1, b2), alpha)


@lowers("cumsum")
def _cumsum(x, dim, dtype=None):
    return loom.cumsum(x, dim, dtype=None if dtype is None else loom_dtype(dtype))


def _narrow(x, d, start, length):
    return loom.slice(x, d, start, start + length, 1)


def _flip1(x, d):
    n = x.shape[d]
    return loom.index_select(x, d, loom.arange(n - 1, -1, -1, dtype=loom.int64)) if n > 1 else x


@lowers("flip")
def _flip(x, dims):
    for d in dims:
        x = _flip1(x, d % max(x.ndim, 1))
    return x


@lowers("roll")
def _roll(x, shifts, dims=()):
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    if not dims:  # torch rolls the flattened tensor
        return _roll(x.reshape(-1), shifts, [0]).reshape(*x.shape)
    for s, d in zip(shifts, dims):
        n = x.shape[d]
        if n == 0:
            continue
        s %= n
        if s:
            x = loom.cat([_narrow(x, d, n - s, s), _narrow(x, d, 0, n - s)], d)
    return x


@lowers("repeat")
def _repeat(x, repeats):
    repeats = list(repeats)
    shape = [1] * (len(repeats) - x.ndim) + list(x.shape)
    x = x.reshape(*shape) if shape else x
    grown, joined = [], []
    for r, n in zip(repeats, shape):
        grown += [r, n]
        joined.append(r * n)
    inter = []
    for n in shape:
        inter += [1, n]
    return x.reshape(*inter).expand(*grown).reshape(*joined)


@lowers("constant_pad_nd")
def _constant_pad_nd(x, pad, value=0):
    for k in range(len(pad) // 2):
        d = x.ndim - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        if before < 0:
            x = _narrow(x, d, -before, x.shape[d] + before)
        if after < 0:
            x = _narrow(x, d, 0, x.shape[d] + after)
        parts = []
        for width in (max(before, 0), None, max(after, 0)):
            if width is None:
                parts.append(x)
            elif width:
                shape = list(x.shape)
                shape[d] = width
                parts.append(loom.full(shape, value, dtype=x.dtype))
        if len(parts) > 1:
            x = loom.cat(parts, d)
    return x


@lowers("nan_to_num")
def _nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    if not x.is_floating_point():
        return x
    big = 65504.0 if x.dtype == loom.float16 else (
        3.3895313892515355e38 if x.dtype == loom.bfloat16 else (
            3.4028234663852886e38 if x.dtype == loom.float32 else 1.7976931348623157e308))
    x = loom.where(x != x, loom.full([], nan, dtype=x.dtype), x)
    x = loom.where(x == math.inf, loom.full([], big if posinf is None else posinf,
                                            dtype=x.dtype), x)
    return loom.where(x == -math.inf, loom.full([], -big if neginf is None else neginf,
                                                dtype=x.dtype), x)


@lowers("silu")
def _silu(x):
    return x * loom.sigmoid(x)


@lowers("silu_backward")
def _silu_backward(grad, x):
    s = loom.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lowers("leaky_relu")
def _leaky_relu(x, negative_slope=0.01):
    return loom.where(x > 0, x, x * negative_slope)


@lowers("leaky_relu_backward")
def _leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return loom.where(x > 0, grad, grad * negative_slope)


@lowers("index_select")
def _index_select(x, dim, index):
    return loom.index_select(x, dim, index.reshape(-1) if index.ndim == 0 else index)


@lowers("isnan")
def _isnan(x):
    return x != x


@lowers("isinf")
def _isinf(x):
    return loom.abs(x) == math.inf if x.dtype.is_floating_point else x != x


@lowers("isfinite")
def _isfinite(x):
    return (x == x) & (loom.abs(x) != math.inf) if x.dtype.is_floating_point else x == x


@lowers("scatter", "scatter_")
def _scatter(x, dim, index, src, *, reduce=None):
    """aten.scatter .src (a tensor) and .value (a number): x with x[..., index[i], ...] = src[i]
    along dim, over index's extent in every dim. Built from a one-hot of index (no data-dependent
    addresses); an index that repeats a position sums its sources there (torch keeps one of them,
    unspecified which)."""
    if reduce is not None:  # the .reduce / .value_reduce overloads (_lowering_index.py)
        return TABLE["scatter.reduce"](x, dim, index, src, reduce=reduce)
    if x.ndim == 0:
        return loom.where(index.reshape([]) == 0, src.reshape([]) if isinstance(src, loom.Tensor)
                          else loom.full([], src, x.dtype), x)
    d = dim % x.ndim
    extent = list(index.shape)
    if isinstance(src, loom.Tensor):
        for k, n in enumerate(extent):
            if src.shape[k] != n:
                src = _narrow(src, k, 0, n)
        src = loom.to(src, x.dtype)
    else:
        src = loom.full(extent, src, x.dtype)
    pos = loom.reshape(loom.arange(0, x.shape[d], dtype=loom.int64),
                       [1] * (d + 1) + [x.shape[d]] + [1] * (x.ndim - d - 1))
    hit = loom.unsqueeze(index, d + 1) == pos  # index's dims with x's dim d after d
    values = loom.sum(loom.unsqueeze(src, d + 1) * loom.to(hit, x.dtype), [d])
    hits = loom.sum(loom.to(hit, loom.int64), [d]) > 0
    for k in range(x.ndim):  # index may cover less than x in the other dims
        if k != d and extent[k] != x.shape[k]:
            pad = [0] * (2 * (x.ndim - k))
            pad[-1] = x.shape[k] - extent[k]
            values = _constant_pad_nd(values, pad, 0)
            hits = _constant_pad_nd(hits, pad, False)
    return loom.where(hits, values, x)


def _truth(x):
    return x if not isinstance(x, loom.Tensor) or x.dtype == loom.bool_ else x != 0


@lowers("logical_and", "logical_and_")
def _logical_and(a, b):
    return loom.logical_and(_truth(a), _truth(b))


@lowers("logical_or", "logical_or_")
def _logical_or(a, b):
    return loom.logical_or(_truth(a), _truth(b))


def _bool_only(name, f):
    def lowering(a, b):
        if not all(t.dtype == loom.bool_ for t in (a, b) if isinstance(t, loom.Tensor)):
            raise loom.Error(f"[loom.torch] aten.{name} of integers is not lowered (loom has "
                             f"no bitwise ops); bool tensors only")
        return f(a, b)
    return lowering


for _n, _f in {"bitwise_and": loom.logical_and, "bitwise_or": loom.logical_or,
               "bitwise_xor": lambda a, b: a != b}.items():
    TABLE[_n] = TABLE[_n + "_"] = _bool_only(_n, _f)


@lowers("logical_xor", "logical_xor_")
def _logical_xor(a, b):
    return (a != 0) != (b != 0)


# ---- ops answering a Python value -----------------------------------------------------------
# torch.equal, torch.allclose and Tensor.is_same_size return a Python bool (equal and
# allclose read the values: a sync, as on CUDA). torch 1.13's autograd asks is_same_size of
# a given gradient (loss.backward(gradient), torch.autograd.grad(..., grad_outputs)).

@lowers("is_same_size")
def _is_same_size(a, b):
    return tuple(a.shape) == tuple(b.shape)


@lowers("equal")
def _equal(a, b):
    return tuple(a.shape) == tuple(b.shape) and bool(_all(a == b).item())


@lowers("allclose")
def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if a.dtype != b.dtype:
        raise loom.Error(f"[loom.torch] aten.allclose: {a.dtype} did not match {b.dtype} "
                         f"(torch refuses mixed dtypes too)")
    close = a == b
    if equal_nan:
        close = loom.logical_or(close, loom.logical_and(a != a, b != b))
    if a.dtype.is_floating_point:
        err = loom.abs(a - b)
        close = loom.logical_or(close, loom.logical_and(_isfinite(err),
                                                        err <= atol + rtol * loom.abs(b)))
    return bool(_all(close).item())
