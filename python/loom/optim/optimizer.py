"""The Optimizer base, after torch.optim.Optimizer: param_groups (a list of dicts with
per-group options), add_param_group, state (per parameter), state_dict/load_state_dict in
torch's layout, zero_grad.

What makes an optimizer replayable by `loom.compile(step, trace_once=True)` and keeps a
changing learning rate from recompiling:
- every piece of state (momentum buffers, moments, step counts) is a tensor allocated once,
  materialized, and updated in place (copy_ under no_grad) by step();
- each group's "lr" is also a 0-d float64 tensor (group.tensor("lr")) that step() reads. It
  is backed by a numpy array: assigning group["lr"] = x (outside any step) writes x into that
  memory, with no graph op, so the next step (traced or replayed) reads the new value, and the
  graph, thus the compiled program, stays the same. Other options are Python numbers read
  while tracing (changing them retraces; under trace_once they keep their traced values).
"""
import collections.abc
import numbers

import numpy as np

from .. import _loom
from .._loom import Tensor

_NP = {_loom.dtype.float16: np.float16, _loom.dtype.float32: np.float32,
       _loom.dtype.float64: np.float64, _loom.dtype.int32: np.int32,
       _loom.dtype.int64: np.int64, _loom.dtype.bool_: np.bool_}


def _materialized_zeros(shape, dtype):
    """Zeros that are already data (no graph op): numpy memory shared by the tensor."""
    np_dtype = _NP.get(dtype)
    if np_dtype is None:  # bfloat16: numpy has none
        t = _loom._zeros(list(shape), dtype)
        return t
    return _loom.from_numpy(np.zeros(tuple(shape), np_dtype))


class _HostScalar:
    """A 0-d float64 tensor over one numpy double: set() writes it without a graph op."""

    __slots__ = ("array", "tensor")

    def __init__(self, value):
        self.array = np.array(float(value), dtype=np.float64)
        self.tensor = _loom.from_numpy(self.array)

    def set(self, value):
        # Pending work traced before keeps the old value: a pending read of memory shared with
        # numpy reads a snapshot taken when it was traced.
        self.array[()] = float(value)


class ParamGroup(dict):
    """One of optimizer.param_groups: a dict (torch's keys); the options in `tensor_keys`
    ("lr") are mirrored by 0-d tensors that assignment updates in place."""

    tensor_keys = ("lr",)

    def __init__(self, options):
        super().__init__()
        self._scalars = {}
        for k, v in options.items():
            self[k] = v

    def __setitem__(self, key, value):
        if key in self.tensor_keys:
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise TypeError(f"param_groups: '{key}' must be a number, got "
                                f"{type(value).__name__}")
            s = self._scalars.get(key)
            if s is None:
                self._scalars[key] = _HostScalar(value)
            else:
                s.set(value)
            value = float(value)
        super().__setitem__(key, value)

    def update(self, other=(), **kw):
        for k, v in dict(other, **kw).items():
            self[k] = v

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def tensor(self, key):
        """The 0-d float64 tensor that mirrors option `key` (what step() reads)."""
        return self._scalars[key].tensor


def _number(cls, name, v):
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise TypeError(f"{cls}(): argument '{name}' must be a number, got {type(v).__name__}")
    return float(v)


class Optimizer:
    """Base class: subclasses define `defaults`, `_init_state(p, group)` and
    `_update(group)`."""

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.state = {}  # param -> dict of state tensors (a Tensor hashes by identity)
        # The parameters stepped with a gradient (torch exports their state only), kept on the
        # host so that state_dict() reads no tensor and a save stays one graph.
        self._stepped = set()
        self.param_groups = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got loom.Tensor")
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(params[0], collections.abc.Mapping):
            params = [{"params": params}]
        for g in params:
            self.add_param_group(g)

    def __repr__(self):
        s = type(self).__name__ + " ("
        for i, g in enumerate(self.param_groups):
            s += f"\nParameter Group {i}"
            for k in sorted(g):
                if k != "params":
                    s += f"\n    {k}: {g[k]}"
        return s + "\n)"

    def add_param_group(self, param_group):
        if not isinstance(param_group, collections.abc.Mapping):
            raise TypeError(f"add_param_group(): argument 'param_group' must be a dict, got "
                            f"{type(param_group).__name__}")
        group = dict(param_group)
        params = group.get("params")
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            params = list(params or [])
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params "
                                f"is {type(p).__module__}.{type(p).__name__}")
            if not p.requires_grad:
                raise ValueError("optimizer can only optimize tensors that require grad "
                                 "(leaves: call requires_grad_() or use nn.Parameter)")
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        self._check_group(group)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        group["params"] = params
        g = ParamGroup(group)
        self.param_groups.append(g)
        for p in params:
            self.state[p] = self._init_state(p, g)

    def _check_group(self, group):
        pass

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                if set_to_none:  # also when None: a compiled step learns the grad is reset
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def step(self, closure=None):
        loss = None
        if closure is not None:
            loss = closure()
        with _loom.no_grad():
            for g in self.param_groups:
                self._update(g)
        return loss

    # ---- state dicts (torch's layout) -----------------------------------------------------

    def _export_state(self, p, group):
        """The state of p as torch has it (None when torch would have none yet)."""
        raise NotImplementedError

    def _import_state(self, p, group, saved):
        raise NotImplementedError

    def state_dict(self):
        """{"state": {index: {name: tensor}}, "param_groups": [{options..., "params":
        [index, ...]}]}, indices counting the parameters over the groups in order."""
        state, groups, i = {}, [], 0
        for g in self.param_groups:
            idx = []
            for p in g["params"]:
                s = self._export_state(p, g)
                if s is not None:
                    state[i] = s
                idx.append(i)
                i += 1
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = idx
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads a state_dict() of this optimizer or of torch's (torch tensors go in through
        DLPack): same number of groups and parameters per group; options and state are
        copied in place."""
        if not isinstance(state_dict, collections.abc.Mapping) or \
                "param_groups" not in state_dict or "state" not in state_dict:
            raise TypeError("load_state_dict(): argument 'state_dict' must be a dict with "
                            "'state' and 'param_groups' (an optimizer's state_dict())")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for g, sg in zip(self.param_groups, saved_groups):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 "match the size of optimizer's group")
        saved_state = state_dict["state"]
        for g, sg in zip(self.param_groups, saved_groups):
            for k, v in sg.items():
                if k != "params":
                    g[k] = v
            for p, idx in zip(g["params"], sg["params"]):
                self._import_state(p, g, saved_state.get(idx))


def _as_loom(v, name):
    if isinstance(v, Tensor):
        return v
    if isinstance(v, numbers.Real):
        return _loom._full([], float(v), _loom.dtype.float64)
    from .._creation import tensor
    try:
        return tensor(v)
    except TypeError:
        raise TypeError(f"load_state_dict(): state '{name}' must be a tensor, got "
                        f"{type(v).__name__}") from None


def _copy_into(dst, src, name):
    src = _as_loom(src, name)
    if tuple(src._shape()) != tuple(dst._shape()):
        raise _loom.ShapeError(f"[optimizer.load_state_dict] state '{name}' has shape "
                               f"{list(src._shape())}, the parameter's is {list(dst._shape())}")
    with _loom.no_grad():
        dst.copy_(src)
