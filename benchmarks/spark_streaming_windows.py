"""Streaming windows benchmark: per-user 1-minute tumbling counts over a parquet file stream, on local[2].

In one run with one session (each job first warmed up on a small input), over the same
events (`--events`, default 1M; `--users` 10k; event times spread evenly over `--minutes`
minutes with up to 2 s of jitter, so each of the `--batches` parquet files holds about
`minutes / batches` minutes of events, out of order within the wait):

1. flowspark: `SparkSource("parquet", streaming=True, maxFilesPerTrigger=1)` ->
   `count_window` (per user, `TumblingWindower(1 minute)`, `EventClock(wait 10 s)`) ->
   `map` to a row -> `SparkSink("parquet")`;
2. Spark's native job: `withWatermark("ts", "10 seconds")` +
   `groupBy(user, window(ts, "1 minute")).count()` in append mode to parquet.

Printed: seconds of each job (and events/s), Spark's `triggerExecution` seconds of each
micro-batch that read rows, and the ratio of the times (target <= 1.0x). The watermarks differ (flowspark
keeps one per user, Spark one for the query), so each job closes a different set of windows
by the end of the stream; the counts are checked equal on every window both closed, and
the numbers of windows each closed are printed.

Usage: python benchmarks/spark_streaming_windows.py [--events 1000000] [--users 10000]
       [--batches 10] [--minutes 10] [--repeat 1] [--layouts default,bucket] [--chart PNG] [--record FILE]

`--layouts` runs flowspark once per state layout in each repeat (`default`: a new checkpoint's
layout, the only one by default), each against the same native job.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import chart  # benchmarks/chart.py: --chart PNG, --record FILE

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.outputs import SparkSink

#: Event times start here (a minute boundary: window ids are minutes since START).
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
WAIT = timedelta(seconds=10)
LENGTH = timedelta(minutes=1)
SCHEMA = "user STRING, ts TIMESTAMP"


def _user(r: dict[str, Any]) -> str:
    return r["user"]


def _ts(r: dict[str, Any]) -> datetime:
    return r["ts"]


def _row(kv: tuple[str, tuple[int, int]]) -> dict[str, Any]:
    return {"user": kv[0], "wid": kv[1][0], "n": kv[1][1]}


def write_events(path: str, events: int, users: int, batches: int, minutes: int, seed: int = 7) -> None:
    """`events` rows `(user, ts)` in `batches` parquet files, in time order up to 2 s of jitter."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    span_us = minutes * 60 * 1_000_000
    base_us = int(START.timestamp() * 1_000_000)
    names = np.array([f"u{i:05d}" for i in range(users)], dtype=object)
    step = events // batches
    for b in range(batches):
        lo, hi = b * step, events if b == batches - 1 else (b + 1) * step
        i = np.arange(lo, hi, dtype=np.int64)
        ts = base_us + span_us * i // events + rng.integers(-2_000_000, 2_000_001, hi - lo)
        ts = np.maximum(ts, base_us)  # nothing before START (window ids >= 0)
        us = names[rng.integers(0, users, hi - lo)]
        table = pa.table({"user": pa.array(us, pa.string()), "ts": pa.array(ts, pa.timestamp("us", tz="UTC"))})
        pq.write_table(table, os.path.join(path, f"b{b:04d}.parquet"))


def build_flow(src: str, out: str) -> Dataflow:
    """The flowspark flow (`flowspark plan --spark 'benchmarks/spark_streaming_windows.py:build_flow("in", "out")'`)."""
    flow = Dataflow("bench_windows")
    s = op.input(
        "inp", flow, SparkSource("parquet", src, schema=SCHEMA, options={"maxFilesPerTrigger": "1"}, streaming=True)
    )
    clock = win.EventClock(_ts, wait_for_system_duration=WAIT)
    w = win.count_window("count", s, clock, win.TumblingWindower(LENGTH, START), _user)
    op.output("out", op.map("row", w.down, _row), SparkSink("parquet", out, schema="user STRING, wid LONG, n LONG"))
    return flow


def run_flowspark(spark: Any, src: str, work: str, layout: str = "default") -> tuple[float, list[float]]:
    """Run the flowspark flow over every file; (seconds, each data micro-batch's seconds)."""
    from flowspark.spark import run

    flow = build_flow(src, f"{work}/out")
    t0 = time.perf_counter()
    chosen = None if layout == "default" else layout
    sr = run(flow, spark=spark, checkpoint=f"{work}/chk", trigger="available_now", progress=False, state_layout=chosen)
    total = time.perf_counter() - t0
    assert sr is not None
    return total, _batch_seconds(sr.query.recentProgress)


def run_native(spark: Any, src: str, work: str) -> tuple[float, list[float]]:
    """Spark's own windowed count over the same files; (seconds, each data micro-batch's seconds)."""
    from pyspark.sql import functions as F  # noqa: TID251

    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(src)
    counts = (
        df.withWatermark("ts", f"{int(WAIT.total_seconds())} seconds")
        .groupBy("user", F.window("ts", "1 minute"))
        .count()
        .select(
            "user",
            ((F.unix_seconds(F.col("window.start")) - int(START.timestamp())) / 60).cast("long").alias("wid"),
            F.col("count").alias("n"),
        )
    )
    t0 = time.perf_counter()
    query = (
        counts.writeStream.format("parquet")
        .outputMode("append")
        .option("path", f"{work}/out")
        .option("checkpointLocation", f"{work}/chk")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - t0, _batch_seconds(query.recentProgress)


def _batch_seconds(progress: Any) -> list[float]:
    return [p["durationMs"]["triggerExecution"] / 1000 for p in progress if p["numInputRows"] > 0]


def compare(spark: Any, fs_out: str, native_out: str, events: int) -> tuple[int, int, int]:
    """Check the counts of every window both jobs closed; return (flowspark's, native's, common) window counts."""
    fs = {(r["user"], r["wid"]): r["n"] for r in spark.read.parquet(fs_out).collect()}
    nat = {(r["user"], r["wid"]): r["n"] for r in spark.read.parquet(native_out).collect()}
    assert len(fs) == spark.read.parquet(fs_out).count(), "flowspark closed a window twice"
    common = fs.keys() & nat.keys()
    bad = [(k, fs[k], nat[k]) for k in common if fs[k] != nat[k]]
    assert not bad, f"{len(bad)} windows differ, e.g. {sorted(bad)[:5]}"
    assert common, "no window closed by both jobs"
    assert sum(fs.values()) <= events
    assert sum(nat.values()) <= events
    return len(fs), len(nat), len(common)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each job (alternating which goes first); best")
    ap.add_argument("--layouts", default="default", help="flowspark's state layouts: default,bucket,key,chunk")
    chart.add_arguments(ap)
    args = ap.parse_args()
    layouts = args.layouts.split(",")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    from flowspark.spark.session import get_session

    spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    work = tempfile.mkdtemp(prefix="fs_windows_bench_")
    n, b = args.events, args.batches
    try:
        src = f"{work}/events"
        write_events(src, n, args.users, b, args.minutes)
        # Warm-up: both jobs once on 2% of the events, in 2 micro-batches.
        write_events(f"{work}/warm_events", max(2, n // 50), args.users, 2, 2)
        for layout in layouts:
            run_flowspark(spark, f"{work}/warm_events", f"{work}/warm_fs_{layout}", layout)
        run_native(spark, f"{work}/warm_events", f"{work}/warm_native")
        from flowspark.spark.streaming.state import LAYOUTS

        print(
            f"{n:,} events, {args.users:,} users, {args.minutes} minutes of event time, {b} parquet micro-batches, "
            f"1-minute tumbling counts, wait 10 s, local[2]; the default layout (a new checkpoint's): {LAYOUTS[0]!r}"
        )
        fs_runs: dict[str, list[tuple[float, list[float]]]] = {layout: [] for layout in layouts}
        nat_runs: list[tuple[float, list[float]]] = []
        for r in range(args.repeat):
            jobs = [*layouts, "native"]
            for name in jobs if r % 2 == 0 else jobs[::-1]:
                out = f"{work}/{name}_{r}"
                if name == "native":
                    nat_runs.append(run_native(spark, src, out))
                else:
                    fs_runs[name].append(run_flowspark(spark, src, out, name))
            nat_s = nat_runs[-1][0]
            for layout in layouts:
                windows = compare(spark, f"{work}/{layout}_{r}/out", f"{work}/native_{r}/out", n)
                fs_s = fs_runs[layout][-1][0]
                print(
                    f"repeat {r + 1}: flowspark ({layout}) {fs_s:.1f} s, native {nat_s:.1f} s: {fs_s / nat_s:.2f}x; "
                    f"windows closed: flowspark {windows[0]:,}, native {windows[1]:,}, both {windows[2]:,} "
                    "(equal counts on all)"
                )
        best = f"(best of {args.repeat})" if args.repeat > 1 else ""
        nat_s, nat_b = min(nat_runs)
        for layout in layouts:
            fs_s, fs_b = min(fs_runs[layout])
            print(f"flowspark count_window ({layout}): {fs_s:6.1f} s  {n / fs_s:>10,.0f} events/s  {best}")
            print(f"  micro-batches: {' '.join(f'{x:.2f}' for x in fs_b)} s")
        print(f"Spark withWatermark + groupBy(user, window):   {nat_s:6.1f} s  {n / nat_s:>10,.0f} events/s  {best}")
        print(f"  micro-batches: {' '.join(f'{x:.2f}' for x in nat_b)} s")
        for layout in layouts:
            print(f"flowspark ({layout}) / native: {min(fs_runs[layout])[0] / nat_s:.2f}x the time  (target <= 1.0x)")
        figures = {f"flowspark count_window ({layout})": n / min(fs_runs[layout])[0] for layout in layouts}
        figures["Spark withWatermark + groupBy(user, window)"] = n / nat_s
    finally:
        shutil.rmtree(work, ignore_errors=True)
    title = f"Spark streaming 1-minute tumbling counts, {n:,} events, {args.users:,} users, {b} micro-batches"
    chart.write(args, title, figures)


if __name__ == "__main__":
    main()
