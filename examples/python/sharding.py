"""The seed's decoder (Example 3) written once at global shapes and laid out by annotations, as
torch_xla's `xs.mark_sharding` users do: first Megatron-style (each pair of layers: the first
weight split by rows, the second by columns), then data parallel as one annotation of the
batch dim. Each run trains from the same weights on the same batches as the unannotated
program, and rank 0 prints the three loss curves and the collectives the partitioner inserted.

    PYTHONPATH=build/python .venv/bin/python -m loom.launch -n 2 examples/python/sharding.py
"""
import loom
import loom.distributed as dist
import loom.nn as nn
from loom import scan_layers

PAIRS, DIM, BATCH, SEQ, STEPS = 4, 128, 16, 32, 20


class DecoderLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.linear(x)) + x  # residual


class Pair(nn.Module):  # the unit scan_layers repeats: column then row
    def __init__(self, dim):
        super().__init__()
        self.first, self.second = DecoderLayer(dim), DecoderLayer(dim)

    def forward(self, x):
        return self.second(self.first(x))


class Decoder(nn.Module):
    def __init__(self, dim, pairs):
        super().__init__()
        self.layers = nn.ModuleList([Pair(dim) for _ in range(pairs)])

    def forward(self, x):
        return scan_layers(self.layers, x)


def train(annotate_model=None, annotate_batch=None):
    loom.manual_seed(0)
    model = Decoder(DIM, PAIRS)
    if annotate_model:
        annotate_model(model)
    opt = loom.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    @loom.compile(trace_once=True)
    def step(x, y):
        opt.zero_grad()
        loss = loom.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    loom.manual_seed(1)
    target = loom.randn(DIM, DIM) * DIM ** -0.5
    losses = []
    for _ in range(STEPS):
        x = loom.randn(BATCH, SEQ, DIM)
        y = loom.tanh(x @ target)
        if annotate_batch:
            annotate_batch(x, y)
        losses.append(step(x, y).item())
    return losses, dist.sharding_report()


def main():
    dist.init()
    world = dist.world_size()
    model_mesh = dist.Mesh((world,), ("model",))
    data_mesh = dist.Mesh((world,), ("data",))

    def megatron(model):
        for pair in model.layers:
            dist.mark_sharding(pair.first.linear.weight, model_mesh, ("model", None))  # column
            dist.mark_sharding(pair.first.linear.bias, model_mesh, ("model",))
            dist.mark_sharding(pair.second.linear.weight, model_mesh, (None, "model"))  # row

    def batch(x, y):
        dist.mark_sharding(x, data_mesh, ("data", None, None))
        dist.mark_sharding(y, data_mesh, ("data", None, None))

    plain, _ = train()
    column_row, report = train(annotate_model=megatron)
    data, _ = train(annotate_batch=batch)
    if dist.rank() == 0:
        print(f"{'step':>4}  {'unannotated':>11}  {'column/row':>10}  {'batch dim':>9}")
        for s in range(STEPS):
            if s == 0 or (s + 1) % 5 == 0:
                print(f"{s + 1:4d}  {plain[s]:11.5f}  {column_row[s]:10.5f}  {data[s]:9.5f}")
        worst = max(abs(run[s] - plain[s]) / abs(plain[s])
                    for run in (column_row, data) for s in range(STEPS))
        print(f"{world} ranks; largest relative loss difference {worst:.1e}")
        print("collectives the partitioner inserted into the column/row step:")
        for op in ("mesh_all_reduce", "mesh_all_gather", "mesh_slice"):
            print(f"  {op}: {report.count(op)}")


if __name__ == "__main__":
    main()
