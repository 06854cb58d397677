"""loom: a lazy-tensor tracing compiler, with PyTorch's names (see PYTHON_API.md)."""
from . import _loom
import os as _os
_loom._skip_frames_under(_os.path.dirname(_os.path.abspath(__file__)) + _os.sep)
from ._loom import (Tensor, dtype, Error, LoomWarning, ShapeError, DTypeError, TraceError,
                    AutodiffError,
                    CompileError, ExecError, ParseError, DistError, Metrics, sync,
                    metrics,
                    reset_metrics, metrics_report, manual_seed, promote_types,
                    recompile_reasons, graph_metrics, graph_name, set_explain_recompiles,
                    set_flush_denormal, flush_denormal,
                    set_dump_ir_dir, set_cache_dir, cache_dir, RecompileReason, GraphMetrics,
                    PureFunction, CompiledFunction,
                    pending_graph_size, is_grad_enabled, from_numpy,
                    neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, sin, cos, erf,
                    logical_not, floor, add, sub, mul, div, true_divide, pow, maximum, minimum,
                    floor_divide, remainder, fmod, logical_and, logical_or, eq, ne, lt, le, gt,
                    ge, where, clamp, to, softmax, log_softmax, matmul, transpose, unsqueeze,
                    flatten, cat, stack, slice, select, index_select, index_add, gather, layer_norm,
                    embedding, dropout, cross_entropy, mse_loss)
from ._autograd import grad, value_and_grad, tree_flatten
from ._tracing import (assume_pure, compile, custom_vjp, pure_callback, scan, while_loop,
                       fori_loop, profile)
from ._creation import (tensor, as_tensor, zeros, ones, full, zeros_like, ones_like, full_like,
                        arange, randn, rand, randn_like, rand_like)
from ._ops import (Size, sum, mean, amax, amin, argmax, argmin, max, min, reshape, view,
                   permute, expand, squeeze, clone)
from ._device import device
from ._grad_mode import no_grad, enable_grad, inference_mode, set_grad_enabled
from ._torch_ops import (gelu, gelu_backward, tril, triu, masked_fill, split, chunk, cumsum, topk, multinomial,
                         sort, argsort, from_dlpack)

bool_ = dtype.bool_
int32 = dtype.int32
int64 = dtype.int64
bfloat16 = dtype.bfloat16
float16 = dtype.float16
float32 = dtype.float32
float64 = dtype.float64
float = float32  # torch.float
long = int64
from ._io import save_safetensors, load_safetensors, load_safetensors_metadata, save, load
from . import nn  # noqa: E402  (after the names nn's modules use)
from . import optim  # noqa: E402
from .nn.scan_layers import scan_layers  # noqa: E402
from . import distributed  # noqa: E402
