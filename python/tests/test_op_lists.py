"""The Python op lists against the one C++ op table: every public op of loom/trace/ops.h and
loom/trace/torch_ops.h is reachable from Python (a loom function or a Tensor method), and every
name the binding adds as a Tensor method (_ops._DIRECT) is a C++ op or one of its spellings.
A new C++ op without a Python spelling, or a Python name without a C++ op, fails here."""
import pathlib
import re

import loom
import loom._ops as ops

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADERS = ["include/loom/trace/ops.h", "include/loom/trace/torch_ops.h"]
# Python spellings of C++ ops under another name: the comparison operators, torch's alias.
ALIASES = {"eq": "operator==", "ne": "operator!=", "lt": "operator<", "le": "operator<=",
           "gt": "operator>", "ge": "operator>=", "true_divide": "div"}
# C++ ops that Python spells only as Tensor methods (torch has no function of that name, or
# the function would shadow a builtin-like name).
METHODS_ONLY = {"contiguous", "fill_", "zero_"}


def cpp_ops():
    names = set()
    decl = re.compile(r"^(?:Tensor|Tensor&|std::vector<Tensor>|TopK) (\w+|operator\S+?)\(")
    for h in HEADERS:
        for line in (ROOT / h).read_text().splitlines():
            m = decl.match(line)
            if m:
                names.add(m.group(1))
    assert len(names) > 50, "the declarations were not found"
    return names


def test_every_cpp_op_is_reachable_from_python():
    missing = []
    for name in sorted(cpp_ops()):
        if name.startswith("operator"):
            continue  # Tensor's dunder methods (test_operators.py)
        if name in METHODS_ONLY:
            ok = hasattr(loom.Tensor, name)
        else:
            ok = hasattr(loom, name)
        if not ok:
            missing.append(name)
    assert not missing, f"C++ ops with no Python spelling: {missing}"


def test_every_direct_tensor_method_is_a_cpp_op():
    ops_h = cpp_ops()
    stray = [n for n in ops._DIRECT if n not in ops_h and ALIASES.get(n) not in ops_h]
    assert not stray, f"Tensor methods bound to no C++ op: {stray}"
    for n in ops._DIRECT:
        assert hasattr(loom, n) and hasattr(loom.Tensor, n), n


def test_the_aliases_and_method_lists_name_real_ops():
    ops_h = cpp_ops()
    assert all(v in ops_h for v in ALIASES.values())
    assert METHODS_ONLY <= ops_h
