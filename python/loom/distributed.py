"""loom.distributed: training across ranks (processes, over Gloo's TCP transport).

    import loom.distributed as dist       # python -m loom.launch -n 2 train.py
    dist.init()                           # LOOM_RANK, LOOM_WORLD_SIZE, LOOM_STORE
    g = dist.all_reduce(t, op="mean")     # a lazy graph op, run when the graph runs

Collectives are graph ops: they run when their graph runs (sync, item(), a compiled step),
on every rank. Every rank must run the same graphs: before a graph that holds collectives
runs, the ranks compare its fingerprint and raise a `loom.DistError` on every rank, naming
the ranks and the first differing op, instead of hanging (ranks that traced different
shapes; a rank that reads a collective's result that the others never evaluate). A dead
rank makes the others raise within the timeout (LOOM_DIST_TIMEOUT seconds, default 60).
After a DistError the communicator is broken: end the program.

Gradients: the objective is the sum of the ranks' objectives (all_reduce's adjoint is the
all_reduce of the adjoints; all_gather and reduce_scatter are each other's adjoints), unless
`replicated=True` says that every rank computes the same objective from the result (tensor
parallel), when the adjoint is the rank's own share.
"""
import os

import numpy as np

from . import _loom
from ._loom import Tensor
from .nn.layers import CausalSelfAttention, Linear
from .nn.module import Module, Parameter

__all__ = ["init", "finalize", "is_initialized", "rank", "world_size", "barrier", "all_reduce",
           "all_gather", "reduce_scatter", "broadcast", "grad_all_reduce", "shard",
           "DataParallel", "ColumnParallelLinear", "RowParallelLinear",
           "ShardedCausalSelfAttention", "Mesh", "mark_sharding", "sharding_of", "full",
           "gather_to", "from_local", "sharding_report"]


def _check(fn, t):
    if not isinstance(t, Tensor):
        raise TypeError(f"{fn}(): argument 'tensor' must be a loom.Tensor, got "
                        f"{type(t).__name__}")


def _int_arg(fn, name, v):
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{fn}(): argument '{name}' must be an int, got {type(v).__name__}")
    return v


def init(rank=None, world_size=None, store=None, address=None, timeout=None):
    """Connects this process to the other ranks and makes the connection the process's
    communicator. Unset arguments come from the environment that `python -m loom.launch`
    sets: LOOM_RANK, LOOM_WORLD_SIZE, LOOM_STORE (a directory every rank sees: the
    rendezvous), LOOM_DIST_ADDR (the address Gloo binds; default 127.0.0.1) and
    LOOM_DIST_TIMEOUT (seconds). A world of one needs no store."""
    for name, v in (("rank", rank), ("world_size", world_size)):
        if v is not None:
            _int_arg("init", name, v)
    for name, v in (("store", store), ("address", address)):
        if v is not None and not isinstance(v, str):
            raise TypeError(f"init(): argument '{name}' must be a str, got {type(v).__name__}")
    _loom._dist_init(rank, world_size, None if store is None else str(store), address,
                     None if timeout is None else float(timeout))


def finalize():
    """Drops the process's communicator (its connections close)."""
    _loom._dist_finalize()


def is_initialized():
    """Whether a communicator is set (init() was called)."""
    return _loom._dist_initialized()


def rank():
    """This process's rank (0 without a communicator)."""
    return _loom._dist_rank()


def world_size():
    """The number of ranks (1 without a communicator)."""
    return _loom._dist_world_size()


def barrier():
    """Waits for every rank; like a graph run, it checks that the ranks reach it together."""
    _loom._dist_barrier()


def all_reduce(tensor, op="sum", replicated=False):
    """The elementwise reduction ("sum", "mean", "max" or "min") of every rank's tensor.
    Unlike torch.distributed.all_reduce it returns the result (a lazy tensor) and leaves
    `tensor` as it is."""
    _check("all_reduce", tensor)
    return _loom._all_reduce(tensor, op, bool(replicated))


def all_gather(tensor, dim=0, replicated=False):
    """Every rank's tensor, concatenated along `dim` in rank order."""
    _check("all_gather", tensor)
    return _loom._all_gather(tensor, _int_arg("all_gather", "dim", dim), bool(replicated))


def reduce_scatter(tensor, dim=0, op="sum"):
    """`tensor` split into world_size() blocks along `dim`; rank r gets the reduction ("sum"
    or "mean") of block r over the ranks."""
    _check("reduce_scatter", tensor)
    return _loom._reduce_scatter(tensor, _int_arg("reduce_scatter", "dim", dim), op)


def broadcast(tensor, root=0):
    """Rank `root`'s tensor, on every rank (no gradient). Returns the result."""
    _check("broadcast", tensor)
    return _loom._broadcast(tensor, _int_arg("broadcast", "root", root))


def grad_all_reduce(tensor):
    """`tensor` unchanged, whose gradient is summed over the ranks (Megatron's f)."""
    _check("grad_all_reduce", tensor)
    return _loom._grad_all_reduce(tensor)


def shard(n, rank=None, world_size=None):
    """This rank's part of n items as (begin, end): n // world_size items each, the
    remainder dropped, so that every rank traces the same shapes."""
    _int_arg("shard", "n", n)
    if (rank is None) != (world_size is None):
        raise ValueError("shard(): give both rank and world_size, or neither")
    if rank is None:
        rank, world_size = _loom._dist_rank(), _loom._dist_world_size()
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"shard(): rank {rank} is not in a world of {world_size}")
    per = n // world_size
    return rank * per, (rank + 1) * per


class Mesh:
    """A mesh of the launched ranks, as torch_xla's `Mesh(device_ids, mesh_shape, axis_names)`:
    the ranks in row-major order over `mesh_shape` (rank r has coordinates
    `np.unravel_index(r, mesh_shape)`). Its size must be the world size when it is used. Under
    `python -m loom.launch`, making a Mesh calls `init()` if the program has not.

        mesh = dist.Mesh((2, 2), ("data", "model"))
        dist.mark_sharding(w, mesh, (None, "model"))

    `device_ids`, when given, must be `range(size)` in order (loom places rank r at position r).
    """

    def __init__(self, mesh_shape, axis_names=None, device_ids=None):
        shape = tuple(int(m) for m in (mesh_shape if isinstance(mesh_shape, (tuple, list))
                                      else (mesh_shape,)))
        if not shape or any(m < 1 for m in shape):
            raise ValueError(f"Mesh(): mesh_shape must be positive extents, got {mesh_shape}")
        names = tuple("" if n is None else str(n) for n in (axis_names or ("",) * len(shape)))
        if len(names) != len(shape):
            raise ValueError(f"Mesh(): {len(shape)} axes but {len(names)} axis names")
        size = int(np.prod(shape))
        if not _loom._dist_initialized() and os.environ.get("LOOM_WORLD_SIZE"):
            init()  # under loom.launch, as torch_xla's users never call an init
        if device_ids is not None and [int(d) for d in np.asarray(device_ids).ravel()] != \
                list(range(size)):
            raise ValueError("Mesh(): device_ids must be range(size) in order: rank r is "
                             "position r of the mesh")
        self.mesh_shape, self.axis_names = shape, names

    @property
    def size(self):
        return int(np.prod(self.mesh_shape))

    def shape(self):
        """{axis name: extent}, as torch_xla's Mesh.shape()."""
        return {n or i: m for i, (n, m) in enumerate(zip(self.axis_names, self.mesh_shape))}

    def __repr__(self):
        return f"Mesh({self.mesh_shape}, {self.axis_names})"


def _spec(fn, spec):
    if not isinstance(spec, (tuple, list)):
        raise TypeError(f"{fn}(): the spec must be a tuple with one entry per dim (a mesh axis "
                        f"name or index, a tuple of them, or None), got {type(spec).__name__}")
    out = []
    for d, e in enumerate(spec):
        axes = () if e is None else tuple(e) if isinstance(e, (tuple, list)) else (e,)
        for a in axes:
            if not isinstance(a, (int, str)) or isinstance(a, bool):
                raise TypeError(f"{fn}(): spec entry {d} must name mesh axes by name or index, "
                                f"got {a!r}")
        out.append(list(axes))
    return out


def _mesh(fn, mesh):
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{fn}(): expected a loom.distributed.Mesh, got {type(mesh).__name__}")
    return list(mesh.mesh_shape), list(mesh.axis_names)


def mark_sharding(tensor, mesh, partition_spec):
    """Lays `tensor` out over `mesh`, in place, with torch_xla's spec form: one entry per dim,
    a mesh axis name or index, a tuple of axes (split over all of them; give them in mesh
    order), or None (replicated). Every rank must annotate alike (a rank that does not runs
    without the collectives and the others wait for it until its next collective or the
    timeout). The program stays written at global shapes: the partitioner propagates
    the layouts through each graph and inserts the collectives (a product over a split
    contracting dim leaves partial sums: one all_reduce where they are needed). Materialized
    data is resharded at once (each rank keeps its block; `shape` stays the global one); a
    pending value is annotated. Reading a sharded tensor (numpy(), item(), print) gathers it.
    Gradients take their tensors' layouts, and an in-place update (an optimizer step) keeps a
    sharded tensor's layout; an unannotated tensor updated in place takes the layout the
    partitioner gives its new value (an optimizer's moments take their gradients').

    Errors (on every rank): ShapeError for a spec whose length is not the tensor's rank, an
    axis not in the mesh or used twice, a dim its axes do not divide (loom does not pad);
    DistError for a mesh whose size is not the world size. Returns `tensor`."""
    _check("mark_sharding", tensor)
    shape, names = _mesh("mark_sharding", mesh)
    _loom._mark_sharding(tensor, shape, names, _spec("mark_sharding", partition_spec))
    return tensor


def sharding_of(tensor):
    """How `tensor` is laid out, as text ("mesh=[2] (None, 0)": dim 1 split over mesh axis 0),
    or None when it is replicated (or pending without an annotation: its layout is decided
    when its graph runs)."""
    _check("sharding_of", tensor)
    return _loom._sharding_of(tensor)


def full(tensor):
    """The whole value of a sharded tensor on every rank (an all_gather of its blocks);
    `tensor` itself when it is replicated."""
    _check("full", tensor)
    return _loom._full(tensor)


def gather_to(tensor, rank=0):
    """The whole value on `rank` (None on the other ranks); every rank must call it."""
    _check("gather_to", tensor)
    whole = _loom._full(tensor)
    return whole if _loom._dist_rank() == int(rank) else None


def from_local(piece, mesh, partition_spec):
    """The sharded tensor whose block on this rank is `piece` (DTensor's from_local): its global
    shape is piece's with each split dim multiplied by its number of blocks."""
    _check("from_local", piece)
    shape, names = _mesh("from_local", mesh)
    return _loom._from_local(piece, shape, names, _spec("from_local", partition_spec))


def sharding_report():
    """The partitioner's account of the last graph this thread ran with shardings: the layout
    of every split value and every inserted collective with its bytes, one per line."""
    return _loom._sharding_report()


class DataParallel(Module):
    """Data parallel training: every rank holds the whole model and a shard of each batch;
    the gradients are averaged over the ranks inside the step's graph, so forward, backward,
    the all_reduces and the optimizer are one graph, compiled once.

        model = dist.DataParallel(Model())     # rank 0's parameters and buffers, everywhere

        @loom.compile(trace_once=True)
        def step(x, y):
            loss = F.mse_loss(model(x), y)     # the mean over this rank's shard
            loss.backward()
            model.average_gradients()          # every grad: its mean over the ranks
            opt.step(); opt.zero_grad()
            return loss

    The gradients travel in buckets of `bucket_mib` MiB (one all_reduce each). The wrapped
    module is `.module` (its state_dict keys gain the "module." prefix, as torch's DDP)."""

    def __init__(self, module, bucket_mib=4.0):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel(): argument 'module' must be a loom.nn.Module, got "
                            f"{type(module).__name__}")
        if not bucket_mib > 0:
            raise ValueError(f"DataParallel(): bucket_mib must be positive, got {bucket_mib}")
        self.module = module
        self.bucket_mib = float(bucket_mib)
        with _loom.no_grad():
            state = list(module.parameters()) + list(module.buffers())
            for t in state:
                t.copy_(_loom._broadcast(t, 0))
        _loom.sync()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def average_gradients(self):
        """Replaces every parameter's grad by its mean over the ranks (lazily: one all_reduce
        per bucket of grads of one dtype, in the current graph). A parameter without a grad
        on this rank must have none on every rank (the graphs would differ)."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        _loom._average_in_buckets(grads, self.bucket_mib * (1 << 20))


# ---- tensor parallel (Megatron-style) -------------------------------------------------------
# Weights split across the ranks; the collectives inserted for the user, with the gradients of
# a replicated objective (every rank computes the same loss from the layers' outputs). The
# graphs do not depend on the rank (shards are data), so every rank traces the same graph and
# the layers work inside scan_layers. load(full) copies this rank's share of an unsharded
# layer (tests, checkpoints).

def _split(fn, n, what):
    w = _loom._dist_world_size()
    if n % w:
        raise _loom.ShapeError(f"[{fn}] {what} {n} is not a multiple of the world size {w}")
    return n // w, _loom._dist_rank()


def _load(dst, src, key):
    """dst = src[key], the slicing done on the host: the graph every rank runs then has the
    same structure (a rank's share is data, not a different slice op)."""
    from ._creation import tensor
    share = tensor(src.detach().numpy()[key], dtype=dst.dtype)
    with _loom.no_grad():
        dst.copy_(share)


class ColumnParallelLinear(Module):
    """y = x W^T + b with W's rows (output features) split: weight [out / world, in], bias
    [out / world]. The input is replicated (its gradient is summed over the ranks); the output
    is all_gathered on the last dim (gather_output=True) or left as this rank's features."""

    def __init__(self, in_features, out_features, bias=True, gather_output=True, dtype=None):
        super().__init__()
        local, _ = _split("ColumnParallelLinear", int(out_features), "out_features")
        shard = Linear(in_features, local, bias=bias, dtype=dtype)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.gather_output = bool(gather_output)
        self.weight = shard.weight
        if bias:
            self.bias = shard.bias
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return _loom._column_parallel_linear(x, self.weight, self.bias, self.gather_output)

    def load(self, full):
        """This rank's rows of an unsharded Linear(in_features, out_features)."""
        local, r = _split("ColumnParallelLinear", self.out_features, "out_features")
        _load(self.weight, full.weight, slice(r * local, (r + 1) * local))
        if self.bias is not None:
            _load(self.bias, full.bias, slice(r * local, (r + 1) * local))


class RowParallelLinear(Module):
    """y = x W^T + b with W's columns (input features) split: weight [out, in / world]; x holds
    this rank's in / world input features (a ColumnParallelLinear's output with
    gather_output=False); the partial products are all_reduced; the bias is replicated."""

    def __init__(self, in_features, out_features, bias=True, dtype=None):
        super().__init__()
        local, _ = _split("RowParallelLinear", int(in_features), "in_features")
        shard = Linear(local, out_features, bias=False, dtype=dtype)
        full_bias = Linear(in_features, out_features, bias=True, dtype=dtype).bias
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = shard.weight
        if bias:  # replicated: rank 0's draw on every rank
            self.bias = Parameter(_loom._broadcast(full_bias.detach(), 0))
            _loom.sync()
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return _loom._row_parallel_linear(x, self.weight, self.bias)

    def load(self, full):
        """This rank's columns of an unsharded Linear(in_features, out_features)."""
        local, r = _split("RowParallelLinear", self.in_features, "in_features")
        _load(self.weight, full.weight, (slice(None), slice(r * local, (r + 1) * local)))
        if self.bias is not None:
            _load(self.bias, full.bias, slice(None))


class ShardedCausalSelfAttention(Module):
    """loom.nn.CausalSelfAttention with its heads split across the ranks: qkv column-parallel
    by heads (this rank's q, k and v rows), attention over the local heads, proj row-parallel.
    Same parameter names as the unsharded layer (qkv.weight, qkv.bias, proj.weight, ...)."""

    def __init__(self, dim, heads, dtype=None):
        super().__init__()
        local_heads, _ = _split("ShardedCausalSelfAttention", int(heads), "heads")
        if dim % heads:
            raise _loom.ShapeError(f"[ShardedCausalSelfAttention] dim {dim} is not a multiple "
                                   f"of heads {heads}")
        self.dim, self.heads, self.local_heads = int(dim), int(heads), local_heads
        self.qkv = ColumnParallelLinear(dim, 3 * dim, gather_output=False, dtype=dtype)
        self.proj = RowParallelLinear(dim, dim, dtype=dtype)

    def forward(self, x):
        CausalSelfAttention.check_input("ShardedCausalSelfAttention", x, self.dim)
        return self.proj(_loom._packed_qkv_attention(self.qkv(x), self.local_heads))

    def load(self, full):
        """This rank's heads of an unsharded CausalSelfAttention(dim, heads)."""
        local_dim = self.dim // self.heads * self.local_heads
        r = _loom._dist_rank()
        rows = np.concatenate([np.arange(k * self.dim + r * local_dim,
                                         k * self.dim + (r + 1) * local_dim) for k in range(3)])
        _load(self.qkv.weight, full.qkv.weight, rows)
        _load(self.qkv.bias, full.qkv.bias, rows)
        self.proj.load(full.proj)

    def extra_repr(self):
        return f"dim={self.dim}, heads={self.heads}, local_heads={self.local_heads}"
