"""Lowerings of torch's window ops (convolution, pooling, unfold/fold) and batch/group norm,
with their backward formulas, from loom's ops: loom has no conv or pool op. A window op over
N-d spatial dims is im2col (one strided slice of the padded input per kernel offset, stacked:
[..., K, *out]) followed by a matmul (conv) or a reduction over K (pooling); its adjoint,
col2im, is one index_add at flat positions that the window geometry fixes (computed here with
numpy: shapes are static). Every geometry torch accepts is lowered: stride, padding, dilation,
groups, ceil_mode, count_include_pad, divisor_override, transposed convolution."""
import functools
import itertools
import math

import numpy as np

import loom

from ._dispatch import lowers
from ._lowering import _constant_pad_nd
from ._lowering_index import extreme


def _ints(v, n):
    """aten's int[] arguments: one value for all n spatial dims, or one each."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def _pad_trailing(x, before, after, value=0):
    """x padded with `value` by before[i] / after[i] in its trailing len(before) dims (a
    negative amount cuts): constant_pad_nd's lowering, its pad list built last dim first."""
    pad = []
    for b, a in zip(reversed(before), reversed(after)):
        pad += [b, a]
    return _constant_pad_nd(x, pad, value)


class _Windows:
    """The windows of an N-d window op over spatial sizes `size`: kernel, stride, padding,
    dilation and ceil_mode as torch's; `out` the output sizes and `right` the padding after
    the input that the last window reaches (negative: the input's tail no window covers)."""

    def __init__(self, op, size, kernel, stride, padding, dilation=1, ceil_mode=False,
                 out=None):
        n = len(size)
        self.size = list(size)
        self.kernel = _ints(kernel, n)
        self.stride = _ints(stride, n) if stride not in (None, [], ()) else list(self.kernel)
        self.padding = _ints(padding, n)
        self.dilation = _ints(dilation, n)
        self.out, self.right = [], []
        for i in range(n):
            s, p = self.stride[i], self.padding[i]
            span = self.dilation[i] * (self.kernel[i] - 1) + 1
            extent = size[i] + 2 * p - span
            if ceil_mode:
                o = -(-extent // s) + 1
                if (o - 1) * s >= size[i] + p:  # torch: the last window starts inside
                    o -= 1
            else:
                o = extent // s + 1
            if out is not None:  # a transposed conv's: output_padding may add a tail
                o = out[i]
            if o <= 0 or extent < 0:
                raise loom.ShapeError(f"[loom.torch] aten.{op}: the window (kernel "
                                      f"{self.kernel}, dilation {self.dilation}, padding "
                                      f"{self.padding}) does not fit the input's spatial sizes "
                                      f"{list(size)}")
            self.out.append(o)
            self.right.append((o - 1) * s + span - size[i] - p)
        self.offsets = list(itertools.product(*[range(k) for k in self.kernel]))

    @property
    def padded(self):
        return [p + n + r for p, n, r in zip(self.padding, self.size, self.right)]

    def flat_positions(self):
        """int64 [K, L]: the flat position in the padded input of window element k of output l."""
        grids = np.meshgrid(*[np.arange(o) * s for o, s in zip(self.out, self.stride)],
                            indexing="ij")
        base = np.zeros([len(self.offsets)] + self.out, dtype=np.int64)
        strides = [math.prod(self.padded[i + 1:]) for i in range(len(self.out))]
        for k, off in enumerate(self.offsets):
            for i, g in enumerate(grids):
                base[k] += (g + off[i] * self.dilation[i]) * strides[i]
        return base.reshape(len(self.offsets), -1)


def _im2col(x, w, value=0):
    """x [..., *size] -> [..., K, *out]: every window's elements, padding `value`."""
    nd = len(w.size)
    xp = _pad_trailing(x, w.padding, w.right, value)
    lead = x.ndim - nd
    pieces = []
    for off in w.offsets:
        piece = xp
        for i in range(nd):
            start = off[i] * w.dilation[i]
            end = start + (w.out[i] - 1) * w.stride[i] + 1
            if (start, end, w.stride[i]) != (0, xp.shape[lead + i], 1):
                piece = loom.slice(piece, lead + i, start, end, w.stride[i])
        pieces.append(piece)
    return pieces[0].unsqueeze(lead) if len(pieces) == 1 else loom.stack(pieces, lead)


def _col2im(cols, w):
    """The adjoint of _im2col: cols [..., K, *out] summed into [..., *size] (one index_add)."""
    nd = len(w.size)
    lead = list(cols.shape[:cols.ndim - nd - 1])
    flat = cols.reshape(*lead, len(w.offsets) * math.prod(w.out))
    pos = loom.tensor(w.flat_positions().reshape(-1))
    zeros = loom.zeros(*lead, math.prod(w.padded), dtype=cols.dtype)
    out = loom.index_add(zeros, len(lead), pos, flat).reshape(*lead, *w.padded)
    return _pad_trailing(out, [-p for p in w.padding], [-r for r in w.right])


# ---- convolution ------------------------------------------------------------------------------

def _conv(x, weight, stride, padding, dilation, groups, out=None):
    """torch's cross-correlation: x [N, C, *size], weight [O, C/groups, *k] -> [N, O, *out]
    (out: the first windows only, for a transposed conv's gradient)."""
    nd = weight.ndim - 2
    w = _Windows("convolution", x.shape[2:], weight.shape[2:], stride, padding, dilation,
                 out=out)
    n, c, o, g = x.shape[0], x.shape[1], weight.shape[0], groups
    k = len(w.offsets)
    cols = _im2col(x, w).reshape(n, g, c // g * k, math.prod(w.out))
    y = loom.matmul(weight.reshape(1, g, o // g, c // g * k), cols)
    return y.reshape(n, o, *w.out) if nd else y


def _conv_weight_grad(x, gy, weight_shape, stride, padding, dilation, groups):
    """d<conv(x, W), gy>/dW: [O, C/groups, *k]."""
    w = _Windows("convolution_backward", x.shape[2:], weight_shape[2:], stride, padding, dilation,
                 out=list(gy.shape[2:]))
    n, c, o, g = x.shape[0], x.shape[1], weight_shape[0], groups
    k = len(w.offsets)
    cols = _im2col(x, w).reshape(n, g, c // g * k, math.prod(w.out))
    gw = loom.matmul(gy.reshape(n, g, o // g, math.prod(w.out)), loom.transpose(cols, 2, 3))
    return loom.sum(gw, [0]).reshape(*weight_shape)


def _conv_transpose(x, weight, stride, padding, dilation, groups, out_size):
    """The adjoint of _conv in its input: x [N, O, *out], weight [O, C/groups, *k] ->
    [N, C, *out_size] (torch's transposed convolution, and conv's input gradient)."""
    w = _Windows("convolution", out_size, weight.shape[2:], stride, padding, dilation,
                 out=list(x.shape[2:]))
    n, o, g, k = x.shape[0], weight.shape[0], groups, len(w.offsets)
    cg = weight.shape[1]
    wm = loom.transpose(weight.reshape(1, g, o // g, cg * k), 2, 3)
    cols = loom.matmul(wm, x.reshape(n, g, o // g, math.prod(w.out)))  # [N, g, C/g * K, L]
    return _col2im(cols.reshape(n, g * cg, k, *w.out), w)


def _bias_view(bias, ndim):
    return bias.reshape(1, -1, *([1] * (ndim - 2)))


def _check_conv(op, x, weight, transposed, groups, bias=None):
    """torch's checks of a convolution's shapes, and its words (before any reshape fails)."""
    where, w, xs = f"[loom.torch] aten.{op}:", list(weight.shape), list(x.shape)
    if x.ndim != weight.ndim or x.ndim < 3:
        raise loom.ShapeError(f"{where} expected a batched input with {weight.ndim - 2} spatial "
                              f"dims for a weight of shape {w}, got an input of shape {xs}")
    if groups < 1 or w[0] < groups or w[0] % groups:
        raise loom.ShapeError(f"{where} given groups={groups}, expected weight to be divisible "
                              f"by {groups} at dimension 0, but got weight of size {w} instead")
    given = "transposed=1" if transposed else f"groups={groups}"
    channels = w[0] if transposed else w[1] * groups
    if xs[1] != channels:
        raise loom.ShapeError(f"{where} given {given}, weight of size {w}, expected input{xs} "
                              f"to have {channels} channels, but got {xs[1]} channels instead")
    outs = w[1] * groups if transposed else w[0]
    if bias is not None and list(bias.shape) != [outs]:
        raise loom.ShapeError(f"{where} given weight of size {w}, expected bias to be "
                              f"1-dimensional with {outs} elements, but got bias of size "
                              f"{list(bias.shape)} instead")


@lowers("convolution", "_convolution", "convolution_overrideable")
def _convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                 *cudnn_flags):
    _check_conv("convolution", x, weight, transposed, groups, bias)
    nd = weight.ndim - 2
    if transposed:
        size = [(i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op in
                zip(x.shape[2:], _ints(stride, nd), _ints(padding, nd), _ints(dilation, nd),
                    weight.shape[2:], _ints(output_padding, nd))]
        y = _conv_transpose(x, weight, stride, padding, dilation, groups, size)
    else:
        y = _conv(x, weight, stride, padding, dilation, groups)
    return y if bias is None else y + _bias_view(bias, y.ndim)


@lowers("convolution_backward_overrideable")
def _convolution_backward_overrideable(grad, x, weight, stride, padding, dilation, transposed,
                                       output_padding, groups, output_mask):
    return _convolution_backward(grad, x, weight, None, stride, padding, dilation, transposed,
                                 output_padding, groups, output_mask)


@lowers("convolution_backward")
def _convolution_backward(grad, x, weight, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    _check_conv("convolution_backward", x, weight, transposed, groups)
    gx = gw = gb = None
    if output_mask[0]:
        gx = _conv(grad, weight, stride, padding, dilation, groups, list(x.shape[2:])) \
            if transposed else \
            _conv_transpose(grad, weight, stride, padding, dilation, groups, x.shape[2:])
    if output_mask[1]:
        gw = _conv_weight_grad(grad, x, weight.shape, stride, padding, dilation, groups) \
            if transposed else \
            _conv_weight_grad(x, grad, weight.shape, stride, padding, dilation, groups)
    if output_mask[2]:
        gb = loom.sum(grad, [0] + list(range(2, grad.ndim)))
    return gx, gw, gb


# ---- im2col / col2im (F.unfold / F.fold) ------------------------------------------------------

@lowers("im2col")
def _im2col_op(x, kernel_size, dilation, padding, stride):
    w = _Windows("im2col", x.shape[-2:], kernel_size, stride, padding, dilation)
    cols = _im2col(x, w)
    lead = list(x.shape[:-3])
    return cols.reshape(*lead, x.shape[-3] * len(w.offsets), math.prod(w.out))


@lowers("col2im")
def _col2im_op(cols, output_size, kernel_size, dilation, padding, stride):
    w = _Windows("col2im", list(output_size), kernel_size, stride, padding, dilation)
    k = len(w.offsets)
    if cols.shape[-1] != math.prod(w.out) or cols.shape[-2] % k:
        raise loom.ShapeError(f"[loom.torch] aten.col2im: expected [.., C * {k}, "
                              f"{math.prod(w.out)}] blocks, got {list(cols.shape)}")
    lead = list(cols.shape[:-2])
    return _col2im(cols.reshape(*lead, cols.shape[-2] // k, k, *w.out), w)


@lowers("im2col_backward")  # torch 1.13
def _im2col_backward(grad, input_size, kernel_size, dilation, padding, stride):
    return _col2im_op(grad, input_size, kernel_size, dilation, padding, stride)


@lowers("col2im_backward")  # torch 1.13
def _col2im_backward(grad, kernel_size, dilation, padding, stride):
    return _im2col_op(grad, kernel_size, dilation, padding, stride)


# ---- pooling ----------------------------------------------------------------------------------

def _pool_windows(op, x, nd, kernel, stride, padding, dilation=1, ceil_mode=False):
    if x.ndim not in (nd + 1, nd + 2):
        raise loom.ShapeError(f"[loom.torch] aten.{op}: expected a {nd + 1}-d or {nd + 2}-d "
                              f"input, got shape {list(x.shape)}")
    return _Windows(op, x.shape[x.ndim - nd:], kernel, stride, padding, dilation, ceil_mode)


def _max_pool(nd):
    def lowering(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        op = f"max_pool{nd}d_with_indices"
        w = _pool_windows(op, x, nd, kernel_size, stride, padding, dilation, ceil_mode)
        lead = x.ndim - nd
        cols = _im2col(x, w, extreme(x.dtype, lowest=True))
        values = loom.amax(cols, [lead], False)
        which = loom.argmax(cols, lead, False)  # the first maximum, as torch's scan
        # the flat input position of window element k of output l: base[l] + offset[k]
        strides = [math.prod(w.size[i + 1:]) for i in range(nd)]
        grids = np.meshgrid(*[np.arange(o) * s - p for o, s, p in
                              zip(w.out, w.stride, w.padding)], indexing="ij")
        base = sum(g * st for g, st in zip(grids, strides)).astype(np.int64)
        offset = np.array([sum(o * d * st for o, d, st in zip(off, w.dilation, strides))
                           for off in w.offsets], dtype=np.int64)
        picked = loom.index_select(loom.tensor(offset), 0, which.reshape(-1))
        return values, picked.reshape(*which.shape) + loom.tensor(base)
    return lowering


def _max_pool_backward(nd):
    """The gradient of a max pool (also adaptive): grad summed at the flat input positions that
    torch's indices (the last argument) name, plane by plane."""
    def lowering(grad, x, *args):
        indices = args[-1]
        planes = math.prod(x.shape[:x.ndim - nd])
        size = x.numel() // planes
        offsets = loom.arange(planes, dtype=loom.int64).reshape(planes, 1) * size
        flat = (indices.reshape(planes, indices.numel() // max(planes, 1)) + offsets).reshape(-1)
        out = loom.index_add(loom.zeros(x.numel(), dtype=grad.dtype), 0, flat, grad.reshape(-1))
        return out.reshape(*x.shape)
    return lowering


def _constant(a, dtype):
    """A float64 numpy array as a loom tensor of dtype (rounded once)."""
    return loom.to(loom.tensor(a), dtype)


def _avg_divisor(w, count_include_pad, divisor_override):
    """torch's divisor of each output of an average pool (its CPU kernel's rule), [*out]."""
    div = np.ones(w.out, dtype=np.float64)
    for idx in np.ndindex(*w.out):
        full = real = 1
        for i, o in enumerate(idx):
            start = o * w.stride[i] - w.padding[i]
            end = min(start + w.kernel[i], w.size[i] + w.padding[i])
            full *= end - start
            real *= max(min(end, w.size[i]) - max(start, 0), 0)
        div[idx] = divisor_override if divisor_override else (
            full if count_include_pad else real)
    div[div == 0] = 1  # an empty window sums to 0
    return div


def _avg_pool(nd):
    def lowering(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        op = f"avg_pool{nd}d"
        w = _pool_windows(op, x, nd, kernel_size, stride, padding, 1, ceil_mode)
        total = loom.sum(_im2col(x, w), [x.ndim - nd])
        div = _avg_divisor(w, count_include_pad, divisor_override)
        return total / _constant(div, x.dtype)
    return lowering


def _avg_pool_backward(nd):
    def lowering(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                 divisor_override):
        op = f"avg_pool{nd}d_backward"
        w = _pool_windows(op, x, nd, kernel_size, stride, padding, 1, ceil_mode)
        div = _avg_divisor(w, count_include_pad, divisor_override)
        g = grad / _constant(div, grad.dtype)
        lead = x.ndim - nd
        cols = loom.unsqueeze(g, lead).expand(*g.shape[:lead], len(w.offsets), *w.out)
        return _col2im(cols, w)
    return lowering


def _adaptive_bounds(n, o):
    return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]


def _adaptive_matrix(n, o, dtype):
    """[o, n]: output i averages the input over torch's adaptive window i."""
    m = np.zeros((o, n), dtype=np.float64)
    for i, (a, b) in enumerate(_adaptive_bounds(n, o)):
        m[i, a:b] = 1.0 / (b - a)
    return _constant(m, dtype)


def _apply_per_dim(x, nd, mats):
    """x with each trailing spatial dim i contracted with mats[i] ([new, old])."""
    for i, m in enumerate(mats):
        d = x.ndim - nd + i
        if m is None:
            continue
        moved = loom.transpose(x, d, x.ndim - 1) if d != x.ndim - 1 else x
        moved = loom.matmul(moved, loom.transpose(m, 0, 1))
        x = loom.transpose(moved, d, x.ndim - 1) if d != x.ndim - 1 else moved
    return x


def _adaptive_avg(nd):
    def lowering(x, output_size):
        out = _ints(output_size, nd)
        size = list(x.shape[x.ndim - nd:])
        if all(o == 1 for o in out):
            return loom.mean(x, list(range(x.ndim - nd, x.ndim)), True)
        return _apply_per_dim(x, nd, [None if o == n else _adaptive_matrix(n, o, x.dtype)
                                      for n, o in zip(size, out)])
    return lowering


def _adaptive_avg_backward(nd):
    def lowering(grad, x):
        size = list(x.shape[x.ndim - nd:])
        out = list(grad.shape[grad.ndim - nd:])
        if all(o == 1 for o in out):
            return (grad / float(math.prod(size))).expand(*x.shape)
        return _apply_per_dim(grad, nd, [None if o == n else
                                         loom.transpose(_adaptive_matrix(n, o, x.dtype), 0, 1)
                                         for n, o in zip(size, out)])
    return lowering


def _adaptive_max(nd):
    """adaptive_max_pool{nd}d -> (values, indices): each output's window (torch's bounds)
    gathered from the flattened input, short windows padded with the lowest value."""
    def lowering(x, output_size):
        out = _ints(output_size, nd)
        size = list(x.shape[x.ndim - nd:])
        bounds = [_adaptive_bounds(n, o) for n, o in zip(size, out)]
        widths = [max(b - a for a, b in bd) for bd in bounds]
        total = math.prod(size)
        strides = [math.prod(size[i + 1:]) for i in range(nd)]
        k, l_ = math.prod(widths), math.prod(out)
        pos = np.full((k, l_), total, dtype=np.int64)  # `total`: the padding slot
        for li, oidx in enumerate(np.ndindex(*out)):
            for ki, kidx in enumerate(np.ndindex(*widths)):
                p, ok = 0, True
                for i in range(nd):
                    a, b = bounds[i][oidx[i]]
                    ok = ok and a + kidx[i] < b
                    p += (a + kidx[i]) * strides[i]
                if ok:
                    pos[ki, li] = p
        lead = list(x.shape[:x.ndim - nd])
        flat = x.reshape(*lead, total)
        flat = loom.cat([flat, loom.full(lead + [1], extreme(x.dtype, lowest=True), dtype=x.dtype)],
                        len(lead))
        cols = loom.index_select(flat, len(lead), loom.tensor(pos.reshape(-1)))
        cols = cols.reshape(*lead, k, l_)
        values = loom.amax(cols, [len(lead)], False)
        which = loom.argmax(cols, len(lead), False)  # [*lead, L]
        chosen = which * l_ + loom.arange(l_, dtype=loom.int64)
        idx = loom.index_select(loom.tensor(pos.reshape(-1)), 0, chosen.reshape(-1))
        return values.reshape(*lead, *out), idx.reshape(*lead, *out)
    return lowering


for _nd in (1, 2, 3):
    lowers(f"max_pool{_nd}d_with_indices")(_max_pool(_nd))
    lowers(f"max_pool{_nd}d_with_indices_backward", f"adaptive_max_pool{_nd}d_backward")(
        _max_pool_backward(_nd))
    lowers(f"avg_pool{_nd}d")(_avg_pool(_nd))
    lowers(f"avg_pool{_nd}d_backward")(_avg_pool_backward(_nd))
    lowers(f"_adaptive_avg_pool{_nd}d", f"adaptive_avg_pool{_nd}d")(_adaptive_avg(_nd))
    lowers(f"_adaptive_avg_pool{_nd}d_backward", f"adaptive_avg_pool{_nd}d_backward")(
        _adaptive_avg_backward(_nd))
    lowers(f"adaptive_max_pool{_nd}d")(_adaptive_max(_nd))


# ---- batch norm -------------------------------------------------------------------------------

def _channel(v, ndim):
    return v.reshape(1, -1, *([1] * (ndim - 2)))


def _channel_sum(x):
    """x [N, C, *spatial] summed over every axis but the channels -> [C] float64, as eager's CPU
    batch norm sums (a float32 sum, even as loom adds it in levels, stays above eager's error
    far from zero). The spatial axes first, then the samples: faster than one float64
    reduction over [0, 2, 3]."""
    x = loom.to(x, loom.float64)
    if x.ndim > 2:
        x = loom.sum(x, list(range(2, x.ndim)))  # [N, C]
    return loom.sum(x, [0])


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """-> out, save_mean, save_invstd, the new running mean and var (None where absent)."""
    new_mean, new_var = running_mean, running_var
    if training:
        n = x.numel() // x.shape[1]
        inv_n = 1 / n if n else math.nan
        # Past the sums the [C] values are x's type: each consumer of a small value recomputes
        # it, and a float64 rsqrt there cost 2 ms a step at [16, 64, 56, 56].
        mean = loom.to(_channel_sum(x) * inv_n, x.dtype)
        xc = x - _channel(mean, x.ndim)
        var = _channel_sum(xc * xc) * inv_n  # float64
        invstd = loom.rsqrt(loom.to(var, x.dtype) + eps)
        y = xc * _channel(invstd, x.ndim)
        if running_mean is not None:
            new_mean = running_mean * (1 - momentum) + loom.to(mean, running_mean.dtype) * momentum
        if running_var is not None:
            unbiased = var * (n / (n - 1) if n > 1 else math.nan)
            new_var = running_var * (1 - momentum) + loom.to(unbiased, running_var.dtype) * momentum
        save_mean, save_invstd = mean, invstd
    else:
        invstd = loom.rsqrt(loom.to(running_var, x.dtype) + eps)
        y = (x - _channel(loom.to(running_mean, x.dtype), x.ndim)) * _channel(invstd, x.ndim)
        save_mean = save_invstd = loom.zeros(0, dtype=x.dtype)
    if weight is not None:
        y = y * _channel(weight, x.ndim)
    if bias is not None:
        y = y + _channel(bias, x.ndim)
    return y, save_mean, save_invstd, new_mean, new_var


def _update(stat, new):
    """A running statistic that torch's op updates in place (its schema's Tensor(a!))."""
    if stat is not None and new is not stat:
        stat.copy_(new)


@lowers("native_batch_norm", "_native_batch_norm_legit")
def _native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    y, mean, invstd, new_mean, new_var = _batch_norm(x, weight, bias, running_mean, running_var,
                                                     training, momentum, eps)
    if training:
        _update(running_mean, new_mean)
        _update(running_var, new_var)
    return y, mean, invstd


@lowers("_batch_norm_with_update")
def _batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    out = _native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return (*out, loom.zeros(0, dtype=loom.float32))


@lowers("_native_batch_norm_legit.no_stats")
def _native_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _batch_norm(x, weight, bias, None, None, True, momentum, eps)[:3]


@lowers("_native_batch_norm_legit_no_training")
def _native_batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowers("_batch_norm_no_update")
def _batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None
    y, mean, invstd, _, _ = _batch_norm(x, weight, bias, running_mean, running_var, training,
                                        momentum, eps)
    return y, mean, invstd, loom.zeros(0, dtype=loom.float32)


@lowers("_native_batch_norm_legit_functional")
def _native_batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum,
                                  eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowers("native_batch_norm_backward")
def _native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                                save_invstd, train, eps, output_mask):
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean = loom.to(running_mean, x.dtype)
        invstd = loom.rsqrt(loom.to(running_var, x.dtype) + eps)
    xhat = (x - _channel(mean, x.ndim)) * _channel(invstd, x.ndim)
    gb, gw = _channel_sum(grad), _channel_sum(grad * xhat)  # float64
    scale = invstd if weight is None else invstd * weight
    gx = None
    if output_mask[0]:
        if train:
            n = x.numel() // x.shape[1]
            inv_n = 1 / n if n else math.nan
            gb_n, gw_n = (_channel(loom.to(g * inv_n, x.dtype), x.ndim) for g in (gb, gw))
            gx = _channel(scale, x.ndim) * (grad - gb_n - xhat * gw_n)
        else:
            gx = grad * _channel(scale, x.ndim)
    gw, gb = loom.to(gw, grad.dtype), loom.to(gb, grad.dtype)
    return gx, gw if output_mask[1] else None, gb if output_mask[2] else None


@lowers("batch_norm_backward")
def _batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update,
                         eps, output_mask, reserve):
    return _native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean,
                                       save_var, update or running_mean is None, eps,
                                       output_mask)


# ---- group norm -------------------------------------------------------------------------------

@lowers("native_group_norm")
def _native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    xg = x.reshape(n, group, c // group * hxw)
    mean = loom.mean(xg, [2], True)
    xc = xg - mean
    rstd = loom.rsqrt(loom.mean(xc * xc, [2], True) + eps)
    y = (xc * rstd).reshape(n, c, hxw)
    if weight is not None:
        y = y * weight.reshape(1, c, 1)
    if bias is not None:
        y = y + bias.reshape(1, c, 1)
    return y.reshape(*x.shape), mean.reshape(n, group), rstd.reshape(n, group)


@lowers("native_group_norm_backward")
def _native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    m, r = mean.reshape(n, group, 1), rstd.reshape(n, group, 1)
    d = c // group * hxw
    xhat = ((x.reshape(n, group, d) - m) * r).reshape(n, c, hxw)
    g = grad.reshape(n, c, hxw)
    gx = gw = gb = None
    if output_mask[0]:
        gwx = (g if weight is None else g * weight.reshape(1, c, 1)).reshape(n, group, d)
        xh = xhat.reshape(n, group, d)
        gx = r * (gwx - loom.mean(gwx, [2], True) - xh * loom.mean(gwx * xh, [2], True))
        gx = gx.reshape(*x.shape)
    if output_mask[1]:
        gw = loom.sum(g * xhat, [0, 2])
    if output_mask[2]:
        gb = loom.sum(g, [0, 2])
    return gx, gw, gb


# ---- reflect / replicate / circular padding ----------------------------------------------

def _select_adjoint(grad, d, n, positions):
    """The adjoint of index_select(x, d, positions) for an x of extent n along d: grad's
    entries summed into their source positions."""
    shape = list(grad.shape)
    shape[d] = n
    return loom.index_add(loom.zeros(*shape, dtype=grad.dtype), d, loom.tensor(positions), grad)


def _pad_positions(n, before, after, mode):
    """The source position of each of the n + before + after outputs along one dim."""
    i = np.arange(-before, n + after)
    if mode == "reflect":
        period = 2 * (n - 1)
        j = np.abs(i) % period if period else np.zeros_like(i)
        return np.where(j >= n, period - j, j).astype(np.int64)
    if mode == "replicate":
        return np.clip(i, 0, n - 1).astype(np.int64)
    return (i % n).astype(np.int64)  # circular


def _padded_dims(x_ndim, pad):
    """(dim, before, after) for torch's pad list (last dim first)."""
    return [(x_ndim - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]


def _index_pad(x, padding, mode):
    for d, b, a in _padded_dims(x.ndim, padding):
        n = x.shape[d]
        if mode == "reflect" and (b >= n or a >= n):
            raise loom.ShapeError(f"[loom.torch] reflection pad: padding ({b}, {a}) should be "
                                  f"less than the corresponding input dimension {n}")
        x = loom.index_select(x, d, loom.tensor(_pad_positions(n, b, a, mode)))
    return x


def _index_pad_backward(grad, x, padding, mode):
    for d, b, a in reversed(_padded_dims(x.ndim, padding)):
        grad = _select_adjoint(grad, d, x.shape[d], _pad_positions(x.shape[d], b, a, mode))
    return grad


for _mode, _names in (("reflect", "reflection"), ("replicate", "replication")):
    for _k in (1, 2, 3):
        lowers(f"{_names}_pad{_k}d")(functools.partial(_index_pad, mode=_mode))
        lowers(f"{_names}_pad{_k}d_backward")(functools.partial(_index_pad_backward, mode=_mode))


@lowers("_pad_circular")
def _pad_circular(x, pad):
    return _index_pad(x, pad, "circular")


@lowers("_pad_enum")
def _pad_enum(x, pad, mode, value=None):
    """torch 2.x's F.pad: mode 0 constant, 1 reflect, 2 replicate, 3 circular."""
    if mode == 0:
        return _constant_pad_nd(x, pad, 0 if value is None else value)
    return _index_pad(x, pad, ("reflect", "replicate", "circular")[mode - 1])


# ---- interpolation (F.interpolate's nearest and (bi/tri)linear modes) ---------------------

def _scale(n_in, n_out, given, align_corners=False):
    """torch's source-index scale of one dim (area_pixel_compute_scale)."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / given if given else n_in / n_out


def _nearest_positions(n_in, n_out, given):
    s = _scale(n_in, n_out, given)
    return np.minimum(np.floor(np.arange(n_out) * s).astype(np.int64), n_in - 1)


def _linear_weights(n_in, n_out, given, align_corners):
    """(i0, i1, lambda) of each output position: the two sources and the second's weight."""
    s = _scale(n_in, n_out, given, align_corners)
    dst = np.arange(n_out, dtype=np.float64)
    src = dst * s if align_corners else np.maximum((dst + 0.5) * s - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, src - i0


def _spatial(x_ndim, sizes, scales):
    k = len(sizes)
    scales = list(scales) + [None] * (k - len(scales))
    return [(x_ndim - k + j, sizes[j], scales[j]) for j in range(k)]


def _upsample_nearest(x, output_size, *scales):
    for d, n_out, s in _spatial(x.ndim, output_size, scales):
        x = loom.index_select(x, d, loom.tensor(_nearest_positions(x.shape[d], n_out, s)))
    return x


def _upsample_nearest_backward(grad, output_size, input_size, *scales):
    for d, n_out, s in reversed(_spatial(len(input_size), output_size, scales)):
        n = input_size[d]
        grad = _select_adjoint(grad, d, n, _nearest_positions(n, n_out, s))
    return grad


def _weights_along(lam, d, ndim, dtype):
    shape = [1] * ndim
    shape[d] = lam.shape[0]
    return loom.tensor(lam.astype(np.float64)).reshape(*shape).to(dtype)


def _upsample_linear(x, output_size, align_corners, *scales):
    for d, n_out, s in _spatial(x.ndim, output_size, scales):
        i0, i1, lam = _linear_weights(x.shape[d], n_out, s, align_corners)
        w = _weights_along(lam, d, x.ndim, x.dtype)
        x = loom.index_select(x, d, loom.tensor(i0)) * (1 - w) + \
            loom.index_select(x, d, loom.tensor(i1)) * w
    return x


def _upsample_linear_backward(grad, output_size, input_size, align_corners, *scales):
    for d, n_out, s in reversed(_spatial(len(input_size), output_size, scales)):
        i0, i1, lam = _linear_weights(input_size[d], n_out, s, align_corners)
        w = _weights_along(lam, d, grad.ndim, grad.dtype)
        n = input_size[d]
        grad = _select_adjoint(grad * (1 - w), d, n, i0) + _select_adjoint(grad * w, d, n, i1)
    return grad


def _size_and_scales(spatial_in, output_size, factors):
    """The .vec overloads' output size (given, or the scale factors' floor) and scales."""
    if output_size is None:
        return ([int(math.floor(n * f)) for n, f in zip(spatial_in, factors)], list(factors))
    return output_size, [None] * len(spatial_in)


def _vec(fn, linear):
    """The .vec overloads: output_size or scale_factors, as torch computes the size."""
    def vec(x, output_size, *rest):
        size, scales = _size_and_scales(x.shape[2:], output_size, rest[-1])
        return fn(x, size, *rest[:1 if linear else 0], *scales)
    return vec


def _vec_backward(fn, linear):
    """The backward's .vec overloads (torch 1.13)."""
    def vec(grad, output_size, input_size, *rest):
        size, scales = _size_and_scales(input_size[2:], output_size, rest[-1])
        return fn(grad, size, input_size, *rest[:1 if linear else 0], *scales)
    return vec


for _k in (1, 2, 3):
    lowers(f"upsample_nearest{_k}d_backward.vec")(_vec_backward(_upsample_nearest_backward,
                                                                False))
    lowers(f"upsample_nearest{_k}d", f"upsample_nearest{_k}d.default")(_upsample_nearest)
    lowers(f"upsample_nearest{_k}d.vec")(_vec(_upsample_nearest, False))
    lowers(f"upsample_nearest{_k}d_backward")(_upsample_nearest_backward)
for _name in ("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d"):
    lowers(_name, f"{_name}.default")(_upsample_linear)
    lowers(f"{_name}.vec")(_vec(_upsample_linear, True))
    lowers(f"{_name}_backward")(_upsample_linear_backward)
    lowers(f"{_name}_backward.vec")(_vec_backward(_upsample_linear_backward, True))
