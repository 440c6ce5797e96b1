"""Benchmark: a count per user and event-time window on Spark batch, flowspark vs hand-written Spark.

One run, one warm SparkSession (local[2] by default). Input: parquet, 1M events over 10k users,
a TIMESTAMP column spread over one hour in position order plus up to 2 minutes of jitter, so a
user's values are out of order and some are late for a 10 s wait.

- flowspark, rules on: `count_window` (EventClock on the column, wait 10 s, tumbling 10 minutes) ->
  `map` to a dict -> `SparkSink("parquet")`: the rule `native_reduction` runs it as an aggregate;
- flowspark, `rules="-native_reduction"` and `rules="none"`: the Python pass;
- hand-written Spark of the same semantics: the late values found with the same window function
  over the rows' positions, then `groupBy(user, window id).count()`;
- naive Spark: `groupBy(user, window id).count()` ignoring lateness (not the same result: the
  lower bound of any job that counts per window).

Every flowspark output is compared row for row with the hand-written job's.

Usage: python benchmarks/spark_bounded_windows.py [--events 1000000] [--keys 10000] [--repeat 1]
       [--chart PNG] [--record FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from typing import Any

import chart  # benchmarks/chart.py: --chart PNG, --record FILE

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def user_of(r):
    return r["user"]


def ts_of(r):
    return r["ts"]


def window_row(kv):
    return {"user": kv[0], "wid": kv[1][0], "n": kv[1][1]}


def build(path: str, out: str) -> Any:
    import flowspark.operators as op
    import flowspark.operators.windowing as win
    from flowspark.dataflow import Dataflow
    from flowspark.spark import SparkSink, SparkSource

    flow = Dataflow("bench_windows")
    s = op.input("inp", flow, SparkSource("parquet", path))
    clock = win.EventClock(ts_of, timedelta(seconds=10))
    counts = win.count_window("per_10min", s, clock, win.TumblingWindower(timedelta(minutes=10), T0), user_of)
    op.output(
        "out", op.map("row", counts.down, window_row), SparkSink("parquet", out, schema="user STRING, wid LONG, n LONG")
    )
    return flow


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every job; the best time is reported")
    chart.add_arguments(ap)
    args = ap.parse_args()
    n = args.events

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F  # noqa: N812, TID251
    from spark_bounded import bench_session, rounds

    from flowspark.spark import compile_flow, run
    from flowspark.spark.batch.describe import describe_stage
    from flowspark.spark.tools import physical_plans

    spark = bench_session(args.master, **{"spark.sql.session.timeZone": "UTC"})
    tmp = tempfile.mkdtemp(prefix="flowspark-bench-windows-")
    path = os.path.join(tmp, "events")
    t0 = int(T0.timestamp())
    (
        spark.range(n, numPartitions=2)
        .select(
            F.concat(F.lit("u"), (F.col("id") * 7919 % args.keys).cast("string")).alias("user"),
            F.timestamp_micros(
                F.lit(t0 * 1_000_000)
                + F.col("id") * (3_600_000_000 // n)
                + F.pmod(F.hash("id"), F.lit(121)) * 1_000_000
            ).alias("ts"),
        )
        .coalesce(1)  # one file: the rows' order is the positions' (files are read largest first)
        .write.parquet(path)
    )
    print(f"{n:,} events, {args.keys:,} keys, master {args.master}, parquet at {path}")
    plan = physical_plans(compile_flow(build(path, os.path.join(tmp, "plan"))), spark)[0]
    print(plan.render(describe_stage))

    def flowspark_job(rules: str) -> Any:
        def job() -> None:
            run(build(path, os.path.join(tmp, f"out-{rules}")), spark=spark, rules=rules)

        return job

    def hand_written(late: bool) -> Any:
        def job() -> None:
            rows = spark.read.parquet(path).selectExpr(
                "user", "unix_micros(ts) AS u", "monotonically_increasing_id() AS p"
            )
            if late:
                earlier = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"
                wm = f"max(u - 10000000) OVER (PARTITION BY user ORDER BY p {earlier})"
                rows = rows.selectExpr("user", "u", f"{wm} AS wm").where("wm IS NULL OR u >= wm")
            a = t0 * 1_000_000
            counts = rows.selectExpr("user", f"floor((u - {a}) / 600000000) AS wid").groupBy("user", "wid").count()
            counts.selectExpr("user", "wid", "count AS n").write.mode("overwrite").parquet(
                os.path.join(tmp, f"out-hand-{late}")
            )

        return job

    jobs = [
        ("flowspark count_window, rules on", flowspark_job("all")),
        ("flowspark count_window, -native_reduction", flowspark_job("-native_reduction")),
        ("flowspark count_window, rules=none", flowspark_job("none")),
        ("hand-written Spark, same semantics", hand_written(True)),
        ("naive Spark, lateness ignored", hand_written(False)),
    ]
    results: dict[str, float] = {}
    rounds(jobs, n, results, max(1, args.repeat))
    best = {label: n / rate for label, rate in results.items()}
    hand = spark.read.parquet(os.path.join(tmp, "out-hand-True"))
    for rules in ("all", "-native_reduction", "none"):
        got = spark.read.parquet(os.path.join(tmp, f"out-{rules}")).select("user", "wid", "n")
        assert got.exceptAll(hand).count() == 0, f"{rules}: outputs differ"
        assert hand.exceptAll(got).count() == 0, f"{rules}: outputs differ"
    naive = spark.read.parquet(os.path.join(tmp, "out-hand-False"))
    print(f"late values left out: {naive.groupBy().sum('n').first()[0] - hand.groupBy().sum('n').first()[0]:,}")
    ref = best["hand-written Spark, same semantics"]
    for label, _job in jobs[:3]:
        print(f"{label}: {best[label] / ref:5.2f}x the hand-written job's time")
    spark.stop()
    title = f"Spark batch count per user and 10-minute window, {n:,} events, {args.keys:,} keys (best wall)"
    chart.write(args, title, results)


if __name__ == "__main__":
    main()
