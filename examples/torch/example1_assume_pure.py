"""Seed Example 1 as a torch_xla user wrote it, on loom: only the imports and the device differ."""
import torch
import loom
import loom.torch as lt
from loom.torch import assume_pure

device = lt.device()


@assume_pure
def do_math(a, b, c=42):
    """Pure function: same input → same output, no side effects."""
    return a @ b + c


loom.reset_metrics()
# Traced once, cached for all subsequent calls with same shapes
for i in range(1000):
    x = torch.randn(4, 4, device=device)
    y = torch.randn(4, 4, device=device)
    result = do_math(x, y, c=42)
    if i == 0:
        print("First call: traced and cached")
    # Subsequent calls: skip tracing, use cached computation

lt.sync()
print(f"Result shape: {result.shape}")
m = lt.metrics()
print(f"do_math traced {m.bodies_traced} time(s) for 1000 calls; cached calls: {m.pure_hits}")
