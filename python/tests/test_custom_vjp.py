"""loom.custom_vjp: a user-defined backward (as jax.custom_vjp). Values and gradients against
the same function without it (and against torch), through scan, fori_loop, while_loop,
assume_pure, compile and nesting; the backward traced exactly once per use; errors."""
import pytest
import torch

import loom
from conftest import from_torch, to_torch


def make_sin(counter=None):
    @loom.custom_vjp
    def sin(x):
        return loom.sin(x)

    def fwd(x):
        return loom.sin(x), {"cos": loom.cos(x)}

    def bwd(res, g):
        if counter is not None:
            counter.append(1)
        return (g * res["cos"],)

    sin.defvjp(fwd, bwd)
    return sin


def test_a_custom_backward_replaces_autodiff():
    """bwd's formula is used, not the derivative of fn: x * x with a backward of 3 g x."""
    @loom.custom_vjp
    def sq(x):
        return x * x

    sq.defvjp(lambda x: (x * x, x), lambda x, g: (3 * g * x,))
    x = loom.tensor([1.0, -2.0, 0.5], requires_grad=True)
    y = sq(x)
    y.sum().backward()
    assert y.tolist() == [1.0, 4.0, 0.25]
    assert x.grad.tolist() == [3.0, -6.0, 1.5]


def test_fwd_may_call_the_function_itself():
    """JAX's first custom_vjp example: f_fwd computes the output by calling f; inside fwd, f is
    its plain primal (no recursion). Gradients against the closed form."""
    @loom.custom_vjp
    def f(x, y):
        return loom.sin(x) * y

    def f_fwd(x, y):
        return f(x, y), (loom.cos(x), loom.sin(x), y)

    def f_bwd(res, g):
        cos_x, sin_x, y = res
        return (cos_x * g * y, sin_x * g)

    f.defvjp(f_fwd, f_bwd)
    x = loom.tensor([0.3, 0.7], dtype=loom.float64, requires_grad=True)
    y = loom.tensor([2.0, 3.0], dtype=loom.float64, requires_grad=True)
    out = f(x, y)
    out.sum().backward()
    xs, ys = torch.tensor([0.3, 0.7], dtype=torch.float64), torch.tensor([2.0, 3.0],
                                                                         dtype=torch.float64)
    torch.testing.assert_close(to_torch(out), torch.sin(xs) * ys)
    torch.testing.assert_close(to_torch(x.grad), torch.cos(xs) * ys)
    torch.testing.assert_close(to_torch(y.grad), torch.sin(xs))


def test_values_and_gradients_equal_autodiff_of_the_same_function():
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    x = from_torch(t).requires_grad_()
    y = make_sin()(x) * 2
    y.sum().backward()
    tt = t.clone().requires_grad_()
    (torch.sin(tt) * 2).sum().backward()
    torch.testing.assert_close(to_torch(y), torch.sin(t) * 2)
    torch.testing.assert_close(to_torch(x.grad), tt.grad)


def test_several_arguments_pytrees_and_none_gradients():
    @loom.custom_vjp
    def f(x, p, scale):
        return {"y": x * p["w"] * scale}

    def fwd(x, p, scale):
        return {"y": x * p["w"] * scale}, (x, p["w"])

    def bwd(res, g):
        x, w = res
        return g["y"] * w * 2.0, {"w": None}, None

    f.defvjp(fwd, bwd)
    x = loom.tensor([1.0, 2.0], requires_grad=True)
    w = loom.tensor([3.0, 4.0], requires_grad=True)
    out = f(x, {"w": w}, 2.0)
    out["y"].sum().backward()
    assert out["y"].tolist() == [6.0, 16.0]
    assert x.grad.tolist() == [6.0, 8.0]   # bwd's formula: g * w * 2
    assert w.grad.tolist() == [0.0, 0.0]   # None: zeros


def _loop_grads(fn, tool):
    gen = torch.Generator().manual_seed(1)
    h0 = from_torch(torch.randn(3, generator=gen, dtype=torch.float64)).requires_grad_()
    ws = from_torch(torch.randn(4, 3, generator=gen, dtype=torch.float64)).requires_grad_()
    if tool == "scan":
        out, _ = loom.scan(lambda c, w: (fn(c * w), None), h0, ws)
    elif tool == "fori_loop":
        out, _ = loom.fori_loop(0, 4, lambda i, c, w: (fn(c * w[i]), w), h0, ws)
    elif tool == "assume_pure":
        def body(c, w):
            for k in range(4):
                c = fn(c * w[k])
            return c
        out = loom.assume_pure(body)(h0, ws)
    else:
        out = h0
        for k in range(4):
            out = fn(out * ws[k])
    out.sum().backward()
    return to_torch(out), to_torch(h0.grad), to_torch(ws.grad)


@pytest.mark.parametrize("tool", ["scan", "fori_loop", "assume_pure"])
def test_inside_the_tools_equals_the_plain_function(tool):
    want = _loop_grads(loom.sin, "unrolled")
    got = _loop_grads(make_sin(), tool)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_inside_compile_and_nested():
    outer_calls = []

    @loom.custom_vjp
    def outer(x):
        return make_sin()(x) * x

    def fwd(x):
        s = make_sin()
        return s(x) * x, (x, s(x))

    def bwd(res, g):  # d/dx (sin x * x) = cos x * x + sin x, written with another custom_vjp
        outer_calls.append(1)
        x, sx = res
        return (g * (loom.cos(x) * x + sx),)

    outer.defvjp(fwd, bwd)

    def step(x):
        y = outer(x)
        y.sum().backward()
        return y, x.grad

    t = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    y, g = loom.compile(step)(from_torch(t).requires_grad_())
    tt = t.clone().requires_grad_()
    (torch.sin(tt) * tt).sum().backward()
    torch.testing.assert_close(to_torch(y), torch.sin(t) * t)
    torch.testing.assert_close(to_torch(g), tt.grad)
    assert len(outer_calls) == 1


def test_the_backward_is_traced_once_per_use():
    calls = []
    sin = make_sin(calls)
    x = loom.tensor([0.1, 0.2], requires_grad=True)
    out, _ = loom.scan(lambda c, _: (sin(c), None), x, None, length=6)
    assert len(calls) == 1        # one use inside the scan body, traced once
    y = sin(out) + sin(x)
    assert len(calls) == 3        # two more uses
    y.sum().backward()
    assert len(calls) == 3        # backward runs the traces, not the Python function


def test_without_gradients_the_function_runs_plainly():
    ran = []

    @loom.custom_vjp
    def f(x):
        ran.append(1)
        return x + 1

    def fwd(x):
        raise AssertionError("fwd must not run without gradients")

    f.defvjp(fwd, lambda r, g: (g,))
    assert f(loom.tensor([1.0])).tolist() == [2.0]
    with loom.no_grad():
        assert f(loom.tensor([1.0], requires_grad=True)).tolist() == [2.0]
    assert len(ran) == 2


def test_bad_backwards_are_clear_errors():
    x = loom.tensor([1.0, 2.0], requires_grad=True)

    @loom.custom_vjp
    def f(x):
        return x * 2

    f.defvjp(lambda x: (x * 2, None), lambda r, g: (g, g))
    with pytest.raises(TypeError, match="one gradient .*per positional argument: 1 here"):
        f(x)
    f.defvjp(lambda x: (x * 2, None), lambda r, g: (g.sum(),))
    with pytest.raises(loom.ShapeError, match=r"bwd's gradient 0 is f32\[\] but argument 0 is "
                                              r"f32\[2\]"):
        f(x)
    w = loom.tensor([3.0, 4.0], requires_grad=True)
    f.defvjp(lambda x: (x * w, None), lambda r, g: (g,))
    with pytest.raises(loom.TraceError, match="fwd reads a tensor f32\\[2\\] that requires grad "
                                              "from outside its arguments"):
        f(x)
    # fwd's output of another structure than the function's (JAX refuses it too): the result
    # would change structure with grad mode.
    f.defvjp(lambda x: ((x * 2, x), None), lambda r, g: (g[0],))
    assert f(x.detach()).tolist() == [2.0, 4.0]  # without gradients f runs plainly
    with pytest.raises(TypeError, match=r"fwd of f returns an output of structure "
                                        r"\('Tensor', 'Tensor'\); expected .* output, Tensor"):
        f(x)
    g = loom.custom_vjp(lambda x: x)
    with pytest.raises(TypeError, match="no backward yet"):
        g(x)
    with pytest.raises(TypeError, match="positionally"):
        f(x=x)


@pytest.mark.parametrize("tool", ["scan", "while_loop"])
def test_inside_loop_bodies_the_custom_backward_is_used(tool):
    """Two steps of c = sq(c) with sq's backward 3 g x: d/dx is 9 x^3 (autodiff: 4 x^3). A
    while_loop has no backward: its body's forward runs the custom function's value."""
    @loom.custom_vjp
    def sq(x):
        return x * x

    sq.defvjp(lambda x: (x * x, x), lambda x, g: (3 * g * x,))
    x = loom.tensor([1.0, 2.0], requires_grad=tool == "scan")
    if tool == "scan":
        out, _ = loom.scan(lambda c, _: (sq(c), None), x, None, length=2)
        out.sum().backward()
        assert x.grad.tolist() == [9.0, 72.0]
    else:
        _, out = loom.while_loop(lambda i, c: i < 2, lambda i, c: (i + 1, sq(c)),
                                 (loom.tensor(0), x))
    assert out.tolist() == [1.0, 16.0]
