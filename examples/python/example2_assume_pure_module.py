"""Seed Example 2: @assume_pure with an nn.Module, on loom."""
import loom
import loom.nn as nn
from loom.nn import functional_call
from loom import assume_pure


class MyModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 10)

    def forward(self, x):
        return self.linear(x)


module = MyModule()

# Convert module forward to pure function
pure_forward = lambda params, buffers, x: functional_call(  # noqa: E731 (the seed's form)
    module, (params, buffers), (x,)
)
cached_forward = assume_pure(pure_forward)

# Training loop — forward traced once per shape
params = dict(module.named_parameters())
buffers = dict(module.named_buffers())

loom.reset_metrics()
for step in range(1000):
    x = loom.randn(5, 10)
    y = cached_forward(params, buffers, x)
    # ... loss, backward, optimizer step
    if step % 100 == 99:
        loom.sync()

loom.sync()
m = loom.metrics()
print(f"Output shape: {y.shape}")
print(f"forward traced {m.bodies_traced} time(s) for 1000 steps; cached calls: {m.pure_hits}")
