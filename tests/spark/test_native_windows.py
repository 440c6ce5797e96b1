"""The rule `native_reduction` on window counts: `count_window` (and `fold_window` with a count) as Spark aggregates.

Every case compares the Spark batch run with every rule on (the aggregate), with `rules="none"`
(the Python pass) and with the in-memory executor (`run_main(clock="fixed")` over the same
rows): the same windows per key, the same counts, the same metadata, the same error.
"""

from __future__ import annotations

import contextlib
import io
import os
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from examples_budget import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark import reducers
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark import SparkSink, SparkSource, compile_flow, run
from flowspark.spark.batch.describe import describe_stage
from flowspark.spark.tools import physical_plans
from flowspark.testing import TestingSink, TestingSource, run_main

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SCHEMA = "user STRING, ts TIMESTAMP, x LONG"
DOWN = "user STRING, wid LONG, n LONG"
META = "user STRING, wid LONG, open TIMESTAMP, close TIMESTAMP"


def _user(r):
    return r["user"]


def _ts(r):
    return r["ts"]


def _ts_plus(r):
    return r["ts"] + timedelta(seconds=1)


def _down_row(kv):
    return {"user": kv[0], "wid": kv[1][0], "n": kv[1][1]}


def _meta_row(kv):
    return {"user": kv[0], "wid": kv[1][0], "open": kv[1][1].open_time, "close": kv[1][1].close_time}


def _late_row(kv):
    return {"user": kv[0], "wid": kv[1][0], "n": kv[1][1]["x"]}


def _windower(sliding: bool) -> Any:
    if sliding:
        return win.SlidingWindower(timedelta(seconds=60), timedelta(seconds=20), T0)
    return win.TumblingWindower(timedelta(seconds=60), T0 + timedelta(seconds=7))


def _flow(src: Any, sinks: dict[str, Any], wait: int, sliding: bool, folded: bool, ts: Any = _ts) -> Dataflow:
    """Counts per user and window (`count_window`, or `fold_window` with reducers); down and meta to `sinks`."""
    flow = Dataflow("wcount")
    s = op.input("inp", flow, src)
    clock = win.EventClock(ts, timedelta(seconds=wait))
    if folded:
        keyed = op.key_on("key", s, _user)
        out = win.fold_window("n", keyed, clock, _windower(sliding), reducers.zero, reducers.count, reducers.sum)
    else:
        out = win.count_window("n", s, clock, _windower(sliding), _user)
    op.output("down", op.map("down_row", out.down, _down_row), sinks["down"])
    op.output("meta", op.map("meta_row", out.meta, _meta_row), sinks["meta"])
    if "late" in sinks:
        op.output("late", op.map("late_row", out.late, _late_row), sinks["late"])
    return flow


def _parquet(spark: Any, tmp: Any, rows: list[dict[str, Any]]) -> str:
    path = str(tmp / f"in{len(list(tmp.iterdir()))}")
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.parquet(path)
    return path


def _in_memory(rows: list[dict[str, Any]], **shape: Any) -> dict[str, list[Any]]:
    outs: dict[str, list[Any]] = {"down": [], "meta": [], "late": []}
    sinks = {name: TestingSink(items) for name, items in outs.items()}
    run_main(_flow(TestingSource(rows), sinks, **shape), clock="fixed")
    return {name: sorted(tuple(r.values()) for r in items) for name, items in outs.items()}


def _on_spark(spark: Any, tmp: Any, path: str, rules: str, late: bool = False, **shape: Any) -> tuple[dict, str]:
    """The rows the run wrote, sorted, and its rendered decisions."""
    names = ["down", "meta", *(["late"] if late else [])]
    dirs = {name: str(tmp / f"{name}-{rules}-{len(list(tmp.iterdir()))}") for name in names}
    schemas = {"down": None, "meta": META, "late": DOWN}  # down: inferred from the aggregate's first rows
    sinks = {name: SparkSink("parquet", d, schema=schemas[name]) for name, d in dirs.items()}
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        run(_flow(SparkSource("parquet", path), sinks, **shape), spark=spark, rules=rules, explain=True)
    got = {}
    for name, d in dirs.items():
        cols = ["user", "wid", "n"] if name != "meta" else ["user", "wid", "open", "close"]
        # No rows and no schema: nothing to infer a schema from, nothing written.
        rows = spark.read.parquet(d).collect() if os.path.exists(d) else []
        got[name] = sorted(tuple(r[c] for c in cols) for r in rows)
    return got, text.getvalue()


def _aware(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Spark's collect gives naive local datetimes: back to aware UTC ones (the test session's zone is UTC)."""
    return [tuple(v.replace(tzinfo=timezone.utc) if isinstance(v, datetime) else v for v in r) for r in rows]


_ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "user": st.sampled_from(["a", "b", "é", "\U0001f600"]),
            "ts": st.integers(min_value=-150, max_value=300).map(lambda s: T0 + timedelta(seconds=s)),
            "x": st.integers(min_value=0, max_value=9),
        }
    ),
    max_size=40,
)
_SHAPES = st.fixed_dictionaries({"wait": st.sampled_from([0, 15]), "sliding": st.booleans(), "folded": st.booleans()})


@pytest.mark.slow
@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_ROWS, shape=_SHAPES)
@example(rows=[], shape={"wait": 0, "sliding": False, "folded": False})
@example(
    # Out of order: 100 is late (below 200 - 15), 185 (exactly 200 - 15) and 190 are not.
    rows=[{"user": "a", "ts": T0 + timedelta(seconds=s), "x": 0} for s in (10, 200, 100, 185, 190, -130, 250)],
    shape={"wait": 15, "sliding": True, "folded": False},
)
def test_window_counts_equal_the_python_pass_and_run_main(spark, tmp_path, rows, shape):
    path = _parquet(spark, tmp_path, rows)
    expected = _in_memory(rows, **shape)
    native, text = _on_spark(spark, tmp_path, path, "all", **shape)
    assert "rule native_reduction: applied" in text
    reference, text = _on_spark(spark, tmp_path, path, "none", **shape)
    assert "rule native_reduction: applied" not in text
    for name in ("down", "meta"):
        assert _aware(native[name]) == expected[name]
        assert _aware(reference[name]) == expected[name]


def test_late_values_read_keep_the_python_pass(spark, tmp_path):
    rows = [{"user": "a", "ts": T0 + timedelta(seconds=s), "x": s} for s in (100, 30, 130, 10)]
    path = _parquet(spark, tmp_path, rows)
    shape = {"wait": 0, "sliding": False, "folded": False}
    got, text = _on_spark(spark, tmp_path, path, "all", late=True, **shape)
    assert "its late values are read (by wcount.late_row.flat_map_batch); Spark counts only the values on time" in text
    expected = _in_memory(rows, **shape)
    assert expected["late"] == [("a", 0, 10), ("a", 0, 30)]
    for name in ("down", "meta", "late"):
        assert _aware(got[name]) == expected[name]


def test_the_rule_needs_a_clock_reading_a_timestamp_column_and_no_order_across_keys(spark, tmp_path):
    rows = [{"user": u, "ts": T0 + timedelta(seconds=s), "x": 1} for u, s in (("a", 5), ("b", 70), ("a", 65))]
    path = _parquet(spark, tmp_path, rows)
    shape = {"wait": 0, "sliding": False, "folded": False}

    def decision(flow: Dataflow) -> str:
        plan, _ = physical_plans(compile_flow(flow), spark)
        return next(str(d) for d in plan.decisions if d.rule == "native_reduction")

    sinks = {name: SparkSink("parquet", str(tmp_path / name)) for name in ("down", "meta")}

    def src() -> Any:
        return SparkSource("parquet", path)

    flow = _flow(src(), sinks, **shape)
    assert decision(flow) == "rule native_reduction: applied"
    plan, _ = physical_plans(compile_flow(flow), spark)
    assert "groupBy('user', window id (length 0:01:00, every 0:01:00)).agg(count(*))" in plan.render(describe_stage)
    flow = _flow(SparkSource("parquet", path), sinks, ts=_ts_plus, **shape)
    assert "ts_getter is not proven to read a column (row[column])" in decision(flow)
    flow = _flow(SparkSource("parquet", path), {"down": TestingSink([]), "meta": TestingSink([])}, **shape)
    assert "order of the stage's emits across keys is read (unordered_emits did not apply)" in decision(flow)
    # In a zone with daylight saving time, Python subtracts the wait in wall-clock time.
    zone = spark.conf.get("spark.sql.session.timeZone")
    try:
        spark.conf.set("spark.sql.session.timeZone", "Europe/Paris")
        assert "the session time zone 'Europe/Paris' has no fixed UTC offset" in decision(_flow(src(), sinks, **shape))
        spark.conf.set("spark.sql.session.timeZone", "+02:00")
        assert decision(_flow(src(), sinks, **shape)) == "rule native_reduction: applied"
        got, _text = _on_spark(spark, tmp_path, path, "all", **shape)
        assert _aware(got["down"]) == _in_memory(rows, **shape)["down"]
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    # The same windows and counts as in memory with a TestingSink (the Python pass, in order).
    outs: dict[str, list[Any]] = {"down": [], "meta": []}
    run(_flow(SparkSource("parquet", path), {k: TestingSink(v) for k, v in outs.items()}, **shape), spark=spark)
    expected = _in_memory(rows, **shape)
    assert sorted(tuple(r.values()) for r in outs["down"]) == expected["down"]


def test_a_null_time_gives_the_in_memory_error(spark, tmp_path):
    rows = [{"user": "a", "ts": T0, "x": 1}, {"user": "b", "ts": None, "x": 2}]
    path = _parquet(spark, tmp_path, rows)
    shape = {"wait": 0, "sliding": False, "folded": False}
    errors = []
    for rules in ("all", "none"):
        with pytest.raises(FlowsparkRuntimeError) as info:
            _on_spark(spark, tmp_path, path, rules, **shape)
        errors.append(str(info.value))
    with pytest.raises(FlowsparkRuntimeError) as info:
        _in_memory(rows, **shape)
    assert "error in step 'wcount.n.stateful_batch' for key 'b'" in errors[0]
    assert "ts_getter returned None" in errors[0]
    assert errors[0] == errors[1] == str(info.value)


def test_a_source_of_several_files_is_counted_in_its_rows_order(spark, tmp_path):
    """Positions span partitions (files): the late values are those of the Python pass's order (partition, row)."""
    rows = [
        {"user": f"u{i % 5}", "ts": T0 + timedelta(seconds=(i * 37) % 400 - 100 + (i // 50) * 30), "x": i}
        for i in range(600)
    ]
    path = str(tmp_path / "parts")
    spark.createDataFrame(rows, SCHEMA).repartition(3).write.parquet(path)
    conf = "spark.sql.files.maxPartitionBytes"
    old = spark.conf.get(conf)
    spark.conf.set(conf, "2000")  # one partition per file at least
    try:
        df = spark.read.parquet(path)
        assert df.rdd.getNumPartitions() >= 3
        # The rows in Spark's order (collect keeps the partitions' order), as the Python pass sees them.
        ordered = [{**r.asDict(), "ts": r.ts.replace(tzinfo=timezone.utc)} for r in df.collect()]
        shape = {"wait": 20, "sliding": False, "folded": True}
        expected = _in_memory(ordered, **shape)
        assert expected["down"] != _in_memory(rows, **shape)["down"]  # the order decides which values are late
        got = {}
        for rules in ("all", "none"):
            outs = {name: str(tmp_path / f"{name}-{rules}-parts") for name in ("down", "meta")}
            sinks = {name: SparkSink("parquet", d, schema=DOWN if name == "down" else META) for name, d in outs.items()}
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                run(_flow(SparkSource("parquet", path), sinks, **shape), spark=spark, rules=rules, explain=True)
            assert ("rule native_reduction: applied" in text.getvalue()) == (rules == "all")
            got[rules] = sorted(tuple(r) for r in spark.read.parquet(outs["down"]).select("user", "wid", "n").collect())
        assert got["all"] == got["none"] == expected["down"]
        # A DataFrame's row order may depend on the columns read: the rule does not apply.
        plan, _ = physical_plans(
            compile_flow(_flow(SparkSource.from_dataframe(df.repartition(2)), sinks, **shape)), spark
        )
        assert "the SparkSource reads a dataframe, whose row order may depend on the columns read" in str(plan)
    finally:
        spark.conf.set(conf, old)


def _down_only(src: Any, sink: Any) -> Dataflow:
    flow = Dataflow("wdown")
    s = op.input("inp", flow, src)
    clock = win.EventClock(_ts, timedelta(seconds=5))
    out = win.count_window("n", s, clock, _windower(True), _user)
    op.output("down", op.map("down_row", out.down, _down_row), sink)
    return flow


def test_a_sink_without_schema_infers_it_from_the_aggregated_windows(spark, tmp_path):
    """`aggregate_sample` over a window count: the check job's first rows of each partition, as events."""
    rows = [{"user": f"u{i % 13}", "ts": T0 + timedelta(seconds=(i * 7) % 500), "x": i} for i in range(400)]
    path = _parquet(spark, tmp_path, rows)
    expected: list[Any] = []
    run_main(_down_only(TestingSource(rows), TestingSink(expected)), clock="fixed")
    for rules in ("all", "-aggregate_sample", "none"):
        d = str(tmp_path / f"down-{rules}")
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            run(
                _down_only(SparkSource("parquet", path), SparkSink("parquet", d)),
                spark=spark,
                rules=rules,
                explain=True,
            )
        assert ("rule aggregate_sample: applied" in text.getvalue()) == (rules == "all")
        assert ("rule native_reduction: applied" in text.getvalue()) == (rules != "none")
        df = spark.read.parquet(d)
        assert df.schema.simpleString() == "struct<n:bigint,user:string,wid:bigint>"
        assert sorted(tuple(r) for r in df.select("user", "wid", "n").collect()) == sorted(
            tuple(x.values()) for x in expected
        )
