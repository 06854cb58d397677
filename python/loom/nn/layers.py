"""The layers of the C++ API (loom/nn/nn.h) with torch.nn's names, parameter names, shapes and
default initialization, and the containers ModuleList, Sequential and ModuleDict."""
import collections
import math
import numbers

from .. import _loom
from .._creation import arange
from .._loom import Tensor
from . import functional as F
from .module import Module, Parameter


def _dtype_arg(cls, dtype):
    d = dtype if dtype is not None else _loom.dtype.float32
    if not isinstance(d, _loom.dtype) or not d.is_floating_point:
        raise TypeError(f"{cls}(): argument 'dtype' must be a floating-point loom.dtype, got "
                        f"{dtype!r}")
    return d


def _positive(cls, **kw):
    for k, v in kw.items():
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"{cls}(): argument '{k}' must be an int, got {type(v).__name__}")
        if v <= 0:
            raise ValueError(f"{cls}(): argument '{k}' must be positive, got {v}")


def _uniform(shape, bound, dtype):
    """U(-bound, bound), torch.nn.init.uniform_'s distribution."""
    with _loom.no_grad():
        u = _loom._rand(list(shape), _loom.dtype.float64) * (2.0 * bound) - bound
        return _loom.to(u, dtype)


class Identity(Module):
    def forward(self, input):
        return input


class Linear(Module):
    """y = x W^T + b; weight [out_features, in_features], bias [out_features], both
    U(-1/sqrt(in_features), 1/sqrt(in_features)) (torch's kaiming_uniform_(a=sqrt(5)))."""

    def __init__(self, in_features, out_features, bias=True, dtype=None):
        super().__init__()
        _positive("Linear", in_features=in_features, out_features=out_features)
        d = _dtype_arg("Linear", dtype)
        self.in_features, self.out_features = int(in_features), int(out_features)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(_uniform((out_features, in_features), bound, d))
        if bias:
            self.bias = Parameter(_uniform((out_features,), bound, d))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        y = _loom.matmul(input, _loom.transpose(self.weight, 0, 1))
        b = self.bias
        return y if b is None else y + b

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, input):
        return _loom.relu(input)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU(): approximate must be 'none' or 'tanh', got "
                             f"{approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, self.approximate)

    def extra_repr(self):
        return f"approximate='{self.approximate}'"


class SiLU(Module):
    def forward(self, input):
        return F.silu(input)


class Tanh(Module):
    def forward(self, input):
        return _loom.tanh(input)


class Sigmoid(Module):
    def forward(self, input):
        return _loom.sigmoid(input)


def _norm_shape(cls, normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (normalized_shape,)
    shape = tuple(int(s) for s in normalized_shape)
    _positive(cls, **{f"normalized_shape[{i}]": s for i, s in enumerate(shape)})
    return shape


class LayerNorm(Module):
    """Normalizes the trailing normalized_shape dims; weight ones, bias zeros of that shape."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, dtype=None):
        super().__init__()
        d = _dtype_arg("LayerNorm", dtype)
        self.normalized_shape = _norm_shape("LayerNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_loom._ones(list(self.normalized_shape), d))
            self.bias = Parameter(_loom._zeros(list(self.normalized_shape), d))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return _loom.layer_norm(input, list(self.normalized_shape), self.weight, self.bias,
                                self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing normalized_shape dims; weight ones.
    eps=None is the input dtype's machine epsilon (torch.nn.RMSNorm, torch >= 2.4)."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, dtype=None):
        super().__init__()
        d = _dtype_arg("RMSNorm", dtype)
        self.normalized_shape = _norm_shape("RMSNorm", normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_loom._ones(list(self.normalized_shape), d))
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class Embedding(Module):
    """Rows of weight [num_embeddings, embedding_dim] ~ N(0, 1) at integer indices; the row at
    `padding_idx` starts at zero and gets no gradient (torch's padding_idx)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, dtype=None):
        super().__init__()
        _positive("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        d = _dtype_arg("Embedding", dtype)
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.padding_idx = F._padding_index("Embedding", padding_idx, self.num_embeddings)
        with _loom.no_grad():
            w = _loom._randn([num_embeddings, embedding_dim], d)
            if self.padding_idx is not None:
                rows = _loom.unsqueeze(arange(num_embeddings) != self.padding_idx, -1)
                w = _loom.where(rows, w, 0.0)
            self.weight = Parameter(w)

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class CrossEntropyLoss(Module):
    """F.cross_entropy as a module; `weight` [C] is a buffer, as in torch."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(Module):
    """F.nll_loss as a module (input holds log-probabilities)."""

    def __init__(self, ignore_index=-100, reduction="mean"):
        super().__init__()
        self.ignore_index, self.reduction = int(ignore_index), reduction

    def forward(self, input, target):
        return F.nll_loss(input, target, ignore_index=self.ignore_index, reduction=self.reduction)


class MSELoss(Module):
    """F.mse_loss as a module."""

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(Module):
    """F.l1_loss as a module."""

    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class Dropout(Module):
    """Zeroes elements with probability p in training mode (scaling the rest by 1/(1-p));
    the identity in eval mode."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)

    def forward(self, input):
        return _loom.dropout(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace=False"


class CausalSelfAttention(Module):
    """Causal multi-head self-attention over x [batch, seq, dim], the C++
    nn::CausalSelfAttention: qkv = Linear(dim, 3 dim) split into q, k, v (in that order),
    softmax(q k^T / sqrt(dim / heads)) over keys at positions <= the query's, heads joined,
    proj = Linear(dim, dim)."""

    def __init__(self, dim, heads, dtype=None):
        super().__init__()
        _positive("CausalSelfAttention", dim=dim, heads=heads)
        if dim % heads:
            raise _loom.ShapeError(f"[CausalSelfAttention] dim {dim} is not a multiple of "
                                   f"heads {heads}")
        self.dim, self.heads = int(dim), int(heads)
        self.qkv = Linear(dim, 3 * dim, dtype=dtype)
        self.proj = Linear(dim, dim, dtype=dtype)

    def forward(self, x):
        self.check_input("CausalSelfAttention", x, self.dim)
        return self.proj(_loom._packed_qkv_attention(self.qkv(x), self.heads))

    @staticmethod
    def check_input(name, x, dim):
        """x must be a [batch, seq, dim] tensor: a ShapeError naming the layer otherwise."""
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[2] != dim:
            got = f"{x.dtype!r}{list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
            raise _loom.ShapeError(f"[{name}] expected [batch, seq, {dim}], got {got}")

    def extra_repr(self):
        return f"dim={self.dim}, heads={self.heads}"


# ---- containers ---------------------------------------------------------------------------

class ModuleList(Module):
    """Children "0", "1", ...; indexable, iterable; what scan_layers takes."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx):
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range")
        return str(idx % n)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(list(self._modules.values())[idx])
        return self._modules[self._index(idx)]

    def __setitem__(self, idx, module):
        self.add_module(self._index(idx), module)

    def __delitem__(self, idx):
        keys = list(self._modules)
        if isinstance(idx, slice):
            for k in keys[idx]:
                del self._modules[k]
        else:
            del self._modules[self._index(idx)]
        mods = list(self._modules.values())
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules):
        return self.extend(modules)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(mods):
            self.add_module(str(i), m)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward: iterate over it (or use "
                                  "loom.scan_layers)")


class Sequential(ModuleList):
    """Runs its children in order: Sequential(a, b) or Sequential(OrderedDict(name=a, ...))."""

    def __init__(self, *args):
        Module.__init__(self)
        if len(args) == 1 and isinstance(args[0], collections.OrderedDict):
            for k, m in args[0].items():
                self.add_module(k, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return Sequential(collections.OrderedDict(list(self._modules.items())[idx]))
        keys = list(self._modules)
        n = len(keys)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range")
        return self._modules[keys[idx % n]]

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class ModuleDict(Module):
    """Children by name, in insertion order."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def pop(self, key):
        m = self._modules[key]
        del self._modules[key]
        return m

    def update(self, modules):
        items = modules.items() if hasattr(modules, "items") else modules
        for k, m in items:
            self[k] = m
