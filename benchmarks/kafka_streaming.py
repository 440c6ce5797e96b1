"""Kafka streaming benchmark: a running count per key, Kafka in, Kafka and parquet out, on local[2].

N records (default 1M over 10k keys; record i has the key `k{i % keys}`) are produced once
into a 3-partition topic of a one-node KRaft broker (`tests/spark/kafka_broker.py`, from the
jars `python scripts/fetch_jars.py connector broker` caches), with the Kafka client the tests
use. Then, in one SparkSession (local[2], 2 shuffle partitions, Spark's Kafka connector in
`spark.jars`), two jobs read the whole topic, `--batches` micro-batches each
(`maxOffsetsPerTrigger` = records / batches, trigger `availableNow`), and write one row
`(key, running count)` per record both to a Kafka topic (3 partitions) and to parquet:

1. flowspark: `KafkaSource -> key_on -> stateful_map (running count) -> map (row)`, the row
   going to a `KafkaSink` and to a `SparkSink("parquet")`, run with
   `flowspark.spark.run(trigger="available_now")`;
2. hand-written Structured Streaming: `readStream.format("kafka")`, the key cast to a string,
   `groupBy("key").applyInPandasWithState` (a running count per key, one row per record), and
   a `foreachBatch` that persists the micro-batch, writes it to the Kafka topic and appends it
   to parquet (Spark's documented way to write one stream to several sinks: one query, one
   checkpoint, the stateful step computed once per micro-batch).

Each job first runs once on a small topic (2% of the records, 2 micro-batches) so neither
pays for the cold JVM and Python workers; then each runs `--repeat` times (default 2), in
alternating order, on new output topics, directories and checkpoints. The figures are the
best run of each job (each repeat's pair is printed too), with the sum of Spark's progress
`durationMs` over the run's micro-batches (where the time went). After every run both outputs
are read back with Spark: each key's final (largest) count and its number of rows must equal
the records produced with that key, in both sinks of both jobs; the script stops with an
error if not.

Usage: python benchmarks/kafka_streaming.py [--records 1000000] [--keys 10000] [--batches 10]
       [--repeat 2]

Spark's Kafka connector is published up to pyspark 4.2: run it with pyspark 4.2
(`.nox/compat-4.2/bin/python benchmarks/kafka_streaming.py`, after `python -m nox -s kafka`
or `scripts/fetch_jars.py connector broker` with that interpreter); it needs Java 17.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import chart  # benchmarks/chart.py: --chart PNG, --record FILE

import flowspark.operators as op
from flowspark.dataflow import Dataflow

ROOT = Path(__file__).resolve().parents[1]
OUT_SCHEMA = "key STRING, value STRING"
DURATIONS = ("addBatch", "latestOffset", "getBatch", "queryPlanning", "walCommit", "commitOffsets")


def _broker_module() -> Any:
    """`tests/spark/kafka_broker.py`, imported by path (the test broker: `broker(workdir)`)."""
    spec = importlib.util.spec_from_file_location("kafka_broker", ROOT / "tests" / "spark" / "kafka_broker.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def produce(bootstrap: str, topic: str, records: int, keys: int) -> float:
    """Produce `records` records (record i: key `k{i % keys}`, value `i`) to `topic`; return the seconds taken."""
    from kafka import KafkaProducer

    names = [f"k{j}".encode() for j in range(keys)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024)
    t0 = time.perf_counter()
    for i in range(records):
        producer.send(topic, key=names[i % keys], value=str(i).encode())
    producer.flush()
    producer.close()
    return time.perf_counter() - t0


# -- flowspark -------------------------------------------------------------------------------------


def _key_of(record: dict[str, Any]) -> str:
    return record["key"].decode()


def _count(state: Optional[int], _record: Any) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def _row(kv: tuple[str, int]) -> dict[str, Any]:
    return {"key": kv[0], "value": str(kv[1])}


def run_flowspark(spark: Any, bootstrap: str, src: str, dst: str, work: str, per_batch: int) -> tuple[float, Any]:
    """Run the flowspark job; return (seconds, its StreamingQuery)."""
    from flowspark.spark import KafkaSink, KafkaSource, SparkSink, run

    flow = Dataflow("bench_kafka")
    records = op.input("inp", flow, KafkaSource(bootstrap, src, options={"maxOffsetsPerTrigger": str(per_batch)}))
    rows = op.map("row", op.stateful_map("count", op.key_on("key", records, _key_of), _count), _row)
    op.output("kafka_out", rows, KafkaSink(bootstrap, dst))
    op.output("parquet_out", rows, SparkSink("parquet", f"{work}/out", schema=OUT_SCHEMA))
    t0 = time.perf_counter()
    sr = run(flow, spark=spark, checkpoint=f"{work}/chk", trigger="available_now", progress=False)
    return time.perf_counter() - t0, sr.query


# -- hand-written Structured Streaming -------------------------------------------------------------


def _running_count(key: tuple, pdfs: Any, state: Any) -> Any:
    import pandas as pd

    n = state.get[0] if state.exists else 0
    counts: list[str] = []
    for pdf in pdfs:
        m = len(pdf)
        counts.extend(str(c) for c in range(n + 1, n + m + 1))
        n += m
    state.update((n,))
    yield pd.DataFrame({"key": [key[0]] * len(counts), "value": counts})


def run_hand_written(spark: Any, bootstrap: str, src: str, dst: str, work: str, per_batch: int) -> tuple[float, Any]:
    """Run the hand-written job; return (seconds, its StreamingQuery)."""
    from pyspark.sql import functions as F  # noqa: N812, TID251

    def write_both(df: Any, _batch_id: int) -> None:
        df.persist()
        df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", dst).save()
        df.write.mode("append").parquet(f"{work}/out")
        df.unpersist()

    t0 = time.perf_counter()
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", src)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
        .load()
    )
    counts = (
        records.select(F.col("key").cast("string").alias("key"))
        .groupBy("key")
        .applyInPandasWithState(_running_count, OUT_SCHEMA, "n long", "append", "NoTimeout")
    )
    query = (
        counts.writeStream.foreachBatch(write_both)
        .option("checkpointLocation", f"{work}/chk")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - t0, query


# -- checks and figures ----------------------------------------------------------------------------


def per_key(df: Any) -> dict[str, tuple[int, int]]:
    """`{key: (largest count, rows)}` of a DataFrame of `(key, value)` rows, `value` a count."""
    from pyspark.sql import functions as F  # noqa: N812, TID251

    agg = df.groupBy("key").agg(F.max(F.col("value").cast("long")).alias("n"), F.count("*").alias("rows"))
    return {r["key"]: (r["n"], r["rows"]) for r in agg.collect()}


def topic_df(spark: Any, bootstrap: str, topic: str) -> Any:
    """A Kafka topic's records as `(key, value)` strings (a batch read)."""
    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    return df.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")


def check(spark: Any, bootstrap: str, name: str, topic: str, out: str, produced: dict[str, int]) -> int:
    """Fail unless each key's final count and row count equal its produced records, in the topic and in parquet."""
    want = {k: (n, n) for k, n in produced.items()}
    rows = 0
    for where, df in [
        (f"topic {topic}", topic_df(spark, bootstrap, topic)),
        (f"parquet {out}", spark.read.parquet(out)),
    ]:
        got = per_key(df)
        if got != want:
            bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            sys.exit(
                f"CHECK FAILED: {name}, {where}: {len(bad)} keys differ from the records produced, e.g. "
                + ", ".join(f"{k}: (final count, rows) {got.get(k)} != {want.get(k)}" for k in bad[:3])
            )
        rows += sum(r for _n, r in got.values())
    return rows


def breakdown(query: Any) -> str:
    """The sum over a query's micro-batches of Spark's progress `durationMs`, in seconds."""
    progress = query.recentProgress
    total = {k: sum(p["durationMs"].get(k, 0) for p in progress) / 1000 for k in ("triggerExecution", *DURATIONS)}
    parts = ", ".join(f"{k} {total[k]:.1f}" for k in DURATIONS if total[k] >= 0.05)
    return f"{len(progress)} micro-batches, triggerExecution {total['triggerExecution']:.1f} s ({parts})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument(
        "--repeat", type=int, default=2, help="runs of each job (alternating which goes first); best of them"
    )
    chart.add_arguments(ap)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    from flowspark.spark.io.kafka import FETCH_JARS, connector_jars
    from flowspark.spark.session import get_session

    jars = connector_jars()
    if jars is None:
        sys.exit(
            f"Spark's Kafka connector is not cached for this pyspark; run `{FETCH_JARS} broker` with {sys.executable}"
        )
    n, k, b = args.records, args.keys, args.batches
    wn = max(2 * k, n // 50)
    work = tempfile.mkdtemp(prefix="fs_kafka_bench_")
    figures: dict[str, float] = {}
    try:
        with _broker_module().broker(Path(work)) as broker:
            src, warm = broker.create_topic("bench_in", 3), broker.create_topic("bench_warm", 3)
            secs = produce(broker.bootstrap, src, n, k)
            produce(broker.bootstrap, warm, wn, k)
            print(f"{n:,} records, {k:,} keys, {b} micro-batches, local[2]; produced in {secs:.1f} s")
            spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.jars": ",".join(jars)})
            produced = {
                r["key"]: r["count"] for r in topic_df(spark, broker.bootstrap, src).groupBy("key").count().collect()
            }
            expected = {f"k{j}": n // k + (1 if j < n % k else 0) for j in range(k)}
            if produced != expected:
                sys.exit(f"CHECK FAILED: the input topic does not hold the records produced ({len(produced)} keys)")
            jobs = {"flowspark": run_flowspark, "hand-written": run_hand_written}
            # Warm-up: each job once on the small topic, in 2 micro-batches.
            for name, job in jobs.items():
                tag = name.split("-")[0]
                job(spark, broker.bootstrap, warm, broker.create_topic(f"warm_{tag}", 3), f"{work}/warm_{tag}", wn // 2)
            runs: dict[str, list[float]] = {name: [] for name in jobs}
            queries: dict[str, list[Any]] = {name: [] for name in jobs}
            for r in range(args.repeat):
                names = list(jobs) if r % 2 == 0 else list(jobs)[::-1]
                for name in names:
                    tag = name.split("-")[0]
                    dst, out = broker.create_topic(f"{tag}_out_{r}", 3), f"{work}/{tag}_{r}"
                    secs, query = jobs[name](spark, broker.bootstrap, src, dst, out, n // b)
                    runs[name].append(secs)
                    queries[name].append(query)
                    rows = check(spark, broker.bootstrap, name, dst, f"{out}/out", produced)
                    print(f"  {name}: {secs:.1f} s; {rows:,} rows written (topic + parquet); {breakdown(query)}")
                fs, hw = runs["flowspark"][-1], runs["hand-written"][-1]
                print(
                    f"repeat {r + 1} (order {', '.join(names)}): flowspark {fs:.1f} s, hand-written {hw:.1f} s, "
                    f"{hw / fs:.2f}x"
                )
            print(
                f"check: in both jobs, the Kafka topic and the parquet output give every one of the {k:,} keys a final "
                "count and a row count equal to the records produced with that key: OK"
            )
            best = f"(best of {args.repeat})"
            for name in jobs:
                t = min(runs[name])
                figures[name] = n / t
                print(f"{name:13s}: {t:6.1f} s  {n / t:>10,.0f} records/s  {best}")
            ratio = min(runs["hand-written"]) / min(runs["flowspark"])
            print(f"flowspark / hand-written: {ratio:.2f}x  (target >= 0.9x: flowspark at least 0.9x as fast)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    chart.write(args, f"Kafka running count, {n:,} records, {k:,} keys, {b} micro-batches (best)", figures, "records/s")


if __name__ == "__main__":
    main()
