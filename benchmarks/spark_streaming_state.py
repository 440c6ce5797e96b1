"""Streaming state benchmark: hot micro-batches and filling as the keys held in state grow; timers; TTL.

For each state layout (`state_layout="bucket"`: applyInPandasWithState, one state row per
bucket; `"key"`: transformWithStateInPandas, one state row per key; `"chunk"`: the same, cold
keys in rows of many keys) and each N:

1. the state is filled with N keys (parquet files of up to 1M new keys, one file per
   micro-batch);
2. then `--hot` micro-batches of 100k events each touch the same 10k hot keys (keys already
   in state).

The flow is what a user writes: `SparkSource("parquet", streaming=True)` -> `key_on` ->
`stateful_map` (running count) -> `map` to a dict -> `SparkSink("parquet")` with a schema.
Printed: seconds per hot micro-batch (median of Spark's `triggerExecution` durations), its
ratio to the smallest N in the same layout, the first hot micro-batch after the fill over the
median of the next ones (target <= 2x), the fill rate (new keys/s), and each layout's figures
over the bucket layout's (fill target >= 1.0x). Everything runs in one process with one
session, so the ratios are measured in one run.

`--timers 10000,1000000`: the same with `op.stateful` whose logic keeps a `notify_at` one
hour ahead for every key (none is due during the run): every key in state holds a pending
timer; printed: hot micro-batch seconds with each N and the ratio to the smallest (target
<= 1.5x).

`--ttl N`: a running count with `state_ttl=--ttl-seconds` fills N keys, waits for the TTL
to pass, then runs `--hot` micro-batches over 10k *other* keys: the expired keys are never
touched. Printed per layout: Spark's state rows before and after, Spark's TTL removal
counters, and the hot micro-batch seconds (whether they pay for reading the expired keys).

Usage: python benchmarks/spark_streaming_state.py [--sizes 10000,1000000,4000000] [--hot 5]
       [--layouts bucket,key,chunk] [--timers 10000,1000000] [--ttl 1000000 --ttl-seconds 20]
       (`--sizes ""` skips the hot/fill case)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta
from typing import Any, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.operators import StatefulLogic
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.outputs import SparkSink

HOT_KEYS = 10_000
HOT_EVENTS = 100_000
FILL_CHUNK = 1_000_000


def _count(state: Optional[int], _v: Any) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def _row(kv: tuple[str, int]) -> dict[str, Any]:
    return {"k": kv[0], "n": kv[1]}


def _key(r: dict[str, Any]) -> str:
    return r["k"]


class Waiting(StatefulLogic):
    """Counts a key's values and keeps a notification one hour after its last value (a session's end)."""

    def __init__(self, state: Optional[tuple[int, datetime]]) -> None:
        self.n, self.last = state if state is not None else (0, None)

    def on_item(self, value: Any) -> tuple[list[Any], bool]:
        from flowspark._time import utc_now

        self.n += 1
        self.last = utc_now()
        return [self.n], StatefulLogic.RETAIN

    def on_notify(self) -> tuple[list[Any], bool]:
        return [-self.n], StatefulLogic.DISCARD

    def notify_at(self) -> Optional[datetime]:
        return None if self.last is None else self.last + timedelta(hours=1)

    def snapshot(self) -> tuple[int, Optional[datetime]]:
        return self.n, self.last


def write_input(src: str, n: int, hot: int, hot_from: int = 0) -> int:
    """Fill files (N new keys) then `hot` files of 100k events over 10k keys from `hot_from`; return the file count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(src, exist_ok=True)
    files = 0
    for start in range(0, n, FILL_CHUNK):
        keys = [f"c{i:08d}" for i in range(start, min(n, start + FILL_CHUNK))]
        pq.write_table(pa.table({"k": keys}), os.path.join(src, f"f{files:05d}.parquet"))
        files += 1
    hot_keys = [f"c{i:08d}" for i in range(hot_from, hot_from + min(HOT_KEYS, max(n, HOT_KEYS)))]
    for _ in range(hot):
        keys = [hot_keys[j % len(hot_keys)] for j in range(HOT_EVENTS)]
        pq.write_table(pa.table({"k": keys}), os.path.join(src, f"f{files:05d}.parquet"))
        files += 1
    return files


def run_layout(
    spark: Any, src: str, work: str, layout: str, timers: bool = False, ttl: Optional[timedelta] = None
) -> Any:
    """Run the flow over every file (a running count, or `Waiting` with `timers`); return the `StreamingRun`."""
    from flowspark.spark import run

    flow = Dataflow("bench_state")
    s = op.input(
        "inp", flow, SparkSource("parquet", src, schema="k STRING", options={"maxFilesPerTrigger": "1"}, streaming=True)
    )
    keyed = op.key_on("key", s, _key)
    counts = op.stateful("wait", keyed, Waiting) if timers else op.stateful_map("count", keyed, _count)
    op.output("out", op.map("row", counts, _row), SparkSink("parquet", f"{work}/out", schema="k STRING, n LONG"))
    name, _, buckets = layout.partition(":")
    sr = run(
        flow,
        spark=spark,
        checkpoint=f"{work}/chk",
        trigger="available_now",
        progress=False,
        state_layout=None if name == "default" else name,
        state_ttl=ttl,
        **({"buckets": int(buckets)} if buckets else {}),
    )
    assert sr is not None
    return sr


def batch_seconds(sr: Any) -> list[float]:
    """Seconds of each micro-batch that read rows (Spark's `triggerExecution`)."""
    return [p["durationMs"]["triggerExecution"] / 1000 for p in sr.query.recentProgress if p["numInputRows"] > 0]


def state_rows(sr: Any) -> int:
    """Spark's state rows after the run's last micro-batch."""
    last = sr.query.recentProgress[-1]
    return sum(int(o.get("numRowsTotal", 0)) for o in last["stateOperators"])


def ttl_removed(sr: Any) -> int:
    """Spark's TTL removal counters (custom metrics with `TTL` in their name) summed over the run."""
    total = 0
    for p in sr.query.recentProgress:
        for o in p["stateOperators"]:
            total += sum(int(v) for k, v in (o.get("customMetrics") or {}).items() if "ttl" in k.lower())
    return total


def hot_and_fill(spark: Any, work: str, sizes: list[int], layouts: list[str], hot_n: int, timers: bool) -> None:
    """Fill N keys then run hot micro-batches, per N and layout; print seconds, fill rates and ratios."""
    what = "keys each with a pending notify_at" if timers else "keys"
    print(f"-- {'timers' if timers else 'hot / fill'}: {HOT_EVENTS:,} events over {HOT_KEYS:,} {what} in state")
    hot: dict[tuple[str, int], float] = {}
    first: dict[tuple[str, int], float] = {}  # the first hot micro-batch after the fill / the median of the next ones
    fill: dict[tuple[str, int], float] = {}
    for n in sizes:
        src = f"{work}/in_{n}_{timers}"
        files = write_input(src, n, hot_n)
        for layout in layouts:
            t0 = time.perf_counter()
            ds = batch_seconds(run_layout(spark, src, f"{work}/{layout}_{n}_{timers}", layout, timers))
            total = time.perf_counter() - t0
            assert len(ds) == files, f"{len(ds)} micro-batches with rows, expected {files}"
            fills, hots = ds[: files - hot_n], ds[files - hot_n :]
            hot[(layout, n)] = statistics.median(hots)
            if len(hots) > 1:
                first[(layout, n)] = hots[0] / statistics.median(hots[1:])
            fill[(layout, n)] = n / max(sum(fills), 1e-9)
            print(
                f"layout {layout:6s} N={n:>9,}: hot micro-batch {hot[(layout, n)]:5.2f} s (median of "
                f"{' '.join(f'{x:.2f}' for x in hots)}); filling took {sum(fills):6.1f} s "
                f"({fill[(layout, n)]:,.0f} new keys/s); whole run {total:6.1f} s",
                flush=True,
            )
        shutil.rmtree(src, ignore_errors=True)
    print(f"ratios (hot micro-batch time / the same layout's at N={sizes[0]:,}; target <= 1.5x):")
    for layout in layouts:
        base = hot[(layout, sizes[0])]
        print(f"  {layout:6s} " + ", ".join(f"N={n:,}: {hot[(layout, n)] / base:.2f}x" for n in sizes))
    if first:
        print("the first hot micro-batch after the fill / the median of the next ones (target <= 2x):")
        for layout in layouts:
            ratios = ", ".join(f"N={n:,}: {first[(layout, n)]:.2f}x" for n in sizes if (layout, n) in first)
            print(f"  {layout:6s} {ratios}")
    if "bucket" in layouts:
        for layout in layouts:
            if layout == "bucket":
                continue
            hots = ", ".join(f"N={n:,}: {hot[(layout, n)] / hot[('bucket', n)]:.2f}x" for n in sizes)
            fills = ", ".join(f"N={n:,}: {fill[(layout, n)] / fill[('bucket', n)]:.2f}x" for n in sizes)
            print(f"  {layout} / bucket hot micro-batch (target at the smallest N <= 1.2x): {hots}")
            print(f"  {layout} / bucket new keys/s (target >= 1.0x): {fills}")


def ttl_case(spark: Any, work: str, n: int, layouts: list[str], hot_n: int, seconds: float) -> None:
    """Fill N keys with a state TTL, wait for it, then touch 10k other keys: do the expired keys cost?"""
    ttl = timedelta(seconds=seconds)
    print(f"-- TTL: {n:,} keys filled with state_ttl={seconds:g} s, then {hot_n} micro-batches over 10k other keys")
    for layout in layouts:
        src = f"{work}/ttl_in_{layout}"
        write_input(src, n, 0)
        out = f"{work}/ttl_{layout}"
        sr = run_layout(spark, src, out, layout, ttl=ttl)
        before = state_rows(sr)
        filled = time.perf_counter()
        # The second run's hot files: 10k keys none of which is in state.
        hot_dir = f"{work}/ttl_hot_{layout}"
        write_input(hot_dir, 0, hot_n, hot_from=n)
        for name in sorted(os.listdir(hot_dir)):
            os.replace(os.path.join(hot_dir, name), os.path.join(src, f"h{name}"))
        time.sleep(max(0.0, seconds + 2 - (time.perf_counter() - filled)))
        sr = run_layout(spark, src, out, layout, ttl=ttl)
        ds = batch_seconds(sr)
        print(
            f"layout {layout:6s}: state rows {before:,} after filling, {state_rows(sr):,} after the TTL's "
            f"micro-batches; Spark's TTL counters {ttl_removed(sr):,}; micro-batches over 10k other keys "
            f"{' '.join(f'{x:.2f}' for x in ds)} s",
            flush=True,
        )
        shutil.rmtree(src, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,1000000,4000000")
    ap.add_argument("--hot", type=int, default=5)
    ap.add_argument(
        "--layouts",
        default="bucket,key,chunk",
        help="default: a new checkpoint's layout; LAYOUT:B runs it with B buckets (e.g. chunk:16)",
    )
    ap.add_argument("--timers", default="", help="N1,N2: keys each holding a pending notify_at")
    ap.add_argument("--ttl", type=int, default=0, help="keys filled in the TTL case (0: skip it)")
    ap.add_argument("--ttl-seconds", type=float, default=20.0)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    layouts = args.layouts.split(",")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    from flowspark.spark.session import get_session
    from flowspark.spark.streaming.state import LAYOUTS

    spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    work = tempfile.mkdtemp(prefix="fs_state_bench_")
    try:
        print(f"local[2]; the default layout (a new checkpoint's): {LAYOUTS[0]!r}")
        # Warm-up: each layout once on a small state (JVM, Python workers, RocksDB loaded).
        write_input(f"{work}/warm_in", 20_000, 1)
        for layout in layouts:
            run_layout(spark, f"{work}/warm_in", f"{work}/warm_{layout}", layout)
            if args.timers:
                run_layout(spark, f"{work}/warm_in", f"{work}/warm_t_{layout}", layout, timers=True)
        if sizes:
            hot_and_fill(spark, work, sizes, layouts, args.hot, False)
        if args.timers:
            hot_and_fill(spark, work, [int(x) for x in args.timers.split(",")], layouts, args.hot, True)
        if args.ttl:
            ttl_case(spark, work, args.ttl, layouts, args.hot, args.ttl_seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
