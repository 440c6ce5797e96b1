"""Spark keys the rows of a SparkSource itself when `key_on` reads one string column (`ColumnKey`).

Every case runs the flow twice on the same DataFrame: once with a key function
flowspark recognises (`lambda r: r["user"]`: Spark computes the key and each row's
position, one Python pass) and once with an equivalent it does not recognise
(`lambda r: (r["user"],)[0]`: today's two Python passes). The outputs must be the
same list, in the same order, and the errors the same text.
"""

from __future__ import annotations

import operator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from examples_budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark import SparkSink, SparkSource, compile_flow, run
from flowspark.spark.batch.describe import describe_stage
from flowspark.spark.rules.optimizer import Env, optimize
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

pytestmark = [pytest.mark.spark]

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def recognised(r):
    return r["user"]


def not_recognised(r):
    return (r["user"],)[0]


def _count(state, v):
    n = (state or 0) + 1
    return n, (n, v)


def build(source: Any, key: Any, out: list[Any], pre_filter: bool = True, tail: str = "count") -> Dataflow:
    flow = Dataflow("ck")
    rows = op.input("inp", flow, source)
    if pre_filter:
        rows = op.filter("small", rows, lambda r: r["v"] is None or r["v"] < 35)
    keyed = op.key_on("key", rows, key)
    vals = op.map_value("v", keyed, lambda r: r["v"])
    vals = op.flat_map_value("twice", vals, lambda v: [v, -1] if v is not None and v % 5 == 0 else [v])
    if tail == "count":
        s = op.stateful_map("count", vals, _count)
        s = op.fold_final("last", s, lambda: None, lambda acc, nv: nv)
    else:
        s = op.collect("batches", vals, timedelta(hours=1), 3)
    op.output("out", s, TestingSink(out))
    return flow


def _df(spark, rows, schema="user string, v long", partitions=3):
    return spark.createDataFrame(rows, schema).repartition(partitions)


def _run_both(spark, df, **kw):
    out_native: list[Any] = []
    out_python: list[Any] = []
    run(build(SparkSource.from_dataframe(df), recognised, out_native, **kw), spark=spark, start_time=T0)
    run(build(SparkSource.from_dataframe(df), not_recognised, out_python, **kw), spark=spark, start_time=T0)
    return out_native, out_python


def test_plan_says_which_lowering_a_keyed_stage_gets():
    env = Env("batch", columns={0: (("user", "string"), ("v", "bigint"))})
    native = optimize(compile_flow(build(SparkSource("parquet", "/x"), recognised, [])), env)
    python = optimize(compile_flow(build(SparkSource("parquet", "/x"), not_recognised, [])), env)
    assert native.stages[1].spec.column_key is not None
    assert python.stages[1].spec.column_key is None
    assert "Spark keys the rows" in native.render(describe_stage)
    assert "Spark keys the rows" not in python.render(describe_stage)


def test_same_results_and_order_as_the_python_pass(spark):
    rows = [(f"u{i % 7}", i % 40) for i in range(300)]
    df = _df(spark, rows)
    native, python = _run_both(spark, df)
    assert native == python
    assert len(native) == 7
    native, python = _run_both(spark, df, tail="collect")
    assert native == python


def test_same_results_as_in_memory_per_key(spark):
    rows = [(f"u{i % 5}", i % 40) for i in range(200)]
    df = spark.createDataFrame(rows, "user string, v long")  # contiguous slices: partition order is list order
    out: list[Any] = []
    run(build(SparkSource.from_dataframe(df), recognised, out), spark=spark, start_time=T0)
    ref: list[Any] = []
    run_main(
        build(TestingSource([{"user": u, "v": v} for u, v in rows]), recognised, ref), clock="fixed", start_time=T0
    )
    assert per_key(out) == per_key(ref)


def _inv(v):
    return None if v is None else 100 // (v - 13)


def _values_flow(source: Any, key: Any, out: list[Any], project: bool = False) -> Dataflow:
    """`key_on` then only `map_value` steps before the keyed step: Spark-keyed stages map the values as a column.

    With `project`, the first of them is `lambda r: r["v"]` (the values are then read from column `v`).
    """
    flow = Dataflow("vals")
    keyed = op.key_on("key", op.input("inp", flow, source), key)
    if project:
        vals = op.map_value("inv", op.map_value("v", keyed, lambda r: r["v"]), _inv)
    else:
        vals = op.map_value("inv", keyed, lambda r: _inv(r["v"]))
    vals = op.map_value("pair", vals, lambda v: (v, -v if v is not None else None))
    op.output("out", op.stateful_map("count", vals, _count), TestingSink(out))
    return flow


def test_value_mappers_are_carried_to_the_spark_keyed_stage():
    for project, ids in ((False, ["inv", "pair"]), (True, ["v", "inv", "pair"])):
        flow = _values_flow(SparkSource("parquet", "/x"), recognised, [], project=project)
        plan = optimize(compile_flow(flow), Env("batch", columns={0: (("user", "string"), ("v", "bigint"))}))
        stage = next(st for st in plan.stages if st.spec.chain)
        assert plan.decision("value_mappers", "stage 1").applied
        assert plan.decision("value_column", "stage 1").applied is project
        ck = stage.spec.column_key
        assert ck is not None
        assert [o.step_id for o in ck.ops[1:]] == [f"vals.{i}.flat_map_batch" for i in ids]
        assert all(o.value_fn is not None for o in ck.ops[1:])
        assert ck.ops[-1].value_fn(7) == (7, -7)  # the user's mapper, per value
        assert ck.value_from == ("v" if project else None)


@pytest.mark.parametrize("project", [False, True])
def test_values_mapped_as_a_column_give_the_python_pass_output_and_errors(spark, project):
    rows = [(f"u{i % 6}", None if i % 17 == 0 else i % 13) for i in range(240)]  # v is never 13: no error
    df = spark.createDataFrame(rows, "user string, v long")  # contiguous slices: partition order is list order
    outs = []
    for key in (recognised, not_recognised):
        out: list[Any] = []
        run(_values_flow(SparkSource.from_dataframe(df), key, out, project), spark=spark, start_time=T0)
        outs.append(out)
    ref: list[Any] = []
    items = [{"user": u, "v": v} for u, v in rows]
    run_main(_values_flow(TestingSource(items), recognised, ref, project), clock="fixed", start_time=T0)
    assert outs[0] == outs[1]
    assert per_key(outs[0]) == per_key(ref)
    assert len(ref) == 240

    bad = _df(spark, [*rows[:50], ("u2", 13), *rows[50:]], partitions=1)
    errors = []
    for key in (recognised, not_recognised):
        with pytest.raises(FlowsparkRuntimeError) as e:
            run(_values_flow(SparkSource.from_dataframe(bad), key, [], project), spark=spark, start_time=T0)
        errors.append((e.value.step_id, e.value.exc_type, str(e.value)))
    with pytest.raises(FlowsparkRuntimeError) as e:
        run_main(_values_flow(TestingSource([{"user": "u2", "v": 13}]), recognised, [], project))
    assert errors[0] == errors[1]
    assert errors[0][:2] == (e.value.step_id, e.value.exc_type) == ("vals.inv.flat_map_batch", "ZeroDivisionError")
    assert ("('u2', 13)" if project else "{'user': 'u2', 'v': 13}") in errors[0][2]


def _row_of(user_count):
    user, (n, v) = user_count
    if v == 14:
        raise ValueError("fourteen")
    return {"user": user, "v": v, "n": n}


@pytest.mark.parametrize("schema", [None, "user STRING, v LONG, n LONG"])
def test_a_sink_stages_map_steps_give_rows_and_their_errors_name_the_step(spark, tmp_path, schema):
    """The steps after the keyed step run on the item list when they are one line of `map`s."""
    rows = [(f"u{i % 3}", i) for i in range(60)]
    df = spark.createDataFrame(rows, "user string, v long")

    def job(data: Any, where: str) -> Dataflow:
        flow = Dataflow("job")
        k = op.key_on("key", op.input("inp", flow, SparkSource.from_dataframe(data)), recognised)
        c = op.stateful_map("count", op.map_value("v", k, lambda r: r["v"]), _count)
        s = op.map("row", op.map("twice", c, lambda kv: (kv[0], (kv[1][0], kv[1][1] * 2))), _row_of)
        op.output("out", s, SparkSink("parquet", str(tmp_path / where), schema=schema))
        return flow

    run(job(df.filter("v % 2 = 0"), "even"), spark=spark)
    got = sorted(tuple(r) for r in spark.read.parquet(str(tmp_path / "even")).select("user", "v", "n").collect())
    per_user: dict[str, int] = {}
    want = []
    for u, v in rows:
        if v % 2 == 0:
            per_user[u] = per_user.get(u, 0) + 1
            want.append((u, 2 * v, per_user[u]))
    assert got == sorted(want)
    with pytest.raises(FlowsparkRuntimeError) as e:
        run(job(df.filter("v % 2 = 1"), "odd"), spark=spark)  # v = 7 (user u1, its 2nd odd value) fails
    assert e.value.step_id == "job.row.flat_map_batch"
    assert e.value.exc_type == "ValueError"
    assert "('u1', (2, 14))" in str(e.value)  # the item the `row` step got
    assert "Traceback" not in str(e.value)


def test_itemgetter_parquet_to_spark_sink(spark, tmp_path):
    rows = [(f"u{i % 3}", i) for i in range(60)]
    spark.createDataFrame(rows, "user string, v long").repartition(2).write.parquet(str(tmp_path / "in"))

    def job(key: Any, where: str) -> Dataflow:
        flow = Dataflow("job")
        k = op.key_on("key", op.input("inp", flow, SparkSource("parquet", str(tmp_path / "in"))), key)
        c = op.stateful_map(
            "count", k, lambda s, r: ((s or 0) + 1, {"user": r["user"], "v": r["v"], "n": (s or 0) + 1})
        )
        op.output("out", op.key_rm("rm", c), SparkSink("parquet", str(tmp_path / where)))
        return flow

    run(job(operator.itemgetter("user"), "a"), spark=spark)
    run(job(not_recognised, "b"), spark=spark)
    a = spark.read.parquet(str(tmp_path / "a"))
    b = spark.read.parquet(str(tmp_path / "b"))
    assert a.count() == 60
    assert a.exceptAll(b).count() == 0
    assert b.exceptAll(a).count() == 0


def _error(spark, df, key):
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(build(SparkSource.from_dataframe(df), key, [], pre_filter=False), spark=spark, start_time=T0)
    return info.value


def test_null_key_raises_the_same_error_naming_the_step(spark):
    df = _df(spark, [("a", 1), (None, 2), ("b", 3)])
    native = _error(spark, df, recognised)
    python = _error(spark, df, not_recognised)
    assert str(native) == str(python)
    assert native.step_id == "ck.key.flat_map_batch"
    assert "key function must return a str; returned None" in str(native)


def test_null_keys_a_filter_drops_are_no_error(spark):
    df = _df(spark, [("a", 1), (None, 99), ("b", 3)])
    native, python = _run_both(spark, df)
    assert native == python
    assert sorted(k for k, _ in native) == ["a", "b"]


def test_a_non_string_column_keeps_the_python_pass_and_its_error(spark):
    df = _df(spark, [(1, 1)], schema="user long, v long")
    native = _error(spark, df, recognised)
    python = _error(spark, df, not_recognised)
    assert str(native) == str(python)
    assert "key function must return a str; returned 1 of type int" in str(native)


def test_a_missing_column_keeps_the_python_pass_and_its_error(spark):
    df = _df(spark, [("a", 1)], schema="name string, v long")
    native = _error(spark, df, recognised)
    python = _error(spark, df, not_recognised)
    assert str(native) == str(python)
    assert native.exc_type == "KeyError"


def test_explain_prints_the_lowering_each_keyed_stage_got(spark, capsys):
    df = _df(spark, [("a", 1)])
    run(build(SparkSource.from_dataframe(df), recognised, []), spark=spark, explain=True)
    assert "    rule spark_keys: applied" in capsys.readouterr().out
    df = _df(spark, [(1, 1)], schema="user long, v long")
    with pytest.raises(FlowsparkRuntimeError):
        run(build(SparkSource.from_dataframe(df), recognised, []), spark=spark, explain=True)
    assert "    rule spark_keys: not applied (column 'user' is bigint, not string)" in capsys.readouterr().out


ROWS = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", None]), st.integers(0, 60)), max_size=40)


@pytest.mark.slow
@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS, parts=st.integers(1, 3), tail=st.sampled_from(["count", "collect"]))
def test_both_lowerings_agree(spark, rows, parts, tail):
    """Random rows (some with a null key, which the filter keeps only when `v` < 35): same output or same error.

    With null keys in several partitions, which bad row a run reports first may differ
    (the Python pass reads partitions in parallel), so errors compare by step and type
    and must name one of the bad rows.
    """
    df = _df(spark, rows, partitions=parts)
    bad = [{"user": None, "v": v} for u, v in rows if u is None and v < 35]
    results = []
    for key in (recognised, not_recognised):
        out: list[Any] = []
        try:
            run(build(SparkSource.from_dataframe(df), key, out, tail=tail), spark=spark, start_time=T0)
            results.append(("ok", out))
        except FlowsparkRuntimeError as e:
            named = any(f"returned None of type NoneType for item {b!r}" in str(e) for b in bad)
            results.append(("error", e.step_id, e.exc_type, named))
    assert results[0] == results[1]
    assert results[0][0] == ("error" if bad else "ok")
    if bad:
        assert results[0][3], "the error names one of the rows with a null key"


def _sample_job(src: str, key: Any, where: str) -> Dataflow:
    """parquet `src` keyed by `key` -> the row unchanged per key -> `{user, x: v}` -> parquet `where`, no schema."""
    flow = Dataflow("job")
    k = op.key_on("key", op.input("inp", flow, SparkSource("parquet", src)), key)
    c = op.stateful_map("same", k, lambda s, r: (s, r))
    op.output("out", op.map("row", c, lambda kv: {"user": kv[0], "x": kv[1]["v"]}), SparkSink("parquet", where))
    return flow


@pytest.mark.parametrize("first_key_rows", [99, 100])
def test_a_sink_without_schema_infers_it_from_the_first_100_items_on_both_lowerings(
    spark, tmp_path, capsys, first_key_rows
):
    # Key "a" sorts first in the only partition; its items have x = None. With 99 of them the
    # first 100 items include one of key "b" (x a long): Spark infers the schema. With 100,
    # Spark cannot type x and the run asks for a schema. The Spark-keyed stage samples with
    # a job that stops early (no persisted output); the Python pass samples the persisted
    # output: both must agree.
    rows = [("a", None)] * first_key_rows + [("b", i) for i in range(50)]
    spark.createDataFrame(rows, "user string, v long").coalesce(1).write.parquet(str(tmp_path / "in"))

    outcomes = []
    for key, where in ((recognised, "a"), (not_recognised, "b")):
        path = str(tmp_path / where)
        try:
            run(_sample_job(str(tmp_path / "in"), key, path), spark=spark, partitions=1, explain=True)
        except FlowsparkRuntimeError as e:
            outcomes.append(str(e))
        else:
            df = spark.read.parquet(path)
            outcomes.append((df.schema.simpleString(), sorted(df.collect())))
    assert outcomes[0] == outcomes[1]
    printed = capsys.readouterr().out
    assert "    rule schema_sampling: applied" in printed
    assert (
        "    rule schema_sampling: not applied (its stage is fed by another Python stage, which would run twice)"
        in printed
    )
    if first_key_rows == 99:
        assert outcomes[0][0] == "struct<user:string,x:bigint>"
        assert len(outcomes[0][1]) == 149
    else:
        assert outcomes[0].startswith("error in step 'job.out': cannot infer the rows' schema")


@pytest.mark.parametrize("takes", [None, (5, 400), (5, 10)])
def test_the_first_keys_sample_reads_partition_0_as_the_stage_does(spark, tmp_path, monkeypatch, takes):
    # 600 keys of 3 rows each, x = None, except key z, the 10th key Spark puts in partition 0
    # of 3: only partition 0's first keys, in sorted order, give its 3 longs to the first 100
    # items, so inferring the schema succeeds only if the sample reads what partition 0 runs.
    # `takes`: the rows the sample takes from partition 0 (`columns.SAMPLE_ROWS`): all of it
    # (None: the default), a cut first take then a second one that gives 100 items (the cut
    # key's rows dropped), or two cut takes too small (the full sampling job then runs).
    from pyspark.sql import functions as F  # noqa: N812,TID251

    from flowspark.spark.io import columns

    if takes is not None:
        monkeypatch.setattr(columns, "SAMPLE_ROWS", takes)
    keys = [f"k{i:03d}" for i in range(600)]
    part = spark.createDataFrame([(k,) for k in keys], "user string").select(
        "user", F.pmod(F.hash("user"), F.lit(3)).alias("p")
    )
    z = sorted(r.user for r in part.collect() if r.p == 0)[9]
    rows = [(k, 7 if k == z else None) for k in keys for _ in range(3)]
    spark.createDataFrame(rows, "user string, v long").repartition(4).write.parquet(str(tmp_path / "in"))

    got = []
    for key, where in ((recognised, "a"), (not_recognised, "b")):
        run(_sample_job(str(tmp_path / "in"), key, str(tmp_path / where)), spark=spark, partitions=3)
        df = spark.read.parquet(str(tmp_path / where))
        got.append((df.schema.simpleString(), sorted(df.collect())))
    assert got[0] == got[1]
    assert got[0][0] == "struct<user:string,x:bigint>"
    assert len(got[0][1]) == 1800


def _times_flow(source: Any, key: Any, out: list[Any]) -> Dataflow:
    flow = Dataflow("ck_times")
    keyed = op.key_on("key", op.input("inp", flow, source), key)
    op.output("out", op.stateful_map("seen", keyed, lambda st, r: (None, r["ts"])), TestingSink(out))
    return flow


def test_timestamps_are_utc_datetimes_in_a_utc_session_whichever_pass_reads_them(spark):
    """A TIMESTAMP column in a UTC session: `datetime`s in `timezone.utc`, the same through either lowering."""
    times = [T0 + timedelta(seconds=7 * i, microseconds=i) for i in range(12)]
    rows = [(f"u{i % 3}", t) for i, t in enumerate(times)]
    df = spark.createDataFrame(rows, "user string, ts timestamp")
    outs = {}
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        for key in (recognised, not_recognised):
            out: list[Any] = []
            run(_times_flow(SparkSource.from_dataframe(df), key, out), spark=spark)
            outs[key.__name__] = sorted(out)
            assert sorted(ts for _k, ts in out) == times
            assert all(type(ts) is datetime and ts.tzinfo is timezone.utc for _k, ts in out)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert outs["recognised"] == outs["not_recognised"]
