"""Which of Spark's Python state APIs is the floor for flowspark's streaming lowering?

The same hand-written bucketed running count (64 buckets, one pickled `{key: count}` per
bucket, no sequences, no user callables) over the same parquet file stream (1M events over
10k keys, one file per micro-batch), in one run and one session, through:

1. `applyInPandasWithState` with Spark's default state store (what flowspark's bucket
   layout uses, and `benchmarks/spark_streaming.py`'s hand-written baseline);
2. `applyInPandasWithState` with the RocksDB state store;
3. `transformWithState`, the row API (Spark >= 4.1; RocksDB): rows as `Row` objects, no pandas;
4. `transformWithStateInPandas` (RocksDB): what flowspark's key layout uses.

Each job is warmed up on 20k events first. Prints seconds per job and the ratio to 1.

Usage: python benchmarks/spark_streaming_apis.py [--events 1000000] [--keys 10000] [--batches 10]
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _processors() -> tuple[type, type]:
    """The two `StatefulProcessor`s (pyspark imported only when the benchmark runs)."""
    from pyspark.sql import Row  # noqa: TID251
    from pyspark.sql.streaming import StatefulProcessor  # noqa: TID251

    class RowCount(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("blob", "blob binary")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
            counts = pickle.loads(self.state.get()[0]) if self.state.exists() else {}
            out = []
            for r in rows:
                n = counts.get(r.key, 0) + 1
                counts[r.key] = n
                out.append(Row(key=r.key, n=n))
            self.state.update((pickle.dumps(counts),))
            return iter(out)

        def close(self) -> None:
            pass

    class PandasCount(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("blob", "blob binary")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
            from spark_streaming import count_frames

            counts = pickle.loads(self.state.get()[0]) if self.state.exists() else {}
            out = count_frames(counts, rows)
            self.state.update((pickle.dumps(counts),))
            yield out

        def close(self) -> None:
            pass

    return RowCount, PandasCount


def run_transform(spark: Any, parquet: str, work: str, processor: Any, pandas: bool) -> float:
    import spark_streaming as ss
    from pyspark.sql import functions as F  # noqa: N812,TID251

    df = spark.readStream.schema("key STRING").option("maxFilesPerTrigger", 1).parquet(parquet)
    grouped = df.withColumn("bucket", F.pmod(F.hash("key"), F.lit(64))).groupBy("bucket")
    api = grouped.transformWithStateInPandas if pandas else grouped.transformWithState
    return ss.time_to_parquet(api(processor, "key string, n long", "Append", "None"), work)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=10)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *sys.path])
    import spark_streaming as ss

    from flowspark.spark.session import get_session

    spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    row_count, pandas_count = _processors()
    work = tempfile.mkdtemp(prefix="fs_stream_apis_")
    n, k, b = args.events, args.keys, args.batches
    try:
        events, warm = f"{work}/events", f"{work}/warm"
        ss.write_parquet(events, n, k, b)
        ss.write_parquet(warm, max(2, n // 50), k, 2)
        print(f"{n:,} events, {k:,} keys, {b} micro-batches, local[2], parquet file stream")
        times: dict[str, float] = {}
        for store in ("default", "rocksdb"):
            if store == "rocksdb":
                spark.conf.set("spark.sql.streaming.stateStore.providerClass", _ROCKSDB)
            ss.run_hand_written(spark, max(2, n // 50), k, 2, f"{work}/warm_apws_{store}", True, warm)
            times[f"applyInPandasWithState, {store} state store"] = ss.run_hand_written(
                spark, n, k, b, f"{work}/apws_{store}", True, events
            )
        for label, proc, pandas in (
            ("transformWithState (rows), RocksDB", row_count(), False),
            ("transformWithStateInPandas, RocksDB", pandas_count(), True),
        ):
            run_transform(spark, warm, f"{work}/warm_{pandas}", proc, pandas)
            times[label] = run_transform(spark, events, f"{work}/tws_{pandas}", proc, pandas)
            got = spark.read.parquet(f"{work}/tws_{pandas}/out").count()
            assert got == n, f"{label} wrote {got} rows, expected {n}"
        base = next(iter(times.values()))
        for label, t in times.items():
            print(f"{label:<48} {t:6.1f} s {n / t:>10,.0f} events/s  {t / base:5.2f}x the time of the first")
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
