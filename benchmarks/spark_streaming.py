"""Streaming benchmark: running count of 1M events over 10k keys in 10 micro-batches, on local[2].

flowspark (bucketed applyInPandasWithState, one Python call per bucket) against a hand-written
per-key `applyInPandasWithState` job (one Python call per key) over the same events, in one run.

Usage: python benchmarks/spark_streaming.py [--events 1000000] [--keys 10000] [--batches 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.inputs import FixedPartitionedSource, StatefulSourcePartition
from flowspark.spark.outputs import SparkSink


class _GenPart(StatefulSourcePartition):
    def __init__(self, idx: int, parts: int, events: int, keys: int, pos: Optional[int]) -> None:
        self.idx, self.parts, self.events, self.keys = idx, parts, events, keys
        self.pos = pos or 0  # events of this partition read so far

    def next_batch(self) -> list[str]:
        start = self.pos * self.parts + self.idx
        stop = min(self.events, start + 10_000 * self.parts)
        out = [f"k{j % self.keys}" for j in range(start, stop, self.parts)]
        self.pos += len(out)
        return out

    def snapshot(self) -> int:
        return self.pos


class GenSource(FixedPartitionedSource):
    """Event j (0 <= j < events) is the key `k{j % keys}`; partition i holds the j with j % parts == i."""

    def __init__(self, events: int, keys: int, parts: int = 2) -> None:
        self.events, self.keys, self.parts = events, keys, parts

    def list_parts(self) -> list[str]:
        return [str(i) for i in range(self.parts)]

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _GenPart:
        return _GenPart(int(for_part), self.parts, self.events, self.keys, resume_state)


def _count(state: Optional[int], _v: Any) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def _row(kv: tuple[str, int]) -> dict[str, Any]:
    return {"key": kv[0], "n": kv[1]}


def run_flowspark(spark: Any, events: int, keys: int, batches: int, work: str) -> float:
    from flowspark.spark import run

    flow = Dataflow("bench_count")
    s = op.input("inp", flow, GenSource(events, keys))
    counts = op.stateful_map("count", op.key_on("key", s, lambda x: x), _count)
    op.output("out", op.map("row", counts, _row), SparkSink("parquet", f"{work}/fs_out", schema="key STRING, n LONG"))
    t0 = time.perf_counter()
    run(flow, spark=spark, checkpoint=f"{work}/fs_chk", trigger="available_now", max_items=events // batches // 2)
    return time.perf_counter() - t0


def run_per_key(spark: Any, events: int, keys: int, batches: int, work: str) -> float:
    import pandas as pd
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition  # noqa: TID251
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: TID251

    step = events // batches

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def initialOffset(self) -> dict:
            return {"pos": 0}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: dict, limit: Any) -> dict:
            return {"pos": min(start["pos"] + step, events)}

        def partitions(self, start: dict, end: dict) -> list:
            s, e = start["pos"], end["pos"]
            return [InputPartition((i, s, e)) for i in range(2)] if e > s else []

        def read(self, part: Any) -> Any:
            i, s, e = part.value
            for j in range(s + ((i - s) % 2), e, 2):
                yield (f"k{j % keys}",)

    class Src(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_events"

        def schema(self) -> str:
            return "key string"

        def streamReader(self, schema: Any) -> Any:
            return Reader()

    spark.dataSource.register(Src)

    def count(key: tuple, pdfs: Any, state: Any) -> Any:
        n = state.get[0] if state.exists else 0
        for pdf in pdfs:
            n += len(pdf)
        state.update((n,))
        yield pd.DataFrame({"key": [key[0]], "n": [n]})

    df = spark.readStream.format("bench_events").load()
    q = df.groupBy("key").applyInPandasWithState(count, "key string, n long", "n long", "append", "NoTimeout")
    t0 = time.perf_counter()
    query = (
        q.writeStream.format("parquet")
        .option("path", f"{work}/pk_out")
        .option("checkpointLocation", f"{work}/pk_chk")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--skip-per-key", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    from flowspark.spark.session import get_session

    spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    work = tempfile.mkdtemp(prefix="fs_stream_bench_")
    try:
        fs = run_flowspark(spark, args.events, args.keys, args.batches, work)
        got = spark.read.parquet(f"{work}/fs_out").count()
        print(
            f"flowspark bucketed: {args.events} events, {args.keys} keys, {args.batches} micro-batches: "
            f"{fs:.1f} s, {args.events / fs:,.0f} events/s ({got} output rows)"
        )
        if not args.skip_per_key:
            pk = run_per_key(spark, args.events, args.keys, args.batches, work)
            print(f"hand-written per-key applyInPandasWithState: {pk:.1f} s, {args.events / pk:,.0f} events/s")
            print(f"speed-up: {pk / fs:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
