"""Benchmark: tumbling `fold_window` (sum) over timestamped events, flowspark vs bytewax 0.21.1.

    python benchmarks/windowing.py [--events 1000000] [--keys 10000] [--window-minutes 5]

Both libraries run the same flow in one process, one after the other: a
`TestingSource` of pre-built `(key, (timestamp, amount))` items (batch_size 1000),
`fold_window` with an `EventClock` (10 s wait) over 5-minute tumbling windows,
and a sink that counts what it receives. Event times span one hour starting at
the current time (so no window is due on the system clock while the flow runs)
with up to 2 s of jitter (out of order within the wait). The results of both
runs are compared (per key and window) before the figures are printed. (An
`EventClock` watermark also advances with system time, so a very slow run could
in principle see a value as late; the wait is long enough that this needs more
than 6 s of processing between two events of one key.)

Both wall-clock and process CPU time are printed (bytewax runs in this single
thread too, so CPU time compares like with like): on a shared machine the CPU
time is the steadier figure. `--repeat N` alternates N runs of each and keeps
each library's best.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import chart  # benchmarks/chart.py: --chart PNG, --record FILE

WAIT = timedelta(seconds=10)


def make_events(n: int, keys: int, seed: int = 7) -> tuple[datetime, list[tuple[str, tuple[datetime, int]]]]:
    rng = random.Random(seed)
    start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=1)
    span_us = 3600 * 1_000_000
    names = [f"k{i}" for i in range(keys)]
    out = []
    for i in range(n):
        base_us = span_us * i // n
        ts = start + timedelta(microseconds=base_us + rng.randint(-2_000_000, 2_000_000))
        out.append((names[rng.randrange(keys)], (ts, rng.randint(-50, 100))))
    return start, out


def get_ts(tv: tuple[datetime, int]) -> datetime:
    return tv[0]


def add(acc: int, tv: tuple[datetime, int]) -> int:
    return acc + tv[1]


def merge(a: int, b: int) -> int:
    return a + b


def zero() -> int:
    return 0


def run_flowspark(events: list[Any], start: datetime, length: timedelta) -> tuple[float, list[Any], int]:
    import flowspark.operators as op
    import flowspark.operators.windowing as win
    from flowspark.dataflow import Dataflow
    from flowspark.testing import TestingSink, TestingSource, run_main

    flow = Dataflow("bench")
    s = op.input("inp", flow, TestingSource(events, batch_size=1000))
    clock = win.EventClock(get_ts, WAIT)
    w = win.fold_window("sum", s, clock, win.TumblingWindower(length, start), zero, add, merge)
    down: list[Any] = []
    late: list[Any] = []
    op.output("down", w.down, TestingSink(down))
    op.output("late", w.late, TestingSink(late))
    t0, c0 = time.perf_counter(), time.process_time()
    run_main(flow)
    return (time.perf_counter() - t0, time.process_time() - c0), down, len(late)


def run_bytewax(events: list[Any], start: datetime, length: timedelta) -> tuple[float, list[Any], int]:
    import bytewax.operators as bop
    import bytewax.operators.windowing as bwin
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main

    flow = Dataflow("bench")
    s = bop.input("inp", flow, TestingSource(events, batch_size=1000))
    clock = bwin.EventClock(get_ts, WAIT)
    w = bwin.fold_window("sum", s, clock, bwin.TumblingWindower(length, start), zero, add, merge)
    down: list[Any] = []
    late: list[Any] = []
    bop.output("down", w.down, TestingSink(down))
    bop.output("late", w.late, TestingSink(late))
    t0, c0 = time.perf_counter(), time.process_time()
    run_main(flow)
    return (time.perf_counter() - t0, time.process_time() - c0), down, len(late)


def report(name: str, n: int, wall: float, cpu: float, windows: int, late: int) -> None:
    print(
        f"{name:10s} wall {wall:7.2f} s = {n / wall:10,.0f} events/s | "
        f"cpu {cpu:7.2f} s = {n / cpu:10,.0f} events/s | {windows} windows, {late} late"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--window-minutes", type=float, default=5.0)
    ap.add_argument("--skip-bytewax", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each library; the best time of each is kept")
    chart.add_arguments(ap)
    args = ap.parse_args()
    length = timedelta(minutes=args.window_minutes)
    start, events = make_events(args.events, args.keys)
    n = len(events)
    print(f"{n} events, {args.keys} keys, {length} tumbling windows, wait {WAIT}")

    fs_wall = fs_cpu = bw_wall = bw_cpu = float("inf")
    for _ in range(args.repeat):  # alternate the two; keep each one's best time
        (wall, cpu), fs_down, fs_late = run_flowspark(events, start, length)
        fs_wall, fs_cpu = min(fs_wall, wall), min(fs_cpu, cpu)
        if args.skip_bytewax:
            continue
        (wall, cpu), bw_down, bw_late = run_bytewax(events, start, length)
        bw_wall, bw_cpu = min(bw_wall, wall), min(bw_cpu, cpu)
    report("flowspark", n, fs_wall, fs_cpu, len(fs_down), fs_late)
    figures = {"flowspark": n / fs_wall} if args.skip_bytewax else {"flowspark": n / fs_wall, "bytewax": n / bw_wall}
    chart.write(args, f"tumbling windows in memory, {n:,} events, {args.keys:,} keys (best wall)", figures)
    if args.skip_bytewax:
        return
    report("bytewax", n, bw_wall, bw_cpu, len(bw_down), bw_late)
    same = Counter(fs_down) == Counter(bw_down) and fs_late == bw_late
    print(f"results identical: {same}")
    print(f"ratio flowspark/bytewax (events/s): wall {bw_wall / fs_wall:.2f}x, cpu {bw_cpu / fs_cpu:.2f}x")
    if not same:
        raise SystemExit("results differ between flowspark and bytewax")


if __name__ == "__main__":
    main()
