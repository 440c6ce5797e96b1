"""Streaming lowering details: the source stage runs inside the Python data source's read, and a
keyed stage whose only output is the lone file sink writes the sink's rows itself."""

from __future__ import annotations

import json

import pytest
from streaming_helpers import (
    JsonlDirSource,
    ListSource,
    count_mapper,
    count_row,
    count_row_with_list,
    not_a_row,
    write_jsonl,
)

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark.io.outputs import SparkSink
from flowspark.spark.streaming import META_FILE

pytestmark = [pytest.mark.spark]

USERS = [f"u{i % 3}" for i in range(7)] + [f"u{i % 2}" for i in range(4)]


def _flow(root: str, out_dir: str, row_fn, schema: str, key=lambda e: e["user"]) -> Dataflow:
    flow = Dataflow("fused")
    s = op.input("inp", flow, JsonlDirSource(root, ["a", "b"]))
    counts = op.stateful_map("count", op.key_on("key", s, key), count_mapper)
    op.output("out", op.map("row", counts, row_fn), SparkSink("parquet", out_dir, schema=schema))
    return flow


def _write_input(root: str) -> None:
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": u} for u in USERS[:7]])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": u} for u in USERS[7:]])


@pytest.mark.parametrize(
    ("row_fn", "schema", "fused"),
    [
        (count_row, "user STRING, n LONG", True),
        (count_row_with_list, "user STRING, n LONG, seen ARRAY<LONG>", False),  # not atomic: a separate pass
    ],
)
def test_lone_file_sink_rows_written_by_the_keyed_stage(spark, tmp_path, row_fn, schema, fused):
    from flowspark.spark import run

    root, out_dir = str(tmp_path / "in"), str(tmp_path / "out")
    _write_input(root)
    lines: list = []
    sr = run(
        _flow(root, out_dir, row_fn, schema),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        progress=lines.append,
    )
    assert (sr._sink_fused_stage is not None) is fused
    rows = spark.read.parquet(out_dir).collect()
    expected = {}
    for u in USERS:
        expected.setdefault(u, []).append(len(expected.get(u, [])) + 1)
    got: dict = {}
    for r in rows:
        got.setdefault(r.user, []).append(r.n)
        if not fused:
            assert r.seen == list(range(r.n))
    assert {k: sorted(v) for k, v in got.items()} == expected
    # Input rows are items (the source stage runs in the read). stateful_map cannot ask for a
    # notification, so the query runs without timers: no tick row, and Spark ends it by itself.
    total = sum(int(x.split(": ")[1].split(" input rows")[0]) for x in lines)
    assert total == len(USERS)
    assert sr.timers is False
    assert json.load(open(tmp_path / "chk" / META_FILE))["timers"] is False


def test_fused_sink_names_the_sink_step_for_a_non_dict_item(spark, tmp_path):
    from flowspark.spark import run

    root = str(tmp_path / "in")
    _write_input(root)
    flow = _flow(root, str(tmp_path / "out"), not_a_row, "user STRING, n LONG")
    with pytest.raises(FlowsparkRuntimeError, match=r"step 'fused.out': .*SparkSink writes dict items") as info:
        run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    assert info.value.step_id == "fused.out"


def test_error_in_the_source_stage_inside_the_read_names_the_step(spark, tmp_path):
    from flowspark.spark import run

    root = str(tmp_path / "in")
    _write_input(root)
    flow = _flow(root, str(tmp_path / "out"), count_row, "user STRING, n LONG", key=lambda e: e["missing"])
    with pytest.raises(FlowsparkRuntimeError, match=r"step 'fused.key\.flat_map_batch': KeyError: 'missing'"):
        run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)


def test_reader_splits_a_partition_range_over_the_tasks_and_keeps_positions():
    from flowspark.spark.io import pysource
    from flowspark.spark.worker.codec import loads, source_seq

    src = ListSource({"only": list(range(12_000))}, batch=6000)
    reader = pysource._Reader("f.inp", src, 0, 100_000, None, None, 4)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert end["only"]["act"] == 2  # two source batches: the next micro-batch starts at activation 2
    parts = reader.partitions(start, end)
    assert len(parts) == 4  # 4 chunks of <= 5000 items of one source batch each, up to 4 tasks
    rows = [row for p in parts for row in reader.read(p)]
    # A chunk's header: the activation (source batch) of its first item and its offset in that batch.
    assert [r[1] for r in rows] == [source_seq(0, 0, a, o) for a, o in ((0, 0), (0, 5000), (1, 0), (1, 5000))]
    assert [x for r in rows for x in loads(r[2])] == list(range(12_000))
    one_task = pysource._Reader("f.inp", src, 0, 100_000, None, None, 1)
    assert len(one_task.partitions(start, one_task.latestOffset(start, None))) == 1
    # A replay (nothing buffered: a restarted query) cuts the same chunks from the snapshot.
    again = pysource._Reader("f.inp", src, 0, 100_000, None, None, 4)
    assert [row for p in again.partitions(start, end) for row in again.read(p)] == rows


def _fails_on_u2(state, _value):
    if _value["user"] == "u2":
        return state, 1 / 0
    return count_mapper(state, _value)


def test_a_user_error_in_a_keyed_stage_reads_as_on_every_runtime(spark, tmp_path):
    """The per-key driver words the error once: same text as the in-memory executor and the batch job."""
    from flowspark.spark import run

    root = str(tmp_path / "in")
    _write_input(root)
    flow = Dataflow("fused")
    s = op.input("inp", flow, JsonlDirSource(root, ["a", "b"]))
    counts = op.stateful_map("count", op.key_on("key", s, lambda e: e["user"]), _fails_on_u2)
    op.output(
        "out",
        op.map("row", counts, count_row),
        SparkSink("parquet", str(tmp_path / "out"), schema="user STRING, n LONG"),
    )
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    err = info.value
    assert str(err) == "error in step 'fused.count.stateful_batch' for key 'u2': ZeroDivisionError: division by zero"
    assert (err.step_id, err.key, err.exc_type, err.exc_message) == (
        "fused.count.stateful_batch",
        "u2",
        "ZeroDivisionError",
        "division by zero",
    )
