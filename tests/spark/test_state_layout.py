"""The key and chunk state layouts give the bucket layout's results; the layout is fixed for a checkpoint."""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta

import pytest
from streaming_helpers import T0, FileClock, JsonlDirSource, count_mapper, write_jsonl
from test_streaming import _active_flow, _chain_flow, _count_flow

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkTypeError, RecoveryError
from flowspark.testing import TestingSink, run_main

pytestmark = [pytest.mark.spark]


@pytest.fixture
def tiny_hot_tier(monkeypatch):
    """One hot key per bucket: most keys then live in MapState rows (read, evicted, removed)."""
    monkeypatch.setattr("flowspark.spark.streaming.keylayout.HOT_PER_BUCKET", 1)


@pytest.mark.parametrize("hot", ["default", "tiny"])
def test_key_layout_running_count_and_resume(spark, tmp_path, monkeypatch, hot):
    from flowspark.spark import run

    if hot == "tiny":
        monkeypatch.setattr("flowspark.spark.streaming.keylayout.HOT_PER_BUCKET", 1)
    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": f"u{i % 2}"} for i in range(4)])
    out: list = []
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False, "buckets": 2}
    run(_count_flow(root, out), state_layout="key", **opts)
    assert sorted(v for k, v in out if k == "u0") == [1, 2, 3, 4, 5]
    assert {k: max(v for kk, v in out if kk == k) for k, _ in out} == {"u0": 5, "u1": 4, "u2": 2}
    with open(os.path.join(chk, "flowspark.json")) as f:
        assert json.load(f)["state_layout"] == "key"
    # The restart takes the layout from the checkpoint: counts go on from the per-key rows.
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u2"}, {"user": "u9"}, {"user": "u0"}])
    out2: list = []
    run(_count_flow(root, out2), **opts)
    assert sorted(out2) == [("u0", 6), ("u2", 3), ("u9", 1)]
    # Asking for the other layout on this checkpoint is refused, naming both and the way out.
    with pytest.raises(RecoveryError, match=r"'key' layout; received state_layout='bucket'.*new checkpoint"):
        run(_count_flow(root, []), state_layout="bucket", **opts)


def _count_flow_of(src: JsonlDirSource, out: list) -> Dataflow:
    flow = Dataflow("stream_count")
    keyed = op.key_on("key", op.input("inp", flow, src), lambda e: e["user"])
    op.output("out", op.stateful_map("count", keyed, count_mapper), TestingSink(out))
    return flow


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunk layout: one hot key per bucket, and the chunk count doubling past one cold key per chunk."""
    monkeypatch.setattr("flowspark.spark.streaming.chunklayout.HOT_PER_BUCKET", 1)
    monkeypatch.setattr("flowspark.spark.streaming.chunklayout.CHUNK_KEYS", 1)


def test_chunk_layout_running_count_restart_and_splits(spark, tmp_path, tiny_chunks):
    """Many keys through one-key hot tiers and one-key chunks (every flush splits chunks); a restart goes on."""
    from flowspark.spark import run

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    users = [f"u{i % 23}" for i in range(60)] + [f"u{i % 7}" for i in range(10)]
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": u} for u in users[:60]])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": u} for u in users[60:]])
    out: list = []
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False, "buckets": 2}
    run(_count_flow(root, out), state_layout="chunk", **opts)
    with open(os.path.join(chk, "flowspark.json")) as f:
        assert json.load(f)["state_layout"] == "chunk"
    more = [f"u{i % 29}" for i in range(40)]
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": u} for u in more])
    run(_count_flow(root, out), **opts)  # the layout comes from the checkpoint
    # A running count: each key's counts 1..n, as run_main gives on the same files (read as a bounded stream).
    local: list = []
    run_main(_count_flow_of(JsonlDirSource(root, ["a", "b"], bounded=True), local))
    assert sorted(out) == sorted(local)
    assert sorted(out) == sorted((u, n) for u in set(users + more) for n in range(1, (users + more).count(u) + 1))
    with pytest.raises(RecoveryError, match=r"'chunk' layout; received state_layout='key'.*new checkpoint"):
        run(_count_flow(root, []), state_layout="key", **opts)


@pytest.mark.parametrize("layout", ["key", "chunk"])
def test_tiered_layouts_chain_of_stateful_steps(spark, tmp_path, tiny_hot_tier, tiny_chunks, layout):
    from flowspark.spark import run

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 4}"} for i in range(30)])
    streamed: list = []
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False, "max_items": 12}
    opts["buckets"] = 2
    run(_chain_flow(JsonlDirSource(root, ["a"], batch=5), streamed), state_layout=layout, **opts)
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": f"u{i % 3}"} for i in range(9)])
    run(_chain_flow(JsonlDirSource(root, ["a"], batch=5), streamed), **opts)
    local: list = []
    run_main(_chain_flow(JsonlDirSource(root, ["a"], batch=5, bounded=True), local))
    assert sorted(streamed) == sorted(local) == [("all", n) for n in range(1, 40)]


def test_a_checkpoint_from_before_layouts_keeps_the_bucket_layout(tmp_path):
    from flowspark.spark.streaming.checkpoint import check_layout, check_meta

    chk = str(tmp_path / "chk")
    check_meta(chk, "f", 64, ["f.count"])
    meta = os.path.join(chk, "flowspark.json")
    with open(meta) as f:
        m = json.load(f)
    m.pop("state_layout", None)  # what a checkpoint of the previous version holds
    with open(meta, "w") as f:
        json.dump(m, f)
    os.makedirs(os.path.join(chk, "query"))  # its query ran
    assert check_layout(chk, None, ("bucket", "key")) == "bucket"
    with pytest.raises(RecoveryError, match="'bucket' layout"):
        check_layout(chk, "key", ("bucket", "key"))
    # A checkpoint whose query never started may still choose.
    fresh = str(tmp_path / "fresh")
    check_meta(fresh, "f", 64, ["f.count"])
    assert check_layout(fresh, "key", ("bucket", "key")) == "key"
    assert check_layout(fresh, "bucket", ("bucket", "key")) == "bucket"
    from flowspark.spark.streaming.state import LAYOUTS

    assert check_layout(chk, None, LAYOUTS) == "bucket"
    newer = str(tmp_path / "newer")
    check_meta(newer, "f", 64, ["f.count"])
    assert check_layout(newer, "chunk", LAYOUTS) == "chunk"
    # A new checkpoint run without a layout gets the default, recorded.
    default = str(tmp_path / "default")
    check_meta(default, "f", 64, ["f.count"])
    assert check_layout(default, None, LAYOUTS) == "chunk"
    with open(os.path.join(default, "flowspark.json")) as f:
        assert json.load(f)["state_layout"] == "chunk"


def test_bad_state_layout_is_refused(tmp_path):
    from flowspark.spark import run

    with pytest.raises(
        FlowsparkTypeError, match=r"state_layout must be one of 'chunk', 'bucket', 'key'; received 'keys'"
    ):
        run(_count_flow(str(tmp_path), []), checkpoint=str(tmp_path / "c"), state_layout="keys")


@pytest.mark.parametrize("layout", ["bucket", "key", "chunk"])
def test_state_ttl_drops_idle_keys_on_every_layout(spark, tmp_path, layout):
    """A key idle for state_ttl (injected clock) starts again from fresh state; a live key goes on."""
    from flowspark.spark import run

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    clock = FileClock(str(tmp_path / "now.txt"))
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False, "clock": clock}
    opts.update(state_layout=layout, state_ttl=timedelta(minutes=5), buckets=1)
    os.makedirs(f"{root}/b")
    steps = [(0, ["amy", "bob"]), (3, ["amy"]), (7, ["amy", "bob"]), (13, ["amy"])]
    got: list = []
    for n, (minute, users) in enumerate(steps):
        clock.set(T0 + timedelta(minutes=minute))
        write_jsonl(f"{root}/a/{n:04d}.jsonl", [{"user": u} for u in users])
        out: list = []
        run(_count_flow(root, out), **opts)
        got.append(sorted(out))
    # bob: 0, then 7 (idle 7 >= 5: fresh); amy: 0, 3, 7 (idle 4), then 13 (idle 6: fresh).
    assert got == [[("amy", 1), ("bob", 1)], [("amy", 2)], [("amy", 3), ("bob", 1)], [("amy", 1)]]


@pytest.mark.parametrize("layout", ["bucket", "key", "chunk"])
def test_progress_line_shows_keys_timers_and_bytes_in_state(spark, tmp_path, layout):
    from flowspark.spark import run

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": "u3"}])
    lines: list = []
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": lines.append, "buckets": 4}
    run(_count_flow(root, []), state_layout=layout, **opts)
    assert re.search(r"state 4 keys, 0 timers pending, [\d.]+ (B|KiB|MiB) in memory", lines[-1]), lines
    # The counts survive a restart (saved next to the checkpoint); a new key adds one.
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u9"}])
    lines.clear()
    run(_count_flow(root, []), **opts)
    assert "state 5 keys" in lines[-1], lines


@pytest.mark.parametrize("layout", ["key", "chunk"])
def test_progress_line_counts_pending_timers(spark, tmp_path, layout):
    from flowspark.spark import run

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    clock = FileClock(str(tmp_path / "now.txt"))
    clock.set(T0)
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "amy"}, {"user": "bob"}])
    lines: list = []
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": lines.append, "clock": clock}
    run(_active_flow(root, []), state_layout=layout, **opts)
    assert "state 2 keys, 2 timers pending" in lines[-1], lines


def test_state_ttl_may_change_between_runs_of_a_key_layout_checkpoint(spark, tmp_path):
    """Spark keeps a TTL with the MapState: a restart with another state_ttl (or none) still runs."""
    from flowspark.spark import run

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    os.makedirs(f"{root}/b")
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False}
    outs: list = []
    for n, ttl in enumerate([timedelta(hours=1), None, timedelta(hours=2)]):
        write_jsonl(f"{root}/a/{n:04d}.jsonl", [{"user": "amy"}])
        out: list = []
        run(_count_flow(root, out), state_layout="key", state_ttl=ttl, **opts)
        outs.extend(out)
    assert outs == [("amy", 1), ("amy", 2), ("amy", 3)]


def test_a_key_or_chunk_checkpoint_records_whether_it_runs_untimed(tmp_path):
    """No timers and no state_ttl: untimed (time mode "None"), for the checkpoint's lifetime."""
    from flowspark.spark.streaming.checkpoint import check_layout, check_meta, check_recorded, check_untimed

    def fresh(name: str, layout: str) -> str:
        chk = str(tmp_path / name)
        check_meta(chk, "f", 64, ["f.count"], timers=False)
        check_layout(chk, layout, ("bucket", "key", "chunk"))
        return chk

    assert check_untimed(fresh("b", "bucket"), "bucket", False, False) is False  # the bucket layout has no TTL rows
    assert check_untimed(fresh("t", "chunk"), "chunk", True, False) is False
    assert check_untimed(fresh("l", "chunk"), "chunk", False, True) is False
    chk = fresh("u", "chunk")
    assert check_untimed(chk, "chunk", False, False) is True
    os.makedirs(os.path.join(chk, "query"))  # its query ran: the choice is fixed
    assert check_untimed(chk, "chunk", False, False) is True
    with pytest.raises(RecoveryError, match="state rows carry no TTL; received a state_ttl"):
        check_untimed(chk, "chunk", False, True)
    with pytest.raises(RecoveryError, match="state rows carry no TTL; received a state_ttl"):
        check_recorded(chk, "f", 64, ["f.count"], False, None, ("chunk",), ttl=True)
    check_recorded(chk, "f", 64, ["f.count"], False, None, ("chunk",))
    # A chunk checkpoint whose query ran before the choice was recorded ran timed, and stays so.
    old = fresh("o", "chunk")
    with open(os.path.join(old, "flowspark.json")) as f:
        assert "untimed_state" not in json.load(f)
    os.makedirs(os.path.join(old, "query"))
    assert check_untimed(old, "chunk", False, False) is False
    assert check_untimed(old, "chunk", False, True) is False


@pytest.mark.parametrize("layout", ["key", "chunk"])
def test_an_untimed_checkpoint_refuses_a_later_state_ttl(spark, tmp_path, layout):
    from flowspark.spark import run

    root, chk = str(tmp_path / "in"), str(tmp_path / "chk")
    os.makedirs(f"{root}/b")
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False}
    write_jsonl(f"{root}/a/0000.jsonl", [{"user": "amy"}, {"user": "bob"}, {"user": "amy"}])
    out: list = []
    run(_count_flow(root, out), state_layout=layout, **opts)
    with open(os.path.join(chk, "flowspark.json")) as f:
        assert json.load(f)["untimed_state"] is True
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "amy"}])
    with pytest.raises(RecoveryError, match="state rows carry no TTL"):
        run(_count_flow(root, out), state_ttl=timedelta(hours=1), **opts)
    run(_count_flow(root, out), **opts)
    assert sorted(out) == [("amy", 1), ("amy", 2), ("amy", 3), ("bob", 1)]
