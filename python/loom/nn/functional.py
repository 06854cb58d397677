"""loom.nn.functional: torch.nn.functional's names over loom's ops (composites of primitives)."""
import numbers

from .. import _loom
from .._loom import Tensor, dtype as _dtype
from .._torch_ops import gelu as _gelu

_FINFO_EPS = {_dtype.float64: 2.220446049250313e-16, _dtype.float32: 1.1920928955078125e-07,
              _dtype.float16: 0.0009765625, _dtype.bfloat16: 0.0078125}


def _check_tensor(fn, arg, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument '{arg}' must be a loom.Tensor, got "
                        f"{type(x).__name__}")


def linear(input, weight, bias=None):
    """input @ weight.T + bias (weight [out, in])."""
    _check_tensor("linear", "input", input)
    _check_tensor("linear", "weight", weight)
    y = _loom.matmul(input, _loom.transpose(weight, 0, 1) if weight.ndim == 2 else weight)
    return y if bias is None else y + bias


def relu(input, inplace=False):
    return _loom.relu(input)


def gelu(input, approximate="none"):
    """The exact erf form, or torch's tanh approximation (approximate='tanh')."""
    _check_tensor("gelu", "input", input)
    return _gelu(input, approximate)


def silu(input, inplace=False):
    return input * _loom.sigmoid(input)


def sigmoid(input):
    return _loom.sigmoid(input)


def tanh(input):
    return _loom.tanh(input)


def _cast(input, dtype):
    return input if dtype is None or input.dtype == dtype else _loom.to(input, dtype)


def softmax(input, dim, dtype=None):
    return _loom.softmax(_cast(input, dtype), dim)


def log_softmax(input, dim, dtype=None):
    return _loom.log_softmax(_cast(input, dtype), dim)


def _shape_arg(fn, normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return [int(normalized_shape)]
    try:
        return [int(s) for s in normalized_shape]
    except TypeError:
        raise TypeError(f"{fn}(): argument 'normalized_shape' must be an int or a sequence of "
                        f"ints, got {type(normalized_shape).__name__}") from None


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _loom.layer_norm(input, _shape_arg("layer_norm", normalized_shape), weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2 over normalized_shape's dims) + eps) * weight; eps=None is the input
    dtype's machine epsilon (torch.nn.functional.rms_norm, torch >= 2.4)."""
    shape = _shape_arg("rms_norm", normalized_shape)
    _check_tensor("rms_norm", "input", input)
    n = len(shape)
    if tuple(input.shape[input.ndim - n:]) != tuple(shape) or input.ndim < n:
        raise _loom.ShapeError(f"[rms_norm] expected input with shape [*, "
                               f"{', '.join(map(str, shape))}], got {list(input.shape)}")
    if eps is None:
        eps = _FINFO_EPS.get(input.dtype, 1.1920928955078125e-07)
    dims = list(range(-n, 0))
    y = input * _loom.rsqrt(_loom._mean(input * input, dims, True) + eps)
    return y if weight is None else y * weight


def dropout(input, p=0.5, training=True, inplace=False):
    if not isinstance(p, numbers.Real) or not 0 <= p <= 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return _loom.dropout(input, float(p), bool(training))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch's scaled_dot_product_attention: softmax(query key^T * scale + mask) value, with
    query [..., L, E], key [..., S, E], value [..., S, Ev] -> [..., L, Ev] (batch dims
    broadcast). attn_mask is boolean (True: the key takes part) or additive of query's dtype,
    broadcast to [..., L, S]; is_causal lets query i see keys j <= i (with attn_mask, both apply);
    scale defaults to 1 / sqrt(E); dropout_p applies to the weights whenever > 0, as torch;
    enable_gqa lets key and value have fewer heads (dim -3) than query. A query whose keys are
    all masked out gives zeros, as torch >= 2.5."""
    return _loom.scaled_dot_product_attention(query, key, value, attn_mask, float(dropout_p),
                                              bool(is_causal), scale, bool(enable_gqa))


def _padding_index(fn, padding_idx, num):
    """padding_idx in [-num, num) as a row index (torch's rule)."""
    if padding_idx is None:
        return None
    if not isinstance(padding_idx, int) or isinstance(padding_idx, bool):
        raise TypeError(f"{fn}(): argument 'padding_idx' must be an int, got "
                        f"{type(padding_idx).__name__}")
    if not -num <= padding_idx < num:
        raise _loom.ShapeError(f"[{fn}] padding_idx {padding_idx} must be within "
                               f"num_embeddings {num} (in [{-num}, {num}))")
    return padding_idx + num if padding_idx < 0 else padding_idx


def embedding(input, weight, padding_idx=None):
    """Rows of weight [num, dim] at the integer indices `input`; the rows picked at
    `padding_idx` get no gradient (torch's padding_idx)."""
    _check_tensor("embedding", "input", input)
    _check_tensor("embedding", "weight", weight)
    out = _loom.embedding(input, weight)
    pad = _padding_index("embedding", padding_idx, weight.shape[0] if weight.ndim else 0)
    if pad is None:
        return out
    keep = _loom.unsqueeze(input != pad, -1)
    return _loom.where(keep, out, out.detach())


def _reduce(loss, reduction, fn):
    if reduction == "mean":
        return _loom._mean(loss, None, False)
    if reduction == "sum":
        return _loom._sum(loss, None, False)
    if reduction == "none":
        return loss
    raise ValueError(f"{fn}(): reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _legacy_reduction(size_average, reduce, reduction):
    """torch's mapping of the deprecated size_average / reduce flags to `reduction`."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "mean" if size_average and reduce else "sum" if reduce else "none"


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """torch's cross_entropy: input [C], [N, C] or [N, C, d1, ...] logits (classes in dim 1),
    target class indices (ignore_index rows count nowhere) or class probabilities; `weight`
    [C] rescales each class (the mean then divides by the targets' total weight)."""
    _check_tensor("cross_entropy", "input", input)
    _check_tensor("cross_entropy", "target", target)
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy(): reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")
    cdim = 1 if input.ndim > 1 else 0
    ncls = input.shape[cdim] if input.ndim else 0
    if weight is not None:
        _check_tensor("cross_entropy", "weight", weight)
        if tuple(weight.shape) != (ncls,) or not weight.dtype.is_floating_point:
            raise _loom.ShapeError(f"[cross_entropy] weight must be a floating tensor of shape "
                                   f"[{ncls}] (one per class), got {list(weight.shape)} "
                                   f"{weight.dtype}")
    if not target.dtype.is_floating_point:  # class indices: torch's shape checks, its words
        if input.ndim > 2:
            want = [input.shape[0]] + list(input.shape[2:])
            if list(target.shape) != want and input.ndim == 4:  # torch's nll_loss2d words
                raise _loom.ShapeError(f"[cross_entropy] size mismatch (got input: "
                                       f"{list(input.shape)} , target: {list(target.shape)}); "
                                       f"expected target size {want} (classes in dim 1)")
            if list(target.shape) != want:
                raise _loom.ShapeError(f"[cross_entropy] Expected target size {want}, got "
                                       f"{list(target.shape)} (input {list(input.shape)} "
                                       f"{input.dtype!r}, classes in dim 1)")
        elif input.ndim == 2 and target.ndim > 1:
            raise _loom.ShapeError(f"[cross_entropy] 0D or 1D target tensor expected, "
                                   f"multi-target not supported (input {list(input.shape)}, "
                                   f"target {list(target.shape)})")
        elif input.ndim == 2 and (target.ndim != 1 or target.shape[0] != input.shape[0]):
            got = target.shape[0] if target.ndim else target.numel()
            raise _loom.ShapeError(f"[cross_entropy] Expected input batch_size "
                                   f"({input.shape[0]}) to match target batch_size ({got}) "
                                   f"(input {list(input.shape)}, target {list(target.shape)})")
    if input.ndim > 2:  # classes to the last dim, then rows
        perm = [0] + list(range(2, input.ndim)) + [1]
        out_shape = [input.shape[0]] + list(input.shape[2:])
        flat = _loom._reshape(_loom._permute(input, perm), [-1, ncls])
        if target.dtype.is_floating_point:
            tflat = _loom._reshape(_loom._permute(target, perm), [-1, ncls])
        else:
            tflat = _loom._reshape(target, [-1])
        loss = cross_entropy(flat, tflat, weight=weight, ignore_index=ignore_index,
                             reduction=reduction, label_smoothing=label_smoothing)
        return _loom._reshape(loss, out_shape) if reduction == "none" else loss
    if reduction == "mean" and label_smoothing == 0.0 and weight is None:
        return _loom.cross_entropy(input, target, ignore_index)
    cdim = input.ndim - 1
    logp = _loom.log_softmax(input, cdim)
    if weight is not None and weight.dtype != logp.dtype:
        weight = _loom.to(weight, logp.dtype)
    wlogp = logp * weight if weight is not None else logp
    if target.dtype.is_floating_point:
        tgt = _loom.to(target, logp.dtype) if target.dtype != logp.dtype else target
        if label_smoothing:
            tgt = tgt * (1 - label_smoothing) + label_smoothing / ncls
        return _reduce(-_loom._sum(tgt * wlogp, [cdim], False), reduction, "cross_entropy")
    valid = target != ignore_index
    safe = _loom.where(valid, target, 0)
    nll = -_loom._squeeze(_loom.gather(wlogp, cdim, _loom.unsqueeze(safe, -1)), cdim)
    if label_smoothing:
        smooth = -_loom._sum(wlogp, [cdim], False) / ncls
        nll = nll * (1 - label_smoothing) + smooth * label_smoothing
    nll = _loom.where(valid, nll, 0.0)
    if reduction == "mean":
        if weight is None:
            count = _loom.to(_loom._sum(valid, None, False), nll.dtype)
        else:
            picked = _loom.embedding(safe, _loom.unsqueeze(weight, -1))
            count = _loom._sum(_loom.where(valid, _loom._squeeze(picked, -1), 0.0), None, False)
        return _loom._sum(nll, None, False) / count
    return _reduce(nll, reduction, "cross_entropy")


def nll_loss(input, target, ignore_index=-100, reduction="mean"):
    """-input[target] (input holds log-probabilities [N, C])."""
    cdim = input.ndim - 1
    valid = target != ignore_index
    safe = _loom.where(valid, target, 0)
    nll = -_loom._squeeze(_loom.gather(input, cdim, _loom.unsqueeze(safe, -1)), cdim)
    nll = _loom.where(valid, nll, 0.0)
    if reduction == "mean":
        return _loom._sum(nll, None, False) / _loom.to(_loom._sum(valid, None, False), nll.dtype)
    return _reduce(nll, reduction, "nll_loss")


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    _check_tensor("mse_loss", "input", input)
    _check_tensor("mse_loss", "target", target)
    if tuple(input.shape) != tuple(target.shape):
        raise _loom.ShapeError(f"[mse_loss] input {list(input.shape)} and target "
                               f"{list(target.shape)} must have the same shape")
    if reduction == "mean":
        return _loom.mse_loss(input, target)
    d = input - target
    return _reduce(d * d, reduction, "mse_loss")


def l1_loss(input, target, reduction="mean"):
    return _reduce(_loom.abs(input - target), reduction, "l1_loss")
