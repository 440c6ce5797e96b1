"""Recovery on the local executor: continuation after EOF, resume after ABORT or a crash, store errors."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream
from flowspark.errors import (
    InconsistentPartitionsError,
    MissingPartitionsError,
    NoPartitionsError,
    RecoveryError,
)
from flowspark.recovery import RecoveryConfig, init_db_dir, main
from flowspark.testing import TestingSink, TestingSource, run_main

EOF = TestingSource.EOF
ABORT = TestingSource.ABORT
EVERY_PASS = timedelta(0)


def _count(state, _v):
    n = (state or 0) + 1
    return n, n


@pytest.fixture
def db(tmp_path: Path) -> Path:
    init_db_dir(tmp_path / "db", 3)
    return tmp_path / "db"


class Runner:
    """Builds the same flow for each execution over one item list and one recovery store."""

    def __init__(self, db: Path, items: list[Any], build: Callable[[Stream[Any]], Stream[Any]]):
        self.db = db
        self.items = items
        self.build = build

    def __call__(self, epoch_interval: timedelta = EVERY_PASS) -> list[Any]:
        flow = Dataflow("rec")
        s = op.input("inp", flow, TestingSource(self.items))
        out: list[Any] = []
        op.output("out", self.build(s), TestingSink(out))
        run_main(flow, epoch_interval=epoch_interval, recovery_config=RecoveryConfig(self.db))
        return out


def test_continuation_after_eof_restores_state(db):
    items = [("a", 0), ("b", 0), ("a", 0), EOF(), ("a", 0), ("c", 0), EOF(), ("b", 0)]
    run = Runner(db, items, lambda s: op.stateful_map("count", s, _count))
    assert run(timedelta(seconds=10)) == [("a", 1), ("b", 1), ("a", 2)]
    assert run(timedelta(seconds=10)) == [("a", 3), ("c", 1)]
    assert run(timedelta(seconds=10)) == [("b", 2)]
    assert run(timedelta(seconds=10)) == []  # input exhausted


def test_continuation_without_recovery_starts_over():
    items = [("a", 0), EOF(), ("a", 0)]
    for _ in range(2):
        flow = Dataflow("rec")
        out: list[Any] = []
        s = op.input("inp", flow, TestingSource(items))
        op.output("out", op.stateful_map("count", s, _count), TestingSink(out))
        run_main(flow)
        assert out == [("a", 1)]


def test_final_state_discarded_at_eof_does_not_carry_over(db):
    items = [("a", 1), ("a", 2), ("b", 5), EOF(), ("a", 10), EOF(), EOF()]

    def build(s):
        return op.fold_final("sum", s, int, lambda acc, v: acc + v)

    run = Runner(db, items, build)
    assert sorted(run()) == [("a", 3), ("b", 5)]
    assert run() == [("a", 10)]
    assert run() == []


def test_collect_and_join_final_state_discarded_at_eof(db):
    items = [("a", 1), ("b", 2), EOF(), ("a", 3)]

    def build(s):
        c = op.collect("c", s, timedelta(hours=1), max_size=10)
        j = op.join("j", s, s, emit_mode="final")
        return op.merge("m", c, j)

    run = Runner(db, items, build)
    assert sorted(run(), key=repr) == sorted([("a", [1]), ("b", [2]), ("a", (1, 1)), ("b", (2, 2))], key=repr)
    assert sorted(run(), key=repr) == sorted([("a", [3]), ("a", (3, 3))], key=repr)


def test_discarded_key_stays_discarded_after_resume(db):
    def mapper(state, v):
        if v == "reset":
            return None, "reset"
        return _count(state, v)

    items = [("a", 0), ("a", 0), ("a", "reset"), EOF(), ("a", 0)]
    run = Runner(db, items, lambda s: op.stateful_map("m", s, mapper))
    assert run() == [("a", 1), ("a", 2), ("a", "reset")]
    assert run() == [("a", 1)]


def test_abort_returns_normally_and_resumes_from_last_snapshot(db):
    items = [("a", 0), ("b", 0), ABORT(), ("a", 0), ("b", 0), EOF()]
    run = Runner(db, items, lambda s: op.stateful_map("count", s, _count))
    assert run() == [("a", 1), ("b", 1)]  # returns normally at the ABORT
    assert run() == [("a", 2), ("b", 2)]  # state from the last epoch; the ABORT fires once


@pytest.mark.parametrize(
    ("batch_size", "first_run"),
    [
        (1, [("a", 1), ("b", 1), ("a", 2)]),
        # One source batch holds the three items: grouped by key, keys sorted (as bytewax 0.21.1).
        (3, [("a", 1), ("a", 2), ("b", 1)]),
        (7, [("a", 1), ("a", 2), ("b", 1)]),
    ],
)
def test_items_read_before_abort_are_processed(db, batch_size, first_run):
    # Items in the same source batch as (before) the ABORT still flow through the dataflow.
    items = [("a", 0), ("b", 0), ("a", 0), ABORT(), ("a", 0)]

    def build(s):
        return op.stateful_map("count", s, _count)

    flow_out = []
    for _ in range(2):
        flow = Dataflow("rec")
        out: list[Any] = []
        s = op.input("inp", flow, TestingSource(items, batch_size))
        op.output("out", build(s), TestingSink(out))
        run_main(flow, epoch_interval=EVERY_PASS, recovery_config=RecoveryConfig(db))
        flow_out.append(out)
    assert flow_out == [first_run, [("a", 3)]]


def test_abort_replays_input_since_last_snapshot(db):
    # With a long epoch no snapshot was written before the abort: everything is replayed
    # (at-least-once output), and the state is rebuilt from the replay, not doubled.
    items = [("a", 0), ("a", 0), ABORT(), ("a", 0)]
    run = Runner(db, items, lambda s: op.stateful_map("count", s, _count))
    assert run(timedelta(hours=1)) == [("a", 1), ("a", 2)]
    assert run(timedelta(hours=1)) == [("a", 1), ("a", 2), ("a", 3)]


def test_abort_after_eof_replays_only_since_the_eof(db):
    items = [("a", 0), EOF(), ("a", 0), ABORT(), ("a", 0)]
    run = Runner(db, items, lambda s: op.stateful_map("count", s, _count))
    assert run(timedelta(hours=1)) == [("a", 1)]
    assert run(timedelta(hours=1)) == [("a", 2)]
    assert run(timedelta(hours=1)) == [("a", 2), ("a", 3)]


def test_markers_advance_the_resume_position(db):
    # Bytewax 0.21.1's TestingSource does not count a skipped ABORT (or a PAUSE) in its
    # resume index, so after one the next continuation re-reads the preceding EOF marker and
    # loses the rest of the input. We count every marker: the last run still sees ("a", 0).
    items = [("a", 0), ABORT(), TestingSource.PAUSE(timedelta(0)), ("a", 0), EOF(), ("a", 0)]
    run = Runner(db, items, lambda s: op.stateful_map("count", s, _count))
    assert run() == [("a", 1)]
    assert run() == [("a", 2)]
    assert run() == [("a", 3)]


def test_collect_state_survives_abort(db):
    items = [("a", 1), ("a", 2), ABORT(), ("a", 3), ("b", 4)]
    run = Runner(db, items, lambda s: op.collect("c", s, timedelta(hours=1), max_size=3))
    assert run() == []
    assert run() == [("a", [1, 2, 3]), ("b", [4])]


class _Crash(Exception):
    pass


def test_crash_resumes_from_last_snapshot(db):
    crash = {"armed": True}

    def maybe_crash(x):
        if x == ("a", "boom") and crash["armed"]:
            crash["armed"] = False
            raise _Crash

        return x

    # The pause ends the executor's pass, so an epoch closes after the first two items.
    items = [("a", 0), ("a", 0), TestingSource.PAUSE(timedelta(0)), ("a", "boom"), ("a", 0)]

    def build(s):
        s = op.map("maybe_crash", s, maybe_crash)
        return op.stateful_map("count", s, _count)

    run = Runner(db, items, build)
    with pytest.raises(RuntimeError) as info:
        run()
    assert isinstance(info.value.__cause__, _Crash)
    assert run() == [("a", 3), ("a", 4)]


def test_resume_builds_every_snapshotted_key_eagerly(db):
    built: list[Any] = []

    class Keep(op.StatefulLogic):
        def __init__(self, resume):
            built.append(resume)
            self.n = resume or 0

        def on_item(self, value):
            self.n += value
            return [self.n], self.RETAIN

        def on_eof(self):
            return [("eof", self.n)], self.RETAIN

        def snapshot(self):
            return self.n

    items = [("a", 1), ("b", 2), EOF(), EOF()]
    run = Runner(db, items, lambda s: op.stateful("keep", s, Keep))
    assert run() == [("a", 1), ("b", 2), ("a", ("eof", 1)), ("b", ("eof", 2))]
    built.clear()
    # No input for either key, yet both logics are rebuilt and see EOF.
    assert sorted(run()) == [("a", ("eof", 1)), ("b", ("eof", 2))]
    assert sorted(built) == [1, 2]


def test_resume_reschedules_notifications(db):
    items = [("a", 1), ABORT(), TestingSource.PAUSE(timedelta(seconds=0.5)), ("b", 1)]
    run = Runner(db, items, lambda s: op.collect("c", s, timedelta(milliseconds=200), max_size=10))
    assert run() == []
    # The collected item comes back with its deadline, which has passed: it is emitted before b's.
    assert run() == [("a", [1]), ("b", [1])]


def test_store_with_one_partition_and_keys_spread(tmp_path):
    init_db_dir(tmp_path / "one", 1)
    keys = [f"k{i}" for i in range(20)]
    items = [(k, 0) for k in keys] + [EOF()] + [(k, 0) for k in keys]
    run = Runner(tmp_path / "one", items, lambda s: op.stateful_map("count", s, _count))
    assert run() == [(k, 1) for k in keys]
    assert run() == [(k, 2) for k in keys]


# -- the store ----------------------------------------------------------------


def test_init_db_dir_creates_partitions(tmp_path):
    init_db_dir(tmp_path / "d", 3)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "part-0.sqlite3",
        "part-1.sqlite3",
        "part-2.sqlite3",
    ]


def test_init_db_dir_cli(tmp_path):
    main([str(tmp_path / "cli"), "2"])
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == ["part-0.sqlite3", "part-1.sqlite3"]


@pytest.mark.parametrize("count", [0, -1, "2", 1.5])
def test_init_db_dir_bad_count(tmp_path, count):
    with pytest.raises(ValueError, match=r"partition count must be an int >= 1"):
        init_db_dir(tmp_path / "d", count)


def _flow_with_recovery(db_dir: Path) -> None:
    flow = Dataflow("rec")
    op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink([]))
    run_main(flow, recovery_config=RecoveryConfig(db_dir))


def test_no_partitions_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoPartitionsError, match=r"holds no partitions.*python -m flowspark\.recovery"):
        _flow_with_recovery(tmp_path / "empty")


def test_missing_directory_is_no_partitions_error(tmp_path):
    with pytest.raises(NoPartitionsError):
        _flow_with_recovery(tmp_path / "nope")


def test_missing_partition_error(tmp_path):
    init_db_dir(tmp_path / "d", 3)
    (tmp_path / "d" / "part-1.sqlite3").unlink()
    with pytest.raises(MissingPartitionsError, match=r"missing partitions \[1\] of 3"):
        _flow_with_recovery(tmp_path / "d")


def test_inconsistent_partitions_error(tmp_path):
    init_db_dir(tmp_path / "a", 2)
    init_db_dir(tmp_path / "b", 3)
    (tmp_path / "a" / "part-2.sqlite3").write_bytes((tmp_path / "b" / "part-2.sqlite3").read_bytes())
    with pytest.raises(InconsistentPartitionsError, match="disagree on the partition count"):
        _flow_with_recovery(tmp_path / "a")


def test_uninitialised_partition_error(tmp_path):
    init_db_dir(tmp_path / "d", 1)
    sqlite3.connect(tmp_path / "d" / "part-1.sqlite3").close()  # an empty file that is not a partition
    with pytest.raises(InconsistentPartitionsError, match=r"part-1\.sqlite3' is not a flowspark recovery partition"):
        _flow_with_recovery(tmp_path / "d")


def test_garbage_partition_error(tmp_path):
    init_db_dir(tmp_path / "d", 1)
    (tmp_path / "d" / "part-0.sqlite3").write_bytes(b"not a database at all, clearly" * 100)
    with pytest.raises(InconsistentPartitionsError, match="not a flowspark recovery partition"):
        _flow_with_recovery(tmp_path / "d")


def test_duplicate_partition_index_error(tmp_path):
    init_db_dir(tmp_path / "d", 2)
    (tmp_path / "d" / "part-1.sqlite3").write_bytes((tmp_path / "d" / "part-0.sqlite3").read_bytes())
    with pytest.raises(InconsistentPartitionsError, match="repeats partition index 0"):
        _flow_with_recovery(tmp_path / "d")


def test_recovery_errors_are_value_errors():
    assert issubclass(NoPartitionsError, ValueError)
    assert issubclass(MissingPartitionsError, RecoveryError)


def test_backup_interval_is_accepted(db):
    flow = Dataflow("rec")
    out: list[Any] = []
    op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink(out))
    run_main(flow, recovery_config=RecoveryConfig(db, backup_interval=timedelta(minutes=5)))
    assert out == [1]


@pytest.mark.parametrize(
    ("kw", "err", "word"),
    [
        ({"epoch_interval": 5}, TypeError, "epoch_interval must be a timedelta"),
        ({"epoch_interval": timedelta(seconds=-1)}, ValueError, "must not be negative"),
        ({"recovery_config": "db"}, TypeError, "recovery_config must be a flowspark.recovery.RecoveryConfig"),
    ],
)
def test_run_main_rejects_bad_options(kw, err, word):
    flow = Dataflow("rec")
    op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink([]))
    with pytest.raises(err, match=word):
        run_main(flow, **kw)


# -- crash consistency of the store -------------------------------------------


class _FailingCon:
    """A partition connection that fails while an epoch is written to it."""

    def __init__(self, con):
        self._con = con

    def __enter__(self):
        return self._con.__enter__()

    def __exit__(self, *exc):
        return self._con.__exit__(*exc)

    def executemany(self, *args):
        raise OSError("disk gone")

    def __getattr__(self, name):
        return getattr(self._con, name)


def _keys_in_every_partition(store, n=30):
    parts = {}
    for i in range(n):
        parts.setdefault(id(store._part("step", f"k{i}")), f"k{i}")
    assert len(parts) == store.count
    return list(parts.values())


def test_epoch_written_to_some_partitions_only_is_not_resumed(tmp_path):
    from flowspark.recovery import DELETED, RecoveryStore

    init_db_dir(tmp_path / "d", 2)
    cfg = RecoveryConfig(tmp_path / "d")
    store = RecoveryStore(cfg)
    keys = _keys_in_every_partition(store)
    store.write(1, [("step", k, f"{k}@1") for k in keys])
    # Epoch 2 rewrites every key, but the write fails after the first partition committed.
    first, second = sorted(store._cons)
    store._cons[second] = _FailingCon(store._cons[second])
    with pytest.raises(OSError, match="disk gone"):
        store.write(2, [("step", k, f"{k}@2") for k in keys])
    store._cons[second] = store._cons[second]._con
    store.close()

    store = RecoveryStore(cfg)
    assert store.resume_epoch() == 1
    assert store.load() == {"step": {k: f"{k}@1" for k in keys}}
    # The next execution writes epoch 2 again, touching one key only: the half-written
    # epoch 2 of the failed run must not show through for the others.
    store.write(2, [("step", keys[0], DELETED)])
    store.close()
    store = RecoveryStore(cfg)
    assert store.load() == {"step": {k: f"{k}@1" for k in keys[1:]}}
    store.close()


def test_store_drops_superseded_versions(tmp_path):
    from flowspark.recovery import DELETED, RecoveryStore

    init_db_dir(tmp_path / "d", 1)
    store = RecoveryStore(RecoveryConfig(tmp_path / "d"))
    store.write(1, [("s", "a", 1), ("s", "b", 1)])
    store.write(2, [("s", "a", 2), ("s", "b", DELETED)])
    store.write(3, [("s", "c", 3)])
    assert store.load() == {"s": {"a": 2, "c": 3}}
    rows = sorted(store._cons[0].execute("SELECT state_key, epoch FROM snaps").fetchall())
    assert rows == [("a", 2), ("c", 3)]
    store.close()
