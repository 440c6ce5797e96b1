"""Benchmark: flowspark's in-memory executor against bytewax 0.21.1's run_main.

    python benchmarks/local_executor.py [--events 1000000] [--keys 10000] [--repeat 3] [--flows abc]

Three flows over the same pre-built `(key, amount)` items (`--events` items,
keys drawn at random from `--keys` names, amounts 1..100):

- (a) `map` -> `filter` -> `map_value` -> `filter_value` chain (stateless)
- (b) `stateful_map` running count per key (one output per input)
- (c) `fold_final` sum per key (one output per key at EOF)

Each flow is built with the same code against both libraries (flowspark mirrors
the Bytewax API) and run with each library's `run_main` in this process, the
runs alternating: flowspark (TestingSource batch_size=1, the default),
bytewax (batch_size=1, the default), and, as second references, bytewax and
flowspark with batch_size=1000. Every run's output is checked against the first
run of the same flow (as a multiset: bytewax reorders across keys inside a
batch). The input list is built once and frozen out of the garbage collector
(`gc.freeze()`) for all runs alike; `gc.collect()` runs before each timed run.

Printed per flow and runner: the best (as `timeit` reports) and the median wall
time over `--repeat` runs with their events/s, events/s from the best process
CPU time (steadier on a shared machine), and the ratios to bytewax with the
default batch size. Targets, judged on the best wall times:
flowspark >= 3x bytewax (default batch size) on every flow, and >= 500k
events/s on (b).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections import Counter
from typing import Any

import chart  # benchmarks/chart.py: --chart PNG, --record FILE

TARGET_RATIO = 3.0
TARGET_B_EPS = 500_000


def make_items(n: int, keys: int, seed: int = 11) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    names = [f"user{i}" for i in range(keys)]
    return [(names[rng.randrange(keys)], rng.randint(1, 100)) for _ in range(n)]


# The user functions of the three flows (shared by both libraries).
def scale(kv: tuple[str, int]) -> tuple[str, int]:
    return (kv[0], kv[1] * 3)


def is_odd(kv: tuple[str, int]) -> bool:
    return kv[1] % 2 == 1


def add_fee(v: int) -> int:
    return v + 1


def is_big(v: int) -> bool:
    return v > 50


def count(n: Any, _v: int) -> tuple[int, int]:
    n = (n or 0) + 1
    return n, n


def zero() -> int:
    return 0


def add(acc: int, v: int) -> int:
    return acc + v


def build(lib: dict[str, Any], which: str, items: list[Any], batch_size: int, out: list[Any]) -> Any:
    op = lib["op"]
    flow = lib["Dataflow"](f"bench_{which}")
    s = op.input("inp", flow, lib["TestingSource"](items, batch_size))
    if which == "a":
        s = op.map("scale", s, scale)
        s = op.filter("odd", s, is_odd)
        s = op.map_value("fee", s, add_fee)
        s = op.filter_value("big", s, is_big)
    elif which == "b":
        s = op.stateful_map("count", s, count)
    elif which == "c":
        s = op.fold_final("sum", s, zero, add)
    else:
        raise ValueError(f"unknown flow {which!r}; use a, b or c")
    op.output("out", s, lib["TestingSink"](out))
    return flow


def load_flowspark() -> dict[str, Any]:
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.testing import TestingSink, TestingSource, run_main

    return {"op": op, "Dataflow": Dataflow, "TestingSource": TestingSource, "TestingSink": TestingSink, "run": run_main}


def load_bytewax() -> dict[str, Any]:
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main

    return {"op": op, "Dataflow": Dataflow, "TestingSource": TestingSource, "TestingSink": TestingSink, "run": run_main}


FLOW_NAMES = {
    "a": "(a) map+filter chain",
    "b": "(b) stateful_map running count",
    "c": "(c) fold_final sum per key",
}


def timed_run(lib: dict[str, Any], which: str, items: list[Any], batch_size: int) -> tuple[float, float, list[Any]]:
    out: list[Any] = []
    flow = build(lib, which, items, batch_size, out)
    gc.collect()
    w0 = time.perf_counter()
    c0 = time.process_time()
    lib["run"](flow)
    cpu = time.process_time() - c0
    wall = time.perf_counter() - w0
    return wall, cpu, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="items per run (default 1000000)")
    ap.add_argument("--keys", type=int, default=10_000, help="distinct keys (default 10000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per flow and runner; medians are reported (default 3)")
    ap.add_argument("--flows", default="abc", help="which flows to run, e.g. 'b' (default abc)")
    chart.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.events < 1 or args.keys < 1 or args.repeat < 1:
        ap.error("--events, --keys and --repeat must be >= 1")
    flows = list(dict.fromkeys(args.flows))
    for f in flows:
        if f not in FLOW_NAMES:
            ap.error(f"unknown flow {f!r} in --flows; use letters from 'abc'")

    import bytewax

    print(f"python {sys.version.split()[0]}; bytewax {getattr(bytewax, '__version__', '0.21.1')}")
    print(f"events={args.events} keys={args.keys} repeat={args.repeat}")
    t0 = time.perf_counter()
    items = make_items(args.events, args.keys)
    gc.collect()
    gc.freeze()
    print(f"built input in {time.perf_counter() - t0:.1f}s")

    fs, bw = load_flowspark(), load_bytewax()
    runners: list[tuple[str, dict[str, Any], int]] = [
        ("flowspark bs=1", fs, 1),
        ("bytewax   bs=1", bw, 1),
        ("bytewax   bs=1000", bw, 1000),
        ("flowspark bs=1000", fs, 1000),
    ]
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    expected: dict[str, Counter[Any]] = {}
    for rep in range(args.repeat):
        for which in flows:
            for name, lib, bs in runners:
                wall, cpu, out = timed_run(lib, which, items, bs)
                got = Counter(out)
                if which not in expected:
                    expected[which] = got
                elif got != expected[which]:
                    print(f"ERROR: {name} gave a different output for flow {which}", file=sys.stderr)
                    return 2
                walls.setdefault((which, name), []).append(wall)
                cpus.setdefault((which, name), []).append(cpu)
                print(
                    f"  run {rep + 1}/{args.repeat} flow {which} {name:<18} {wall:7.2f}s wall "
                    f"{cpu:7.2f}s cpu  {len(out)} outputs",
                    flush=True,
                )

    n = args.events
    ok = True
    ref = "bytewax   bs=1"
    print()
    print("best = fastest of the --repeat runs (as timeit reports); med = median; cpu = process CPU time")
    print(
        f"{'flow / runner':<24} {'best s':>7} {'best ev/s':>11} {'med s':>7} {'med ev/s':>11} "
        f"{'cpu ev/s':>11} {'x bytewax bs=1: best':>21} {'med':>6} {'cpu':>6}"
    )
    for which in flows:
        print(FLOW_NAMES[which])
        ref_b, ref_m, ref_c = min(walls[(which, ref)]), statistics.median(walls[(which, ref)]), min(cpus[(which, ref)])
        for name, _lib, _bs in runners:
            b = min(walls[(which, name)])
            m = statistics.median(walls[(which, name)])
            c = min(cpus[(which, name)])
            print(
                f"  {name:<22} {b:7.2f} {n / b:11,.0f} {m:7.2f} {n / m:11,.0f} {n / c:11,.0f} "
                f"{ref_b / b:21.2f} {ref_m / m:6.2f} {ref_c / c:6.2f}"
            )
        fb = min(walls[(which, "flowspark bs=1")])
        ratio = ref_b / fb
        hit = ratio >= TARGET_RATIO
        ok &= hit
        verdict = "MET" if hit else "MISSED"
        print(f"  target flowspark >= {TARGET_RATIO:.0f}x bytewax (bs=1), best wall: {ratio:.2f}x {verdict}")
        if which == "b":
            eps = n / fb
            hit_b = eps >= TARGET_B_EPS
            ok &= hit_b
            verdict = "MET" if hit_b else "MISSED"
            print(f"  target flowspark >= {TARGET_B_EPS:,} events/s, best wall: {eps:,.0f} {verdict}")
    print()
    print("all targets met" if ok else "some targets missed (see above)")
    figures = {f"{which} {name}": n / min(walls[(which, name)]) for which in flows for name, _lib, _bs in runners}
    chart.write(args, f"in-memory executor vs bytewax, {n:,} events, {args.keys:,} keys (best wall)", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
