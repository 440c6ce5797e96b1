"""Bring your own Spark source and sink: streaming DataFrames and tables in, tables and foreachBatch out.

Every streaming case runs twice on one checkpoint (new input between the runs), as a
restarted job would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from streaming_helpers import JsonlDirSource, count_mapper, count_row, write_jsonl

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark import ForeachBatchSink, SparkSink, SparkSource, compile_flow, run
from flowspark.spark.streaming import META_FILE
from flowspark.testing import TestingSink, TestingSource, per_key

pytestmark = [pytest.mark.spark]


def _counts(flow: Dataflow, rows: Any) -> Any:
    """Running count per user, as `{"user": ..., "n": ...}` rows."""
    keyed = op.key_on("key", rows, lambda r: r["user"])
    return op.map("row", op.stateful_map("count", keyed, count_mapper), count_row)


def _write_json(path: Path, users: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"user": u}) + "\n" for u in users))


def test_streaming_dataframe_source_runs_as_a_query_and_resumes(spark, tmp_path):
    src_dir, chk = tmp_path / "in", str(tmp_path / "chk")

    def flow_over(out: list) -> Dataflow:
        df = spark.readStream.schema("user STRING").json(str(src_dir))  # the user's own stream
        flow = Dataflow("own_stream")
        op.output("out", _counts(flow, op.input("inp", flow, SparkSource.from_dataframe(df))), TestingSink(out))
        return flow

    _write_json(src_dir / "0001.json", ["ann", "bob", "ann"])
    first: list = []
    flow = flow_over(first)
    assert compile_flow(flow).bounded is False  # the plan, not the runtime, knows it streams
    run(flow, spark=spark, checkpoint=chk, trigger="available_now", progress=False)
    # A stream promises each key's order (a micro-batch of a `SparkSource` is one activation).
    assert per_key([(r["user"], r["n"]) for r in first]) == {"ann": [1, 2], "bob": [1]}
    _write_json(src_dir / "0002.json", ["ann", "cid"])
    second: list = []
    run(flow_over(second), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
    assert sorted(second, key=lambda r: r["user"]) == [{"user": "ann", "n": 3}, {"user": "cid", "n": 1}]


def test_table_stream_into_a_table_sink_resumes(spark, tmp_path):
    src, dst = "flowspark_io_events", "flowspark_io_counts"
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    spark.sql(f"DROP TABLE IF EXISTS {dst}")
    chk = str(tmp_path / "chk")

    def flow_() -> Dataflow:
        flow = Dataflow("tables")
        rows = op.input("inp", flow, SparkSource("table", src, streaming=True))
        op.output("out", _counts(flow, rows), SparkSink("table", dst, schema="user STRING, n LONG"))
        return flow

    try:
        spark.createDataFrame([("ann",), ("bob",), ("ann",)], "user STRING").write.saveAsTable(src)
        spark.sql(f"CREATE TABLE {dst} (user STRING, n BIGINT) USING json")  # not Spark's default format
        run(flow_(), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
        got = sorted((r.user, r.n) for r in spark.table(dst).collect())
        assert got == [("ann", 1), ("ann", 2), ("bob", 1)]
        spark.createDataFrame([("bob",), ("dan",)], "user STRING").write.mode("append").saveAsTable(src)
        run(flow_(), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
        got = sorted((r.user, r.n) for r in spark.table(dst).collect())
        assert got == [("ann", 1), ("ann", 2), ("bob", 1), ("bob", 2), ("dan", 1)]
        assert SparkSink("table", dst).table_provider(spark) == "json"
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {src}")
        spark.sql(f"DROP TABLE IF EXISTS {dst}")


@pytest.mark.parametrize("mode", ["overwrite", "append"])
def test_table_sink_of_a_bounded_run(spark, mode):
    dst = "flowspark_io_batch_table"
    spark.sql(f"DROP TABLE IF EXISTS {dst}")
    flow = Dataflow("batch_table")
    rows = op.input("inp", flow, TestingSource([{"user": "ann"}, {"user": "bob"}, {"user": "ann"}]))
    op.output("out", _counts(flow, rows), SparkSink("table", dst, schema="user STRING, n LONG", mode=mode))
    want = [("ann", 1), ("ann", 2), ("bob", 1)]
    try:
        spark.sql(f"CREATE TABLE {dst} (user STRING, n BIGINT) USING json")  # an existing table of another format
        run(flow, spark=spark)
        run(flow, spark=spark)
        got = sorted((r.user, r.n) for r in spark.table(dst).collect())
        assert got == (want if mode == "overwrite" else sorted(want * 2))
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {dst}")


def _jsonl_flow(root: str, sink: Any, also: list | None = None) -> Dataflow:
    """Items of `<root>/a/*.jsonl` straight to `sink` (and to a TestingSink when `also` is a list)."""
    flow = Dataflow("byo_sink")
    rows = op.map("same", op.input("inp", flow, JsonlDirSource(root, ["a"])), dict)
    op.output("out", rows, sink)
    if also is not None:
        op.output("copy", rows, TestingSink(also))
    return flow


@pytest.mark.parametrize("alone", [True, False], ids=["lone sink", "next to another output"])
def test_foreach_batch_sink_gets_each_micro_batch_and_resumes(spark, tmp_path, alone):
    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    calls: list[tuple[int, list[tuple[str, int]], str]] = []

    def fn(df: Any, batch_id: int) -> None:
        calls.append((batch_id, sorted((r.user, r.n) for r in df.collect()), df.schema.simpleString()))

    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "ann", "n": 1}, {"user": "bob", "n": 2}])
    run(_jsonl_flow(root, ForeachBatchSink(fn), None if alone else []), spark=spark, checkpoint=chk,
        trigger="available_now", progress=False)  # fmt: skip
    assert calls == [(0, [("ann", 1), ("bob", 2)], "struct<n:bigint,user:string>")]
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "cid", "n": 3}])
    run(_jsonl_flow(root, ForeachBatchSink(fn), None if alone else []), spark=spark, checkpoint=chk,
        trigger="available_now", progress=False)  # fmt: skip
    assert len(calls) == 2
    batch_id, rows, schema = calls[1]
    assert batch_id > 0
    assert rows == [("cid", 3)]
    assert schema == "struct<n:bigint,user:string>"


def _counts_and_sums(src: Any, sink: Any) -> Dataflow:
    """A merge of two stateful outputs: the keyed stage is read twice, so the query is a routed chain."""
    flow = Dataflow("routed")
    keyed = op.key_on("key", op.input("inp", flow, src), lambda r: r["user"])
    counts = op.map_value("c", op.stateful_map("count", keyed, count_mapper), lambda n: ("count", n))
    sums = op.map_value("s", op.stateful_map("sum", keyed, lambda t, r: ((t or 0) + r["n"],) * 2), lambda n: ("sum", n))
    rows = op.map("row", op.merge("both", counts, sums), lambda kv: {"user": kv[0], "what": kv[1][0], "v": kv[1][1]})
    op.output("out", rows, sink)
    return flow


def test_foreach_batch_sink_as_the_lone_output_of_a_routed_chain(spark, tmp_path):
    from flowspark.spark.streaming import Lowering
    from flowspark.testing import run_main

    root = str(tmp_path / "in")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": u, "n": n} for u, n in [("ann", 1), ("bob", 2), ("ann", 3)]])
    got: list = []
    flow = _counts_and_sums(JsonlDirSource(root, ["a"]), ForeachBatchSink(lambda df, _b: got.extend(df.collect())))
    assert Lowering(compile_flow(flow), 4, timers=False, layout="bucket").routed
    run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    want: list = []
    run_main(_counts_and_sums(JsonlDirSource(root, ["a"], bounded=True), TestingSink(want)))
    assert sorted((r.user, r.what, r.v) for r in got) == sorted((w["user"], w["what"], w["v"]) for w in want)
    assert len(want) == 6


def test_foreach_batch_sink_of_a_bounded_run_is_called_once_with_batch_id_0(spark):
    calls: list = []
    flow = Dataflow("fb_batch")
    rows = op.input("inp", flow, TestingSource([{"user": "ann"}, {"user": "bob"}, {"user": "ann"}]))
    op.output(
        "out",
        _counts(flow, rows),
        ForeachBatchSink(lambda df, b: calls.append((b, df.collect())), "user STRING, n LONG"),
    )
    run(flow, spark=spark)
    assert len(calls) == 1
    assert calls[0][0] == 0
    assert sorted((r.user, r.n) for r in calls[0][1]) == [("ann", 1), ("ann", 2), ("bob", 1)]


def _boom(df: Any, batch_id: int) -> None:
    raise ValueError(f"cannot store batch {batch_id}")


@pytest.mark.parametrize("mode", ["lone", "with another output", "bounded"])
def test_an_error_in_the_foreach_batch_function_names_the_step(spark, tmp_path, mode):
    root = str(tmp_path / "in")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "ann", "n": 1}])
    if mode == "bounded":
        flow = Dataflow("byo_sink")
        op.output("out", op.input("inp", flow, TestingSource([{"user": "ann"}])), ForeachBatchSink(_boom))
        kwargs: dict = {}
    else:
        flow = _jsonl_flow(root, ForeachBatchSink(_boom), None if mode == "lone" else [])
        kwargs = {"checkpoint": str(tmp_path / "chk"), "trigger": "available_now", "progress": False}
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(flow, spark=spark, **kwargs)
    assert str(info.value) == "error in step 'byo_sink.out': ValueError: cannot store batch 0"
    assert info.value.step_id == "byo_sink.out"
    assert "Py4J" not in str(info.value)
    assert "Traceback" not in str(info.value)


@pytest.mark.parametrize("alone", [True, False], ids=["lone sink", "next to another output"])
def test_streaming_spark_sink_without_schema_pins_the_first_rows_schema(spark, tmp_path, alone):
    root, chk, out = str(tmp_path / "in"), str(tmp_path / "chk"), str(tmp_path / "out")

    def go() -> None:
        sink = SparkSink("parquet", out)
        run(_jsonl_flow(root, sink, None if alone else []), spark=spark, checkpoint=chk, trigger="available_now",
            progress=False)  # fmt: skip

    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "ann", "n": 1}])
    go()
    pinned = json.load(open(f"{chk}/{META_FILE}"))["sink_schemas"]
    assert list(pinned) == ["byo_sink.out"]
    # After the restart the pinned schema is used: a batch whose `n` is always None could
    # not be inferred on its own (Spark cannot type a column of nulls).
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "bob", "n": None}])
    go()
    df = spark.read.parquet(out)
    assert df.schema.simpleString() == "struct<n:bigint,user:string>"
    assert sorted((r.user, r.n) for r in df.collect()) == [("ann", 1), ("bob", None)]
    # A later row that does not fit: the step, the item and the fix.
    write_jsonl(f"{root}/a/0003.jsonl", [{"user": "cid", "n": "three"}])
    with pytest.raises(FlowsparkRuntimeError) as info:
        go()
    msg = str(info.value)
    assert msg.startswith("error in step 'byo_sink.out': ArrowInvalid: Could not convert 'three'")
    assert "the item does not fit the sink's schema <n int64, user string>" in msg
    assert "give the sink another schema" in msg
    assert msg.endswith("(item: {'user': 'cid', 'n': 'three'})")
    assert info.value.step_id == "byo_sink.out"


def test_a_first_micro_batch_spark_cannot_type_asks_for_a_schema(spark, tmp_path):
    root = str(tmp_path / "in")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "ann", "n": None}])
    flow = _jsonl_flow(root, SparkSink("parquet", str(tmp_path / "out")))
    with pytest.raises(FlowsparkRuntimeError, match=r"^error in step 'byo_sink.out': cannot infer the rows' schema .*"
                       r"pass the sink a schema, e.g. schema="):  # fmt: skip
        run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)


# -- no session needed -----------------------------------------------------------------------


class _FakeFrame:
    """Stands in for a DataFrame: `from_dataframe` reads only `isStreaming` when the flow is built."""

    def __init__(self, streaming: bool) -> None:
        self.isStreaming = streaming


@pytest.mark.parametrize(
    ("source", "bounded"),
    [
        (SparkSource.from_dataframe(_FakeFrame(streaming=True)), False),
        (SparkSource.from_dataframe(_FakeFrame(streaming=False)), True),
        (SparkSource("table", "events", streaming=True), False),
        (SparkSource("table", "events"), True),
    ],
)
def test_the_plan_knows_whether_a_spark_source_streams(source, bounded):
    from flowspark.spark.streaming import Lowering

    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, source), ForeachBatchSink(lambda df, b: None))
    plan = compile_flow(flow)
    assert plan.bounded is bounded
    assert [sk.where for sk in plan.sinks] == ["native"]
    if not bounded:
        assert "spark.readStream" in plan.render(Lowering(plan, 4, timers=False, layout="bucket").stage)


def test_bad_byo_source_and_sink_arguments():
    from flowspark.errors import FlowsparkTypeError

    with pytest.raises(FlowsparkTypeError, match=r"from_dataframe needs a pyspark.sql.DataFrame .*received \[1\]"):
        SparkSource.from_dataframe([1])
    with pytest.raises(FlowsparkTypeError, match=r"fn must be a function fn\(df, batch_id\); received 'x'"):
        ForeachBatchSink("x")
    with pytest.raises(
        FlowsparkTypeError, match=r"has no DataFrame .*build the source with SparkSource.from_dataframe"
    ):
        SparkSource("dataframe", streaming=True).load(None)


def test_pinned_schemas_live_with_the_checkpoint_metadata(tmp_path):
    from flowspark.spark.streaming import check_meta
    from flowspark.spark.streaming.checkpoint import pin_schema, pinned_schemas

    chk = str(tmp_path / "chk")
    assert pinned_schemas(chk) == {}
    check_meta(chk, "f", 8, [], timers=False)
    pin_schema(chk, "f.out", '{"type": "struct", "fields": []}')
    assert check_meta(chk, "f", 8, [], timers=False) is False  # the other facts are kept
    assert pinned_schemas(chk) == {"f.out": '{"type": "struct", "fields": []}'}


def test_a_missing_table_stream_names_the_input_step(spark, tmp_path):
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, SparkSource("table", "flowspark_no_such_table", streaming=True)),
              TestingSink([]))  # fmt: skip
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    assert info.value.step_id == "f.inp"
    assert str(info.value).startswith("step 'f.inp': [TABLE_OR_VIEW_NOT_FOUND]")
    assert "flowspark_no_such_table" in str(info.value)
    assert "\tat " not in str(info.value)  # no Java trace
