"""Seed Example 6: while_loop, on loom."""
import loom
from loom import while_loop


def cond_fn(iteri, x):
    return iteri > 0


def body_fn(iteri, x):
    return iteri - 1, loom.add(x, 1)


loom.reset_metrics()
init_val = loom.tensor(3)
iteri = loom.tensor(10)
_, res = while_loop(cond_fn, body_fn, (iteri, init_val))
print(f"Result: {res}")  # tensor(13)
m = loom.metrics()
print(f"cond and body traced {m.bodies_traced} time(s) for 10 trips; "
      f"{m.compiles} compilation(s)")
