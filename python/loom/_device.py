"""loom.device: where a tensor lives. loom runs on the host, so the only device is 'cpu' (what
numpy and DLPack see of loom's memory): `t.device` is device('cpu'), whose str is 'cpu', and
`t.to('cpu')`, `t.cpu()` return the tensor itself."""
from . import _loom

_type = type


class device:
    """Where a tensor lives: always the host ('cpu'). device('cpu'), device('cpu:0') and
    device(another_device) are accepted, as torch.device; a device equals its string."""

    __slots__ = ("type", "index")

    def __init__(self, type="cpu", index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        if not isinstance(type, str):
            raise TypeError(f"device(): argument 'type' must be a str or loom.device, got "
                            f"{_type(type).__name__}")
        name, _, idx = type.partition(":")
        if name != "cpu":
            raise _loom.Error(f"[device] loom tensors live in host memory: the only device is "
                              f"'cpu', got {type!r} (torch code's `'cuda' if "
                              f"torch.cuda.is_available() else 'cpu'` picks 'cpu')")
        if idx:
            index = int(idx)
        self.type = "cpu"
        self.index = index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other):
        if isinstance(other, str):
            try:
                other = device(other)
            except (_loom.Error, ValueError):
                return False
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self):
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (self.type, self.index))


CPU = device("cpu")


def check(d, fn):
    """d as a device (a str or device), or the error torch would give."""
    if not isinstance(d, (str, device)):
        raise TypeError(f"{fn}(): expected a device (a str or loom.device), got "
                        f"{_type(d).__name__}")
    return device(d)
