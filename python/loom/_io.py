"""Checkpoints as safetensors files, readable and writable by the `safetensors` package."""
import os

from . import _loom
from ._loom import Tensor


def _path(path, fn):
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(f"{fn}(): argument 'path' must be a str or os.PathLike, got "
                        f"{type(path).__name__}") from None


def save_safetensors(state_dict, path, metadata=None):
    """Writes a dict of name -> Tensor (a module's state_dict()) and optional string metadata
    (the header's __metadata__) to `path`."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"save_safetensors(): argument 'state_dict' must be a dict of str to "
                        f"Tensor, got {type(state_dict).__name__}")
    for k, v in state_dict.items():
        if not isinstance(k, str):
            raise TypeError(f"save_safetensors(): argument 'state_dict' has a key of type "
                            f"{type(k).__name__}; keys must be str")
        if not isinstance(v, Tensor):
            raise TypeError(f"save_safetensors(): argument 'state_dict' maps '{k}' to a "
                            f"{type(v).__name__}; values must be loom Tensors")
    meta = {}
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise TypeError(f"save_safetensors(): argument 'metadata' must be a dict of str to "
                            f"str or None, got {type(metadata).__name__}")
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"save_safetensors(): argument 'metadata' must map str to str, "
                                f"got {k!r}: {type(v).__name__}")
        meta = dict(metadata)
    _loom._save_safetensors(dict(state_dict), _path(path, "save_safetensors"), meta)


def load_safetensors(path):
    """The tensors of a safetensors file, as a dict of name -> Tensor (materialized)."""
    return dict(_loom._load_safetensors(_path(path, "load_safetensors")))


def load_safetensors_metadata(path):
    """The file's __metadata__ as a dict of str (empty when it has none)."""
    return dict(_loom._load_safetensors_metadata(_path(path, "load_safetensors_metadata")))


# ---- loom.save / loom.load: nested checkpoints -------------------------------------------------

_TREE = "loom.tree"


def _encode(obj, path, tensors):
    """obj as JSON with each tensor replaced by a marker naming its entry in `tensors`."""
    from ._device import device
    if isinstance(obj, Tensor):
        key = path or "tensor"
        while key in tensors:
            key += "_"
        tensors[key] = obj
        return {"__tensor__": key, "requires_grad": bool(obj.requires_grad)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):  # any keys JSON can spell: str, int, float, bool, None, tuples
        items = []
        for k, v in obj.items():
            if isinstance(k, Tensor):
                raise TypeError("save(): a dict keyed by tensors cannot be saved (optimizer "
                                "state is keyed by parameter index in state_dict())")
            items.append([_encode(k, "", {}), _encode(v, f"{path}.{k}" if path else str(k),
                                                      tensors)])
        return {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        out = [_encode(v, f"{path}.{i}" if path else str(i), tensors) for i, v in enumerate(obj)]
        return out if isinstance(obj, list) else {"__tuple__": out}
    if isinstance(obj, _loom.dtype):
        return {"__dtype__": str(obj).split(".")[-1]}
    if isinstance(obj, device):
        return {"__device__": str(obj)}
    raise TypeError(f"save(): cannot save a {type(obj).__name__} at '{path or '<root>'}': "
                    f"loom.save stores tensors, dict, list, tuple, None, bool, int, float and "
                    f"str (pickle other objects yourself: loom tensors pickle)")


def _decode(obj, tensors):
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        t = tensors[obj["__tensor__"]]
        return t.requires_grad_(True) if obj.get("requires_grad") else t
    if "__dict__" in obj:
        return {_hashable(_decode(k, tensors)): _decode(v, tensors) for k, v in obj["__dict__"]}
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__dtype__" in obj:
        name = obj["__dtype__"]
        return getattr(_loom.dtype, "bool_" if name == "bool" else name)
    if "__device__" in obj:
        from ._device import device
        return device(obj["__device__"])
    raise ValueError(f"load(): unknown entry {obj!r} in the file's tree")


def _hashable(k):
    return tuple(_hashable(v) for v in k) if isinstance(k, (list, tuple)) else k


def save(obj, f):
    """torch.save for loom: writes `obj` (a tensor, or dicts, lists and tuples of tensors and
    plain values, nested freely: {'model': m.state_dict(), 'opt': opt.state_dict(),
    'step': 10}) to the path `f` as one safetensors file. Tensors are stored under dotted
    names ("model.linear.weight", "opt.state.0.exp_avg"), the tree and the other values as JSON
    in the header's metadata, so the `safetensors` package reads the tensors too. Pending
    tensors are computed first, together (one graph)."""
    import json
    tensors = {}
    tree = _encode(obj, "", tensors)
    if _loom.pending_graph_size() > 0:
        _loom.sync()
    _loom._save_safetensors({k: v.detach() for k, v in tensors.items()}, _path(f, "save"),
                            {_TREE: json.dumps(tree, allow_nan=True)})


def load(f, map_location=None, weights_only=None):
    """torch.load for loom: what save() wrote (tensors materialized, requires_grad as saved).
    A safetensors file without loom's tree (one written by another library) gives its flat
    dict of name -> Tensor. map_location may only name the host ('cpu', or None)."""
    import json
    if map_location is not None and not callable(map_location) and not isinstance(
            map_location, dict):
        from ._device import check
        check(map_location, "load")
    path = _path(f, "load")
    tensors = dict(_loom._load_safetensors(path))
    meta = dict(_loom._load_safetensors_metadata(path))
    if _TREE not in meta:
        return tensors
    return _decode(json.loads(meta[_TREE]), tensors)
