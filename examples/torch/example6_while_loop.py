"""Seed Example 6 as a torch_xla user wrote it, on loom (torch's while_loop signature)."""
import torch
import loom.torch as lt
from loom.torch import while_loop

device = lt.device()


def cond_fn(iteri, x):
    return iteri > 0


def body_fn(iteri, x):
    return iteri - 1, torch.add(x, 1)


init_val = torch.tensor(3, device=device)
iteri = torch.tensor(10, device=device)
_, res = while_loop(cond_fn, body_fn, (iteri, init_val))
print(f"Result: {res}")  # tensor(13, device='xla:0')
