"""The tracing tools with Python callables and pytrees, against the same program unrolled by
hand (plain loom ops, no tracing tool) and against closed forms; trace counts as the C++
tests assert them; user exceptions inside traced bodies."""
import collections
import threading

import numpy as np
import pytest

import loom

Pair = collections.namedtuple("Pair", ["a", "b"])


def close(x, y, tol=1e-5):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- scan ------------------------------------------------------------------------------------

def test_scan_cumsum_seed_example_4():
    def cumsum(acc, x):
        new = acc + x
        return new, new

    init = loom.tensor([0.0])
    xs = loom.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])
    final, history = loom.scan(cumsum, init, xs)
    assert final.tolist() == [15.0]
    assert history.tolist() == [[1.0], [3.0], [6.0], [10.0], [15.0]]
    assert repr(final) == "tensor([15.])"


def test_scan_body_traced_once_per_call_and_cache_hit():
    def body(c, x):
        return c * 0.5 + x, c.sum()

    xs = loom.tensor(rnd(7, 3))
    loom.reset_metrics()
    c1, y1 = loom.scan(body, loom.zeros(3), xs)
    loom.sync()
    m = loom.metrics()
    assert m.bodies_traced == 1
    compiles = m.compiles
    c2, y2 = loom.scan(body, loom.zeros(3), xs)
    loom.sync()
    m = loom.metrics()
    assert m.bodies_traced == 2  # traced again per call, but the graph is a cache hit
    assert m.compiles == compiles
    close(c1, c2)
    close(y1, y2)


def unrolled(body, init, xs_np, reverse=False):
    """The scan by hand: a Python loop of plain ops."""
    carry, ys = init, []
    order = range(len(xs_np) - 1, -1, -1) if reverse else range(len(xs_np))
    for t in order:
        carry, y = body(carry, {"u": loom.tensor(xs_np[t]), "v": None})
        ys.append((t, y))
    ys.sort(key=lambda p: p[0])
    return carry, ys


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_pytrees_against_unrolled(reverse):
    w = loom.tensor(rnd(3, 3, seed=1))

    def body(carry, x):
        h = (carry["h"] @ w + x["u"]).tanh()
        p = Pair(a=carry["p"].a + h.sum(), b=[carry["p"].b[0] * 0.9])
        return {"h": h, "p": p}, (h * 2.0, {"s": h.sum()})

    init = {"h": loom.tensor(rnd(2, 3, seed=2)),
            "p": Pair(a=loom.tensor(0.0), b=[loom.tensor([1.0, 2.0])])}
    xs_np = rnd(5, 2, 3, seed=3)
    final, (ys0, ys1) = loom.scan(body, init, {"u": loom.tensor(xs_np), "v": None},
                                  reverse=reverse)
    ref_final, ref_ys = unrolled(body, init, xs_np, reverse)
    assert isinstance(final["p"], Pair) and isinstance(final["p"].b, list)
    close(final["h"], ref_final["h"])
    close(final["p"].a, ref_final["p"].a)
    close(final["p"].b[0], ref_final["p"].b[0])
    close(ys0, np.stack([np.asarray(y[0]) for _, y in ref_ys]))
    close(ys1["s"], np.stack([np.asarray(y[1]["s"]) for _, y in ref_ys]))


def test_scan_dict_seed_example_5():
    def fn(carry, x):
        s = carry["sum"] + x["val"]
        c = carry["count"] + 1.0
        return {"sum": s, "count": c}, s / c

    carry = {"sum": loom.zeros(2), "count": loom.tensor(0.0)}
    xs = {"val": loom.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}
    final, means = loom.scan(fn, carry, xs)
    close(final["sum"], [9.0, 12.0])
    assert final["count"].item() == 3.0
    close(means, [[1.0, 2.0], [2.0, 3.0], [3.0, 4.0]])


def test_scan_length_without_xs_and_zero_length():
    final, ys = loom.scan(lambda c, x: (c + 1.0, c), loom.tensor(0.0), None, length=4)
    assert final.item() == 4.0
    assert ys.tolist() == [0.0, 1.0, 2.0, 3.0]
    final, ys = loom.scan(lambda c, x: (c + x, c), loom.zeros(2), loom.zeros(0, 2))
    assert final.tolist() == [0.0, 0.0] and ys.shape == (0, 2)


def test_scan_gradient_against_unrolled():
    w_np = rnd(3, 3, seed=4) * 0.5
    xs_np = rnd(4, 3, seed=5)

    def run(unroll):
        w = loom.tensor(w_np, requires_grad=True)

        def body(c, x):
            h = (c @ w + x).tanh()
            return h, h.sum()

        if unroll:
            c, ys = loom.ones(1, 3), []
            for t in range(4):
                c, y = body(c, loom.tensor(xs_np[t]))
                ys.append(y)
            loss = c.sum() + loom.stack(ys).sum()
        else:
            c, ys = loom.scan(body, loom.ones(1, 3), loom.tensor(xs_np), remat=True)
            loss = c.sum() + ys.sum()
        loss.backward()
        return loss.item(), w.grad.numpy()

    l1, g1 = run(False)
    l2, g2 = run(True)
    close(l1, l2)
    close(g1, g2, 1e-4)


def test_scan_errors():
    with pytest.raises(loom.TraceError, match="carry"):
        loom.scan(lambda c, x: ((c, c), c), loom.zeros(2), loom.zeros(3, 2))
    with pytest.raises(TypeError, match="pair"):
        loom.scan(lambda c, x: c + x, loom.zeros(2), loom.zeros(3, 2))
    with pytest.raises(TypeError, match="pytree of tensors"):
        loom.scan(lambda c, x: (c, x), {"a": 1.0}, loom.zeros(3, 2))
    with pytest.raises(TypeError, match="fn"):
        loom.scan(3, loom.zeros(2), loom.zeros(3, 2))
    with pytest.raises(loom.ShapeError):  # carry changes shape
        loom.scan(lambda c, x: (loom.cat([c, x]), x), loom.zeros(2), loom.zeros(3, 2))
    with pytest.raises(loom.TraceError, match="test_tracing.py"):  # the Python call site
        loom.scan(lambda c, x: (c + x, c.sum().item()), loom.zeros(2), loom.zeros(3, 2))


class Boom(Exception):
    pass


def test_exception_on_third_scan_traces_afresh():
    calls = {"n": 0}

    def body(c, x):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Boom("third")
        return c + x, c * 2.0

    xs_np = rnd(5, 2, seed=6)
    expected_final = xs_np.sum(0)
    for k in range(5):
        if k == 2:
            with pytest.raises(Boom, match="third") as info:
                loom.scan(body, loom.zeros(2), loom.tensor(xs_np))
            assert info.traceback[-1].name == "body"  # the user's frame is in the traceback
            del info
            # nothing of the failed trace stays pending or open: values can be read again
            # (a body's scope left open would refuse it) and the next sync runs nothing
            loom.sync()
            assert loom.pending_graph_size() == 0
            assert loom.ones(2).tolist() == [1.0, 1.0]
            continue
        final, ys = loom.scan(body, loom.zeros(2), loom.tensor(xs_np))
        close(final, expected_final)
    assert calls["n"] == 5


def test_exception_in_while_and_assume_pure_and_compile():
    def bad_cond(i, x):
        raise Boom("cond")

    with pytest.raises(Boom):
        loom.while_loop(bad_cond, lambda i, x: (i - 1, x), (loom.tensor(3), loom.tensor(0.0)))
    i, x = loom.while_loop(lambda i, x: i > 0, lambda i, x: (i - 1, x + 2.0),
                           (loom.tensor(3), loom.tensor(0.0)))
    assert x.item() == 6.0

    state = {"fail": True}

    @loom.assume_pure
    def f(a):
        if state["fail"]:
            raise Boom("pure")
        return a * 3.0

    with pytest.raises(Boom):
        f(loom.ones(2))
    state["fail"] = False
    assert f(loom.ones(2)).tolist() == [3.0, 3.0]

    def step(a):
        if state["fail"]:
            raise Boom("step")
        return a + 1.0

    compiled = loom.compile(step, trace_once=True)
    state["fail"] = True
    with pytest.raises(Boom):
        compiled(loom.ones(2))
    state["fail"] = False
    assert compiled(loom.ones(2)).tolist() == [2.0, 2.0]


# ---- while_loop, fori_loop -------------------------------------------------------------------

def test_while_loop_seed_example_6():
    def cond_fn(iteri, x):
        return iteri > 0

    def body_fn(iteri, x):
        return iteri - 1, loom.add(x, 1)

    init_val = loom.tensor(3)
    iteri = loom.tensor(10)
    _, res = loom.while_loop(cond_fn, body_fn, (iteri, init_val))
    assert repr(res) == "tensor(13)"


def test_while_loop_tree_carry_and_data_dependent_trip_count():
    def cond(state, n):
        return state["x"].sum() < 100.0

    def body(state, n):
        return {"x": state["x"] * 2.0}, n + 1

    (state, n) = loom.while_loop(cond, body, ({"x": loom.tensor([1.0, 2.0])}, loom.tensor(0)))
    x = np.array([1.0, 2.0])
    k = 0
    while x.sum() < 100:
        x, k = x * 2, k + 1
    close(state["x"], x)
    assert n.item() == k


def test_while_loop_errors():
    with pytest.raises(TypeError, match="carried"):
        loom.while_loop(lambda i: i > 0, lambda i: i - 1, loom.tensor(3))
    with pytest.raises(loom.DTypeError):  # cond must be bool[]
        loom.while_loop(lambda i: i, lambda i: i - 1, (loom.tensor(3),))
    with pytest.raises(loom.DTypeError):  # body changes a dtype
        loom.while_loop(lambda i: i > 0, lambda i: i - 1.5, (loom.tensor(3),))
    x = loom.tensor([1.0], requires_grad=True)
    _, y = loom.while_loop(lambda i, y: i > 0, lambda i, y: (i - 1, y * 2.0), (loom.tensor(2), x))
    with pytest.raises(loom.AutodiffError, match="while_loop"):
        y.sum().backward()


def test_fori_loop_int_and_tensor_bounds():
    def body(i, acc, v):
        return acc + i.to(loom.float32) * v, v

    acc, v = loom.fori_loop(2, 6, body, loom.tensor(0.0), loom.tensor(0.5))
    assert acc.item() == pytest.approx(0.5 * (2 + 3 + 4 + 5))
    acc, v = loom.fori_loop(loom.tensor(2), loom.tensor(6), body, loom.tensor(0.0),
                            loom.tensor(0.5))
    assert acc.item() == pytest.approx(7.0)
    single = loom.fori_loop(0, 3, lambda i, x: x * 2.0, loom.tensor(1.0))
    assert single.item() == 8.0
    assert loom.fori_loop(5, 2, lambda i, x: x + 1.0, loom.tensor(1.0)).item() == 1.0
    with pytest.raises(TypeError, match="lower"):
        loom.fori_loop("0", 3, lambda i, x: x, loom.tensor(1.0))
    with pytest.raises(loom.DTypeError, match="integer"):
        loom.fori_loop(0.5, 3, lambda i, x: x, loom.tensor(1.0))
    with pytest.raises(TypeError, match="carry at least one"):
        loom.fori_loop(0, 3, lambda i: i)


def test_fori_loop_int_bounds_differentiable():
    w = loom.tensor([1.5], requires_grad=True)
    x = loom.fori_loop(0, 3, lambda i, x: x * w, loom.tensor([2.0]))
    x.sum().backward()
    assert w.grad.tolist() == [pytest.approx(2.0 * 3 * 1.5 ** 2)]


# ---- assume_pure -----------------------------------------------------------------------------

def test_assume_pure_seed_example_1_traced_once():
    traces = {"n": 0}

    @loom.assume_pure
    def do_math(a, b, c=42):
        traces["n"] += 1
        return a @ b + c

    a, b = loom.tensor(rnd(4, 3, seed=7)), loom.tensor(rnd(3, 2, seed=8))
    loom.reset_metrics()
    r1 = do_math(a, b)
    r2 = do_math(a, b)
    r3 = do_math(a * 2.0, b)
    assert traces["n"] == 1
    assert loom.metrics().pure_hits == 2
    close(r1, np.asarray(a) @ np.asarray(b) + 42)
    close(r3, 2 * np.asarray(a) @ np.asarray(b) + 42)
    close(r2, r1)
    do_math(a, b, c=1)  # a static keyword: a new signature
    do_math(a, b, 1)
    assert traces["n"] == 3  # positional 1 and c=1 are different call trees
    do_math(a, b, c=1.0)  # 1.0 == 1 but a different type: its own trace
    assert traces["n"] == 4
    do_math(loom.tensor(rnd(5, 3)), b)  # a new shape
    assert traces["n"] == 5
    assert do_math.__name__ == "do_math"


def test_assume_pure_pytrees_and_gradients():
    calls = {"n": 0}

    @loom.assume_pure
    def f(params, batch, scale=2.0):
        calls["n"] += 1
        h = (batch["x"] @ params["w"] + params["b"]).tanh()
        return {"loss": (h * scale).sum(), "h": h}, None

    w_np, b_np, x_np = rnd(3, 4, seed=9), rnd(4, seed=10), rnd(2, 3, seed=11)
    grads = []
    for _ in range(2):
        w = loom.tensor(w_np, requires_grad=True)
        b = loom.tensor(b_np, requires_grad=True)
        out, none = f({"w": w, "b": b}, {"x": loom.tensor(x_np)})
        assert none is None
        out["loss"].backward()
        grads.append((out["loss"].item(), w.grad.numpy(), b.grad.numpy()))
    assert calls["n"] == 1
    w = loom.tensor(w_np, requires_grad=True)
    b = loom.tensor(b_np, requires_grad=True)
    ref = ((loom.tensor(x_np) @ w + b).tanh() * 2.0).sum()
    ref.backward()
    for loss, gw, gb in grads:
        close(loss, ref.item())
        close(gw, w.grad)
        close(gb, b.grad)


def test_assume_pure_requires_grad_in_signature_and_check_purity():
    state = {"k": 1.0}

    def impure(x):
        return x * state["k"]

    g = loom.assume_pure(impure, check_purity=True)
    g(loom.ones(2))
    state["k"] = 2.0
    with pytest.raises(loom.TraceError, match="differ"):
        g(loom.ones(2))


def test_assume_pure_method_and_static_errors():
    class Model:
        def __init__(self):
            self.w = loom.tensor(rnd(3, 3, seed=12))

        @loom.assume_pure
        def forward(self, x):
            return x @ self.w

    m = Model()
    x = loom.tensor(rnd(2, 3, seed=13))
    close(m.forward(x), np.asarray(x) @ np.asarray(m.w))
    with pytest.raises(TypeError, match=r"args\[1\]"):
        loom.assume_pure(lambda x, a: x)(x, np.zeros(3))
    with pytest.raises(TypeError, match="dict key"):
        loom.assume_pure(lambda d: d)({1: x})
    with pytest.raises(TypeError, match="callable"):
        loom.assume_pure(3)


def test_assume_pure_recompile_reason_names_the_path():
    @loom.assume_pure
    def f(d):
        return d["x"] * 2.0

    loom.reset_metrics()
    with loom.graph_name("pure_path"):
        f({"x": loom.ones(2)}).tolist()
        f({"x": loom.ones(3)}).tolist()
    reasons = [r for r in loom.recompile_reasons() if r.kind == "input type" or r.path]
    assert any("['x']" in r.path for r in reasons), loom.recompile_reasons()


# ---- compile ---------------------------------------------------------------------------------

def test_compile_trace_once_sgd_replays_in_place_updates():
    w_np, x_np, y_np = rnd(3, 1, seed=14), rnd(8, 3, seed=15), rnd(8, 1, seed=16)
    traces = {"n": 0}

    def make():
        w = loom.tensor(w_np, requires_grad=True)

        def step(x, y):
            traces["n"] += 1
            loss = ((x @ w - y) ** 2).mean()
            loss.backward()
            with loom.no_grad():
                w.copy_(w - w.grad * 0.1)
            w.grad = None
            return loss

        return w, step

    w, step = make()
    compiled = loom.compile(step, trace_once=True)
    loom.reset_metrics()
    losses = [compiled(loom.tensor(x_np), loom.tensor(y_np)).item() for _ in range(6)]
    assert traces["n"] == 1
    w_ref = w_np.astype(np.float64)
    for k in range(6):
        r = x_np @ w_ref - y_np
        assert losses[k] == pytest.approx((r ** 2).mean(), rel=1e-5)
        w_ref = w_ref - 0.1 * (2 * x_np.T @ r / len(r))
    close(w, w_ref, 1e-5)


def test_compile_trace_once_accumulates_gradients_across_calls():
    # Micro-batches accumulating into .grad (backward inside the step, no zero_grad): each
    # replay adds to the leaf's grad of the call, as eager and torch do.
    w = loom.tensor([1.0, 2.0], requires_grad=True)
    (w * 0).sum().backward()
    loom.sync()

    @loom.compile(trace_once=True)
    def micro(x):
        loss = (w * x).sum()
        loss.backward()
        return loss

    x = loom.tensor([3.0, 4.0])
    for k in range(1, 4):
        micro(x)
        assert w.grad.tolist() == [3.0 * k, 4.0 * k]
    w.grad = None
    for k in range(1, 3):
        micro(x)
        assert w.grad.tolist() == [3.0 * k, 4.0 * k]


def test_compile_full_graph_and_max_different_graphs():
    @loom.compile(full_graph=True)
    def reads(x):
        return x * x.sum().item()

    with pytest.raises(loom.TraceError):
        reads(loom.ones(2))

    @loom.compile(max_different_graphs=1, name="shapes")
    def grows(x):
        return x * 2.0

    grows(loom.ones(2))
    with pytest.raises(loom.TraceError, match="shapes"):
        grows(loom.ones(3))
    with pytest.raises(ValueError):
        loom.compile(lambda x: x, max_different_graphs=0)


def test_compile_plain_step_matches_eager_and_names_graph():
    @loom.compile(name="my_step")
    def step(x, k):
        return {"y": x * k + 1.0}

    loom.reset_metrics()
    for k in range(3):
        out = step(loom.tensor([1.0, 2.0]), 3)
        assert out["y"].tolist() == [4.0, 7.0]
    names = [g.name for g in loom.graph_metrics()]
    assert "my_step" in names


# ---- threads, sync sites, profile ------------------------------------------------------------

def test_tensor_from_another_thread_is_a_trace_error():
    t = loom.ones(3) * 2.0  # pending, owned by this thread
    errors = []

    def use():
        try:
            (t + 1.0).tolist()
        except Exception as e:  # noqa: BLE001 - the class is asserted below
            errors.append(e)

    th = threading.Thread(target=use)
    th.start()
    th.join()
    assert len(errors) == 1 and isinstance(errors[0], loom.TraceError), errors
    assert t.tolist() == [2.0, 2.0, 2.0]


def test_threads_trace_their_own_work_concurrently():
    results = {}

    def work(k):
        x = loom.tensor(rnd(16, seed=k))
        y = loom.scan(lambda c, v: (c + v, c), loom.tensor(0.0), x)[0]
        results[k] = (y.item(), float(rnd(16, seed=k).sum()))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(results) == 4
    for got, want in results.values():
        assert got == pytest.approx(want, rel=1e-5)


def test_sync_graph_named_by_python_line():
    loom.reset_metrics()
    x = loom.ones(2) * 3.0
    loom.sync()
    assert any(g.name.startswith("test_tracing.py:") for g in loom.graph_metrics())
    del x


def test_profile_writes_a_chrome_trace(tmp_path):
    import json
    path = tmp_path / "trace.json"
    with loom.profile(str(path)):
        (loom.ones(4) * 2.0).sum().item()
    events = json.loads(path.read_text())["traceEvents"]
    cats = {e.get("cat") for e in events}
    assert {"sync", "compile", "execute", "kernel"} <= cats, cats


def test_dump_ir(tmp_path):
    loom.set_dump_ir_dir(str(tmp_path))
    try:
        (loom.ones(5) * 7.0 + 1.0).tolist()
    finally:
        loom.set_dump_ir_dir("")
    files = [p.name for p in tmp_path.iterdir()]
    assert any(f.endswith(".before.ir") for f in files), files


def test_pending_tensor_freed_on_another_thread():
    """The last reference to a pending tensor dropped on another thread (the GC or a queue
    consumer) hands it back to its owner; the owner keeps tracing and syncing correctly."""
    import queue
    q = queue.Queue()

    def consumer():
        while True:
            item = q.get()
            if item is None:
                return
            del item  # the last reference dies here, on a non-owner thread

    th = threading.Thread(target=consumer)
    th.start()
    acc = loom.zeros(4)
    for k in range(2000):
        t = loom.ones(4) * float(k)  # pending, owned by this thread
        acc = acc + 1.0
        q.put(t)
        del t
        if k % 100 == 99:
            loom.sync()
    q.put(None)
    th.join()
    assert acc.tolist() == [2000.0] * 4
