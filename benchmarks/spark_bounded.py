"""Benchmark: flowspark on Spark (bounded input) vs hand-written PySpark vs native Spark vs bytewax.

One run, one warm SparkSession (local[2] by default):

1. 1M events over 10k keys read from parquet; per key a running count
   (`stateful_map`) and a sum (`fold_final`), fused into one keyed stage:
   - flowspark: `SparkSource("parquet") -> key_on -> stateful_map -> fold_final -> TestingSink`;
   - hand-written PySpark of flowspark's shape: native key, position from
     `monotonically_increasing_id`, `repartition(user)` + `sortWithinPartitions(user, pos)`
     and one `mapInPandas` running a dict loop (the floor of flowspark's design);
   - hand-written PySpark: `groupBy(user).applyInPandas` (sort by position, running
     count, sum) — one Python call per key;
   - native Spark: `groupBy(user).agg(count, sum)`.
2. A whole job as users write it: parquet in -> running count per user
   (`key_on(lambda r: r["user"])`, `stateful_map`, `map` to a dict) -> `SparkSink("parquet")`,
   vs the hand-written job of the same shape (read, position, repartition, sort, one
   `mapInPandas` dict loop, write parquet); both outputs are compared row for row.
3. The TestingSource path: the same flow as 1. over 1M dict items shipped from the driver,
   vs bytewax 0.21's `run_main` on the same flow; and a flow emitting every event
   (`key_on -> map_value -> stateful_map` running count -> `TestingSink`: 1M items back at the
   driver), vs bytewax on the same flow.
4. Count + sum per user as Spark aggregates (the rule `native_reduction`): `count_final` and
   `reduce_final(operator.add)` on `map_value(lambda r: r["amount"])` over the parquet input, each
   mapped to a dict and written to a parquet `SparkSink`; the same with `fold_final` and
   `flowspark.reducers`; the same with the two writes one after the other (`rules="-concurrent_sinks"`);
   the same with `rules="none"`; vs native `groupBy("user").agg(count, sum)`
   (cached) writing the same two outputs. Every output is compared row for row.

Usage: python benchmarks/spark_bounded.py [--events 1000000] [--keys 10000] [--master local[2]] [--repeat 1]
       [--only count_sum|whole|testing]   (one section alone: each fits the shared machine's 8-minute lock)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Optional

import chart  # benchmarks/chart.py: --chart PNG, --record FILE


def count_mapper(state, amount):
    """Running count per key; emits (count so far, amount)."""
    n = (state or 0) + 1
    return n, (n, amount)


def sum_folder(acc, count_amount):
    """Final (count, sum of amounts) per key."""
    return (count_amount[0], acc[1] + count_amount[1])


def zero():
    return (0, 0)


def build_flowspark(source: Any, out: list[Any]):
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.testing import TestingSink

    flow = Dataflow("bench")
    s = op.input("inp", flow, source)
    k = op.key_on("key", s, lambda e: e["user"])
    amounts = op.map_value("amount", k, lambda e: e["amount"])
    counts = op.stateful_map("count", amounts, count_mapper)
    totals = op.fold_final("sum", counts, zero, sum_folder)
    op.output("out", totals, TestingSink(out))
    return flow


def running_count(state, event):
    """Running count per user; emits the event with its count."""
    n = (state or 0) + 1
    return n, (n, event)


def count_row(user_count_event):
    """The output row of the whole job."""
    user, (n, event) = user_count_event
    return {"user": user, "pos": event["pos"], "amount": event["amount"], "count": n}


def build_whole_job(source: Any, sink: Any):
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow

    flow = Dataflow("job")
    rows = op.input("inp", flow, source)
    keyed = op.key_on("user", rows, lambda r: r["user"])
    counts = op.stateful_map("count", keyed, running_count)
    op.output("out", op.map("row", counts, count_row), sink)
    return flow


def shape_count_sum(pdfs):
    """The hand-written keyed pass of flowspark's shape: rows sorted by (user, pos), one dict loop."""
    import pandas as pd

    state: dict[str, Any] = {}
    users, counts, totals = [], [], []
    cur = None
    for pdf in pdfs:
        for user, amount in zip(pdf["user"].tolist(), pdf["amount"].tolist(), strict=True):
            if user != cur:
                if cur is not None:
                    users.append(cur)
                    counts.append(state[cur][0])
                    totals.append(state[cur][1])
                cur = user
            c, t = state.get(user, (0, 0))
            state[user] = (c + 1, t + amount)
    if cur is not None:
        users.append(cur)
        counts.append(state[cur][0])
        totals.append(state[cur][1])
    yield pd.DataFrame({"user": users, "cnt": counts, "total": totals})


def shape_running_count(pdfs):
    """The hand-written keyed pass of the whole job: running count per user, one dict loop."""
    state: dict[str, int] = {}
    for pdf in pdfs:
        counts = []
        for user in pdf["user"].tolist():
            n = state.get(user, 0) + 1
            state[user] = n
            counts.append(n)
        out = pdf[["user", "pos", "amount"]].copy()
        out["count"] = counts
        yield out


def shape_same_functions(batches):
    """The whole job's keyed pass calling the flow's own functions on row dicts (what flowspark runs per row)."""
    import pyarrow as pa

    schema = pa.schema([("user", pa.string()), ("pos", pa.int64()), ("amount", pa.int64()), ("count", pa.int64())])
    state: dict[str, Any] = {}
    for b in batches:
        out = []
        for row in b.to_pylist():
            user = row["user"]
            st, emit = running_count(state.get(user), row)
            state[user] = st
            out.append(count_row((user, emit)))
        yield pa.RecordBatch.from_pylist(out, schema=schema)


def build_every_event(op: Any, dataflow: Any, source: Any, sink: Any):
    """Running count per user emitting every event, on `op` (flowspark's or bytewax's operators)."""
    flow = dataflow("bench_every")
    s = op.input("inp", flow, source)
    k = op.key_on("key", s, lambda e: e["user"])
    amounts = op.map_value("amount", k, lambda e: e["amount"])
    op.output("out", op.stateful_map("count", amounts, count_mapper), sink)
    return flow


def build_bytewax(items: list[Any], out: list[Any]):
    import bytewax.operators as bop
    from bytewax.dataflow import Dataflow as BDataflow
    from bytewax.testing import TestingSink as BSink
    from bytewax.testing import TestingSource as BSource

    flow = BDataflow("bench")
    s = bop.input("inp", flow, BSource(items, batch_size=1000))
    k = bop.key_on("key", s, lambda e: e["user"])
    amounts = bop.map_value("amount", k, lambda e: e["amount"])
    counts = bop.stateful_map("count", amounts, count_mapper)
    totals = bop.fold_final("sum", counts, zero, sum_folder)
    bop.output("out", totals, BSink(out))
    return flow


def user_count_row(kv):
    """A count per user as a row."""
    return {"user": kv[0], "n": kv[1]}


def total_row(kv):
    """A sum per user as a row."""
    return {"user": kv[0], "total": kv[1]}


def build_count_sum(source: Any, out_counts: str, out_totals: str, helpers: bool = False):
    """Count and sum of `amount` per user, each to a parquet SparkSink (`helpers`: `fold_final` + reducers)."""
    import operator

    import flowspark.operators as op
    from flowspark import reducers
    from flowspark.dataflow import Dataflow
    from flowspark.spark import SparkSink

    flow = Dataflow("count_sum")
    s = op.input("inp", flow, source)
    keyed = op.key_on("key", s, lambda r: r["user"])
    amounts = op.map_value("amount", keyed, lambda r: r["amount"])
    if helpers:
        counts = op.fold_final("count", keyed, reducers.zero, reducers.count)
        totals = op.fold_final("total", amounts, reducers.zero, reducers.sum)
    else:
        counts = op.count_final("count", s, lambda r: r["user"])
        totals = op.reduce_final("total", amounts, operator.add)
    op.output("out_counts", op.map("count_row", counts, user_count_row), SparkSink("parquet", out_counts))
    op.output("out_totals", op.map("total_row", totals, total_row), SparkSink("parquet", out_totals))
    return flow


def count_sum_section(spark: Any, path: str, tmp: str, n: int, results: dict[str, float]) -> None:
    """Section 4: count + sum per user, flowspark (rules on, helpers, rules=none) vs native groupBy().agg."""
    from pyspark.sql import functions as F  # noqa: N812, TID251

    from flowspark.spark import SparkSource, compile_flow, run
    from flowspark.spark.batch.describe import describe_stage
    from flowspark.spark.tools import physical_plans

    print("\n-- count + sum per user (count_final, reduce_final(operator.add)) -> two parquet SparkSinks --")
    out = os.path.join(tmp, "count-sum")

    def flowspark_job(tag: str, helpers: bool = False, rules: str = "all") -> Any:
        def job() -> None:
            flow = build_count_sum(SparkSource("parquet", path), f"{out}-{tag}-n", f"{out}-{tag}-t", helpers)
            run(flow, spark=spark, rules=rules)

        return job

    def native_job() -> None:
        agg = spark.read.parquet(path).groupBy("user").agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
        agg = agg.cache()
        agg.select("user", "n").write.mode("overwrite").parquet(f"{out}-native-n")
        agg.select("user", "total").write.mode("overwrite").parquet(f"{out}-native-t")
        agg.unpersist()

    plan = compile_flow(build_count_sum(SparkSource("parquet", path), f"{out}-plan-n", f"{out}-plan-t"))
    print(physical_plans(plan, spark)[0].render(describe_stage))
    jobs = [
        ("flowspark count + sum, rules on", flowspark_job("all")),
        ("flowspark count + sum, fold_final + reducers", flowspark_job("helpers", helpers=True)),
        ("flowspark count + sum, rules=-concurrent_sinks", flowspark_job("serial", rules="-concurrent_sinks")),
        ("flowspark count + sum, rules=none", flowspark_job("none", rules="none")),
        ("native groupBy().agg(count, sum), two writes", native_job),
    ]
    # Round-robin: each repeat runs every job once, so no job always follows the big rules=none job
    # (the job right after it ran up to 0.4 s slower, measured).
    rounds(jobs, n, results)
    for tag in ("all", "helpers", "serial", "none"):
        for part, cols in (("n", "user, n"), ("t", "user, total")):
            a = spark.read.parquet(f"{out}-{tag}-{part}").selectExpr(*cols.split(", "))
            b = spark.read.parquet(f"{out}-native-{part}").selectExpr(*cols.split(", "))
            assert a.exceptAll(b).count() == 0, f"{tag}: outputs differ"
            assert b.exceptAll(a).count() == 0, f"{tag}: outputs differ"
    nat = results["native groupBy().agg(count, sum), two writes"]
    for label, _job in jobs[:4]:
        print(f"{label}: {nat / results[label]:5.2f}x native's time (target <= 1.5)")


REPEAT = 1


def bench_session(master: str, **conf: str) -> Any:
    """The benchmarks' warm SparkSession: 2 shuffle partitions, no UI, no AQE, Arrow on, 3g driver, and `conf`."""
    from pyspark.sql import SparkSession  # noqa: TID251

    builder = (
        SparkSession.builder.master(master)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "3g")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rounds(jobs: list[tuple[str, Any]], n: int, results: dict[str, float], repeat: Optional[int] = None) -> None:
    """Warm every job up, then run them round-robin `repeat` (default REPEAT) times; report each one's best time.

    Every round runs each job once, so a job's best time comes from the same spells of machine
    load as the others' (a section timing one job's repeats, then the next's, is not).
    """
    for _label, job in jobs:
        job()  # warm-up
    best = dict.fromkeys([label for label, _job in jobs], float("inf"))
    for _ in range(REPEAT if repeat is None else repeat):
        for label, job in jobs:
            t = time.perf_counter()
            job()
            best[label] = min(best[label], time.perf_counter() - t)
    for label, _job in jobs:
        results[label] = n / best[label]
        print(f"{label:<48} {best[label]:8.2f} s {n / best[label]:>12,.0f} events/s", flush=True)


def timed(label: str, fn, n: int, results: dict[str, float]) -> Any:
    """Run `fn` REPEAT times; report the best time."""
    best = float("inf")
    res = None
    for _ in range(REPEAT):
        t = time.perf_counter()
        res = fn()
        best = min(best, time.perf_counter() - t)
    results[label] = n / best
    print(f"{label:<48} {best:8.2f} s {n / best:>12,.0f} events/s", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--skip-bytewax", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each job; the best time is reported")
    ap.add_argument("--only", choices=["count_sum", "whole", "testing"], help="run that section alone")
    chart.add_arguments(ap)
    args = ap.parse_args()
    n, nkeys = args.events, args.keys
    global REPEAT
    REPEAT = max(1, args.repeat)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F  # noqa: TID251

    from flowspark.spark import SparkSink, SparkSource, compile_flow, run
    from flowspark.testing import TestingSource

    spark = bench_session(args.master)
    tmp = tempfile.mkdtemp(prefix="flowspark-bench-")
    path = os.path.join(tmp, "events")
    (
        spark.range(n, numPartitions=2)
        .select(
            F.col("id").alias("pos"),
            F.concat(F.lit("u"), (F.col("id") * 7919 % nkeys).cast("string")).alias("user"),
            (F.col("id") % 100).alias("amount"),
        )
        .write.parquet(path)
    )
    print(f"{n:,} events, {nkeys:,} keys, master {args.master}, parquet at {path}")
    expected = {
        r.user: (r.cnt, r.total)
        for r in spark.read.parquet(path)
        .groupBy("user")
        .agg(F.count("*").alias("cnt"), F.sum("amount").alias("total"))
        .collect()
    }

    def flowspark_parquet() -> list[Any]:
        out: list[Any] = []
        run(build_flowspark(SparkSource("parquet", path), out), spark=spark)
        return out

    def apply_in_pandas() -> list[Any]:
        import pandas as pd

        def per_key(pdf: pd.DataFrame) -> pd.DataFrame:
            pdf = pdf.sort_values("pos")
            running = pdf["pos"].expanding().count()
            return pd.DataFrame(
                {"user": [pdf["user"].iloc[0]], "cnt": [int(running.iloc[-1])], "total": [int(pdf["amount"].sum())]}
            )

        df = spark.read.parquet(path).groupBy("user").applyInPandas(per_key, "user string, cnt long, total long")
        return df.collect()

    def shape_job() -> list[Any]:
        df = (
            spark.read.parquet(path)
            .select("user", "amount", F.monotonically_increasing_id().alias("seq"))
            .repartition(2, "user")
            .sortWithinPartitions("user", "seq")
            .mapInPandas(shape_count_sum, "user string, cnt long, total long")
        )
        return df.collect()

    def native() -> list[Any]:
        return (
            spark.read.parquet(path)
            .groupBy("user")
            .agg(F.count("*").alias("cnt"), F.sum("amount").alias("total"))
            .collect()
        )

    from flowspark.spark.batch.describe import describe_stage
    from flowspark.spark.tools import physical_plans

    results: dict[str, float] = {}

    def parquet_section() -> None:
        # The physical plan the run uses, with the optimizer's decisions (built by the job's own builder).
        plan = compile_flow(build_flowspark(SparkSource("parquet", path), []))
        print(physical_plans(plan, spark)[0].render(describe_stage))
        # Warm-up (JVM, Python workers, code paths) of every job on the same file.
        flowspark_parquet()
        native()
        apply_in_pandas()

        print("\n-- parquet input --")
        out = timed("flowspark on Spark (parquet)", flowspark_parquet, n, results)
        got = {k: v for k, v in out}
        assert got == expected, "flowspark result differs from Spark's"
        rows = timed("hand-written job of flowspark's shape", shape_job, n, results)
        assert {r.user: (r.cnt, r.total) for r in rows} == expected
        rows = timed("hand-written groupBy().applyInPandas", apply_in_pandas, n, results)
        assert {r.user: (r.cnt, r.total) for r in rows} == expected
        timed("native groupBy().agg(count, sum)", native, n, results)
        fs, shape, aip, nat = (
            results["flowspark on Spark (parquet)"],
            results["hand-written job of flowspark's shape"],
            results["hand-written groupBy().applyInPandas"],
            results["native groupBy().agg(count, sum)"],
        )
        print(
            f"flowspark / shape job: {fs / shape:5.2f}x (target >= 0.8)   flowspark / applyInPandas: "
            f"{fs / aip:5.2f}x (target >= 5)   native / flowspark: {nat / fs:5.2f}x (target <= 4)"
        )

    def whole_section() -> None:
        print("\n-- whole job: parquet -> running count per user -> parquet --")
        out_fs = os.path.join(tmp, "out-flowspark")
        out_hw = os.path.join(tmp, "out-hand")

        def whole_flowspark() -> None:
            run(build_whole_job(SparkSource("parquet", path), SparkSink("parquet", out_fs)), spark=spark)

        def whole_flowspark_schema() -> None:
            sink = SparkSink("parquet", out_fs + "-schema", schema="user string, pos long, amount long, count long")
            run(build_whole_job(SparkSource("parquet", path), sink), spark=spark)

        def whole_flowspark_no_rules() -> None:
            sink = SparkSink("parquet", out_fs + "-none")
            run(build_whole_job(SparkSource("parquet", path), sink), spark=spark, rules="none")

        def whole_hand() -> None:
            (
                spark.read.parquet(path)
                .withColumn("seq", F.monotonically_increasing_id())
                .repartition(2, "user")
                .sortWithinPartitions("user", "seq")
                .mapInPandas(shape_running_count, "user string, pos long, amount long, count long")
                .write.mode("overwrite")
                .parquet(out_hw)
            )

        whole_plan = compile_flow(build_whole_job(SparkSource("parquet", path), SparkSink("parquet", out_fs)))
        print(physical_plans(whole_plan, spark)[0].render(describe_stage))

        def whole_same_functions() -> None:
            (
                spark.read.parquet(path)
                .withColumn("seq", F.monotonically_increasing_id())
                .repartition(2, "user")
                .sortWithinPartitions("user", "seq")
                .drop("seq")
                .mapInArrow(shape_same_functions, "user string, pos long, amount long, count long")
                .write.mode("overwrite")
                .parquet(out_hw + "-fn")
            )

        rounds(
            [
                ("flowspark whole job (parquet -> parquet)", whole_flowspark),
                ("flowspark whole job, SparkSink with a schema", whole_flowspark_schema),
                ("hand-written whole job of the same shape", whole_hand),
                ("hand-written, the flow's functions on row dicts", whole_same_functions),
            ],
            n,
            results,
        )
        whole_flowspark_no_rules()
        timed("flowspark whole job, rules=none (every fast path off)", whole_flowspark_no_rules, n, results)
        a = spark.read.parquet(out_fs).select("user", "pos", "amount", "count")
        b = spark.read.parquet(out_hw).select("user", "pos", "amount", "count")
        assert a.count() == n, "flowspark wrote a different number of rows"
        assert a.exceptAll(b).count() == 0, "outputs differ"
        assert b.exceptAll(a).count() == 0, "outputs differ"
        fw, hw = (
            results["flowspark whole job (parquet -> parquet)"],
            results["hand-written whole job of the same shape"],
        )
        fn = results["hand-written, the flow's functions on row dicts"]
        print(
            f"flowspark / hand-written whole job: {fw / hw:5.2f}x (target >= 0.9 in every run)   "
            f"rows identical: {n:,}   "
            f"flowspark / hand-written calling the same functions: {fw / fn:5.2f}x"
        )
        fs_schema = results["flowspark whole job, SparkSink with a schema"]
        print(f"with a schema: flowspark / hand-written whole job: {fs_schema / hw:5.2f}x")
        none = results["flowspark whole job, rules=none (every fast path off)"]
        c = spark.read.parquet(out_fs + "-none").select("user", "pos", "amount", "count")
        assert c.exceptAll(a).count() == 0, "rules=none wrote other rows"
        assert a.exceptAll(c).count() == 0, "rules=none wrote other rows"
        print(f"the optimizer's rules: rules=all / rules=none: {fw / none:5.2f}x (rows identical)")

    def testing_section() -> None:
        print("\n-- TestingSource input (items built in the driver) --")
        items = [{"user": f"u{i * 7919 % nkeys}", "amount": i % 100} for i in range(n)]

        outs: dict[str, list[Any]] = {}

        def flowspark_testing() -> None:
            outs["flowspark"] = []
            run(build_flowspark(TestingSource(items), outs["flowspark"]), spark=spark)

        jobs = [("flowspark on Spark (TestingSource)", flowspark_testing)]
        if not args.skip_bytewax:
            from bytewax.testing import run_main as bw_run_main

            def bytewax_run() -> None:
                outs["bytewax"] = []
                bw_run_main(build_bytewax(items, outs["bytewax"]))

            jobs.append(("bytewax 0.21 run_main", bytewax_run))
        rounds(jobs, n, results)  # alternating: both under the same spells of load
        for out in outs.values():
            assert dict(out) == expected
        if not args.skip_bytewax:
            ratio = results["flowspark on Spark (TestingSource)"] / results["bytewax 0.21 run_main"]
            print(f"flowspark (TestingSource) / bytewax run_main: {ratio:5.2f}x")

        print("-- the same input, a running count emitting every event (1M items back at the driver) --")
        import flowspark.operators as fop
        from flowspark.dataflow import Dataflow
        from flowspark.testing import TestingSink

        every: dict[str, list[Any]] = {}

        def flowspark_every() -> None:
            every["flowspark"] = []
            run(build_every_event(fop, Dataflow, TestingSource(items), TestingSink(every["flowspark"])), spark=spark)

        jobs = [("flowspark on Spark, every event (TestingSource)", flowspark_every)]
        if not args.skip_bytewax:
            import bytewax.operators as bop
            from bytewax.dataflow import Dataflow as BDataflow
            from bytewax.testing import TestingSink as BSink
            from bytewax.testing import TestingSource as BSource

            def bytewax_every() -> None:
                every["bytewax"] = []
                flow = build_every_event(bop, BDataflow, BSource(items, batch_size=1000), BSink(every["bytewax"]))
                bw_run_main(flow)

            jobs.append(("bytewax 0.21 run_main, every event", bytewax_every))
        rounds(jobs, n, results)
        if "bytewax" in every:
            assert sorted(every["flowspark"]) == sorted(every["bytewax"]), "flowspark and bytewax emitted other items"
        if not args.skip_bytewax:
            ratio = (
                results["flowspark on Spark, every event (TestingSource)"]
                / results["bytewax 0.21 run_main, every event"]
            )
            print(f"flowspark (TestingSource, every event) / bytewax run_main: {ratio:5.2f}x (target >= 2)")

    if args.only != "count_sum":
        run(build_flowspark(TestingSource([{"user": "u1", "amount": 1}] * 1000), []), spark=spark)  # warm-up
    if args.only is None:
        parquet_section()
    if args.only in (None, "whole"):
        whole_section()
    if args.only in (None, "count_sum"):
        count_sum_section(spark, path, tmp, n, results)
    if args.only in (None, "testing"):
        testing_section()
    spark.stop()
    chart.write(args, f"Spark bounded, {n:,} events, {nkeys:,} keys, {args.master} (best wall)", results)


if __name__ == "__main__":
    main()
