"""loom.nn: modules subclassed as torch.nn.Module, layers with torch's names, functional."""
from . import functional
from . import init
from . import utils
from .layers import (CausalSelfAttention, CrossEntropyLoss, Dropout, Embedding, GELU, Identity,
                     L1Loss, LayerNorm, Linear, ModuleDict, ModuleList, MSELoss, NLLLoss, ReLU,
                     RMSNorm, Sequential, Sigmoid, SiLU, Tanh)
from .module import Module, Parameter, functional_call, reparametrize

__all__ = ["functional", "init", "utils", "Module", "Parameter", "functional_call", "reparametrize",
           "CausalSelfAttention", "CrossEntropyLoss", "Dropout", "Embedding", "GELU",
           "Identity", "L1Loss", "LayerNorm", "Linear", "ModuleDict", "ModuleList", "MSELoss",
           "NLLLoss", "ReLU", "RMSNorm", "Sequential", "Sigmoid", "SiLU", "Tanh"]
