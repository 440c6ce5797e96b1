"""Dead letter on Spark: batch jobs and streams, exactly once with the checkpoint (kill -9 included)."""

from __future__ import annotations

import json
import os

import pytest
from streaming_helpers import write_jsonl

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.deadletter import DeadLetterDir
from flowspark.errors import FlowsparkRuntimeError
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

pytestmark = [pytest.mark.spark]

ROWS = [
    {"user": "a", "n": 1},
    {"user": None, "n": 2},  # a null key: refused by key_on
    {"user": "b", "n": 3},
    {"user": "a", "n": 0},  # 10 // 0 in map_value
    {"user": "b", "n": 4},
    {"user": "c", "n": 1},
    {"user": "c", "n": 3},  # c's total 13 does not fit the sink's LONG column (see _row)
    {"user": "a", "n": 5},
]
#: (step id, error type, item) of every dead row ROWS make.
WANT_DEAD = {
    ("dl.key.flat_map_batch", "FlowsparkTypeError", repr({"user": None, "n": 2})),
    ("dl.inv.flat_map_batch", "ZeroDivisionError", repr(("a", {"user": "a", "n": 0}))),
    ("dl.out", "ArrowInvalid", repr({"user": "c", "total": "13!"})),
}


def _row(kv):
    return {"user": kv[0], "total": kv[1] if kv[1] != 13 else "13!"}


def _flow(src, sink) -> Dataflow:
    flow = Dataflow("dl")
    keyed = op.key_on("key", op.input("inp", flow, src), lambda r: r["user"])
    inv = op.map_value("inv", keyed, lambda r: 10 // r["n"])
    sums = op.stateful_map("sum", inv, lambda st, x: ((st or 0) + x,) * 2)
    op.output("out", op.map("row", sums, _row), sink)
    return flow


def _in_memory() -> tuple[list, set]:
    out: list = []
    dead: list = []
    flow = Dataflow("dl")
    keyed = op.key_on("key", op.input("inp", flow, TestingSource(ROWS)), lambda r: r["user"])
    inv = op.map_value("inv", keyed, lambda r: 10 // r["n"])
    sums = op.stateful_map("sum", inv, lambda st, x: ((st or 0) + x,) * 2)
    op.output("out", op.map("row", sums, _row), TestingSink(out))
    run_main(flow, dead_letter=TestingSink(dead))
    fits = [(r["user"], r["total"]) for r in out if isinstance(r["total"], int)]
    return fits, {(d["step_id"], d["error_type"], d["item"]) for d in dead}


def _dead(spark, path: str) -> list:
    return sorted((r.step_id, r.error_type, r.item, r.batch_id) for r in spark.read.parquet(path).collect())


def test_batch_job_sends_the_same_items_to_the_dead_letter_as_in_memory(spark, tmp_path):
    from flowspark.spark import run
    from flowspark.spark.io.inputs import SparkSource
    from flowspark.spark.io.outputs import SparkSink

    src_dir, out_dir, dl = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "dead")
    spark.createDataFrame(ROWS, "user STRING, n LONG").coalesce(1).write.parquet(src_dir)
    sink = SparkSink("parquet", out_dir, schema="user STRING, total LONG")
    run(_flow(SparkSource("parquet", src_dir), sink), spark=spark, dead_letter=dl)
    fits, want_dead = _in_memory()
    assert want_dead == {w for w in WANT_DEAD if w[0] != "dl.out"}  # in memory: no sink schema
    got = sorted((r.user, r.total) for r in spark.read.parquet(out_dir).collect())
    assert got == sorted(fits)
    dead = _dead(spark, dl)
    assert {(s, t, i) for s, t, i, _b in dead} == WANT_DEAD
    assert len(dead) == len(WANT_DEAD)
    assert {b for *_r, b in dead} == {0}
    # A driver-side dead letter gets the rows in sequence order.
    rows: list = []
    run(
        _flow(TestingSource(ROWS), SparkSink("parquet", out_dir, schema="user STRING, total LONG")),
        spark=spark,
        dead_letter=TestingSink(rows),
    )
    assert {(d["step_id"], d["error_type"], d["item"]) for d in rows} == WANT_DEAD
    assert [d["batch_id"] for d in rows] == [0, 0, 0]


def test_batch_job_without_a_dead_letter_fails_naming_the_step(spark):
    from flowspark.spark import run

    with pytest.raises(FlowsparkRuntimeError, match=r"step 'dl.key.flat_map_batch'.*key function must return a str"):
        run(_flow(TestingSource(ROWS), TestingSink([])), spark=spark)


def _write_json(path: str, rows: list) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(path + ".tmp", path)


def test_stream_stuck_on_a_poison_row_goes_on_with_a_dead_letter_exactly_once(spark, tmp_path):
    """A query stopped by a poison row, restarted on its checkpoint with a dead letter; then a replayed micro-batch."""
    from flowspark.spark import run
    from flowspark.spark.io.inputs import SparkSource
    from flowspark.spark.io.outputs import SparkSink

    src_dir, out_dir, chk, dl = (str(tmp_path / d) for d in ("in", "out", "chk", "dead"))
    for i in range(0, len(ROWS), 2):
        _write_json(f"{src_dir}/{i:04d}.json", ROWS[i : i + 2])
    src = SparkSource(
        "json", src_dir, schema="user STRING, n LONG", options={"maxFilesPerTrigger": "1"}, streaming=True
    )
    sink = SparkSink("parquet", out_dir, schema="user STRING, total LONG")
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False}
    # Spark picks files of one modification time in any order: the first poison row met stops it.
    with pytest.raises(FlowsparkRuntimeError, match=r"step 'dl\.(key|inv)\.flat_map_batch'"):
        run(_flow(src, sink), **opts)
    lines: list = []
    sr = run(_flow(src, sink), dead_letter=DeadLetterDir(dl), **{**opts, "progress": lines.append})
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    fits, _ = _in_memory()
    got = sorted((r.user, r.total) for r in spark.read.parquet(out_dir).collect())
    assert per_key(got) == per_key(sorted(fits))
    assert os.path.isdir(os.path.join(out_dir, "_spark_metadata"))  # still Spark's exactly-once file sink
    dead = _dead(spark, dl)
    assert {(s, t, i) for s, t, i, _b in dead} == WANT_DEAD
    assert len(dead) == len(WANT_DEAD)
    assert sum(int(x.split(", ")[1].split()[0]) for x in (ln for ln in lines) if "to the dead letter" in x) == 3
    assert any(" 1 to the dead letter" in ln for ln in lines)
    # A micro-batch that wrote its dead rows but was not committed (a crash) runs again: its rows are
    # replaced, not doubled.
    commits = os.path.join(chk, "query", "commits")
    last = max(int(f) for f in os.listdir(commits) if f.isdigit())
    assert DeadLetterDir(dl).count(last) == 1
    meta = os.path.join(out_dir, "_spark_metadata")
    # First the file sink had written the micro-batch (it skips it when replayed: its dead rows are
    # kept), then it had not (the replay computes it again: its dead rows are rewritten).
    for lost in ([commits], [commits, meta]):
        for folder in lost:
            for name in (str(last), f".{last}.crc"):
                if os.path.exists(os.path.join(folder, name)):
                    os.remove(os.path.join(folder, name))
        run(_flow(src, sink), dead_letter=DeadLetterDir(dl), **opts)
        assert _dead(spark, dl) == dead
        assert sorted((r.user, r.total) for r in spark.read.parquet(out_dir).collect()) == got


def test_stream_dead_letter_at_the_driver_with_a_python_source(spark, tmp_path):
    """A `TestingSink` dead letter (rows reach it through foreachBatch) and two outputs (the routed lowering)."""
    from streaming_helpers import JsonlDirSource

    from flowspark.spark import run

    root = str(tmp_path / "in")
    write_jsonl(f"{root}/a/0001.jsonl", ROWS[:4])
    write_jsonl(f"{root}/b/0001.jsonl", ROWS[4:])
    out: list = []
    raw: list = []
    dead: list = []
    flow = _flow(JsonlDirSource(root, ["a", "b"]), TestingSink(out))
    # A second reader of the source stage's port: the routed lowering carries dead rows along the chain.
    op.output(
        "raw",
        op.map("nums", op.input("inp2", flow, JsonlDirSource(root, ["a"])), lambda r: 1 // r["n"]),
        TestingSink(raw),
    )
    lines: list = []
    run(
        flow,
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        dead_letter=TestingSink(dead),
        progress=lines.append,
    )
    fits, _ = _in_memory()
    assert per_key([(r["user"], r["total"]) for r in out if isinstance(r["total"], int)]) == per_key(fits)
    got = {(d["step_id"], d["error_type"], d["item"]) for d in dead}
    assert got == {w for w in WANT_DEAD if w[0] != "dl.out"} | {
        ("dl.nums.flat_map_batch", "ZeroDivisionError", repr({"user": "a", "n": 0}))
    }
    assert sorted(raw) == [0, 0, 1]
    assert all(isinstance(d["batch_id"], int) for d in dead)
    assert any("to the dead letter" in ln for ln in lines)


@pytest.mark.slow
def test_kill_9_with_poison_rows_in_replayed_micro_batches(spark, tmp_path):
    """Kill -9 the driver mid-stream (every file has a poison row); the restart writes each dead row once."""
    import signal
    import subprocess

    from test_streaming import _committed, _restart_and_read, _start_driver, _wait_for_commits

    from flowspark.spark import run

    root = str(tmp_path / "in")
    poison = 0
    for part in ("a", "b"):
        for f in range(4):
            rows = [{"user": f"u{(i * 3 + f) % 7}"} for i in range(150)]
            rows.insert(f * 20 + 7, {"no_user": f"{part}{f}"})  # key_on's KeyError
            poison += 1
            write_jsonl(f"{root}/{part}/{f:04d}.jsonl", rows)
    from streaming_driver import build

    ref_dl = str(tmp_path / "ref_dead")
    run(
        build(root, str(tmp_path / "ref_out")),
        spark=spark,
        checkpoint=str(tmp_path / "ref_chk"),
        trigger="available_now",
        max_items=100,
        progress=False,
        dead_letter=ref_dl,
    )
    want = sorted((r.user, r.n) for r in spark.read.json(str(tmp_path / "ref_out")).collect())
    assert len(want) == 1200
    chk, out, dl = str(tmp_path / "chk"), str(tmp_path / "out"), str(tmp_path / "dead")
    env = {**os.environ, "FLOWSPARK_TEST_DEAD_LETTER": dl}
    proc = _start_driver(root, chk, out, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    killed = _wait_for_commits(proc, chk, 3)
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert killed, "the driver ended before it could be killed; make the input larger"
    assert len(_committed(chk)) < 6
    os.environ["FLOWSPARK_TEST_DEAD_LETTER"] = dl
    try:
        from streaming_driver import build as b2

        run(
            b2(root, out),
            spark=spark,
            checkpoint=chk,
            trigger="available_now",
            max_items=100,
            progress=False,
            dead_letter=dl,
        )
    finally:
        del os.environ["FLOWSPARK_TEST_DEAD_LETTER"]
    assert sorted((r.user, r.n) for r in spark.read.json(out).collect()) == want
    items = sorted(r.item for r in spark.read.parquet(dl).collect())
    assert items == sorted(repr({"no_user": f"{p}{f}"}) for p in ("a", "b") for f in range(4))
    assert len(items) == poison
    assert _restart_and_read is not None
