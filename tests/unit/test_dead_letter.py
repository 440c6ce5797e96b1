"""Dead letter in the in-memory executor: refused items become rows, every other item goes on."""

from __future__ import annotations

import json
import os

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.deadletter import FIELDS, DeadLetterDir, record
from flowspark.errors import FlowsparkRuntimeError, FlowsparkTypeError
from flowspark.outputs import FileSink
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

GOOD = [{"user": "a", "n": "1"}, {"user": "b", "n": "2"}, {"user": "a", "n": "3"}, {"user": "c", "n": "4"}]
POISON = [
    {"user": "b", "n": "x"},  # int() raises in a map
    {"n": "2"},  # KeyError in key_on
    {"user": "b", "n": "7"},  # the filter's predicate returns None
    {"user": "int", "n": "5"},  # a map makes the key an int: refused by the stateful step
    {"user": "b", "n": "-9"},  # the branch predicate raises
]


def _flow(rows: list, out: list, batch_size: int = 1) -> Dataflow:
    flow = Dataflow("dl")
    s = op.input("inp", flow, TestingSource(rows, batch_size=batch_size))
    s = op.map("parse", s, lambda r: {"user": r["user"], "n": int(r["n"])})
    s = op.filter("pos", s, lambda r: None if r["n"] == 7 else r["n"] > 0 or r["n"] == -9)
    b = op.branch("small", s, lambda r: r["n"] < 3 if r["n"] != -9 else 1 / 0)
    s = op.merge("both", b.trues, b.falses)
    k = op.map("kv", s, lambda r: (5 if r["user"] == "int" else r["user"], r["n"]))
    sums = op.stateful_map("sum", k, lambda st, n: ((st or 0) + n,) * 2)
    op.output("out", sums, TestingSink(out))
    return flow


def _interleave() -> list:
    rows = []
    for i, g in enumerate(GOOD):
        rows.append(g)
        if i < len(POISON):
            rows.append(POISON[i])
    rows.extend(POISON[len(GOOD) :])
    return rows


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_poison_items_go_to_the_dead_letter_and_the_rest_equals_a_clean_run(batch_size):
    rows = _interleave()
    out: list = []
    dead: list = []
    run_main(_flow(rows, out, batch_size), dead_letter=TestingSink(dead))
    clean: list = []
    run_main(_flow([r for r in rows if r not in POISON], clean, batch_size))
    # Per key in order (without the poison the source batches hold other items, so the
    # order across keys within a batch may differ).
    assert per_key(out) == per_key(clean)
    assert len(out) == len(GOOD)
    assert [tuple(d) for d in dead] == [FIELDS] * len(POISON)
    got = {(d["step_id"], d["error_type"], d["item"]) for d in dead}
    assert got == {
        ("dl.parse.flat_map_batch", "ValueError", repr(POISON[0])),
        ("dl.parse.flat_map_batch", "KeyError", repr(POISON[1])),
        ("dl.pos.flat_map_batch", "FlowsparkTypeError", repr({"user": "b", "n": 7})),
        ("dl.sum.stateful_batch", "FlowsparkTypeError", repr((5, 5))),
        ("dl.small", "ZeroDivisionError", repr({"user": "b", "n": -9})),
    }
    keyerr = next(d for d in dead if d["error_type"] == "KeyError")
    assert keyerr["error_message"] == "'user'"
    bad_key = next(d for d in dead if d["step_id"] == "dl.sum.stateful_batch")
    assert "keys must be str; received key 5 of type int" in bad_key["error_message"]
    assert {d["batch_id"] for d in dead} == {1}  # the epoch


def test_without_a_dead_letter_the_first_poison_item_fails_the_run():
    with pytest.raises(FlowsparkRuntimeError, match=r"step 'dl.parse.flat_map_batch'.*ValueError"):
        run_main(_flow(_interleave(), []))


def test_a_mapper_returning_no_iterable_for_an_item_sends_that_item():
    flow = Dataflow("fm")
    s = op.input("inp", flow, TestingSource([1, 2, 3], batch_size=3))
    out: list = []
    op.output("out", op.flat_map("twice", s, lambda x: None if x == 2 else [x, x]), TestingSink(out))
    dead: list = []
    run_main(flow, dead_letter=TestingSink(dead))
    assert out == [1, 1, 3, 3]
    assert [(d["step_id"], d["error_type"], d["item"]) for d in dead] == [
        ("fm.twice.flat_map_batch", "FlowsparkTypeError", "2")
    ]
    assert "must return an iterable" in dead[0]["error_message"]


def test_an_error_in_stateful_logic_still_stops_the_run():
    flow = Dataflow("st")
    s = op.input("inp", flow, TestingSource([("a", 1), ("a", 0)]))
    op.output("out", op.stateful_map("inv", s, lambda st, x: (None, 1 / x)), TestingSink([]))
    with pytest.raises(FlowsparkRuntimeError, match=r"step 'st.inv.stateful_batch' for key 'a'.*ZeroDivisionError"):
        run_main(flow, dead_letter=TestingSink([]))


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_dead_letter_dir_in_memory_has_one_directory_per_batch_id(tmp_path, fmt):
    path = str(tmp_path / "dead")
    out: list = []
    run_main(_flow(_interleave(), out, 3), dead_letter=DeadLetterDir(path, format=fmt))
    assert os.listdir(path) == ["batch_id=1"]
    folder = os.path.join(path, "batch_id=1")
    files = sorted(os.listdir(folder))  # one file per pass that had some
    assert files
    assert all(f.startswith("part-") and f.endswith(f".{fmt}") for f in files)
    rows = []
    for name in files:
        if fmt == "json":
            with open(os.path.join(folder, name)) as f:
                rows.extend(json.loads(line) for line in f)
        else:
            import pyarrow.parquet as pq

            rows.extend(pq.read_table(os.path.join(folder, name)).to_pylist())
    assert len(rows) == len(POISON)
    assert set(rows[0]) == set(FIELDS) - {"batch_id"}
    assert DeadLetterDir(path, format=fmt).count(1) == len(POISON)
    # A second run replaces its batch's directory (as Spark's dynamic partition overwrite does).
    run_main(_flow(_interleave(), [], 3), dead_letter=DeadLetterDir(path, format=fmt))
    assert DeadLetterDir(path, format=fmt).count(1) == len(POISON)


def test_a_path_means_a_parquet_dead_letter_dir(tmp_path):
    path = str(tmp_path / "dl")
    run_main(_flow(_interleave(), [], 3), dead_letter=path)
    assert DeadLetterDir(path).count(1) == len(POISON)


def test_bad_dead_letter_arguments_are_refused(tmp_path):
    with pytest.raises(FlowsparkTypeError, match=r"run_main: dead_letter must be a sink .* received 42 of type int"):
        run_main(_flow(GOOD, []), dead_letter=42)
    with pytest.raises(FlowsparkTypeError, match=r"step 'dl.dead_letter': the dead letter must be a DynamicSink"):
        run_main(_flow(GOOD, []), dead_letter=FileSink(tmp_path / "f.txt"))
    with pytest.raises(FlowsparkTypeError, match="format must be 'parquet' or 'json'"):
        DeadLetterDir(str(tmp_path), format="csv")


def test_record_unwraps_flowspark_errors_and_survives_a_broken_repr():
    from flowspark.errors import step_error

    class Ugly:
        def __repr__(self) -> str:
            raise ValueError("no")

    r = record("f.s", step_error("f.s", KeyError("k")), Ugly())
    assert r["error_type"] == "KeyError"
    assert r["error_message"] == "'k'"
    assert r["item"].startswith("<Ugly whose repr() raised ValueError")


def test_a_malformed_row_marker_built_by_spark_decodes_to_the_input_steps_error():
    """The marker `flowspark.spark.io.inputs.load_rows` builds in SQL (hex of UTF-8 fields) inside a Spark error."""
    from flowspark.deadletter import malformed_record
    from flowspark.spark.worker.codec import MALFORMED_MARK, decode_task_error

    step, file, raw = "f.inp", "file:/data/p1.json", '{"user": "é' + "x" * 300
    hexed = "|".join(x.encode().hex().upper() for x in (step, file, raw[:200]))
    err = decode_task_error(f"[USER_RAISED_EXCEPTION] {MALFORMED_MARK}<<{hexed}>> SQLSTATE: P0001")
    assert isinstance(err, FlowsparkRuntimeError)
    assert err.step_id == step
    assert err.exc_type == "MalformedInput"
    assert str(err).startswith(f"error in step 'f.inp': malformed input row in {file}: {raw[:200]}; fix")
    assert "key function" not in str(err)
    assert malformed_record(step, file, raw) == {
        "step_id": step,
        "error_type": "MalformedInput",
        "error_message": f"malformed input row in {file}: {raw[:200]}",
        "item": raw,
    }
