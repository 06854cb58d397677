"""Seed Example 4 as a torch_xla user wrote it, on loom."""
import torch
import loom
import loom.torch as lt
from loom.torch import scan

device = lt.device()


# Cumulative sum
def cumsum(accumulated, element):
    accumulated = accumulated + element
    return accumulated, accumulated


init = torch.tensor([0.0], device=device)
xs = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=device)
lt.sync()

loom.reset_metrics()
final, result = scan(cumsum, init, xs)
lt.sync()
print(f"Final sum: {final}")       # tensor([15.])
print(f"History: {result}")        # tensor([[1.], [3.], [6.], [10.], [15.]])
m = lt.metrics()
print(f"body traced {m.bodies_traced} time(s) for 5 steps; {m.compiles} compilation(s)")
