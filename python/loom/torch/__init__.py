"""loom.torch: torch programs on loom. A torch tensor on loom's device holds a lazy loom
tensor; the aten ops torch runs on it (forward, and the backward torch's autograd records) go
into loom's pending graph, which lt.sync() (or a read: item(), print, cpu(), numpy()) compiles
once per structure and runs.

    import torch, loom.torch as lt
    dev = lt.device()                  # torch.device('loom') on torch >= 2.1,
                                       # torch.device('privateuseone') on torch 1.13
    model = MyModule().to(dev)         # parameters become loom tensors (in place)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in batches:
        x, y = x.to(dev), y.to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
        lt.sync()                      # or only loss.item(): one graph a step, compiled once

Factories take the device (torch.randn(3, 4, device=dev), zeros, ones, full, arange, tensor,
empty, rand; drawn by loom's generator). lt.to_loom(tree) / lt.to_torch(tree) move tensors,
modules (in place) and pytrees. An aten op the table does not lower raises loom.Error naming
the op, its overload and its arguments.

A write through a view (x[0].add_(1), x[:, 1] = v) reaches the base and its live views, as
in torch (expand, split and as_strided views cannot be written: loom.Error). Limits of this
first version: torch.compile, the tracing tools for torch callables
(assume_pure, scan, ...) and OpInfo coverage are not there yet. Tested with torch 1.13.
"""
import torch
from torch.overrides import TorchFunctionMode

import loom

from ._lowering import TABLE, _STATS
from ._tensor import DEVICE, LoomTensor, is_loom_device, loom_dtype, to_loom, to_torch

__all__ = ["device", "sync", "to_loom", "to_torch", "LoomTensor", "metrics", "metrics_report",
           "lowered_ops", "aten_ops_lowered"]

_FACTORIES = {
    torch.randn: lambda size, dt: loom.randn(*size, dtype=dt),
    torch.rand: lambda size, dt: loom.rand(*size, dtype=dt),
    torch.zeros: lambda size, dt: loom.zeros(*size, dtype=dt),
    torch.ones: lambda size, dt: loom.ones(*size, dtype=dt),
    torch.empty: lambda size, dt: loom.zeros(*size, dtype=dt),
}


def _size(args):
    if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)):
        return tuple(args[0])
    return tuple(args)


class _DeviceMode(TorchFunctionMode):
    """Routes torch calls that name loom's device (factories, Tensor.to) to loom; every
    other call passes through unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if func in _FACTORIES and is_loom_device(dev):
            dt = kwargs.get("dtype") or torch.get_default_dtype()
            out = LoomTensor(_FACTORIES[func](_size(args), loom_dtype(dt)))
            return out.requires_grad_() if kwargs.get("requires_grad") else out
        if func is torch.full and is_loom_device(dev):
            size, value = args[0], args[1]
            dt = kwargs.get("dtype") or (torch.get_default_dtype() if isinstance(value, float)
                                         else torch.int64 if isinstance(value, int) and
                                         not isinstance(value, bool) else torch.bool)
            return LoomTensor(loom.full(list(size), value, dtype=loom_dtype(dt)))
        if func is torch.arange and is_loom_device(dev):
            kw = {k: v for k, v in kwargs.items() if k != "device"}
            return to_loom(torch.arange(*args, **kw))
        if func is torch.tensor and is_loom_device(dev):
            kw = {k: v for k, v in kwargs.items() if k not in ("device", "requires_grad")}
            out = to_loom(torch.tensor(*args, **kw))
            return out.requires_grad_() if kwargs.get("requires_grad") else out
        if func is torch.Tensor.__setitem__ and isinstance(args[0], LoomTensor) and \
                not isinstance(args[2], torch.Tensor):
            # torch would make the value a tensor on the target's device: on 1.13 a real 'meta'
            # tensor, which holds no value. Made here as a loom tensor instead.
            value = LoomTensor(loom.tensor(args[2], dtype=args[0]._elem.dtype))
            return func(args[0], args[1], value)
        if func is torch.Tensor.to and not isinstance(args[0], LoomTensor):
            target = dev if dev is not None else next(
                (a for a in args[1:] if isinstance(a, (str, torch.device))), None)
            if is_loom_device(target):
                dt = kwargs.get("dtype") or next(
                    (a for a in args[1:] if isinstance(a, torch.dtype)), None)
                t = args[0] if dt is None else args[0].to(dt)
                return to_loom(t)
        return func(*args, **kwargs)


_mode = None
_module_to = torch.nn.Module.to


def _to(self, *args, **kwargs):
    """Module.to: to loom's device (or back to the CPU) with tied weights kept tied."""
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    has_loom = any(isinstance(t, LoomTensor) for t in self.parameters())
    if is_loom_device(device) or (device is not None and device.type == "cpu" and has_loom):
        if dtype is not None:
            _module_to(self, dtype)  # floating parameters to dtype, where they are
        return to_loom(self) if is_loom_device(device) else to_torch(self)
    return _module_to(self, *args, **kwargs)


torch.nn.Module.to = _to


def device():
    """loom's torch device; the first call starts routing torch calls that name it to loom."""
    global _mode
    if _mode is None:
        _mode = _DeviceMode()
        _mode.__enter__()
    return DEVICE


def sync():
    """Compiles (once per structure) and runs the pending graph: torch_xla.sync()'s role."""
    loom.sync()


def metrics():
    """loom's counters (loom.metrics())."""
    return loom.metrics()


def aten_ops_lowered():
    """How many aten ops this process has lowered to loom."""
    return _STATS["lowered"]


def metrics_report():
    return loom.metrics_report() + f"\naten ops lowered: {_STATS['lowered']}"


def lowered_ops():
    """The aten op names (and name.overload keys) the table lowers."""
    return sorted(TABLE)
