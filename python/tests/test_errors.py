"""loom.Error classes carry the C++ message; wrong argument types are TypeErrors."""
import pytest

import loom


def test_hierarchy():
    assert issubclass(loom.Error, RuntimeError)
    assert issubclass(loom.ShapeError, loom.Error) and issubclass(loom.ShapeError, ValueError)
    assert issubclass(loom.DTypeError, loom.Error) and issubclass(loom.DTypeError, TypeError)
    for c in (loom.TraceError, loom.AutodiffError, loom.CompileError, loom.ExecError,
              loom.ParseError):
        assert issubclass(c, loom.Error)


def test_shape_error_message_names_op_and_shapes():
    with pytest.raises(loom.ShapeError) as e:
        loom.ones(3) + loom.ones(4)
    msg = str(e.value)
    assert "[add]" in msg and "[3]" in msg and "[4]" in msg


def test_dtype_error():
    with pytest.raises(loom.DTypeError):
        ~loom.tensor([1.0])


def test_matmul_shape_error():
    with pytest.raises(loom.ShapeError, match="matmul"):
        loom.ones(2, 3) @ loom.ones(4, 5)


def test_wrong_argument_types_are_type_errors_naming_the_argument():
    with pytest.raises(TypeError, match="other"):
        loom.add(loom.ones(2), "x")
    with pytest.raises(TypeError, match="dtype"):
        loom.zeros(2, dtype="float32")
    with pytest.raises(TypeError):
        loom.ones(2) + "x"
    with pytest.raises(TypeError):
        loom.exp([1.0, 2.0])
