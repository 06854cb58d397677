"""PyTorch's tensor repr (the common cases of torch/_tensor_str.py): values padded to one
width, 4 decimals or integral floats as "1.", scientific notation for wide ranges."""
import math

import numpy as np

from ._loom import dtype

_DEFAULT = (dtype.float32, dtype.int64, dtype.bool_)


def _formatter(values, kind):
    if kind == "b":
        return lambda v: "True" if v else "False"
    if kind in "iu":
        return lambda v: str(int(v))
    finite = [abs(float(v)) for v in values if math.isfinite(float(v))]
    nonzero = [v for v in finite if v != 0]
    if finite and all(float(v).is_integer() for v in finite):
        if max(finite) > 1e8:
            return lambda v: f"{float(v):.4e}" if math.isfinite(float(v)) else str(float(v))
        return lambda v: f"{float(v):.0f}." if math.isfinite(float(v)) else _special(v)
    sci = bool(nonzero) and (max(nonzero) / min(nonzero) > 1000 or max(nonzero) > 1e8 or
                             min(nonzero) < 1e-4)
    if sci:
        return lambda v: f"{float(v):.4e}" if math.isfinite(float(v)) else _special(v)
    return lambda v: f"{float(v):.4f}" if math.isfinite(float(v)) else _special(v)


def _special(v):
    v = float(v)
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _body(arr, fmt, width, indent):
    if arr.ndim == 0:
        return fmt(arr[()]).rjust(width)
    if arr.ndim == 1:
        return "[" + ", ".join(fmt(v).rjust(width) for v in arr) + "]"
    sep = "," + "\n" * (arr.ndim - 1) + " " * (indent + 1)
    return "[" + sep.join(_body(a, fmt, width, indent + 1) for a in arr) + "]"


def tensor_repr(t):
    a = t.float().numpy() if t.dtype in (dtype.bfloat16, dtype.float16) else t.numpy()
    suffix = []
    if a.size == 0:
        body = "[]"
        if a.ndim != 1:
            suffix.append(f"size={tuple(a.shape)}")
    else:
        flat = a.reshape(-1)
        fmt = _formatter(flat, a.dtype.kind)
        width = max(len(fmt(v)) for v in flat)
        body = _body(a, fmt, width, len("tensor("))
    if t.dtype not in _DEFAULT:
        suffix.append(f"dtype={t.dtype!r}")
    if t.requires_grad:
        suffix.append("requires_grad=True")
    out = "tensor(" + body
    for s in suffix:  # torch starts a new line when the suffix would pass 80 columns
        last = len(out) - out.rfind("\n") - 1 if "\n" in out else len(out)
        out += (",\n" + " " * len("tensor(") if last + len(s) + 2 > 80 else ", ") + s
    return out + ")"
