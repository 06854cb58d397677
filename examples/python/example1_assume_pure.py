"""Seed Example 1: @assume_pure with a pure function, on loom."""
import loom
from loom import assume_pure

loom.reset_metrics()
traces = 0


@assume_pure
def do_math(a, b, c=42):
    """Pure function: same input → same output, no side effects."""
    global traces
    traces += 1  # runs only while tracing: counts the traces
    return a @ b + c


# Traced once, cached for all subsequent calls with same shapes
for i in range(1000):
    x = loom.randn(4, 4)
    y = loom.randn(4, 4)
    result = do_math(x, y, c=42)
    if i == 0:
        print("First call: traced and cached")
    # Subsequent calls: skip tracing, use cached computation

loom.sync()
print(f"Result shape: {result.shape}")
m = loom.metrics()
print(f"do_math traced {traces} time(s) for 1000 calls; cached calls: {m.pure_hits}")
