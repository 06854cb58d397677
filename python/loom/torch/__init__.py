"""loom.torch: torch programs on loom. A torch tensor on loom's device holds a lazy loom
tensor; the aten ops torch runs on it (forward, and the backward torch's autograd records) go
into loom's pending graph, which lt.sync() (or a read: item(), print, cpu(), numpy()) compiles
once per structure and runs.

    import torch, loom.torch as lt
    dev = lt.device()                  # torch.device('loom') on torch >= 2.1,
                                       # torch.device('meta') on torch 1.13 (tensors
                                       # report 'meta' on both, as torchax's)
    model = MyModule().to(dev)         # before making the optimizer: new parameter objects
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
        lt.sync()                      # or only loss.item(): one graph a step, compiled once

Factories take the device (torch.randn(3, 4, device=dev), zeros, ones, empty and rand drawn
by loom's generator, which torch.manual_seed seeds too: a seed repeats loom's draws and
dropout masks, though they are not the CPU's numbers; full, arange, tensor, randint,
randperm, linspace, eye made by torch and moved). lt.to_loom(tree) moves tensors, pytrees
and modules (in place) to loom; lt.to_torch(tree) gives CPU tensors, and a CPU copy of a
module. torch.save stores loom tensors as CPU ones.
An aten op the table does not lower raises loom.Error naming the op, its overload and its
arguments. CPU tensors mix with loom ones only where torch mixes CPU and CUDA tensors: a 0-d
CPU tensor is a number, copy_ moves values either way (cpu_t.copy_(loom_t) writes the CPU
tensor in place: model_on_cpu.load_state_dict of a state dict on loom), and CPU indices are
moved; any other mix raises loom.Error.

F.scaled_dot_product_attention (torch >= 2.0) on loom tensors is loom's attention, one op.
A write through a view (x[0].add_(1), x[:, 1] = v) reaches the base and its live views, as
in torch (expand and split views cannot be written: loom.Error).
torch.compile(model, backend="loom") (torch >= 2.0) takes a model on the CPU and runs
Dynamo's graphs on loom, training through aot_autograd (see loom.torch._compile). A model on
loom's device needs no torch.compile (loom.torch traces it lazily, one graph per step at
lt.sync(); Dynamo cannot trace loom's tensor subclass): a call with loom tensors skips Dynamo.
Tested with torch 1.13 and 2.9 (test_loom_torch.py; OpInfo samples in
test_loom_torch_opinfo.py; scripts/test-torch2.sh).

The seed's tools, with torch_xla's signatures, on torch callables: lt.assume_pure(fn) (over
functional_call), lt.scan(fn, init, xs), lt.scan_layers(layers, x, is_layer_pure=...) over a
ModuleList, lt.fori_loop(lower, upper, body_fn, *carried), lt.while_loop(cond_fn, body_fn,
carried), lt.compile(fn). assume_pure traces fn once per signature (later calls insert the
cached body); the loops trace their body once per call into one loop node, whatever the trip
count (the next call's graph hits the compile cache); assume_pure, scan and scan_layers are
differentiable through torch's autograd (loom's VJP of the region).
"""
import os
import warnings

import torch
from torch.utils._pytree import tree_map
from torch.utils._python_dispatch import TorchDispatchMode

import loom
import loom.nn.functional as LF

from . import _dispatch
from ._dispatch import TABLE, _STATS
from ._tensor import (DEVICE, LoomTensor, is_loom_device, loom_dtype, move_module, to_loom,
                      to_torch, to_torch_tensor)
from . import _compile, _tensor
from ._tools import assume_pure, compile, fori_loop, fused, scan, scan_layers, while_loop

# An op's site in errors and graph names is the user's line, not torch's (F.cross_entropy's).
loom._loom._skip_frames_under(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)

__all__ = ["device", "sync", "to_loom", "to_torch", "LoomTensor", "metrics", "metrics_report",
           "assume_pure", "scan", "scan_layers", "while_loop", "fori_loop", "compile",
           "lowered_ops", "aten_ops_lowered", "fx_graphs_compiled", "compile_counters", "Mesh",
           "mark_sharding", "sharding_of"]

_DRAWS = {"randn": loom.randn, "rand": loom.rand, "zeros": loom.zeros, "ones": loom.ones,
          "empty": loom.zeros}


def _size(args):
    if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)):
        return tuple(args[0])
    return tuple(args)


def _factory(name, original):
    def make(*args, **kwargs):
        if not is_loom_device(kwargs.get("device"), from_user=True):
            return original(*args, **kwargs)
        rg = kwargs.pop("requires_grad", False)
        kwargs.pop("device")
        if name in _DRAWS:
            dt = kwargs.get("dtype") or torch.get_default_dtype()
            out = LoomTensor(_DRAWS[name](*_size(args), dtype=loom_dtype(dt)))
        else:  # torch's own values and dtype rules on the CPU (randint, randperm: torch's
            # generator, as eager), then moved
            out = to_loom(original(*args, **kwargs))
        return out.requires_grad_() if rg else out
    make.__wrapped__ = original
    return make


def _target(args, kwargs):
    dev = kwargs.get("device")
    if dev is None:
        dev = next((a for a in args if isinstance(a, (str, torch.device))), None)
    return dev


_tensor_to = torch.Tensor.to
_tensor_setitem = torch.Tensor.__setitem__


def _to(self, *args, **kwargs):
    """Tensor.to: a CPU tensor moved to loom's device becomes a LoomTensor."""
    if type(self) is not LoomTensor and is_loom_device(_target(args, kwargs), from_user=True):
        dt = kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)
        return to_loom(self if dt is None else _tensor_to(self, dt))
    return _tensor_to(self, *args, **kwargs)


def _loom_key(key):
    """Index lists and CPU index tensors in a key as loom tensors: torch would make them
    tensors on the indexed tensor's device itself (on 1.13 data-less 'meta' tensors)."""
    def one(k):
        if isinstance(k, list) or (isinstance(k, torch.Tensor) and
                                   not isinstance(k, LoomTensor) and k.dim() > 0):
            return to_loom(torch.as_tensor(k))
        return k
    return tuple(one(k) for k in key) if isinstance(key, tuple) else one(key)


_tensor_getitem = torch.Tensor.__getitem__


def _getitem(self, key):
    if type(self) is LoomTensor:
        key = _loom_key(key)
    return _tensor_getitem(self, key)


def _setitem(self, key, value):
    # torch would make a number a tensor on the target's device: on 1.13 a data-less meta
    # tensor. Made here as a loom tensor instead.
    if type(self) is LoomTensor:
        key = _loom_key(key)
        if not isinstance(value, torch.Tensor):
            value = LoomTensor(loom.tensor(value, dtype=self._elem.dtype))
    return _tensor_setitem(self, key, value)


_module_to = torch.nn.Module.to


def _module_to_device(self, *args, **kwargs):
    """Module.to: to loom's device (or back to the CPU) with tied weights kept tied."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    to_loom_device = is_loom_device(device, from_user=True)
    has_loom = any(isinstance(t, LoomTensor) for t in self.parameters())
    if to_loom_device or (device is not None and device.type == "cpu" and has_loom):
        if dtype is not None:
            _module_to(self, dtype)  # floating parameters to dtype, where they are
        if to_loom_device:
            return to_loom(self)
        loom.sync()  # to the CPU in place, as torch's Module.to
        return move_module(self, lambda t: to_torch_tensor(t) if isinstance(t, LoomTensor)
                           else t)
    return _module_to(self, *args, **kwargs)


class _BackwardFactories(TorchDispatchMode):
    """Active during a backward that involves loom tensors: torch's autograd formulas make
    small tensors on the gradient's device (aten.scalar_tensor, zeros, ...) that no loom
    tensor takes part in, so the subclass never sees them; on torch 1.13 they would be
    data-less 'meta' tensors. Made here as loom tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(a, LoomTensor) for a in args):
            # what func(*args) would reach through the subclass, without the round trip
            # through torch's dispatcher (most of a backward's ops)
            return _dispatch.dispatch(func, args, kwargs)
        if is_loom_device(kwargs.get("device")):
            made = _dispatch.factory_op(func, args, kwargs)
            if made is not None:
                return made
        return func(*args, **kwargs)


def _involves_loom(*trees):
    found = []
    for t in trees:
        tree_map(lambda v: found.append(v) if isinstance(v, LoomTensor) else None, t)
    return bool(found)


_autograd_backward = torch.autograd.backward
_autograd_grad = torch.autograd.grad


def _backward(tensors, grad_tensors=None, *args, **kwargs):
    if _involves_loom(tensors, grad_tensors):
        with _BackwardFactories():
            return _autograd_backward(tensors, grad_tensors, *args, **kwargs)
    return _autograd_backward(tensors, grad_tensors, *args, **kwargs)


def _grad(outputs, inputs, grad_outputs=None, *args, **kwargs):
    if _involves_loom(outputs, inputs, grad_outputs):
        with _BackwardFactories():
            return _autograd_grad(outputs, inputs, grad_outputs, *args, **kwargs)
    return _autograd_grad(outputs, inputs, grad_outputs, *args, **kwargs)


def _attention(original):
    """F.scaled_dot_product_attention (torch >= 2.0): on loom tensors, loom's attention as one
    op (torch would decompose it into aten ops whose causal mask it makes on the meta device)."""
    def scaled_dot_product_attention(*args, **kwargs):
        q = args[0] if args else kwargs.get("query")
        if type(q) is not LoomTensor:
            return original(*args, **kwargs)
        return _loom_attention(*args, **kwargs)
    scaled_dot_product_attention.__wrapped__ = original
    scaled_dot_product_attention.__doc__ = original.__doc__
    return scaled_dot_product_attention


def _loom_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    tensors = [query, key, value] + ([] if attn_mask is None else [attn_mask])
    for t in tensors:
        if not isinstance(t, LoomTensor):
            _dispatch._unwrap_all([t])  # a CPU tensor: torch's device-mismatch error
            raise loom.Error(f"[loom.torch] scaled_dot_product_attention: expected tensors on "
                             f"loom's device, got {type(t).__name__}")

    def run(q, k, v, mask=None):
        return LF.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale,
                                               enable_gqa)
    return fused(run, *tensors, draws=dropout_p > 0 and "scaled_dot_product_attention")


def _load(original):
    """torch.load(..., map_location=lt.device()): loaded to the CPU, then moved to loom (a
    state dict, a tensor or any pytree of them)."""
    def load(f, map_location=None, *args, **kwargs):
        if isinstance(map_location, (str, torch.device)) and \
                torch.device(map_location).type == DEVICE.type:  # 'meta' stays torch's on 2.x
            return to_loom(original(f, "cpu", *args, **kwargs))
        return original(f, map_location, *args, **kwargs)
    return load


def _rnn_forward(forward):
    """nn.RNN/LSTM/GRU.forward: with input on loom and no hx, the zero state made on loom (torch
    makes it on input.device, which is 'meta' for loom's tensors on torch 2.x)."""
    def wrapped(self, input, hx=None):
        packed = isinstance(input, torch.nn.utils.rnn.PackedSequence)
        x = input.data if packed else input
        if hx is None and isinstance(x, LoomTensor):
            layers = self.num_layers * (2 if self.bidirectional else 1)
            if packed:
                lead = (layers, int(input.batch_sizes[0]))
            elif x.dim() == 2:  # unbatched
                lead = (layers,)
            else:
                lead = (layers, x.shape[0 if self.batch_first else 1])
            proj = getattr(self, "proj_size", 0)
            h = torch.zeros(*lead, proj or self.hidden_size, dtype=x.dtype, device=DEVICE)
            if isinstance(self, torch.nn.LSTM):
                hx = (h, torch.zeros(*lead, self.hidden_size, dtype=x.dtype, device=DEVICE))
            else:
                hx = h
        return forward(self, input, hx)
    return wrapped


def _manual_seed(original):
    """torch.manual_seed also seeds loom's generator (dropout, rand, randn on loom's device):
    the same seed gives the same draws again, as on torch's devices (loom's numbers, not the
    CPU's: Philox, the same on every loom backend)."""
    def manual_seed(seed):
        out = original(seed)
        loom.manual_seed(int(seed) % (1 << 64))
        return out
    manual_seed.__wrapped__ = original
    manual_seed.__doc__ = original.__doc__
    return manual_seed


def _optimizer_state_policy(original):
    """Optimizer.load_state_dict casts each state tensor with value.to(device=param.device):
    'meta' for a parameter on loom, which torch's own code means as torch's meta device on
    torch 2.x (see is_loom_device), so the momentum buffers and moments came back data-less.
    A state tensor of a parameter on loom goes to loom (dtype as torch's policy casts it; a
    CPU 'step' stays on the CPU, as torch keeps it)."""
    def process(param, value, *args, **kwargs):
        out = original(param, value, *args, **kwargs)
        if isinstance(param, LoomTensor) and type(out) is torch.Tensor and \
                out.device.type == "meta" and isinstance(value, torch.Tensor) and \
                value.device.type != "meta":
            out = to_loom(value.detach().to(out.dtype))
        return out
    return staticmethod(process)


_module_load_state_dict = torch.nn.Module.load_state_dict


def _load_state_dict(self, *args, **kwargs):
    """Module.load_state_dict into a module on loom: torch 2.x warns 'copying from a
    non-meta parameter in the checkpoint to a meta parameter in the current model, which is
    a no-op' for each tensor, since loom's report the device 'meta'; the copy does happen
    (loom's copy_), so the warning is silenced for modules that hold loom tensors."""
    if not any(type(t) is LoomTensor for t in self.parameters()) and \
            not any(type(t) is LoomTensor for t in self.buffers()):
        return _module_load_state_dict(self, *args, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*copying from a non-meta parameter in "
                                r"the checkpoint to a meta parameter", category=UserWarning)
        return _module_load_state_dict(self, *args, **kwargs)


_installed = False


def _install():
    """Routes the torch calls that name loom's device to loom: the factories, Tensor.to,
    Module.to, Tensor.__setitem__, torch.manual_seed (seeds loom's generator too), the
    optimizers' state cast in load_state_dict, Module.load_state_dict (torch 2.x's false
    'meta parameter ... no-op' warning), F.scaled_dot_product_attention, torch.load
    (map_location loom) and the recurrent modules' forward (their zero state) are wrapped
    (one check each; other calls are untouched, unlike a TorchFunctionMode, which would add
    microseconds to every eager torch op)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in ("randn", "rand", "zeros", "ones", "empty", "full", "arange", "tensor",
                 "randint", "randperm", "linspace", "eye", "as_tensor"):
        setattr(torch, name, _factory(name, getattr(torch, name)))
    torch.Tensor.to = _to
    torch.Tensor.__setitem__ = _setitem
    torch.Tensor.__getitem__ = _getitem
    torch.nn.Module.to = _module_to_device
    torch.manual_seed = torch.random.manual_seed = _manual_seed(torch.random.manual_seed)
    torch.nn.Module.load_state_dict = _load_state_dict
    policy = getattr(torch.optim.Optimizer, "_process_value_according_to_param_policy", None)
    if policy is not None:  # torch >= 2.1
        torch.optim.Optimizer._process_value_according_to_param_policy = \
            _optimizer_state_policy(policy)
    torch.load = _load(torch.load)
    for rnn in (torch.nn.RNN, torch.nn.LSTM, torch.nn.GRU):
        rnn.forward = _rnn_forward(rnn.forward)
    torch.autograd.backward = _backward
    torch.autograd.grad = _grad
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        torch.nn.functional.scaled_dot_product_attention = _attention(sdpa)


def device():
    """loom's torch device (importing loom.torch routes the torch calls that name it)."""
    return DEVICE


_install()
_compile.register()


def _stale_optimizer(opt, args, kwargs):
    """An optimizer step over Parameters a move to loom replaced: said once per optimizer."""
    if not _tensor.MOVED_PARAMS or getattr(opt, "_loom_warned", False):
        return
    for group in opt.param_groups:
        if group["params"] and id(group["params"][0]) in _tensor.MOVED_PARAMS:
            opt._loom_warned = True
            warnings.warn(f"loom.torch: this {type(opt).__name__} holds a model's parameters from "
                          f"before module.to(lt.device()) (the CPU ones; loom's .to() makes new "
                          f"Parameters), so its step changes nothing on loom: make the optimizer "
                          f"after moving the model", stacklevel=3)
            return


try:  # torch >= 2.0; torch 1.13 has no global optimizer hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(_stale_optimizer)
except ImportError:
    pass


def sync():
    """Compiles (once per structure) and runs the pending graph: torch_xla.sync()'s role."""
    loom.sync()


def metrics():
    """loom's counters (loom.metrics())."""
    return loom.metrics()


def aten_ops_lowered():
    """How many aten ops this process has lowered to loom."""
    return _STATS["lowered"]


def fx_graphs_compiled():
    """How many FX graphs torch.compile(backend="loom") has handed to loom (Dynamo's graph
    breaks and recompiles each add one)."""
    return _STATS.get("fx_graphs", 0)


def compile_counters():
    """torch.compile(backend="loom")'s graphs, Dynamo's frames and graph breaks (with reasons):
    see loom.torch._compile.counters."""
    return _compile.counters()


def metrics_report():
    """loom's report, the aten ops lowered and, once torch.compile ran, its graphs, frames
    and graph breaks."""
    text = loom.metrics_report() + f"\naten ops lowered: {_STATS['lowered']}"
    if _STATS.get("data_dependent_cuts"):
        text += (f"\ndata-dependent shapes (nonzero, boolean masks) computed at once: "
                 f"{_STATS['data_dependent_cuts']}")
    c = _compile.counters()
    if c["fx_graphs"] or c["dynamo_frames"]:
        text += (f"\ntorch.compile: {c['fx_graphs']} FX graphs on loom, {c['dynamo_frames']} "
                 f"Dynamo frames compiled, {c['graph_breaks']} graph breaks")
        for reason, n in c["graph_break_reasons"].items():
            text += f"\n  graph break x{n}: {reason}"
    return text


def lowered_ops():
    """The aten op names (and name.overload keys) the table lowers."""
    return sorted(TABLE)


# Sharding, as torch_xla.distributed.spmd spells it (`xs.Mesh`, `xs.mark_sharding`), over the
# ranks loom.launch started (loom.distributed).
from loom.distributed import Mesh  # noqa: E402


def _loom_elem(fn, t):
    elem = getattr(t, "_elem", None)
    if elem is None and isinstance(getattr(t, "data", None), LoomTensor):
        elem = t.data._elem  # an nn.Parameter over a LoomTensor
    if elem is None:
        raise TypeError(f"{fn}(): expected a tensor on loom's device ({DEVICE}), got "
                        f"{type(t).__name__} on {getattr(t, 'device', '?')}; move it with "
                        f".to(loom.torch.device()) first")
    return elem


def mark_sharding(t, mesh, partition_spec):
    """torch_xla's `xs.mark_sharding(tensor, mesh, partition_spec)` for a tensor on loom's
    device (a parameter too): lays it out over `mesh` (a loom.torch.Mesh, the launched ranks)
    with one spec entry per dim (a mesh axis name or index, a tuple of axes, or None). The
    program stays written at global shapes; see loom.distributed.mark_sharding. Returns t."""
    import loom.distributed as dist
    dist.mark_sharding(_loom_elem("mark_sharding", t), mesh, partition_spec)
    return t


def sharding_of(t):
    """The layout of a tensor on loom's device, as loom.distributed.sharding_of's text (None:
    replicated)."""
    import loom.distributed as dist
    return dist.sharding_of(_loom_elem("sharding_of", t))
