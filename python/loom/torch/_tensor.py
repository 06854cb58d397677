"""The torch.Tensor wrapper subclass that holds a lazy loom tensor, and the dispatch of aten
ops to the lowering table (_lowering.py)."""
import sys
import weakref

import numpy as np
import torch
from torch.utils._pytree import tree_map

import loom

_T2L = {torch.bool: loom.bool_, torch.int32: loom.int32, torch.int64: loom.int64,
        torch.bfloat16: loom.bfloat16, torch.float16: loom.float16,
        torch.float32: loom.float32, torch.float64: loom.float64}
_L2T = {v: k for k, v in _T2L.items()}
# torch's dtype by loom.Tensor._dtype_code() (loom's dtypes are an Enum: slow to hash or make)
_L2T_BY_CODE = tuple(dict((v.value, k) for k, v in _T2L.items())[c] for c in range(len(_T2L)))
# loom's tensors report 'meta', as torchax's do: privateuseone has no device guard without a C++
# extension (torch's autograd and indexing abort the process on it, 1.13 and 2.9 alike). From
# torch 2.1 privateuseone is renamed 'loom', so users can name the device 'loom'; a tensor
# never carries it. On 1.13 loom's device is spelled 'meta'.
TENSOR_DEVICE = torch.device("meta")
if hasattr(torch.utils, "rename_privateuse1_backend"):
    try:
        torch.utils.rename_privateuse1_backend("loom")
    except RuntimeError:  # renamed already (by an earlier import)
        pass
    DEVICE = torch.device("loom")
else:
    DEVICE = TENSOR_DEVICE


def loom_dtype(dt):
    try:
        return _T2L[dt]
    except KeyError:
        raise loom.DTypeError(f"[loom.torch] torch dtype {dt} has no loom dtype (loom has "
                              f"{', '.join(str(d) for d in _T2L)})") from None


def torch_dtype(dt):
    return _L2T[dt]


_FAKE = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)


def _called_by_torch():
    """Whether the nearest caller outside loom.torch is torch's own code."""
    f = sys._getframe(2)
    while f is not None and f.f_globals.get("__name__", "").startswith("loom.torch"):
        f = f.f_back
    return f is not None and f.f_globals.get("__name__", "").split(".")[0] == "torch"


def is_loom_device(device, from_user=False):
    """'loom' (torch >= 2.1), or 'meta', which loom's tensors report. On torch 2.x a 'meta' that
    torch's own code asks for (fake tensors of torch.compile, meta initialization) stays torch's:
    with from_user, 'meta' is loom's only when the call comes from outside torch."""
    if device is None:
        return False
    d = torch.device(device) if not isinstance(device, torch.device) else device
    if d.type == DEVICE.type:
        return True
    if d.type != TENSOR_DEVICE.type:
        return False
    if _FAKE is not None and torch._C._get_dispatch_mode(_FAKE) is not None:
        return False
    return not (from_user and _called_by_torch())


def contiguous_strides(shape):
    """torch's row-major strides of shape (a dim of extent 0 or 1 steps as one of extent 1)."""
    strides, step = [], 1
    for n in reversed(list(shape)):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class LoomTensor(torch.Tensor):
    """A torch tensor on loom's device: its value is a lazy loom.Tensor (`_elem`); aten ops on
    it are recorded into loom's pending graph (see loom.torch)."""

    @staticmethod
    def __new__(cls, elem, requires_grad=False, strides=None):
        # strides: what torch's checks see (an expanded tensor's 0 strides); loom's own layout
        # is elem's.
        t = torch.Tensor._make_wrapper_subclass(cls, elem._shape(),  # a tuple, as .shape's
                                                strides=strides,
                                                dtype=_L2T_BY_CODE[elem._dtype_code()],
                                                device=TENSOR_DEVICE,
                                                requires_grad=requires_grad)
        t._elem = elem
        if strides is not None:  # several elements at one place: torch refuses writes into it
            t._overlaps = any(st == 0 and n > 1 for st, n in zip(strides, elem._shape()))
        return t

    _overlaps = False

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return (_DISPATCH or _load_dispatch())(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None):
        text = repr(to_torch(self.detach()))
        return text[:-1] + f", device='{DEVICE}')" if text.endswith(")") else text

    def numpy(self):
        return np.array(self._elem.numpy())

    def __reduce_ex__(self, protocol):
        # torch.save / pickle store the value as a CPU tensor: the file loads without loom.
        return to_torch_tensor(self).__reduce_ex__(protocol)

    def tolist(self):
        return self._elem.tolist()


_new_wrapper = torch.Tensor._make_wrapper_subclass


_STRIDED = torch.strided


def _wrap_keywords(elem):
    t = _new_wrapper(LoomTensor, elem._shape(), dtype=_L2T_BY_CODE[elem._dtype_code()],
                     device=TENSOR_DEVICE)
    t._elem = elem
    return t


def _wrap_positional(elem):  # torch 2.x: ~0.2 us less than the keywords' parsing
    t = _new_wrapper(LoomTensor, elem._shape(), None, None, None,
                     _L2T_BY_CODE[elem._dtype_code()], _STRIDED, TENSOR_DEVICE)
    t._elem = elem
    return t


try:  # torch 1.13 takes these arguments by keyword only
    _new_wrapper(LoomTensor, (0,), None, None, None, torch.float32, _STRIDED, TENSOR_DEVICE)
    wrap = _wrap_positional
except TypeError:
    wrap = _wrap_keywords
wrap.__doc__ = """LoomTensor(elem) for a fresh result (contiguous, no gradient), without __new__'s
options: the hot paths' constructor."""


_DISPATCH = None


def _load_dispatch():
    """_dispatch.dispatch, imported on first use (it imports this module); an import statement
    per op cost ~1 us of import machinery."""
    global _DISPATCH
    from ._dispatch import dispatch
    _DISPATCH = dispatch
    return dispatch


def from_cpu(t):
    """A loom tensor holding a copy of CPU tensor t's values."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return loom.tensor(t.float().numpy()).to(loom.bfloat16)
    return loom.tensor(t.contiguous().numpy().copy())


def to_torch_tensor(x):
    """A LoomTensor's value as a CPU torch tensor (materializes)."""
    e = x._elem
    if e.dtype == loom.bfloat16:
        return torch.from_numpy(np.array(e.float().numpy())).to(torch.bfloat16)
    return torch.from_numpy(np.array(e.numpy()))


# ids of the CPU Parameters a move to loom replaced (while they live): an optimizer made before
# the move holds them, and its step changes nothing on loom (torch keeps the Parameter objects
# when it moves a module to CUDA; a tensor subclass cannot take a Parameter's place in them).
MOVED_PARAMS = set()


def move_module(module, convert):
    """Replaces a module's parameters and buffers by convert(tensor), each distinct tensor once,
    so tied weights stay tied (torch's Module._apply converts a tied weight once per owner)."""
    memo = {}
    for mod in module.modules():
        for table, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in memo:
                    new = convert(t.detach())
                    memo[id(t)] = torch.nn.Parameter(new, t.requires_grad) if is_param else new
                    if is_param and isinstance(new, LoomTensor) and not isinstance(t, LoomTensor):
                        MOVED_PARAMS.add(id(t))
                        weakref.finalize(t, MOVED_PARAMS.discard, id(t))
                table[name] = memo[id(t)]
        if hasattr(mod, "_flat_weights_names"):  # nn.LSTM/GRU/RNN keep a list of their weights
            mod._flat_weights = [getattr(mod, n, None) for n in mod._flat_weights_names]
    return module


def to_loom(tree):
    """CPU torch tensors in `tree` as LoomTensors (a module's parameters and buffers in place)."""
    if isinstance(tree, torch.nn.Module):
        return move_module(tree, lambda t: t if isinstance(t, LoomTensor) else
                           LoomTensor(from_cpu(t)))
    if isinstance(tree, LoomTensor):
        return tree
    if isinstance(tree, torch.Tensor):
        out = LoomTensor(from_cpu(tree))
        return out.requires_grad_() if tree.requires_grad and tree.is_leaf else out
    if isinstance(tree, (list, tuple, dict)):
        return tree_map(lambda v: to_loom(v) if isinstance(v, torch.Tensor) else v, tree)
    return tree


def to_torch(tree):
    """LoomTensors in `tree` as CPU torch tensors; a module becomes a CPU copy (ties kept), the
    module itself stays on loom, so a checkpoint mid-training leaves training as it was. One
    loom run for all."""
    if isinstance(tree, torch.nn.Module):
        import copy
        loom.sync()
        memo = {}
        for t in list(tree.parameters()) + list(tree.buffers()):
            if isinstance(t, LoomTensor) and id(t) not in memo:
                cpu = to_torch_tensor(t)
                memo[id(t)] = torch.nn.Parameter(cpu, t.requires_grad) \
                    if isinstance(t, torch.nn.Parameter) else cpu
        return copy.deepcopy(tree, memo)
    loom_leaves = []
    tree_map(lambda v: loom_leaves.append(v._elem) if isinstance(v, LoomTensor) else None, tree)
    if loom_leaves:
        loom.sync()
    return tree_map(lambda v: to_torch_tensor(v) if isinstance(v, LoomTensor) else v, tree)
