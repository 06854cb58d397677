"""loom.nn: modules subclassed as torch.nn.Module, layers with torch's names, functional."""
from . import functional
from .layers import (CausalSelfAttention, Dropout, Embedding, GELU, Identity, LayerNorm, Linear,
                     ModuleDict, ModuleList, ReLU, RMSNorm, Sequential, Sigmoid, SiLU, Tanh)
from .module import Module, Parameter, functional_call, reparametrize

__all__ = ["functional", "Module", "Parameter", "functional_call", "reparametrize",
           "CausalSelfAttention", "Dropout", "Embedding", "GELU", "Identity", "LayerNorm",
           "Linear", "ModuleDict", "ModuleList", "ReLU", "RMSNorm", "Sequential", "Sigmoid",
           "SiLU", "Tanh"]
