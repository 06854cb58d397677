"""torch.compile(model, backend="loom") on torch >= 2.0: Dynamo's FX graphs, through
aot_autograd for training (with Inductor's min-cut partition: the backward recomputes views
and cheap ops rather than saving them), run on loom. Each graph's aten ops go through the same
lowering table as eager loom.torch; the graph's inputs (CPU tensors, parameters included) are
read in place (loom never writes into memory it borrows; the graph runs before the call
returns) and its outputs come back as CPU tensors over loom's memory (DLPack, no copy; an
output whose memory another output, a kept tensor or an input shares is copied), as torch_xla's
openxla backend gives CPU tensors for a CPU model, except the tensors the forward saves for the
backward: they stay on loom between the two graphs (an input saved so is copied first).
Counted in aten_ops_lowered() and fx_graphs_compiled()."""
import sys

import torch

import loom

from ._dispatch import _STATS
from ._tensor import LoomTensor, from_cpu, to_torch_tensor


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


def _on_loom(gm, example_inputs, keep_from=None):
    _STATS["fx_graphs"] = _STATS.get("fx_graphs", 0) + 1

    def run(*args):
        borrowed = set()  # the loom tensors over the caller's memory
        inputs = []
        for a in args:
            if isinstance(a, torch.Tensor) and not isinstance(a, LoomTensor):
                a = LoomTensor(_borrow(a))
                borrowed.add(id(a._elem))
            inputs.append(a)
        with torch.no_grad():
            outs = gm(*inputs)
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


def register():
    """Registers the Dynamo backend "loom" (torch >= 2.0; a no-op on 1.13)."""
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
    return True
