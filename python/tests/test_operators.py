"""+ - * / on loom.Tensor (the type's number slots): Python numbers are graph inputs, so one
compiled graph serves every value; torch's promotion of Python numbers; Python's number
protocol (reflected forms, NotImplemented for foreign operands); loom's errors keep their class."""
import numpy as np
import pytest
import torch

import loom
from conftest import assert_same, from_torch


def test_python_numbers_are_inputs_one_compile_for_every_value():
    xs = np.arange(16, dtype=np.float32) / 7
    x, y = loom.tensor(xs), loom.ones(16)
    loom.sync()
    loom.reset_metrics()
    for c in (1.0001, 1.0002, -3.5, 2.0, 0.0):
        r = (x * c + y) - c / (y + c * c + 1.0) + (2 - x) * (c - 1)
        t = torch.from_numpy(xs)
        want = (t * c + 1) - c / (torch.ones(16) + c * c + 1.0) + (2 - t) * (c - 1)
        np.testing.assert_allclose(r.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    m = loom.metrics()
    assert m.compiles == 1, loom.metrics_report()  # the same graph for all five numbers
    assert m.host_scalars >= 5 * 6


def test_a_long_chain_with_numbers_matches_torch():
    # x = x * c + y, as bench/python/trace_overhead.py, past the pending graph's compaction
    # threshold (16 Ki nodes)
    x, y = loom.ones(16), loom.full((16,), 0.5)
    tx, ty = torch.ones(16), torch.full((16,), 0.5)
    for i in range(6000):
        c = 1.0001 if i % 2 else 0.9999
        x = x * c + y
        tx = tx * c + ty
    assert_same(x, tx, tol=1e-4)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16, torch.int32, torch.int64,
                                torch.bool, torch.float64])
@pytest.mark.parametrize("number", [1.0001, 3, True])
def test_promotion_of_python_numbers_follows_torch(dt, number):
    a = torch.tensor([1, 0, 1]).to(dt)
    for f in (lambda p, q: p + q, lambda p, q: p * q, lambda p, q: p / q):
        assert_same(f(from_torch(a), number), f(a, number), tol=1e-2)
        assert_same(f(number, from_torch(a)), f(number, a), tol=1e-2)


def test_foreign_operands_follow_the_number_protocol():
    class Right:
        def __radd__(self, other):
            return "radd"

        def __rmul__(self, other):
            return "rmul"

    t = loom.ones(2)
    assert t + Right() == "radd" and t * Right() == "rmul"  # NotImplemented, then Right's
    with pytest.raises(TypeError):
        object() - t
    with pytest.raises(TypeError):
        t / "x"
    assert (t.__add__("x")) is NotImplemented  # CPython's wrapper of the slot
    assert t.__rsub__(5).tolist() == [4.0, 4.0]  # 5 - t


def test_errors_from_operators_keep_their_class_and_name_the_op():
    with pytest.raises(loom.ShapeError, match=r"\[mul\].*\[3\].*\[4\]"):
        loom.ones(3) * loom.ones(4)
    with pytest.raises(loom.DTypeError, match=r"\[sub\]"):
        loom.tensor([True]) - True
    with pytest.raises(loom.ShapeError, match=r"\[div\]"):
        2.0 / loom.ones(2, 3) / loom.ones(4)


def test_parameter_subclass_uses_the_slots():
    p = loom.nn.Parameter(loom.ones(3))
    r = p * 2.0 + 1
    assert type(r) is loom.Tensor and r.tolist() == [3.0, 3.0, 3.0]
    assert (3 - p).tolist() == [2.0, 2.0, 2.0]
