"""Streaming state benchmark: the time of a hot micro-batch as the keys held in state grow.

For each state layout (`state_layout="bucket"`: applyInPandasWithState, one state row per
bucket; `"key"`: transformWithStateInPandas, one state row per key) and each N:

1. the state is filled with N keys (parquet files of up to 1M new keys, one file per
   micro-batch);
2. then `--hot` micro-batches of 100k events each touch the same 10k hot keys (keys already
   in state).

The flow is what a user writes: `SparkSource("parquet", streaming=True)` -> `key_on` ->
`stateful_map` (running count) -> `map` to a dict -> `SparkSink("parquet")` with a schema.
Printed: seconds per hot micro-batch (median of Spark's `triggerExecution` durations), its
ratio to N = 10k in the same layout, and the key / bucket ratio. Everything runs in one
process with one session, so the ratios are measured in one run.

Usage: python benchmarks/spark_streaming_state.py [--sizes 10000,1000000,4000000] [--hot 5]
       [--layouts bucket,key]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.spark.inputs import SparkSource
from flowspark.spark.outputs import SparkSink

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


def write_input(src: str, n: int, hot: int) -> int:
    """Fill files (N new keys) then `hot` files of 100k events over the first 10k keys; return the file count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(src, exist_ok=True)
    files = 0
    for start in range(0, n, FILL_CHUNK):
        keys = [f"c{i:08d}" for i in range(start, min(n, start + FILL_CHUNK))]
        pq.write_table(pa.table({"k": keys}), os.path.join(src, f"f{files:05d}.parquet"))
        files += 1
    hot_keys = [f"c{i:08d}" for i in range(min(HOT_KEYS, n))]
    for _ in range(hot):
        keys = [hot_keys[j % len(hot_keys)] for j in range(HOT_EVENTS)]
        pq.write_table(pa.table({"k": keys}), os.path.join(src, f"f{files:05d}.parquet"))
        files += 1
    return files


def run_layout(spark: Any, src: str, work: str, layout: str) -> list[float]:
    """Run the flow over every file; return the seconds of each micro-batch that read rows."""
    from flowspark.spark import run

    flow = Dataflow("bench_state")
    s = op.input(
        "inp", flow, SparkSource("parquet", src, schema="k STRING", options={"maxFilesPerTrigger": "1"}, streaming=True)
    )
    counts = op.stateful_map("count", op.key_on("key", s, _key), _count)
    op.output("out", op.map("row", counts, _row), SparkSink("parquet", f"{work}/out", schema="k STRING, n LONG"))
    sr = run(flow, spark=spark, checkpoint=f"{work}/chk", trigger="available_now", progress=False, state_layout=layout)
    assert sr is not None
    return [p["durationMs"]["triggerExecution"] / 1000 for p in sr.query.recentProgress if p["numInputRows"] > 0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,1000000,4000000")
    ap.add_argument("--hot", type=int, default=5)
    ap.add_argument("--layouts", default="bucket,key")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    layouts = args.layouts.split(",")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    from flowspark.spark.session import get_session

    spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    work = tempfile.mkdtemp(prefix="fs_state_bench_")
    hot: dict[tuple[str, int], float] = {}
    try:
        # Warm-up: both layouts once on a small state (JVM, Python workers, RocksDB loaded).
        write_input(f"{work}/warm_in", 20_000, 1)
        for layout in layouts:
            run_layout(spark, f"{work}/warm_in", f"{work}/warm_{layout}", layout)
        print(f"hot micro-batch: {HOT_EVENTS:,} events over {HOT_KEYS:,} keys already in state; local[2]")
        for n in sizes:
            src = f"{work}/in_{n}"
            files = write_input(src, n, args.hot)
            for layout in layouts:
                t0 = time.perf_counter()
                ds = run_layout(spark, src, f"{work}/{layout}_{n}", layout)
                total = time.perf_counter() - t0
                assert len(ds) == files, f"{len(ds)} micro-batches with rows, expected {files}"
                fill, hots = ds[: files - args.hot], ds[files - args.hot :]
                hot[(layout, n)] = statistics.median(hots)
                print(
                    f"layout {layout:6s} N={n:>9,}: hot micro-batch {hot[(layout, n)]:5.2f} s (median of "
                    f"{' '.join(f'{x:.2f}' for x in hots)}); filling took {sum(fill):6.1f} s "
                    f"({n / max(sum(fill), 1e-9):,.0f} new keys/s); whole run {total:6.1f} s",
                    flush=True,
                )
            shutil.rmtree(src, ignore_errors=True)
        print("ratios (hot micro-batch time / the same layout's at N=10k; target for the large-state layout <= 1.5x):")
        for layout in layouts:
            base = hot.get((layout, sizes[0]))
            line = ", ".join(f"N={n:,}: {hot[(layout, n)] / base:.2f}x" for n in sizes if base)
            print(f"  {layout:6s} {line}")
        if "bucket" in layouts and "key" in layouts:
            line = ", ".join(f"N={n:,}: {hot[('key', n)] / hot[('bucket', n)]:.2f}x" for n in sizes)
            print(f"  key / bucket: {line}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
