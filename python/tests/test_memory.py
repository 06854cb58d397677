"""A long run of traced ops, syncs and tracing-tool calls does not grow the process: resident
memory (the C++ side) and Python allocations (tracemalloc) after a warm-up round equal those
after many more rounds, within a small slack."""
import gc
import resource
import tracemalloc

import loom


def rss_kib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() // 1024


def one_round(scan_body, pure):
    # 100 syncs of 100 traced ops each: 10,000 ops per round
    x, y = loom.ones(16), loom.ones(16)
    for _ in range(100):
        for _ in range(50):
            x = x * 1.0001 + y
        loom.sync()
    final, ys = loom.scan(scan_body, loom.zeros(4), loom.ones(8, 4))
    z = pure(final, ys, scale=2.0)
    z.tolist()


def test_traced_ops_and_syncs_do_not_grow_memory():
    def body(c, v):
        return c + v, c.sum()

    @loom.assume_pure
    def pure(a, b, scale=1.0):
        return a.sum() + b.sum() * scale

    for _ in range(2):  # warm-up: compile caches, allocator pools
        one_round(body, pure)
    gc.collect()
    tracemalloc.start()
    rss0 = rss_kib()
    snap0 = tracemalloc.take_snapshot()
    for _ in range(10):  # 100,000 traced ops and 1,000 syncs
        one_round(body, pure)
    gc.collect()
    snap1 = tracemalloc.take_snapshot()
    rss1 = rss_kib()
    tracemalloc.stop()
    py_growth = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
    assert py_growth < 256 * 1024, snap1.compare_to(snap0, "lineno")[:5]
    # a leak of one 16-float tensor per op would be >= 6 MiB here
    assert rss1 - rss0 < 4096, (rss0, rss1)
