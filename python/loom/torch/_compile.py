"""torch.compile(model, backend="loom") on torch >= 2.0, for a model on the CPU: Dynamo's FX
graphs, through aot_autograd for training (with Inductor's min-cut partition: the backward
recomputes views and cheap ops rather than saving them), run on loom. Each graph's aten ops go
through the same lowering table as eager loom.torch; the graph's inputs (CPU tensors,
parameters included) are read in place (loom never writes into memory it borrows; the graph
runs before the call returns) and its outputs come back as CPU tensors over loom's memory
(DLPack, no copy; an output whose memory another output, a kept tensor or an input shares is
copied), as torch_xla's openxla backend gives CPU tensors for a CPU model, except the tensors
the forward saves for the backward: they stay on loom between the two graphs (an input saved
so is copied first). From its second call a graph is inserted as traced once
(loom.torch.assume_pure over it): no aten op of a cached call goes through Python.
Inside a graph the CPU device is loom's: a tensor the graph makes (arange, ones, full, randn,
a tensor constant, ... on the CPU) is made on loom, and a loom.Error raised in a graph names
the line of the program its op came from. Counted in aten_ops_lowered() and
fx_graphs_compiled().

A model already on loom's device needs no torch.compile: loom.torch traces it lazily itself,
one graph per step at lt.sync(), and Dynamo cannot trace loom's tensor subclass (it breaks its
graph at every op, with warnings; the values stay right). So a call of what
torch.compile(..., backend="loom") returns whose inputs, or whose module's parameters, are loom
tensors skips Dynamo and runs the model as plain loom.torch (_eager_on_loom)."""
import functools
import os
import sys

import torch
from torch.utils._pytree import tree_map
from torch.utils._python_dispatch import TorchDispatchMode

import loom

from . import _dispatch, _tools
from ._dispatch import _STATS
from ._tensor import LoomTensor, from_cpu, is_loom_device, to_torch_tensor


def _saved_from():
    """The index of the forward graph's first output saved for the backward (aot_autograd's
    metadata of the graph being compiled), or None when it is not known."""
    try:
        ctx = torch._guards.TracingContext.try_get()
        meta = ctx.fw_metadata if ctx is not None else None
        return None if meta is None else int(meta.num_forward)
    except (AttributeError, TypeError):
        return None


_BORROWED = (torch.float32, torch.float64, torch.int32, torch.int64)
_EXPORTED = (loom.float32, loom.float64, loom.int32, loom.int64)


def _borrow(a):
    """A CPU tensor as a loom tensor over its memory (no copy; loom never writes into memory it
    does not own), else a copy."""
    if a.dtype in _BORROWED and a.is_contiguous():
        return loom.from_dlpack(a.detach())
    return from_cpu(a)


def _aliased(given, outs, args):
    """Of the outputs `given` to the caller (a set of indices into outs), those to copy rather
    than hand over in place (DLPack): a dtype DLPack does not carry here, or memory that another
    output, a tensor kept on loom for the backward, or an input also has (the caller may write
    its tensors; an output's memory must be its own)."""
    spans = []  # (start, end, output index or -1: memory that is not the caller's to take)
    for a in args:
        if isinstance(a, torch.Tensor) and not isinstance(a, LoomTensor) and a.numel():
            spans.append((a.data_ptr(), a.data_ptr() + a.numel() * a.element_size(), -1))
    copy = set()
    for k, o in enumerate(outs):
        if not isinstance(o, LoomTensor):
            continue
        if k in given and o._elem.dtype not in _EXPORTED:
            copy.add(k)
            continue
        start, size = o._elem._memory()
        if size:
            spans.append((start, start + size, k if k in given else -1))
    spans.sort()
    open_ = []  # spans not yet ended at the current start
    for start, end, k in spans:
        open_ = [s for s in open_ if s[1] > start]
        if open_:  # overlaps every open span
            copy.update(o for _, _, o in open_ if o >= 0)
            if k >= 0:
                copy.add(k)
        open_.append((start, end, k))
    return copy


def _holds_loom(args, kwargs, module=None):
    """Whether a call's arguments (one level of lists, tuples and dicts) or the module's first
    parameter or buffer are loom tensors."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, dict):
            a = list(a.values())
        if isinstance(a, LoomTensor) or (isinstance(a, (list, tuple)) and
                                         any(isinstance(x, LoomTensor) for x in a)):
            return True
    if module is not None:
        first = next(iter(module.parameters()), None)
        if first is None:
            first = next(iter(module.buffers()), None)
        return isinstance(first, LoomTensor)
    return False


def _to_loom(a):
    """A CPU tensor with dims as a LoomTensor (a 0-d one stays: a number beside loom's)."""
    if isinstance(a, torch.Tensor) and not isinstance(a, LoomTensor) and a.dim() > 0:
        return LoomTensor(from_cpu(a))
    return a


class _CpuIsLoom(TorchDispatchMode):
    """Active while a graph runs: the graph's device is the CPU (the model's), which here means
    loom's. An op with loom operands is dispatched to loom with its CPU tensors moved (tensor
    constants) and a copy to the CPU (x.to(idx.device)) staying on loom; a factory (arange,
    ones, full, randn, ...) or an op on CPU tensors alone makes its result on loom, as the
    graph's other tensors are (Dynamo and aot_autograd write them on the CPU)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _holds_loom(args, kwargs):
            args = [[_to_loom(x) for x in a] if isinstance(a, (list, tuple)) else _to_loom(a)
                    for a in args]
            kwargs = {k: _to_loom(v) for k, v in kwargs.items()}
            if "device" in kwargs and not is_loom_device(kwargs["device"]):
                del kwargs["device"]
            return _dispatch.dispatch(func, tuple(args), kwargs)
        dev = kwargs.get("device")
        if dev is None or torch.device(dev).type == "cpu":
            made = _dispatch.factory_op(func, args, kwargs)
            if made is not None:
                _STATS["lowered"] += 1
                return made
        out = func(*args, **kwargs)  # torch's values on the CPU, moved (randint, constants)
        return tree_map(lambda v: LoomTensor(from_cpu(v)) if isinstance(v, torch.Tensor) and
                        not isinstance(v, LoomTensor) and v.device.type == "cpu" else v, out)


_LIBRARY_DIRS = tuple(f'"{os.path.dirname(m.__file__)}{os.sep}' for m in (torch, loom))


def _at_user_line(err, gm):
    """err with the line of the user's program whose op the graph was running when loom raised
    it (the FX node's stack trace), else err as it is."""
    try:
        tb, line = err.__traceback__, None
        code = gm.forward.__code__
        while tb is not None:
            if tb.tb_frame.f_code is code:
                line = tb.tb_lineno
            tb = tb.tb_next
        index = gm._lineno_map.get(line - code.co_firstlineno) if line is not None else None
        node = list(gm.graph.nodes)[index] if index is not None else None
        trace = (node.meta.get("stack_trace") or "").rstrip() if node is not None else ""
    except (AttributeError, TypeError, IndexError):
        return err
    if not trace:
        return err
    lines = trace.splitlines()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith("File ")]
    # the innermost frame of the user's code: not torch's (nn.Module), not loom.torch's
    ours = [i for i in frames if not any(d in lines[i] for d in _LIBRARY_DIRS)]
    at = (ours or frames or [0])[-1]
    where = "\n".join(lines[at:at + 2])
    return type(err)(f"{err}\n  in the graph torch.compile(backend=\"loom\") made of your "
                     f"program, at {node.target}, from:\n{where}")


def _on_loom(gm, example_inputs, keep_from=None):
    _STATS["fx_graphs"] = _STATS.get("fx_graphs", 0) + 1
    # From the second call the graph runs as loom.torch.assume_pure over it: traced once per
    # input signature, then inserted without running its aten ops in Python (aot_autograd's
    # graphs are functional; random ops draw fresh keys per call). Its None outputs (a
    # backward's gradients of inputs that need none) are put back around the call. A graph
    # with other outputs than tensors, or that does not trace as pure, keeps running op by op.
    pure = {"fn": None, "ok": True, "nones": (), "kind": list}

    def call(inputs):
        if pure["fn"] is not None:
            try:
                outs = list(pure["fn"](*inputs))
            except loom.TraceError:
                pure["fn"], pure["ok"] = None, False
            else:
                for i in pure["nones"]:
                    outs.insert(i, None)
                return pure["kind"](outs)
        outs = gm(*inputs)
        if pure["ok"]:
            seq = outs if isinstance(outs, (list, tuple)) else None
            if seq is not None and all(isinstance(a, LoomTensor) for a in inputs) and \
                    all(o is None or isinstance(o, LoomTensor) for o in seq):
                pure["nones"] = tuple(i for i, o in enumerate(seq) if o is None)
                pure["kind"] = type(seq)
                pure["fn"] = _tools.assume_pure(
                    lambda *a: [o for o in gm(*a) if o is not None])
            else:
                pure["ok"] = False
        return outs

    def run(*args):
        borrowed = set()  # the loom tensors over the caller's memory
        inputs = []
        for a in args:
            if isinstance(a, torch.Tensor) and not isinstance(a, LoomTensor):
                a = LoomTensor(_borrow(a))
                borrowed.add(id(a._elem))
            inputs.append(a)
        try:
            with torch.no_grad(), _CpuIsLoom():
                outs = call(inputs)
        except loom.Error as e:
            raise _at_user_line(e, gm) from None
        loom.sync()  # the borrowed inputs are read before their tensors can change
        seq = outs if isinstance(outs, (list, tuple)) else [outs]
        back = list(seq)
        for k, o in enumerate(seq):
            if isinstance(o, LoomTensor) and keep_from is not None and k >= keep_from and \
                    id(o._elem) in borrowed:  # kept for the backward: loom's own copy
                back[k] = LoomTensor(from_cpu(to_torch_tensor(o)))
        given = {k for k, o in enumerate(seq)
                 if isinstance(o, LoomTensor) and (keep_from is None or k < keep_from)}
        shared = _aliased(given, back, args)
        for k in given:
            e = back[k]._elem
            back[k] = to_torch_tensor(back[k]) if k in shared else torch.from_dlpack(e)
        return type(outs)(back) if isinstance(outs, (list, tuple)) else back[0]

    try:
        from torch._functorch.aot_autograd import make_boxed_func
    except ImportError:
        return run
    return make_boxed_func(run)


def _forward(gm, example_inputs):
    return _on_loom(gm, example_inputs, keep_from=_saved_from())


def counters():
    """torch.compile's counts: fx_graphs, the FX graphs handed to loom; from Dynamo's own
    counters (process-wide, every backend's): dynamo_frames, the frames it compiled (a frame
    compiled again after a guard failed is a recompile), graph_breaks and
    graph_break_reasons (each reason's first line and its count)."""
    out = {"fx_graphs": _STATS.get("fx_graphs", 0), "dynamo_frames": 0, "graph_breaks": 0,
           "graph_break_reasons": {}}
    if "torch._dynamo.utils" not in sys.modules:  # Dynamo never ran: importing it takes seconds
        return out
    from torch._dynamo.utils import counters as dynamo
    out["dynamo_frames"] = int(dynamo["frames"].get("total", 0))
    for reason, n in dynamo["graph_break"].items():
        first = str(reason).strip().splitlines()[0] if str(reason).strip() else "?"
        out["graph_break_reasons"][first] = out["graph_break_reasons"].get(first, 0) + n
        out["graph_breaks"] += n
    return out


def _eager_on_loom(original):
    """torch.compile with backend "loom": a call whose inputs (or whose module's parameters) are
    on loom's device runs the model as it is, on loom.torch's lazy tracing (one graph per step
    at lt.sync()), since Dynamo cannot trace loom's tensor subclass (it would break its graph
    at every op, with warnings); a call with CPU tensors goes through Dynamo to the loom
    backend. Other backends are untouched."""
    def compile(model=None, **kwargs):
        if model is None:  # the decorator form: @torch.compile(backend="loom")
            return lambda m: compile(m, **kwargs)
        out = original(model, **kwargs)
        if kwargs.get("backend") != "loom" or kwargs.get("disable"):
            return out
        if isinstance(out, torch.nn.Module) and hasattr(out, "_orig_mod"):
            traced = out.forward  # OptimizedModule: Dynamo's forward, on the instance

            def forward(*args, **kw):
                if _holds_loom(args, kw, out._orig_mod):
                    return out._orig_mod(*args, **kw)
                return traced(*args, **kw)
            out.forward = forward
            return out
        if not callable(out) or out is model:
            return out
        inner = getattr(model, "__self__", None)  # a bound method: its module's parameters
        inner = inner if isinstance(inner, torch.nn.Module) else None

        @functools.wraps(out)
        def run(*args, **kw):
            if _holds_loom(args, kw, inner):
                return model(*args, **kw)
            return out(*args, **kw)
        return run
    compile.__wrapped__ = original
    compile.__doc__ = original.__doc__
    compile._skips_loom_calls = True
    return compile


def register():
    """Registers the Dynamo backend "loom" (torch >= 2.0; a no-op on 1.13), for models on the
    CPU, and wraps torch.compile so that a call on loom's tensors skips Dynamo (see the module's
    docstring)."""
    try:
        from torch._dynamo import list_backends, register_backend
        from torch._dynamo.backends.common import aot_autograd
    except ImportError:
        return False
    if "loom" not in list_backends(exclude_tags=()):
        kw = {}
        try:  # Inductor's partition: the backward recomputes cheap ops and views instead of
            # saving them (each saved tensor is a buffer written out between the two graphs)
            from torch._functorch.partitioners import min_cut_rematerialization_partition
            import networkx  # noqa: F401  (the partition needs it)
            kw["partition_fn"] = min_cut_rematerialization_partition
        except ImportError:
            pass
        register_backend(name="loom")(aot_autograd(fw_compiler=_forward, bw_compiler=_on_loom,
                                                   **kw))
    if not getattr(torch.compile, "_skips_loom_calls", False):
        torch.compile = _eager_on_loom(torch.compile)
    return True
