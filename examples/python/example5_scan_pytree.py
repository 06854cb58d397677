"""Seed Example 5: scan with a dict pytree, on loom."""
import loom
from loom import scan

# Running mean using dict PyTree
carry = {
    'sum': loom.tensor([0.0]),
    'count': loom.tensor([0.0])
}
xs = {'values': loom.arange(1, 6, dtype=loom.float32)}


def fn(carry_dict, x_dict):
    new_sum = carry_dict['sum'] + x_dict['values']
    new_count = carry_dict['count'] + 1.0
    new_carry = {'sum': new_sum, 'count': new_count}
    running_mean = new_sum / new_count
    return new_carry, running_mean


loom.reset_metrics()
final_carry, means = scan(fn, carry, xs)
loom.sync()
print(f"Final carry: {final_carry}")
print(f"Means over time: {means}")
m = loom.metrics()
print(f"body traced {m.bodies_traced} time(s) for 5 steps; {m.compiles} compilation(s)")
