"""Seed Example 2 as a torch_xla user wrote it, on loom (torch.func.functional_call on torch 2.x;
torch 1.13 has it as torch.nn.utils.stateless.functional_call)."""
import torch
import torch.nn as nn
try:
    from torch.func import functional_call
except ImportError:  # torch 1.13
    from torch.nn.utils.stateless import functional_call
import loom.torch as lt
from loom.torch import assume_pure


class MyModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 10)

    def forward(self, x):
        return self.linear(x)


module = MyModule().to(lt.device())

# Convert module forward to pure function
pure_forward = lambda params, buffers, x: functional_call(  # noqa: E731
    module, (params, buffers) if hasattr(torch, "func") else {**params, **buffers}, (x,)
)
cached_forward = assume_pure(pure_forward)

# Training loop — forward traced once per shape
params = dict(module.named_parameters())
buffers = dict(module.named_buffers())
opt = torch.optim.SGD(module.parameters(), lr=0.01)

lt.metrics()
import loom  # noqa: E402
loom.reset_metrics()
for step in range(1000):
    x = torch.randn(5, 10, device=lt.device())
    y = cached_forward(params, buffers, x)
    loss = (y * y).mean()  # ... loss, backward, optimizer step
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 100 == 99:
        lt.sync()
print(f"Output shape: {y.shape}; loss {loss.item():.4f}")
m = lt.metrics()
print(f"forward traced {m.bodies_traced} time(s) for 1000 steps (forward and its gradient "
      f"signature); cached calls: {m.pure_hits}; {m.compiles} compilation(s)")
