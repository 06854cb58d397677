"""scan_layers: homogeneous layers (a ModuleList of one class with equal parameter shapes) run
as one scan over their stacked parameters, so the program, and its compile time, do not grow
with the depth. As torch_xla's scan_layers and the C++ loom::scan_layers."""
from .. import _loom
from .._tracing import scan
from .module import Module, functional_call


def _types(named):
    return {n: (t.dtype, tuple(t.shape)) for n, t in named}


def _check_homogeneous(layers):
    first = layers[0]
    p0, b0 = _types(first.named_parameters()), _types(first.named_buffers())
    for k, layer in enumerate(layers):
        if not isinstance(layer, Module):
            raise TypeError(f"scan_layers: layer {k} is a {type(layer).__name__}, not a "
                            f"loom.nn.Module")
        if type(layer) is not type(first):
            raise TypeError(f"scan_layers: layer {k} is a {type(layer).__name__} but layer 0 a "
                            f"{type(first).__name__}: the layers must be homogeneous")
        for kind, want, got in (("parameter", p0, _types(layer.named_parameters())),
                                ("buffer", b0, _types(layer.named_buffers()))):
            if set(got) != set(want):
                extra = sorted(set(got) ^ set(want))
                raise _loom.ShapeError(f"scan_layers: layer {k} ({type(layer).__name__}) has "
                                       f"{kind}s {sorted(got)} but layer 0 has {sorted(want)} "
                                       f"(differing: {extra})")
            for name, (dt, shape) in want.items():
                if got[name] != (dt, shape):
                    raise _loom.ShapeError(
                        f"scan_layers: layer {k}'s {kind} '{name}' is {got[name][0]}"
                        f"{list(got[name][1])} but layer 0's is {dt}{list(shape)}: the layers "
                        f"must be homogeneous")


def _stack(layers, named):
    per_layer = [dict(named(layer)) for layer in layers]
    return {n: _loom.stack([d[n] for d in per_layer], 0) for n in per_layer[0]}


def scan_layers(layers, x, is_layer_pure=True, remat=False):
    """Runs ``x = layer(x)`` for every layer of ``layers`` (a ModuleList or sequence of
    modules of one class whose parameters and buffers have equal names, shapes and dtypes)
    as one ``loom.scan`` over their stacked parameters: one loop node whatever the depth, the
    first layer's forward traced as the body, once per call whatever the depth. Gradients
    reach every layer's parameters. ``is_layer_pure`` is torch_xla's flag, accepted for its
    code: loom traces only the first layer either way, so the layer must be pure (its trace
    must not depend on which layer it is). (Caching the layer's trace across calls with
    assume_pure measured 1.5x slower steps: a call's gradient recomputes its forward.)
    ``remat=True`` recomputes each layer in the backward instead
    of saving its activations. ``x`` may be a pytree of tensors; the layer returns the same
    structure. Raises ``loom.ShapeError`` / ``TypeError`` naming the layer and parameter that
    differ."""
    layers = list(layers)
    if not layers:
        return x
    _check_homogeneous(layers)
    first = layers[0]
    params = _stack(layers, lambda m: m.named_parameters())
    buffers = _stack(layers, lambda m: m.named_buffers())

    def body(h, layer):
        return functional_call(first, layer, (h,)), None

    out, _ = scan(body, x, (params, buffers), remat=remat)
    return out
