"""loom.distributed over Gloo: ranks as processes on 127.0.0.1 started by python -m loom.launch
(python/tests/dist_worker.py holds each rank's checks against closed forms), data parallel
against one rank with the whole batch, the faults (each a DistError on every surviving rank
within twice the timeout, no process left behind), the launcher, bad arguments."""
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import loom
import loom.distributed as dist

HERE = pathlib.Path(__file__).parent
WORKER = str(HERE / "dist_worker.py")
TIMEOUT_S = 3.0  # LOOM_DIST_TIMEOUT for the fault cases


def env(**extra):
    e = dict(os.environ, LOOM_DIST_TIMEOUT=str(TIMEOUT_S), LOOM_DIST_ADDR="127.0.0.1")
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    e.update(extra)
    return e


def launch(n, *args, timeout=120):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "loom.launch", "-n", str(n), *args],
                       capture_output=True, text=True, env=env(), timeout=timeout, cwd=HERE)
    return r, time.monotonic() - t0


def free_tcp_store():
    """127.0.0.1:PORT with a port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("ranks,store", [(2, "dir"), (3, "tcp")])
def test_collectives_against_closed_forms(ranks, store):
    """Every collective and dtype, sizes past Gloo's segments, all_gather on dim 1, the
    gradient of all_reduce, a compiled trace_once step, barrier; the ranks meet through a
    fresh directory (the launcher's default) or a TCP store that rank 0 serves."""
    store_args = ["--store", free_tcp_store()] if store == "tcp" else []
    r, _ = launch(ranks, *store_args, WORKER, "collectives")
    assert r.returncode == 0, r.stdout + r.stderr
    for k in range(ranks):
        assert f"[rank {k}] ok" in r.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_tensor_parallel_equals_the_unsharded_layers(ranks):
    """ColumnParallelLinear, RowParallelLinear and ShardedCausalSelfAttention: forward and
    every gradient against the unsharded layers; sharded blocks through scan_layers."""
    r, _ = launch(ranks, WORKER, "tensor_parallel")
    assert r.returncode == 0, r.stdout + r.stderr
    for k in range(ranks):
        assert f"[rank {k}] ok" in r.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_mark_sharding_equals_the_unannotated_program(ranks):
    """Megatron-style weight annotations and a batch-dim annotation (data parallel), 3 SGD
    steps: losses and weights equal the unannotated program's; layouts kept; pieces in and
    out; bad specs raise the same error on every rank."""
    r, _ = launch(ranks, WORKER, "sharding")
    assert r.returncode == 0, r.stdout + r.stderr
    for k in range(ranks):
        assert f"[rank {k}] ok" in r.stdout


def test_loom_torch_mark_sharding_equals_torch():
    """torch_xla's spelling on loom.torch: a torch MLP annotated Megatron-style, torch.optim
    for 3 steps, against the same model on torch's CPU."""
    pytest.importorskip("torch")
    r, _ = launch(2, WORKER, "torch_sharding")
    assert r.returncode == 0, r.stdout + r.stderr
    for k in range(2):
        assert f"[rank {k}] ok" in r.stdout


def test_data_parallel_equals_one_rank_with_the_whole_batch(tmp_path):
    """2 ranks x 8 rows each, 20 SGD steps, against one process with all 16 rows."""
    out = tmp_path / "dp.npz"
    r, _ = launch(2, WORKER, "data_parallel", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    got = np.load(out)
    sys.path.insert(0, str(HERE))
    import dist_worker
    loom.manual_seed(1234)  # rank 0's initial weights, which DataParallel broadcast
    model = dist_worker.Net()
    xs, ys = dist_worker.data(16)
    dist_worker.train(model, loom.tensor(xs), loom.tensor(ys), lambda: None)
    want = {k: v.numpy() for k, v in model.state_dict().items()}
    assert sorted(got.files) == sorted(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("mode,what", [
    ("different_graphs", "First difference (rank 0 against rank 1)"),
    ("skipped_collective", "rank 1 calls barrier()"),
    ("different_shardings", "First difference (rank 0 against rank 1)"),
])
def test_faults_raise_on_every_rank(mode, what):
    r, seconds = launch(2, WORKER, mode)
    assert r.returncode == 3, r.stdout + r.stderr
    for k in range(2):
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith(f"[rank {k}] DistError")),
                    None)
        assert line is not None, r.stdout + r.stderr
        assert what in line and "not running the same collectives" in line, line
    assert seconds < 2 * TIMEOUT_S + 10  # interpreter starts and imports included


def test_dead_rank_is_named_within_the_timeout(tmp_path):
    """Without the launcher (which would end the survivor at once): rank 1 exits before the
    collective; rank 0 raises within the timeout, naming rank 1."""
    store = tmp_path / "store"
    store.mkdir()
    procs = []
    for k in range(2):
        e = env(LOOM_RANK=str(k), LOOM_WORLD_SIZE="2", LOOM_STORE=str(store))
        procs.append(subprocess.Popen([sys.executable, WORKER, "dead_rank"], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    t0 = time.monotonic()
    out0, err0 = procs[0].communicate(timeout=60)
    seconds = time.monotonic() - t0
    procs[1].wait(timeout=10)
    assert procs[1].returncode == 9
    assert procs[0].returncode == 3, out0 + err0
    assert "DistError" in out0 and "rank 1" in out0, out0
    assert seconds < 2 * TIMEOUT_S + 10


def test_launcher_prefixes_lines_and_ends_the_others_when_one_fails(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import os, sys, time\n"
        "r = int(os.environ['LOOM_RANK'])\n"
        "print('hello from', r, 'of', os.environ['LOOM_WORLD_SIZE'], flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\n"
        "open(os.path.join(sys.argv[1], f'pid{r}'), 'w').write(str(os.getpid()))\n"
        "if r == 1:  # fails once every rank has printed\n"
        "    while not all(os.path.exists(os.path.join(sys.argv[1], f'pid{k}')) for k in (0, 2)):\n"
        "        time.sleep(0.01)\n"
        "    sys.exit(5)\n"
        "time.sleep(60)\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "loom.launch", "-n", "3", str(script),
                        str(tmp_path)], capture_output=True, text=True, env=env(), timeout=60)
    assert time.monotonic() - t0 < 20
    assert r.returncode == 5, r.stdout + r.stderr
    for k in range(3):
        assert f"[rank {k}] hello from {k} of 3" in r.stdout
        assert f"[rank {k}] to stderr" in r.stderr
    assert "rank 1 failed (exit 5)" in r.stderr
    for k in range(3):
        pid = int((tmp_path / f"pid{k}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # no rank is left behind


def test_launcher_rank_offset_and_world_size(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import os\nprint(os.environ['LOOM_RANK'], os.environ['LOOM_LOCAL_RANK'], "
                      "os.environ['LOOM_WORLD_SIZE'], os.environ['LOOM_STORE'])\n")
    r = subprocess.run([sys.executable, "-m", "loom.launch", "-n", "2", "--rank-offset", "2",
                        "--world-size", "4", "--store", str(tmp_path), str(script)],
                       capture_output=True, text=True, env=env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"[rank 2] 2 0 4 {tmp_path}" in r.stdout
    assert f"[rank 3] 3 1 4 {tmp_path}" in r.stdout
    r = subprocess.run([sys.executable, "-m", "loom.launch", "-n", "2", "--world-size", "1",
                        str(script)], capture_output=True, text=True, env=env(), timeout=60)
    assert r.returncode == 2 and "world-size" in r.stderr


def test_one_process_world_and_bad_arguments():
    assert (dist.rank(), dist.world_size()) == (0, 1)
    with pytest.raises(ValueError, match="op must be 'sum', 'mean', 'max' or 'min'"):
        dist.all_reduce(loom.ones(2), op="prod")
    with pytest.raises(TypeError, match="argument 'tensor' must be a loom.Tensor"):
        dist.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="'dim' must be an int"):
        dist.all_gather(loom.ones(2), dim=0.5)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2"):
        dist.shard(10, rank=2, world_size=2)
    assert dist.shard(10, rank=1, world_size=3) == (3, 6)
    with pytest.raises(TypeError, match="must be a loom.nn.Module"):
        dist.DataParallel(object())
    if not dist.is_initialized():
        with pytest.raises(loom.DistError, match="no communicator"):
            dist.all_reduce(loom.ones(2))
    assert issubclass(loom.DistError, loom.Error)
