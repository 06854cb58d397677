"""loom.pure_callback: numpy code called from loom programs (as jax.pure_callback). Values
against the same function computed by numpy and by torch; inside scan, fori_loop, while_loop,
assume_pure, compile and custom_vjp against the plain program; gradients through a vjp against
torch's autograd of the same function; the callback called once per use and per run; pytrees;
errors: wrong result types, an exception inside the callback (it propagates as itself and loom
stays usable), no vjp, bad declarations."""
import threading

import numpy as np
import pytest
import torch

import loom
from conftest import to_torch


def np_sin(x):
    return np.sin(x)


def np_sin_vjp(args, out, g):
    (x,) = args
    return (g * np.cos(x),)


def test_values_equal_numpy_and_the_callback_runs_once_per_use():
    calls = []

    def double_plus(x, y):
        calls.append(1)
        return 2 * x + y

    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    x, y = loom.tensor(a), loom.tensor(b)
    z = loom.pure_callback(double_plus, x, x * 1.5, y) + 1
    np.testing.assert_allclose(z.numpy(), 2 * (a * 1.5) + b + 1, rtol=1e-6)
    assert len(calls) == 1


def test_a_namedtuple_shape_dtype_struct_is_one_result():
    """jax.ShapeDtypeStruct as users write it without JAX: a namedtuple with shape and dtype is
    a leaf, not a tuple of two results."""
    import collections
    Sds = collections.namedtuple("ShapeDtypeStruct", ["shape", "dtype"])
    x = loom.tensor(np.arange(4.0, dtype=np.float32))
    y = loom.pure_callback(lambda a: np.sort(a)[::-1].copy(), Sds((4,), np.float32), x)
    np.testing.assert_array_equal(y.numpy(), [3.0, 2.0, 1.0, 0.0])


def test_pytrees_several_results_and_dtypes():
    def stats(d, k):
        v = d["v"]
        return {"sum": v.sum(axis=1).astype(np.float64), "arg": v.argmax(axis=1)}, v * k

    v = np.random.default_rng(2).standard_normal((4, 5)).astype(np.float32)
    spec = ({"sum": np.empty((4,), np.float64), "arg": np.empty((4,), np.int64)},
            np.empty((4, 5), np.float32))
    (s, m) = loom.pure_callback(stats, spec, {"v": loom.tensor(v)}, loom.tensor(3.0))
    assert s["sum"].dtype == loom.float64 and s["arg"].dtype == loom.int64
    np.testing.assert_allclose(s["sum"].numpy(), v.sum(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(s["arg"].numpy(), v.argmax(axis=1))
    np.testing.assert_allclose(m.numpy(), v * 3, rtol=1e-6)
    # Declarations by loom tensors and torch tensors too.
    t = loom.pure_callback(lambda a: a[::-1].copy(), torch.zeros(4, dtype=torch.int64),
                           loom.tensor([1, 2, 3, 4]))
    assert t.tolist() == [4, 3, 2, 1]


def test_inside_scan_fori_while_assume_pure_and_compile():
    calls = []

    def np_tanh(x):
        calls.append(1)
        return np.tanh(x)

    h0 = np.linspace(-1, 1, 5)
    xs = np.random.default_rng(3).standard_normal((6, 5))

    def body(h, x):
        h = loom.pure_callback(np_tanh, h, h + x)
        return h, h * 2

    h, ys = loom.scan(body, loom.tensor(h0), loom.tensor(xs))
    want, hist = h0, []
    for x in xs:
        want = np.tanh(want + x)
        hist.append(want * 2)
    np.testing.assert_allclose(h.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(ys.numpy(), np.stack(hist), rtol=1e-12)
    assert len(calls) == 6

    r = loom.fori_loop(0, 4, lambda i, v: loom.pure_callback(np_tanh, v, v) + 1, loom.tensor(h0))
    want = h0
    for _ in range(4):
        want = np.tanh(want) + 1
    np.testing.assert_allclose(r.numpy(), want, rtol=1e-12)

    n, v = loom.while_loop(lambda n, v: v < 1.9,
                           lambda n, v: (n + 1, loom.pure_callback(np_sin, v, v) + 1),
                           (loom.tensor(0), loom.tensor(0.5, dtype=loom.float64)))
    hv, hn = 0.5, 0
    while hv < 1.9:
        hv, hn = np.sin(hv) + 1, hn + 1
    assert n.item() == hn and v.item() == pytest.approx(hv, rel=1e-12)

    @loom.assume_pure
    def f(a):
        return loom.pure_callback(np_tanh, a, a) * 3

    calls.clear()
    for val in (0.25, 0.5, 0.75):
        assert f(loom.tensor(val)).item() == pytest.approx(3 * np.tanh(np.float32(val)), rel=1e-6)
    assert len(calls) == 3

    # Two uses in one graph, a constant in the body: the inlined copies' duplicate constants
    # are merged, the callback nodes copied (CSE once rebuilt them and failed).
    twice = loom.assume_pure(lambda a: loom.pure_callback(np_sin, a, a * 2.0))
    a = np.array([0.1, 0.2, 0.3], np.float32)
    np.testing.assert_allclose((twice(loom.tensor(a)) + twice(loom.tensor(a) + 1)).numpy(),
                               np.sin(a * 2) + np.sin((a + 1) * 2), rtol=1e-6)

    step = loom.compile(lambda a: loom.pure_callback(np_tanh, a, a) - a, trace_once=True)
    for val in (1.0, 2.0):
        assert step(loom.tensor(val)).item() == pytest.approx(np.tanh(val) - val, rel=1e-6)
    assert len(calls) == 5


def test_gradients_through_the_vjp_equal_torch_inside_a_scan():
    """h = sin(h * w_k) over 5 steps with sin a callback: values and the gradients of h0 and
    the weights equal torch's autograd of the unrolled loop; the vjp runs once per step."""
    rng = np.random.default_rng(4)
    h0, ws = rng.standard_normal(4), rng.standard_normal((5, 4))
    vjp_calls = []

    def sin_vjp(args, out, g):
        vjp_calls.append(1)
        return np_sin_vjp(args, out, g)

    h = loom.tensor(h0, requires_grad=True)
    w = loom.tensor(ws, requires_grad=True)
    out, _ = loom.scan(lambda c, wk: (loom.pure_callback(np_sin, c, c * wk, vjp=sin_vjp), None),
                       h, w)
    out.sum().backward()
    th, tw = torch.tensor(h0, requires_grad=True), torch.tensor(ws, requires_grad=True)
    t = th
    for k in range(5):
        t = torch.sin(t * tw[k])
    t.sum().backward()
    np.testing.assert_allclose(out.numpy(), t.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(h.grad.numpy(), th.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)
    assert len(vjp_calls) == 5


def test_a_vjp_of_two_arguments_with_none_for_zeros():
    def mul(a, b):
        return a * b

    def mul_vjp(args, out, g):
        a, b = args
        return (g * b, None)

    a = loom.tensor([1.0, 2.0], requires_grad=True)
    b = loom.tensor([3.0, 4.0], requires_grad=True)
    y = loom.pure_callback(mul, a, a, b, vjp=mul_vjp)
    (y * y).sum().backward()
    ta, tb = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    assert a.grad.tolist() == (2 * ta * tb * tb).tolist()
    assert b.grad.tolist() == [0.0, 0.0]


def test_results_of_the_wrong_type_are_exec_errors_naming_the_callback():
    def wrong_shape(x):
        return np.zeros(2, np.float32)

    y = loom.pure_callback(wrong_shape, np.empty(3, np.float32), loom.ones(3))
    with pytest.raises(loom.ExecError, match=r"'wrong_shape' returned f32\[2\].*expected "
                                             r"f32\[3\].*test_pure_callback.py"):
        y.numpy()
    with pytest.raises(loom.ExecError, match="wrong_shape"):  # y holds the error
        y.tolist()

    def wrong_dtype(x):
        return np.zeros(3, np.float64)

    y = loom.pure_callback(wrong_dtype, np.empty(3, np.float32), loom.ones(3))
    with pytest.raises(loom.ExecError, match=r"'wrong_dtype' returned f64\[3\].*f32\[3\]"):
        y.numpy()

    def not_an_array(x):
        return "text"

    y = loom.pure_callback(not_an_array, np.empty(3, np.float32), loom.ones(3))
    with pytest.raises(loom.ExecError, match="not_an_array"):
        y.numpy()

    def one_of_two(x):
        return x

    a, b = loom.pure_callback(one_of_two, (np.empty(3, np.float32),) * 2, loom.ones(3))
    with pytest.raises(loom.ExecError, match=r"'one_of_two' returned 1 array\(s\); expected 2"):
        a.numpy()


def test_an_exception_in_the_callback_propagates_as_itself_and_loom_stays_usable():
    class Flaky(Exception):
        pass

    fail = [True]

    def flaky(x):
        if fail[0]:
            raise Flaky("failed on purpose")
        return x

    x = loom.ones(3) * 2
    y = loom.pure_callback(flaky, x, x) + 1
    other = x * 5
    with pytest.raises(Flaky, match="failed on purpose"):
        y.numpy()
    with pytest.raises(Flaky, match="failed on purpose"):  # y holds the error
        y.numpy()
    assert other.tolist() == [10.0, 10.0, 10.0]
    fail[0] = False
    assert (loom.pure_callback(flaky, x, x) + 1).tolist() == [3.0, 3.0, 3.0]
    # From a step compiled once, too: the next call runs again.
    fail[0] = True
    step = loom.compile(lambda a: loom.pure_callback(flaky, a, a) * 2, trace_once=True)
    with pytest.raises(Flaky):
        step(loom.ones(2)).numpy()
    fail[0] = False
    assert step(loom.ones(2)).tolist() == [2.0, 2.0]


def test_a_failed_callback_leaves_what_does_not_depend_on_it_usable():
    # The run that fails donates none of its inputs: an in-place update beside the call, and a
    # temporary's dependants, keep their values (not the callback's error).
    def raiser(x):
        raise ZeroDivisionError("division by zero")

    def wrong_dtype(x):
        return np.zeros(2, np.float64)

    for cb, error in ((raiser, ZeroDivisionError), (wrong_dtype, loom.ExecError)):
        w = loom.tensor([1.0, 2.0])
        loom.sync()
        with loom.no_grad():
            w.add_(1)
        y = loom.pure_callback(cb, np.zeros(2, np.float32), loom.tensor([5.0, 6.0]))
        with pytest.raises(error):
            y.numpy()
        assert w.tolist() == [2.0, 3.0]
        a = loom.tensor([1.0, 2.0]) + 1
        y = loom.pure_callback(cb, np.zeros(2, np.float32), a)
        other = a * 2
        with pytest.raises(error):
            y.numpy()
        assert other.tolist() == [4.0, 6.0]
        assert a.tolist() == [2.0, 3.0]


def test_a_gradient_without_a_vjp_is_an_autodiff_error():
    x = loom.tensor([0.5, 1.0], requires_grad=True)
    y = loom.pure_callback(np_sin, x, x)
    with pytest.raises(loom.AutodiffError, match="'np_sin' has no VJP.*vjp="):
        y.sum().backward()


def test_bad_declarations_and_arguments():
    x = loom.ones(2)
    with pytest.raises(TypeError, match="must be callable"):
        loom.pure_callback(3, x, x)
    with pytest.raises(TypeError, match=r"result_shape_dtypes\[1\] must have .shape and .dtype"):
        loom.pure_callback(np_sin, (x, 3), x)
    with pytest.raises(TypeError, match="declares no results"):
        loom.pure_callback(np_sin, (), x)
    with pytest.raises(TypeError, match="bfloat16"):
        loom.pure_callback(np_sin, x, x.to(loom.bfloat16))
    with pytest.raises(TypeError, match="'vjp' must be callable"):
        loom.pure_callback(np_sin, x, x, vjp=1)


def test_the_same_function_every_step_compiles_once():
    def step(w):
        return loom.pure_callback(np_sin, w, w) * 0.5 + w

    w = loom.tensor([0.1, 0.2])
    for _ in range(2):  # the first step reads a host tensor, the later ones a computed one
        w = step(w)
        w.numpy()
    before = loom.metrics().compiles
    for _ in range(5):
        w = step(w)
        w.numpy()
    assert loom.metrics().compiles == before


def test_a_callback_runs_when_the_program_runs_on_another_thread():
    """The GIL is taken inside the callback: a sync on a worker thread does not hang."""
    out = {}

    def worker():
        x = loom.tensor([0.25, 0.5])
        out["v"] = loom.pure_callback(np_sin, x, x).numpy()

    t = threading.Thread(target=worker)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()
    np.testing.assert_allclose(out["v"], np.sin(np.array([0.25, 0.5], np.float32)), rtol=1e-6)


def test_a_callback_with_no_arguments():
    """A host function of no tensors (a reading of host state), eagerly and under compile."""
    y = loom.pure_callback(lambda: np.arange(3, dtype=np.float32), loom.zeros(3))
    np.testing.assert_array_equal(y.numpy(), [0.0, 1.0, 2.0])
    f = loom.compile(lambda x: x + loom.pure_callback(lambda: np.ones(3, np.float32),
                                                       loom.zeros(3)))
    np.testing.assert_array_equal(f(loom.ones(3)).numpy(), [2.0, 2.0, 2.0])
