"""loom.optim: torch.optim's Optimizer, SGD and AdamW, replayable by compile(trace_once=True)."""
from .adamw import AdamW
from .optimizer import Optimizer, ParamGroup
from .sgd import SGD

__all__ = ["AdamW", "Optimizer", "ParamGroup", "SGD"]
