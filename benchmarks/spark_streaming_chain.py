"""Streaming chains of keyed stages: one query (transformWithStateInPandas) vs two queries through files.

A flow with two stateful steps re-keyed between them (count per user, then count per group of
users) cannot lower to two `applyInPandasWithState` in one query (Spark rejects that). Two
lowerings, measured in one run over the same events (each first warmed up on a small input):

A. flowspark's lowering: one query, every keyed stage `transformWithStateInPandas` on the
   RocksDB state store;
B. the flow split in two queries connected through files: query 1 (count per user) writes
   `{user, n, group}` rows to a parquet directory with Spark's file sink; query 2 reads that
   directory as a stream (`SparkSource(..., streaming=True)`) and counts per group. Each
   query has one keyed stage (`applyInPandasWithState`). The queries run one after the other.

Both must give the same `(group, n)` rows (as a multiset: B does not carry the sequences
through the files, so within a group the order of the second stage follows file order).

Usage: python benchmarks/spark_streaming_chain.py [--events 200000] [--keys 10000] [--batches 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from spark_streaming import GenSource  # noqa: E402

import flowspark.operators as op  # noqa: E402
from flowspark.dataflow import Dataflow  # noqa: E402
from flowspark.spark.io.inputs import SparkSource  # noqa: E402
from flowspark.spark.io.outputs import SparkSink  # noqa: E402


def _count(state: Optional[int], _v: Any) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def _user_row(kv: tuple[str, int]) -> dict[str, Any]:
    return {"user": kv[0], "n": kv[1], "group": f"g{int(kv[0][1:]) % 100}"}


def _group_row(kv: tuple[str, int]) -> dict[str, Any]:
    return {"group": kv[0], "n": kv[1]}


def chain_flow(events: int, keys: int, out: str) -> Dataflow:
    flow = Dataflow("chain_one_query")
    s = op.input("inp", flow, GenSource(events, keys))
    per_user = op.stateful_map("per_user", op.key_on("user", s, lambda x: x), _count)
    rows = op.map("user_row", per_user, _user_row)
    per_group = op.stateful_map("per_group", op.key_on("group", rows, lambda r: r["group"]), _count)
    op.output("out", op.map("row", per_group, _group_row), SparkSink("parquet", out, schema="group STRING, n LONG"))
    return flow


def first_half(events: int, keys: int, mid: str) -> Dataflow:
    flow = Dataflow("chain_q1")
    s = op.input("inp", flow, GenSource(events, keys))
    per_user = op.stateful_map("per_user", op.key_on("user", s, lambda x: x), _count)
    schema = "user STRING, n LONG, group STRING"
    op.output("out", op.map("user_row", per_user, _user_row), SparkSink("parquet", mid, schema=schema))
    return flow


def second_half(mid: str, out: str) -> Dataflow:
    flow = Dataflow("chain_q2")
    schema = "user STRING, n LONG, group STRING"
    s = op.input("inp", flow, SparkSource("parquet", mid, schema=schema, streaming=True))
    per_group = op.stateful_map("per_group", op.key_on("group", s, lambda r: r["group"]), _count)
    op.output("out", op.map("row", per_group, _group_row), SparkSink("parquet", out, schema="group STRING, n LONG"))
    return flow


def run_one_query(spark: Any, events: int, keys: int, batches: int, work: str) -> float:
    from flowspark.spark import run

    t0 = time.perf_counter()
    run(
        chain_flow(events, keys, f"{work}/out"),
        spark=spark,
        checkpoint=f"{work}/chk",
        trigger="available_now",
        max_items=events // batches // 2,
        progress=False,
    )
    return time.perf_counter() - t0


def run_two_queries(spark: Any, events: int, keys: int, batches: int, work: str) -> float:
    from flowspark.spark import run

    os.makedirs(f"{work}/mid", exist_ok=True)
    t0 = time.perf_counter()
    run(
        first_half(events, keys, f"{work}/mid"),
        spark=spark,
        checkpoint=f"{work}/chk1",
        trigger="available_now",
        max_items=events // batches // 2,
        progress=False,
    )
    run(second_half(f"{work}/mid", f"{work}/out"), spark=spark, checkpoint=f"{work}/chk2", trigger="available_now")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=4)
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    from flowspark.spark.session import get_session

    spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    work = tempfile.mkdtemp(prefix="fs_chain_bench_")
    n, k, b = args.events, args.keys, args.batches
    try:
        wn = max(2, n // 50)
        run_one_query(spark, wn, k, 2, f"{work}/warm_a")
        run_two_queries(spark, wn, k, 2, f"{work}/warm_b")
        print(f"{n:,} events, {k:,} users in 100 groups, {b} micro-batches, local[2]")
        a = run_one_query(spark, n, k, b, f"{work}/a")
        print(f"A. one query, transformWithStateInPandas x2: {a:6.1f} s  {n / a:>10,.0f} events/s")
        bb = run_two_queries(spark, n, k, b, f"{work}/b")
        print(f"B. two queries through a parquet directory:  {bb:6.1f} s  {n / bb:>10,.0f} events/s")
        print(f"A / B speed: {bb / a:.2f}x")
        ra = sorted(tuple(r) for r in spark.read.parquet(f"{work}/a/out").collect())
        rb = sorted(tuple(r) for r in spark.read.parquet(f"{work}/b/out").collect())
        assert len(ra) == n, f"one query wrote {len(ra)} rows, expected {n}"
        assert ra == rb, "the two lowerings disagree"
        print(f"same {len(ra):,} (group, n) rows from both")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
