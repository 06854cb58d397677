"""nn.Module and nn.Parameter, subclassed and used exactly as torch.nn's.

Attribute assignment registers: a Parameter goes to `_parameters`, a Module to `_modules`, a
tensor assigned to a registered buffer name to `_buffers` (register_buffer makes the name).
Names are dotted ("layers.0.linear.weight") in registration order. The flat views that
functional code needs are `dict(m.named_parameters())` and `dict(m.named_buffers())`;
`reparametrize(m, tensors)` (what functional_call uses) swaps tensors in by those names for
the duration of a `with` block.
"""
import collections
import collections.abc
import contextlib
import itertools

from .. import _loom, _torch_ops
from .._loom import Tensor

_IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Parameter(Tensor):
    """A Tensor that a Module registers as a parameter: a leaf that requires grad (unless
    requires_grad=False), sharing `data`'s value. It is a loom.Tensor (a Python subclass of
    the binding's class): every op takes it and returns plain Tensors; in-place ops (copy_,
    add_, what optimizers do) update it where it is."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = _loom._zeros([0], _loom.dtype.float32)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter(): argument 'data' must be a loom.Tensor, got "
                            f"{type(data).__name__}")
        super().__init__(data.detach())
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, proto):
        # as torch.save pickles a Parameter: its value (materialized) and requires_grad
        array, dtype_name, _ = _torch_ops._reduce(self)[1]
        return (_rebuild_parameter, (array, dtype_name, self.requires_grad))


def _rebuild_parameter(array, dtype_name, requires_grad):
    return Parameter(_torch_ops._rebuild_tensor(array, dtype_name, False), requires_grad)


def _addindent(s, n):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    return lines[0] + "\n" + "\n".join(" " * n + line for line in lines[1:])


class Module:
    """Base class of every layer and model, as torch.nn.Module."""

    training: bool

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments: "
                            f"Module.__init__ takes none")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  f'"forward" function')

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- registration ---------------------------------------------------------------------

    def _check_name(self, what, name, kind):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {what} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f"{kind} name can't contain \".\", got: {name}")
        if name == "":
            raise KeyError(f"{kind} name can't be empty string \"\"")

    def register_parameter(self, name, param):
        self._check_name("parameters", name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter "
                            f"'{name}' (loom.nn.Parameter or None required)")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        self._check_name("buffer", name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer "
                            f"'{name}' (loom.Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name, module):
        self._check_name("module", name, "module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    register_module = add_module

    def __getattr__(self, name):
        # only reached when ordinary lookup fails
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def _forget(self, name):
        d = self.__dict__
        d.pop(name, None)
        d["_parameters"].pop(name, None)
        d["_buffers"].pop(name, None)
        d["_modules"].pop(name, None)
        d["_non_persistent_buffers_set"].discard(name)

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            self._forget(name)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter "
                                f"'{name}' (loom.nn.Parameter or None expected)")
            params[name] = None
        elif isinstance(value, Module):
            if params is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            self._forget(name)
            d["_modules"][name] = value
        elif params is not None and name in d["_modules"]:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module "
                                f"'{name}' (loom.nn.Module or None expected)")
            d["_modules"][name] = None
        elif params is not None and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                f"(loom.Tensor or None expected)")
            d["_buffers"][name] = value
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if name in d.get(store, ()):
                del d[store][name]
                d["_non_persistent_buffers_set"].discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = set(dir(type(self))) | set(self.__dict__)
        keys |= set(self._parameters) | set(self._buffers) | set(self._modules)
        return sorted(k for k in keys if not k[0].isdigit())

    # ---- traversal ------------------------------------------------------------------------

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            yield from m.named_modules(memo, prefix + ("." if prefix else "") + name,
                                       remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, store, prefix, recurse, remove_duplicate):
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) \
            if recurse else [(prefix, self)]
        seen = set()
        for mprefix, m in mods:
            for k, v in m.__dict__[store].items():
                if v is None or (remove_duplicate and id(v) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(v))
                yield mprefix + ("." if mprefix else "") + k, v

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target):
        m = self
        if target == "":
            return m
        for item in target.split("."):
            sub = m._modules.get(item) if isinstance(m, Module) else None
            if sub is None:
                raise AttributeError(f"{type(m).__name__} has no attribute `{item}`")
            m = sub
        return m

    def _get_member(self, target, store, what):
        mod, _, name = target.rpartition(".")
        members = getattr(self.get_submodule(mod), store)
        if name not in members:
            raise AttributeError(f"`{name}` is not {what}")
        return members[name]

    def get_parameter(self, target):
        return self._get_member(target, "_parameters", "an nn.Parameter")

    def get_buffer(self, target):
        return self._get_member(target, "_buffers", "a buffer")

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---- modes and gradients --------------------------------------------------------------

    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if set_to_none:  # also when None: a compiled step learns the grad is reset
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    # ---- dtype ----------------------------------------------------------------------------

    def to(self, *args, **kwargs):
        """torch's Module.to: `to(device)`, `to(dtype)`, `to(device, dtype)`, `to(tensor)` and
        the keywords device=, dtype=, non_blocking=. The device is the host ('cpu': loom's only
        device), so only a dtype changes anything: floating-point parameters and buffers are
        converted (new Parameter objects, tied parameters staying tied: make optimizers after
        this, as torch advises)."""
        from .. import _device
        dtype, device = kwargs.pop("dtype", None), kwargs.pop("device", None)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"Module.to() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        for a in args:
            if isinstance(a, _loom.dtype):
                dtype = a
            elif isinstance(a, _loom.Tensor):
                dtype = a.dtype
            elif isinstance(a, (str, _device.device)):
                device = a
            elif not isinstance(a, bool):  # non_blocking given positionally
                raise TypeError(f"Module.to() expects a device, a loom.dtype or a tensor, got "
                                f"{type(a).__name__}")
        if device is not None:
            _device.check(device, "Module.to")
        if dtype is None:
            return self
        if not dtype.is_floating_point:
            raise TypeError(f"Module.to() only accepts floating point dtypes, got {dtype!r}")
        converted = {}  # id of a parameter -> its converted Parameter (tied weights stay tied)
        for m in self.modules():
            for k, p in m._parameters.items():
                if p is not None and p.dtype.is_floating_point and p.dtype != dtype:
                    if id(p) not in converted:
                        converted[id(p)] = Parameter(_loom.to(p, dtype), p.requires_grad)
                    m._parameters[k] = converted[id(p)]
            for k, b in m._buffers.items():
                if b is not None and b.dtype.is_floating_point and b.dtype != dtype:
                    m._buffers[k] = _loom.to(b, dtype)
        return self

    def cpu(self):
        """The module itself: loom's memory is the host's."""
        return self

    def float(self):
        return self.to(_loom.dtype.float32)

    def double(self):
        return self.to(_loom.dtype.float64)

    def half(self):
        return self.to(_loom.dtype.float16)

    def bfloat16(self):
        return self.to(_loom.dtype.bfloat16)

    # ---- state dicts ----------------------------------------------------------------------

    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        """Parameters and persistent buffers by dotted name, in registration order (torch's
        keys); detached unless keep_vars."""
        out = collections.OrderedDict() if destination is None else destination
        for mprefix, m in self.named_modules(prefix=prefix.rstrip("."), remove_duplicate=False):
            dot = mprefix + ("." if mprefix else "")
            for k, p in m._parameters.items():
                if p is not None:
                    out[dot + k] = p if keep_vars else p.detach()
            for k, b in m._buffers.items():
                if b is not None and k not in m._non_persistent_buffers_set:
                    out[dot + k] = b if keep_vars else b.detach()
        return out

    def _state_targets(self):
        out = collections.OrderedDict()
        for mprefix, m in self.named_modules(remove_duplicate=False):
            dot = mprefix + ("." if mprefix else "")
            for k, p in m._parameters.items():
                if p is not None:
                    out[dot + k] = p
            for k, b in m._buffers.items():
                if b is not None and k not in m._non_persistent_buffers_set:
                    out[dot + k] = b
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Copies `state_dict`'s tensors (loom Tensors, numpy arrays, or any DLPack producer
        such as a torch tensor) into this module's parameters and buffers, as torch does:
        missing and unexpected keys are errors when strict (a loom.Error, a RuntimeError),
        a shape mismatch always (a loom.ShapeError). Returns (missing_keys,
        unexpected_keys)."""
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        targets = self._state_targets()
        missing = [k for k in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in targets]
        sources, errors, size_errors = {}, [], []
        for k, t in targets.items():
            if k not in state_dict:
                continue
            src = state_dict[k]
            if not isinstance(src, Tensor):
                try:
                    from .._creation import tensor
                    src = tensor(src)
                except TypeError:
                    errors.append(f'While copying the parameter named "{k}", expected '
                                  f'a Tensor (or an array) from checkpoint but received '
                                  f'{type(state_dict[k])}')
                    continue
            if tuple(src._shape()) != tuple(t._shape()):
                size_errors.append(
                    f"size mismatch for {k}: copying a param with shape "
                    f"{_size_str(src)} from checkpoint, the shape in current model is "
                    f"{_size_str(t)}.")
                continue
            sources[k] = src
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing)))
        errors += size_errors
        if errors:
            cls = _loom.ShapeError if size_errors else _loom.Error
            raise cls("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        with _loom.no_grad():
            for k, src in sources.items():
                targets[k].copy_(src)
        return _IncompatibleKeys(missing, unexpected)

    # ---- printing -------------------------------------------------------------------------

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = []
        extra = self.extra_repr()
        if extra:
            lines = extra.split("\n")
        for key, m in self._modules.items():
            lines.append("(" + key + "): " + _addindent(repr(m), 2))
        main = type(self).__name__ + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"


def _size_str(t):
    return f"loom.Size({list(t._shape())})"


# ---- functional use -----------------------------------------------------------------------

def _aliases(module):
    """id(tensor) -> every (owner, store, name) that holds it (tied weights included)."""
    out = collections.defaultdict(list)
    for _, m in module.named_modules(remove_duplicate=False):
        for store in ("_parameters", "_buffers"):
            for k, v in m.__dict__[store].items():
                if v is not None:
                    out[id(v)].append((m, store, k))
    return out


def _slot(module, name):
    owner_name, _, leaf = name.rpartition(".")
    try:
        owner = module.get_submodule(owner_name)
    except AttributeError:
        owner = None
    if owner is not None:
        for store in ("_parameters", "_buffers"):
            if leaf in owner.__dict__[store]:
                return owner, store, leaf
    raise _loom.Error(f"[functional_call] {type(module).__name__} has no parameter or buffer "
                      f"named '{name}'")


@contextlib.contextmanager
def reparametrize(module, tensors, tie_weights=True):
    """Within the block, module's parameters and buffers named by `tensors` (a dict of dotted
    name -> Tensor, any Tensor: a slice, a tracer's placeholder) are those tensors; the
    module's own tensors come back on exit, also when the block raises. With tie_weights a
    tensor registered under several names (tied weights) is replaced under all of them."""
    if not isinstance(tensors, collections.abc.Mapping):
        raise TypeError(f"reparametrize(): argument 'tensors' must be a dict of str to Tensor, "
                        f"got {type(tensors).__name__}")
    saved = []
    aliases = _aliases(module) if tie_weights else None
    try:
        for name, t in tensors.items():
            if not isinstance(t, Tensor):
                raise TypeError(f"functional_call(): the value for '{name}' must be a "
                                f"loom.Tensor, got {type(t).__name__}")
            owner, store, leaf = _slot(module, name)
            old = owner.__dict__[store][leaf]
            slots = [(owner, store, leaf)]
            if tie_weights and old is not None:
                slots = aliases.get(id(old), slots)
            for o, s, k in slots:
                saved.append((o, s, k, o.__dict__[s][k]))
                o.__dict__[s][k] = t
        yield module
    finally:
        for o, s, k, old in reversed(saved):
            o.__dict__[s][k] = old


def functional_call(module, parameter_and_buffer_dicts, args=(), kwargs=None, *,
                    tie_weights=True, strict=False):
    """module(*args, **kwargs) with the given tensors in place of its parameters and buffers,
    with torch.func.functional_call's signature: a dict, or a tuple/list of dicts, of dotted
    name -> Tensor; names not given keep the module's own tensors (strict=True makes every
    name required); the module is restored afterwards, also when forward raises."""
    if not isinstance(module, Module):
        raise TypeError(f"functional_call(): argument 'module' must be a loom.nn.Module, got "
                        f"{type(module).__name__}")
    if isinstance(parameter_and_buffer_dicts, collections.abc.Mapping):
        merged = dict(parameter_and_buffer_dicts)
    elif isinstance(parameter_and_buffer_dicts, (tuple, list)):
        merged = {}
        for d in parameter_and_buffer_dicts:
            if not isinstance(d, collections.abc.Mapping):
                raise TypeError(f"functional_call(): argument 'parameter_and_buffer_dicts' "
                                f"must be a dict or a tuple of dicts, got an element of type "
                                f"{type(d).__name__}")
            dup = set(merged) & set(d)
            if dup:
                raise ValueError(f"{sorted(dup)[0]!r} appeared in multiple dictionaries; "
                                 f"behavior of functional call is ambiguous")
            merged.update(d)
    else:
        got = type(parameter_and_buffer_dicts).__name__
        raise TypeError(f"functional_call(): argument 'parameter_and_buffer_dicts' must be a "
                        f"dict or a tuple of dicts, got {got}")
    if strict:
        names = set(itertools.chain((k for k, _ in module.named_parameters()),
                                    (k for k, _ in module.named_buffers())))
        missing = sorted(names - set(merged))
        unexpected = sorted(set(merged) - names)
        if missing or unexpected:
            raise _loom.Error(f"[functional_call] strict: missing key(s) {missing}, unexpected "
                              f"key(s) {unexpected}")
    if not isinstance(args, tuple):
        args = (args,)
    with reparametrize(module, merged, tie_weights=tie_weights):
        return module(*args, **(kwargs or {}))
