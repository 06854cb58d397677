"""loom.optim: torch.optim's Optimizer, SGD and AdamW, replayable by compile(trace_once=True)."""
from .adamw import AdamW
from .optimizer import Optimizer, ParamGroup
from .sgd import SGD
from . import lr_scheduler  # noqa: E402

__all__ = ["AdamW", "Optimizer", "ParamGroup", "SGD", "lr_scheduler"]
