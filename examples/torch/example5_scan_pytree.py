"""Seed Example 5 as a torch_xla user wrote it, on loom."""
import torch
import loom.torch as lt
from loom.torch import scan

device = lt.device()

# Running mean using dict PyTree
carry = {
    'sum': torch.tensor([0.0], device=device),
    'count': torch.tensor([0.0], device=device)
}
xs = {'values': torch.arange(1, 6, dtype=torch.float32, device=device)}


def fn(carry_dict, x_dict):
    new_sum = carry_dict['sum'] + x_dict['values']
    new_count = carry_dict['count'] + 1.0
    new_carry = {'sum': new_sum, 'count': new_count}
    running_mean = new_sum / new_count
    return new_carry, running_mean


final_carry, means = scan(fn, carry, xs)
lt.sync()
print(f"Final carry: {final_carry}")
print(f"Means over time: {means}")
