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
