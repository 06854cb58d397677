"""Seed Example 4: scan for a cumulative sum, on loom."""
import loom
from loom import scan


# Cumulative sum
def cumsum(accumulated, element):
    accumulated = accumulated + element
    return accumulated, accumulated


init = loom.tensor([0.0])
xs = loom.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
loom.sync()

loom.reset_metrics()
final, result = scan(cumsum, init, xs)
loom.sync()
print(f"Final sum: {final}")       # tensor([15.])
print(f"History: {result}")        # tensor([[1.], [3.], [6.], [10.], [15.]])
m = loom.metrics()
print(f"body traced {m.bodies_traced} time(s) for 5 steps; {m.compiles} compilation(s)")
