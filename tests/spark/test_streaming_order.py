"""A Python source read by a stage that needs only its items' order: the read numbers each
micro-batch's items in sequence order (a `long`) instead of stamping 20-byte sequences."""

from __future__ import annotations

import pytest
from streaming_helpers import EndingListSource, ListSource

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.spark.io.outputs import SparkSink
from flowspark.testing import TestingSink, per_key, run_main

# Partitions of different lengths, read 2 items per source batch: a micro-batch holds several
# source batches of each partition, and each key gets items of every partition in it.
ITEMS = {
    "a": [{"user": f"u{i % 2}", "at": f"a{i}"} for i in range(9)],
    "b": [{"user": f"u{i % 2}", "at": f"b{i}"} for i in range(4)],
    "c": [{"user": f"u{i % 2}", "at": f"c{i}"} for i in range(7)],
}


def _seen(state, value):
    seen = (state or "") + value["at"] + " "
    return seen, seen


def _row(kv):
    return {"user": kv[0], "seen": kv[1]}


def _flow(sink, steps=(), bounded=False) -> Dataflow:
    flow = Dataflow("ordered")
    s = op.input("inp", flow, EndingListSource(ITEMS, batch=2, bounded=True) if bounded else ListSource(ITEMS, batch=2))
    for step in steps:
        s = step(s)
    seen = op.stateful_map("seen", op.key_on("key", s, lambda e: e["user"]), _seen)
    op.output("out", op.map("row", seen, _row), sink)
    return flow


def _expected(steps=()) -> dict:
    out: list = []
    run_main(_flow(TestingSink(out), steps, bounded=True))
    return per_key([(r["user"], r["seen"]) for r in out])


def _spark_rows(spark, tmp_path, steps=()):
    from flowspark.spark import run

    out_dir = str(tmp_path / "out")
    sink = SparkSink("parquet", out_dir, schema="user STRING, seen STRING")
    sr = run(
        _flow(sink, steps),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        max_items=3,  # two source batches of each partition per micro-batch
        progress=False,
    )
    rows = spark.read.parquet(out_dir).collect()
    # The last row of a key holds every item it got, in order.
    got = {u: max((r["seen"] for r in rows if r["user"] == u), key=len) for u in ("u0", "u1")}
    return sr, got, sr.batches


@pytest.mark.spark
def test_a_flat_stage_gets_its_items_in_sequence_order_across_partitions_and_batches(spark, tmp_path):
    sr, got, batches = _spark_rows(spark, tmp_path)
    assert sr.plan.decision("ordered_source", "stage 1").applied
    assert batches >= 3
    expected = _expected()
    assert got == {u: seen[-1] for u, seen in expected.items()}


@pytest.mark.spark
def test_a_source_stage_that_is_not_one_to_one_keeps_its_sequences(spark, tmp_path):
    # A filter may drop items: its items' sequences gain a component, so no position is stamped.
    steps = (lambda s: op.filter("drop_b3", s, lambda e: e["at"] != "b3"),)
    sr, got, _ = _spark_rows(spark, tmp_path, steps)
    assert str(sr.plan.decision("ordered_source", "stage 1")) == (
        "rule ordered_source: not applied (a step of stage 0 is not one-to-one)"
    )
    assert got == {u: seen[-1] for u, seen in _expected(steps).items()}


def test_a_replayed_micro_batch_numbers_its_items_the_same():
    from flowspark.spark.io import pysource

    def rows(reader, start, end):
        return [row[1:] for p in reader.partitions(start, end) for row in reader.read(p)]

    src = ListSource(ITEMS, batch=2)
    reader = pysource._Reader("o.inp", src, 0, 3, None, None, 1, True)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    first = rows(reader, start, end)
    # Each chunk (one source batch, of 2 items) is headed by its first item's position: the
    # source batches in (activation, partition) order, as their sequences sort: a0 b0 c0 a1 b1 c1.
    # The chunks come partition by partition: a0 a1, b0 b1, c0 c1.
    assert [int.from_bytes(head, "big") for head, _ in first] == [0, 6, 2, 8, 4, 10]
    again = pysource._Reader("o.inp", src, 0, 3, None, None, 1, True)  # a restarted query replays
    assert rows(again, start, end) == first
