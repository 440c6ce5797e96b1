"""Spark Structured Streaming runtime: bucketed state, timeouts, checkpoints, sinks."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from streaming_helpers import (
    T0,
    ActiveUser,
    FileClock,
    JsonlDirSource,
    count_mapper,
    dict_count_mapper,
    parity_key,
    write_jsonl,
)

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.testing import TestingSink, per_key

pytestmark = [pytest.mark.spark]


def _count_flow(root: str, out: list) -> Dataflow:
    flow = Dataflow("stream_count")
    s = op.input("inp", flow, JsonlDirSource(root, ["a", "b"]))
    keyed = op.key_on("key", s, lambda e: e["user"])
    counts = op.stateful_map("count", keyed, count_mapper)
    op.output("out", counts, TestingSink(out))
    return flow


class _Recorder:
    batches: list = []

    def __new__(cls):
        from pyspark.sql.streaming import StreamingQueryListener  # noqa: TID251

        class Rec(StreamingQueryListener):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                cls.batches.append(event.progress.batchId)

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        return Rec()


def test_running_count_available_now_then_resume(spark, tmp_path):
    from flowspark.spark import run

    root = str(tmp_path / "in")
    chk = str(tmp_path / "chk")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": f"u{i % 2}"} for i in range(4)])
    out: list = []
    lines: list = []
    run(
        _count_flow(root, out),
        spark=spark,
        checkpoint=chk,
        trigger="available_now",
        progress=lines.append,
        listener=_Recorder(),
    )
    # One progress line per micro-batch; the user's listener saw the same micro-batches.
    import time

    deadline = time.monotonic() + 20  # listener events are delivered asynchronously
    while (0 not in _Recorder.batches or not lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 0 in _Recorder.batches
    assert lines
    assert lines[0].startswith("[flowspark] batch 0: ")
    assert all("input rows" in x and "rows/s" in x and "state rows" in x for x in lines)
    finals = {}
    for k, v in out:
        finals[k] = max(finals.get(k, 0), v)
    assert finals == {"u0": 5, "u1": 4, "u2": 2}
    assert sorted(v for k, v in out if k == "u0") == [1, 2, 3, 4, 5]
    # Second run, same checkpoint: only the new file is read; counts go on.
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u2"}, {"user": "u9"}])
    out2: list = []
    run(_count_flow(root, out2), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
    assert sorted(out2) == [("u2", 3), ("u9", 1)]


@pytest.mark.slow
def test_a_restart_whose_stateful_map_no_longer_fits_the_checkpointed_state_says_so(spark, tmp_path):
    from flowspark.errors import FlowsparkRuntimeError
    from flowspark.spark import run

    def flow(out: list, mapper) -> Dataflow:
        f = Dataflow("stream_count")
        keyed = op.key_on("key", op.input("inp", f, JsonlDirSource(root, ["a"])), lambda e: e["user"])
        op.output("out", op.stateful_map("count", keyed, mapper), TestingSink(out))
        return f

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False}
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "u0"}, {"user": "u1"}, {"user": "u0"}])
    out: list = []
    run(flow(out, count_mapper), **opts)
    assert sorted(out) == [("u0", 1), ("u0", 2), ("u1", 1)]
    # The code changes: the state is now a dict; u0's checkpointed state is the int 2.
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u0"}])
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(flow([], dict_count_mapper), **opts)
    err = info.value
    assert not isinstance(err, TypeError)  # as Bytewax: a RuntimeError, the user's TypeError is its cause
    assert (err.step_id, err.key) == ("stream_count.count.stateful_batch", "u0")
    assert str(err).startswith(
        "error in step 'stream_count.count.stateful_batch' for key 'u0': TypeError: 'int' object is not iterable; "
        "the key's state was resumed from a snapshot written by an earlier run of the step (received int 2)"
    )
    assert "run with a new checkpoint directory" in str(err)
    assert type(err.__cause__) is TypeError
    assert str(err.__cause__) == "'int' object is not iterable"


def _active_flow(root: str, out: list) -> Dataflow:
    flow = Dataflow("active_users")
    s = op.input("inp", flow, JsonlDirSource(root, ["a"]))
    keyed = op.key_on("key", s, lambda e: e["user"])
    op.output("out", op.stateful("sessions", keyed, ActiveUser), TestingSink(out))
    return flow


@pytest.mark.parametrize("layout", ["bucket", "key", "chunk"])
def test_timeouts_fire_for_idle_keys(spark, tmp_path, monkeypatch, layout):
    """The active-user example: a user idle for 30 minutes gets ('ended', n), on an injected clock.

    In the key and chunk layouts with a one-key hot tier and one bucket, one of the two users
    lives in a MapState row: the bucket's bookkeeping row must know it waits for a notification.
    """
    from flowspark.spark import run

    monkeypatch.setattr("flowspark.spark.streaming.keylayout.HOT_PER_BUCKET", 1)
    monkeypatch.setattr("flowspark.spark.streaming.chunklayout.HOT_PER_BUCKET", 1)

    root = str(tmp_path / "in")
    chk = str(tmp_path / "chk")
    clock = FileClock(str(tmp_path / "now.txt"))
    clock.set(T0)
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "amy"}, {"user": "bob"}, {"user": "amy"}])
    out: list = []
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False, "clock": clock}
    opts["buckets"] = 1
    run(_active_flow(root, out), state_layout=layout, **opts)
    assert sorted(out) == [("amy", ("active", 1)), ("amy", ("active", 2)), ("bob", ("active", 1))]
    # 10 minutes later amy is active again: nobody is idle for 30 minutes yet.
    clock.set(T0 + timedelta(minutes=10))
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "amy"}])
    out.clear()
    run(_active_flow(root, out), **opts)
    assert out == [("amy", ("active", 3))]
    # 35 minutes after the start, no new data: bob (last seen at 0) times out, amy (at 10) does not.
    clock.set(T0 + timedelta(minutes=35))
    out.clear()
    run(_active_flow(root, out), **opts)
    assert out == [("bob", ("ended", 1))]
    # At 41 minutes amy times out too; bob's state was discarded, so he does not end twice.
    clock.set(T0 + timedelta(minutes=41))
    out.clear()
    run(_active_flow(root, out), **opts)
    assert out == [("amy", ("ended", 3))]


def _same_files_flow(src: JsonlDirSource, out: list) -> Dataflow:
    flow = Dataflow("same_files")
    s = op.input("inp", flow, src)
    s = op.filter("no_zero", s, lambda e: e["n"] != 0)
    keyed = op.key_on("key", s, lambda e: e["user"])
    sums = op.stateful_map("running_sum", keyed, lambda st, e: ((st or 0) + e["n"], (st or 0) + e["n"]))
    op.output("out", op.map_value("fmt", sums, lambda v: f"sum={v}"), TestingSink(out))
    return flow


@pytest.mark.parametrize("parts", [["p1"], ["p1", "p2"]])
def test_same_output_as_in_memory_executor(spark, tmp_path, parts):
    from flowspark.spark import run
    from flowspark.testing import run_main

    # Several micro-batches (max_items=30) must keep each key's order. With two partitions
    # every key is in both: Bytewax polls the partitions in turn, one source batch of each
    # (an activation), and each micro-batch's source batches are stamped the same way.
    root = str(tmp_path / "in")
    for pi, part in enumerate(parts):
        for f in range(3):
            rows = [{"user": f"u{(i * 7 + f + pi) % 5}", "n": (i + f * pi) % 4} for i in range(40)]
            write_jsonl(f"{root}/{part}/{f:04d}.jsonl", rows)
    local: list = []
    run_main(_same_files_flow(JsonlDirSource(root, parts, batch=25, bounded=True), local))
    streamed: list = []
    src = JsonlDirSource(root, parts, batch=25)
    run(
        _same_files_flow(src, streamed),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        progress=False,
        max_items=30,
    )
    assert len(local) == len(streamed) > 0

    assert per_key(streamed) == per_key(local)


def test_malformed_rows_go_to_a_dead_letter_output(spark, tmp_path):
    from flowspark.spark import run
    from flowspark.spark.io.inputs import SparkSource

    src_dir = tmp_path / "json"
    src_dir.mkdir()
    (src_dir / "part1.json").write_text(
        '{"user": "amy", "n": 1}\n{not json at all\n{"user": "bob", "n": "three"}\n{"user": "amy", "n": 2}\n'
    )
    schema = "user STRING, n LONG, _corrupt_record STRING"
    source = SparkSource(
        "json",
        str(src_dir),
        schema=schema,
        streaming=True,
        options={"columnNameOfCorruptRecord": "_corrupt_record", "mode": "PERMISSIVE"},
    )
    good: list = []
    dead: list = []
    flow = Dataflow("dead_letter")
    rows = op.input("inp", flow, source)
    b = op.branch("valid", rows, lambda r: r["_corrupt_record"] is None)
    keyed = op.key_on("key", b.trues, lambda r: r["user"])
    op.output("good", op.stateful_map("sum", keyed, lambda st, r: ((st or 0) + r["n"],) * 2), TestingSink(good))
    op.output("dead", op.map("raw", b.falses, lambda r: r["_corrupt_record"]), TestingSink(dead))
    run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    assert sorted(good) == [("amy", 1), ("amy", 3)]
    assert sorted(dead) == ['{"user": "bob", "n": "three"}', "{not json at all"]


def test_checkpoint_of_another_flow_or_bucket_count_is_refused(tmp_path):
    from flowspark.errors import RecoveryError
    from flowspark.spark.streaming import check_meta as _check_meta

    chk = str(tmp_path / "chk")
    _check_meta(chk, "flow_a", 64, ["flow_a.count"])
    _check_meta(chk, "flow_a", 64, ["flow_a.count"])
    with pytest.raises(RecoveryError, match="buckets=64; received buckets=8"):
        _check_meta(chk, "flow_a", 8, ["flow_a.count"])
    with pytest.raises(RecoveryError, match="belongs to dataflow 'flow_a'"):
        _check_meta(chk, "flow_b", 64, ["flow_b.count"])


def test_checkpoint_keeps_the_timer_choice_it_was_made_with(tmp_path):
    import json

    from flowspark.errors import RecoveryError
    from flowspark.spark.streaming import META_FILE
    from flowspark.spark.streaming import check_meta as _check_meta

    quiet = str(tmp_path / "quiet")
    assert _check_meta(quiet, "f", 64, ["f.count"], timers=False) is False
    assert json.load(open(f"{quiet}/{META_FILE}"))["timers"] is False
    assert _check_meta(quiet, "f", 64, ["f.count"], timers=False) is False
    with pytest.raises(RecoveryError, match="without timers"):
        _check_meta(quiet, "f", 64, ["f.count"], timers=True)
    # A checkpoint written before the choice was recorded ran with timers: it keeps them.
    old = tmp_path / "old"
    old.mkdir()
    (old / META_FILE).write_text(json.dumps({"flow_id": "f", "buckets": 64, "stateful_steps": ["f.count"]}))
    assert _check_meta(str(old), "f", 64, ["f.count"], timers=False) is True


def test_streaming_needs_a_checkpoint(tmp_path):
    from flowspark.errors import FlowsparkTypeError
    from flowspark.spark import run
    from flowspark.spark.streaming import run_streaming

    # A trigger asks for a streaming query; without a checkpoint the flow drains as a batch job.
    with pytest.raises(FlowsparkTypeError, match="give a checkpoint to run it as a streaming query"):
        run(_count_flow(str(tmp_path), []), trigger="available_now")
    with pytest.raises(FlowsparkTypeError, match="needs checkpoint=DIR"):
        run_streaming(_count_flow(str(tmp_path), []), trigger="available_now")


def _driver_input(tmp_path, mult: int, mod: int) -> tuple[str, list]:
    """Write 1200 events for the driver's flow; return (input root, the rows a run over all of them writes).

    The flow counts events per user: whatever the micro-batches, an uninterrupted run writes
    `(user, n)` for n = 1 .. the user's events, once each (computed here from the events, so the
    reference shares no code with the runs it checks).
    """
    from collections import Counter

    root = str(tmp_path / "in")
    users: Counter[str] = Counter()
    for part in ("a", "b"):
        for f in range(4):
            events = [{"user": f"u{(i * mult + f) % mod}"} for i in range(150)]
            write_jsonl(f"{root}/{part}/{f:04d}.jsonl", events)
            users.update(e["user"] for e in events)
    want = sorted((u, n) for u, total in users.items() for n in range(1, total + 1))
    assert len(want) == 1200
    return root, want


def _start_driver(root: str, chk: str, out: str, *extra: str, **popen):
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "streaming_driver.py")
    return subprocess.Popen([sys.executable, script, root, chk, out, *extra], stdout=subprocess.PIPE, **popen)


def _committed(chk: str) -> list[int]:
    import os

    commits = os.path.join(chk, "query", "commits")
    return [int(f) for f in os.listdir(commits) if f.isdigit()] if os.path.isdir(commits) else []


def _wait_for_commits(proc, chk: str, n: int) -> bool:
    """Wait (up to 240 s) until `n` micro-batches are committed; False if the driver ended first."""
    import time

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if len(_committed(chk)) >= n:
            return True
        time.sleep(0.02)
    return False


def _restart_and_read(spark, root: str, chk: str, out: str) -> list:
    from streaming_driver import build

    from flowspark.spark import run

    run(build(root, out), spark=spark, checkpoint=chk, trigger="available_now", max_items=100, progress=False)
    return sorted((r.user, r.n) for r in spark.read.json(out).collect())


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["bucket", "key", "chunk"])
def test_kill_9_then_restart_equals_uninterrupted_run(spark, tmp_path, layout, monkeypatch):
    """Kill -9 the driver mid-stream, restart from the checkpoint: the file sink holds what an uninterrupted run writes.

    The killed run uses `layout`, and the restart (no `state_layout`) the layout its
    checkpoint recorded. Before Spark 4.2 (no Python streaming
    source as flowspark needs it) the flow reads Spark's file stream; on 3.5 (no
    transformWithStateInPandas) in the bucket layout only.
    """
    import os
    import signal
    import subprocess

    from flowspark.spark.versions import PYTHON_STREAM_SOURCE, TRANSFORM_WITH_STATE, lacks

    if layout != "bucket" and lacks(TRANSFORM_WITH_STATE) is not None:
        pytest.skip(str(lacks(TRANSFORM_WITH_STATE)))
    if lacks(PYTHON_STREAM_SOURCE) is not None:
        monkeypatch.setenv("FLOWSPARK_TEST_SOURCE", "files")
    root, want = _driver_input(tmp_path, 3, 7)
    # The killed run: a driver process killed with SIGKILL once some micro-batches are committed.
    chk, out = str(tmp_path / "chk"), str(tmp_path / "out")
    env = {**os.environ, "FLOWSPARK_TEST_STATE_LAYOUT": layout}
    proc = _start_driver(root, chk, out, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    killed = _wait_for_commits(proc, chk, 3)
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert killed, "the driver ended before it could be killed; make the input larger"
    assert len(_committed(chk)) < 6, "all 6 data micro-batches were committed before the kill"
    # Restart from the checkpoint (in this process) and finish.
    got = _restart_and_read(spark, root, chk, out)
    assert got == want
    finals: dict = {}
    for u, n in got:
        finals[u] = max(finals.get(u, 0), n)
    assert sum(finals.values()) == 1200
    with open(os.path.join(chk, "flowspark.json")) as f:
        assert json.load(f)["state_layout"] == layout


@pytest.mark.slow
def test_ctrl_c_stops_between_micro_batches_and_a_restart_loses_nothing(spark, tmp_path):
    """SIGINT to a driver running until stopped: it stops between micro-batches; a restart finishes the input."""
    import os
    import signal
    import subprocess

    root, want = _driver_input(tmp_path, 5, 9)
    chk, out = str(tmp_path / "chk"), str(tmp_path / "out")
    proc = _start_driver(root, chk, out, "continuous", stderr=subprocess.DEVNULL, text=True)
    assert _wait_for_commits(proc, chk, 2), "the driver ended on its own; it should run until stopped"
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the driver
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "DRIVER INTERRUPTED" in stdout
    # Stopped between micro-batches: with data flowing, batches run back to back, so the stop
    # (right after a batch finished) may find the next one just planned; at most that one is
    # uncommitted, and the restart redoes it (the output check below proves nothing is lost or doubled).
    offsets = os.path.join(chk, "query", "offsets")
    planned, committed = max(int(f) for f in os.listdir(offsets) if f.isdigit()), max(_committed(chk))
    assert committed <= planned <= committed + 1, (planned, committed)
    assert _restart_and_read(spark, root, chk, out) == want


def _chain_flow(src: JsonlDirSource, out: list) -> Dataflow:
    flow = Dataflow("chain3")
    s = op.input("inp", flow, src)
    per_user = op.stateful_map("per_user", op.key_on("user", s, lambda e: e["user"]), count_mapper)
    per_parity = op.stateful_map("per_parity", op.key_on("parity", per_user, parity_key), count_mapper)
    total = op.stateful_map("total", op.key_on("all", per_parity, lambda kv: "all"), count_mapper)
    op.output("out", total, TestingSink(out))
    return flow


def test_chain_of_three_stateful_steps_with_rekeying(spark, tmp_path):
    """Three keyed stages in one query, over several micro-batches and a restart, in the bucket layout.

    Chained keyed stages run on transformWithStateInPandas in every layout; the key and chunk
    layouts' chains are tested in test_state_layout.py (`test_tiered_layouts_chain_of_stateful_steps`).
    """
    from flowspark.spark import run
    from flowspark.spark.versions import TRANSFORM_WITH_STATE, lacks
    from flowspark.testing import run_main

    if lacks(TRANSFORM_WITH_STATE) is not None:
        pytest.skip(str(lacks(TRANSFORM_WITH_STATE)))
    root = str(tmp_path / "in")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 4}"} for i in range(30)])
    chk = str(tmp_path / "chk")
    streamed: list = []
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False, "max_items": 12}
    run(_chain_flow(JsonlDirSource(root, ["a"], batch=5), streamed), state_layout="bucket", **opts)
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": f"u{i % 3}"} for i in range(9)])
    run(_chain_flow(JsonlDirSource(root, ["a"], batch=5), streamed), **opts)
    local: list = []
    run_main(_chain_flow(JsonlDirSource(root, ["a"], batch=5, bounded=True), local))
    # Each stage counts, so whatever the order of keys between stages, the multiset is the same.
    assert sorted(streamed) == sorted(local) == [("all", n) for n in range(1, 40)]


def test_interval_trigger_runs_until_timeout(spark, tmp_path):
    """A processing-time trigger keeps the query running; `timeout` stops it between micro-batches."""
    from flowspark.spark import run

    root = str(tmp_path / "in")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "amy"}, {"user": "bob"}, {"user": "amy"}])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": "cy"}])
    out: list = []
    sr = run(
        _count_flow(root, out),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="1 second",
        timeout=15,
        progress=False,
    )
    assert sorted(out) == [("amy", 1), ("amy", 2), ("bob", 1), ("cy", 1)]
    assert not sr.query.isActive
    assert sr.query.exception() is None
