"""The worker-side pieces without a SparkSession: per-key driver, sequences, error markers."""

from __future__ import annotations

import copy
import dataclasses
import enum
import itertools
import pickle
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

import numpy as np
import pytest
from error_helpers import Boom, LockedBoom
from streaming_helpers import AlwaysPast

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError, FlowsparkTypeError, step_error
from flowspark.operators import StatefulLogic
from flowspark.runtime.driver import drive_chain, drive_states
from flowspark.runtime.tags import idx
from flowspark.spark import SparkSink, SparkSource, compile_flow, run
from flowspark.spark.plan.types import KeyedStep, Port, StageSpec
from flowspark.spark.rules.optimizer import Env, optimize
from flowspark.spark.streaming.state import BucketDriver
from flowspark.spark.worker.codec import (
    CAUSE_LIMIT,
    SINGLES,
    apply_pad,
    decode_task_error,
    dumps,
    encode_task_error,
    loads,
    loads_all,
    loads_arrow,
    read_head,
    source_items,
    source_seq,
)
from flowspark.spark.worker.rows import RowSchema
from flowspark.spark.worker.stage import run_stage_rows, stage_drivers
from flowspark.testing import TestingSink, TestingSource

StepFailure = FlowsparkRuntimeError  # what a worker raises for a failed step
RUN = b"this run"  # a BucketDriver's run token, fixed to compare state entries
BARE = frozenset({"bare_state"})  # the mode of a stage the rule `bare_state` applied to


def drivers_of(steps):
    """The per-key drivers of a chain of plan steps, as a keyed stage's workers build them."""
    return stage_drivers(StageSpec(1, "rows", "s", chain=tuple(steps)))


def physical(plan, **env):
    """The plan as the streaming lowering runs it, for `env` (`flowspark.spark.rules.optimizer.Env`'s fields)."""
    return optimize(plan, Env("streaming", **env))


def drive_key(key, items, steps, logics=None, *, now, eof=True):
    """The per-key driver over a chain of plan steps."""
    return drive_chain(drivers_of(steps), key, items, logics, now=now, eof=eof)


def drive_sorted_rows(rows, steps, *, now):
    """One `drive_key` call per key of rows sorted by (key, sequence)."""
    for key, grp in itertools.groupby(rows, key=lambda r: r[0]):
        yield key, drive_key(key, [(s, v) for _k, s, v in grp], steps, now=now)[0]


T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def seqs(n: int) -> list[bytes]:
    return [source_seq(0, 0, i) for i in range(n)]


class Sum(StatefulLogic):
    def __init__(self, state):
        self.total = state or 0

    def on_item(self, value):
        self.total += value
        return [self.total], self.RETAIN

    def on_eof(self):
        return [("eof", self.total)], self.DISCARD

    def snapshot(self):
        return self.total


def stateful_builder(cls):
    flow = Dataflow("f")
    s = op.stateful("st", op.input("inp", flow, TestingSource([])), cls)
    op.output("out", s, TestingSink([]))
    node = next(n for n in flow.graph().nodes if type(n).__name__ == "StatefulBatch")
    return node.builder


def test_drive_key_runs_values_in_order_then_eof():
    step = KeyedStep("f.st", stateful_builder(Sum))
    items = list(zip(seqs(3), [1, 2, 3], strict=True))
    out, logics = drive_key("k", items, (step,), now=T0)
    assert [v for _, v in out] == [1, 3, 6, ("eof", 6)]
    assert [s for s, _ in out] == sorted(s for s, _ in out)
    assert logics == [None]  # discarded by on_eof


def test_drive_key_without_eof_keeps_the_logic_for_a_later_call():
    step = KeyedStep("f.st", stateful_builder(Sum))
    out, logics = drive_key("k", list(zip(seqs(2), [1, 2], strict=True)), (step,), now=T0, eof=False)
    assert [v for _, v in out] == [1, 3]
    out2, _ = drive_key("k", [(source_seq(0, 0, 5), 10)], (step,), logics, now=T0)
    assert [v for _, v in out2] == [13, ("eof", 13)]


class Timer(StatefulLogic):
    """Arms a notification at the time given by each value (None disarms)."""

    def __init__(self, state):
        self.at = None
        self.log = []

    def on_item(self, value):
        self.at = value
        return [("item", value)], self.RETAIN

    def on_notify(self):
        fired, self.at = self.at, None
        return [("notify", fired)], self.RETAIN

    def on_eof(self):
        return [("eof",)], self.DISCARD

    def notify_at(self):
        return self.at

    def snapshot(self):
        return self.at


def test_notifications_fire_after_the_next_activations_values_and_before_eof():
    """Bytewax's default order (bytewax 0.21.1 gives the same for this logic on the system clock)."""
    step = KeyedStep("f.t", stateful_builder(Timer))
    past = T0 - timedelta(seconds=1)
    future = T0 + timedelta(seconds=1)
    items = list(zip(seqs(4), [past, future, None, past], strict=True))
    out, _ = drive_key("k", items, (step,), now=T0)
    assert [v for _, v in out] == [
        ("item", past),
        ("item", future),  # the next activation's values first...
        ("notify", future),  # ...then the notification the schedule read after the first one held
        ("item", None),
        ("item", past),
        ("notify", past),  # due after the last value, before on_eof
        ("eof",),
    ]


def test_a_notification_due_before_activations_without_the_keys_values_fires_before_its_next_values():
    step = KeyedStep("f.t", stateful_builder(Timer))
    past = T0 - timedelta(seconds=1)
    gap = [source_seq(0, 0, 0), source_seq(0, 0, 2)]  # activation 1 held other keys only
    out, _ = drive_key("k", list(zip(gap, [past, None], strict=True)), (step,), now=T0)
    assert [v for _, v in out] == [("item", past), ("notify", past), ("item", None), ("eof",)]


class Stuck(Timer):
    def on_notify(self):
        return [("notify",)], self.RETAIN  # leaves notify_at() unchanged


def test_a_notification_that_does_not_move_fires_once_per_point():
    step = KeyedStep("f.t", stateful_builder(Stuck))
    past = T0 - timedelta(seconds=1)
    out, _ = drive_key("k", list(zip(seqs(2), [past, past], strict=True)), (step,), now=T0)
    # After the second activation's values, then at the end of the key (not again at the same point).
    assert [v for _, v in out] == [("item", past), ("item", past), ("notify",), ("notify",), ("eof",)]


def test_chain_of_steps_and_sorted_rows():
    step1 = KeyedStep("f.a", stateful_builder(Sum))
    step2 = KeyedStep("f.b", stateful_builder(Sum), level=2)
    rows = [("a", s, v) for s, v in zip(seqs(2), [1, 2], strict=True)] + [("b", source_seq(0, 0, 9), 5)]
    got = dict(drive_sorted_rows(rows, (step1,), now=T0))
    assert [v for _, v in got["a"]] == [1, 3, ("eof", 3)]
    assert [v for _, v in got["b"]] == [5, ("eof", 5)]
    # step2 sums the running sums of step1; the ("eof", ...) tuple reaches its on_item.
    with pytest.raises(StepFailure) as ei:
        drive_key("a", list(zip(seqs(2), [1, 2], strict=True)), (step1, step2), now=T0)
    assert ei.value.step_id == "f.b"
    assert isinstance(ei.value.__cause__, TypeError)


class Burst(StatefulLogic):
    """Emits `value` copies of its running count per value (more emits than values, or none)."""

    def __init__(self, state):
        self.n = state or 0

    def on_item(self, value):
        self.n += 1
        return [self.n] * (value if isinstance(value, int) else 1), self.RETAIN

    def snapshot(self):
        return self.n


@pytest.mark.parametrize("cls", [Sum, Burst, Timer])
def test_untagged_drive_gives_the_same_emits_in_the_same_order(cls):
    # `tags=False` (a stage writing a sink's rows) leaves the values' emits untagged; the
    # emits and the logics left must be those of the tagged drive.
    steps = (KeyedStep("f.a", stateful_builder(cls)), KeyedStep("f.b", stateful_builder(Burst), level=2))
    values = [T0 - timedelta(seconds=1), None, T0] if cls is Timer else [2, 0, 3, 1]
    steps = steps[:1] if cls is Timer else steps
    items = list(zip(seqs(len(values)), values, strict=True))
    for eof in (True, False):
        drivers = drivers_of(steps)
        tagged, logics = drive_chain(drivers, "k", items, now=T0, eof=eof)
        untagged, logics2 = drive_chain(drivers, "k", items, now=T0, eof=eof, tags=False)
        assert [v for _, v in untagged] == [v for _, v in tagged]
        assert [lg.snapshot() if lg else None for lg in logics2] == [lg.snapshot() if lg else None for lg in logics]
        if cls is not Timer and not eof:  # a logic with notifications keeps the tagged path
            assert {t for t, _ in untagged} == {b""}


def test_a_step_before_an_eof_only_step_skips_its_tags_and_the_output_is_the_same():
    # `fold_final` promises to emit only at EOF (`eof_only`): the step before it then gives
    # its values' emits no tags, and the chain's emits (values and tags) do not change.
    flow = Dataflow("f")
    s = op.stateful_map("a", op.input("inp", flow, TestingSource([])), lambda st, v: ((st or 0) + v, (st or 0) + v))
    op.output("out", op.fold_final("b", s, list, lambda acc, v: [*acc, v]), TestingSink([]))
    op.output("out2", op.count_final("c", op.input("inp2", flow, TestingSource([])), str), TestingSink([]))
    a, b, c = (n for n in flow.graph().nodes if type(n).__name__ == "StatefulBatch")
    assert (a.eof_only, b.eof_only, c.eof_only) == (False, True, True)  # count_final: a reduce_final
    items = list(zip(seqs(4), [1, 2, 3, 4], strict=True))
    got = {}
    for promise in (True, False):
        steps = (KeyedStep(a.step_id, a.builder), KeyedStep(b.step_id, b.builder, level=2, eof_only=promise))
        got[promise] = drive_chain(drivers_of(steps), "k", items, now=T0)[0]
    assert got[True] == got[False]
    assert [v for _, v in got[True]] == [[1, 3, 6, 10]]


def _map_steps() -> tuple[KeyedStep, ...]:
    """Two `stateful_map`s as the compiler gives them: a running total that discards its
    state at a 0 (and starts over), then the list of the totals seen (a mutable state, emitted)."""
    flow = Dataflow("f")

    def total(st, v):
        t = (st or 0) + v
        return (None if v == 0 else t), t

    def seen(st, v):
        st = st if st is not None else []
        st.append(v)
        return st, st  # the emit is the state object itself

    a = op.stateful_map("a", op.input("inp", flow, TestingSource([])), total)
    op.output("out", op.stateful_map("b", a, seen), TestingSink([]))
    nodes = [n for n in flow.graph().nodes if type(n).__name__ == "StatefulBatch"]
    assert all(n.batch_fn is not None for n in nodes)  # stateful_map records it in the IR
    return tuple(KeyedStep(n.step_id, n.builder, level=i + 1, batch_fn=n.batch_fn) for i, n in enumerate(nodes))


@pytest.mark.parametrize("n", [5, 4096 + 7])  # one batch; more than one `_KEY_CHUNK`
def test_bare_states_give_the_logics_emits_tags_and_snapshots(n):
    # `drive_states` (a chain of `batch_fn` steps on bare states, the streaming bucket
    # call's path) must give exactly what `drive_chain` gives with logic objects.
    rng = np.random.default_rng(n)
    values = [int(x) for x in rng.integers(0, 4, n)]
    items = list(zip(seqs(n), values, strict=True))
    for regroup, tags, start in itertools.product((True, False), (True, False), (None, [7, [1, 2]])):
        steps = tuple(dataclasses.replace(st, regroup=regroup) for st in _map_steps())
        drivers = drivers_of(steps)
        states = [None, None] if start is None else start
        logics = [None if s is None else d.build("k", copy.deepcopy(s)) for d, s in zip(drivers, states, strict=True)]
        want, live = drive_chain(drivers, "k", items, logics, now=T0, eof=False, tags=tags)
        got, bare = drive_states(drivers, "k", items, copy.deepcopy(states), tags=tags)
        assert got == want
        assert [d.state_snapshot("k", s) if s is not None else None for d, s in zip(drivers, bare, strict=True)] == [
            lg.snapshot() if lg is not None else None for lg in live
        ]
        if tags:
            assert len({t for t, _ in got}) == len(got)  # tagged emits stay ordered


def test_the_bucket_call_on_bare_states_keeps_the_same_state_entries_and_emits():
    spec = StageSpec(1, "rows", "s", chain=_map_steps(), depth_in=len(source_seq(0, 0, 0)), modes=BARE)
    runs = [("a", list(zip(seqs(4), [1, 2, 0, 5], strict=True))), ("b", list(zip(seqs(2), [3, 3], strict=True)))]
    out = {}
    for bare in (True, False):
        driver = BucketDriver(spec, timers=False)
        assert driver.bare
        driver.bare = bare
        driver.run = RUN
        table = {"b": ([(6,), ([1, 2],)], None)}  # an entry of an earlier version: no run token
        emits = driver.process_runs(table, runs, T0)
        out[bare] = (emits, table)
    assert out[True] == out[False]
    assert out[True][1]["a"] == ([(5,), ([1, 3, 3, 5],)], None, RUN)  # totals 1, 3, 3 (0 discards), 5
    out[True][0][-1][1][1].append("changed downstream")  # the state is a snapshot: a copy
    assert out[True][1]["b"] == ([(12,), ([1, 2, 9, 12],)], None, RUN)
    errors = []
    for bare in (True, False):
        driver = BucketDriver(spec, timers=False)
        driver.bare = bare
        with pytest.raises(FlowsparkRuntimeError, match="step 'f.a.stateful_batch' for key 'c': TypeError") as info:
            driver.process_runs({}, [("c", [(source_seq(0, 0, 0), "x")])], T0)  # int + str fails in the mapper
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("path", ["flat", "bare", "logic"])
def test_a_bucket_call_on_an_earlier_runs_state_that_no_longer_fits_says_so(path):
    """An entry of an earlier run (no token, another token) whose state the step's code cannot read."""
    import pandas as pd
    import pyarrow as pa

    spec = next(st.spec for st in _seen_flow(TestingSource([])).stages if st.spec.chain)
    schema = pa.schema([("user", pa.string()), ("last", pa.list_(pa.int64()))])

    def call(table, rows):
        vs = [dumps({"user": u, "v": v} if spec.input_value_only else (u, {"user": u, "v": v})) for u, v in rows]
        seqs = [source_seq(0, 0, 0, i) for i in range(len(rows))]
        driver.call(table, iter([pd.DataFrame({"k": [u for u, _ in rows], "seq": seqs, "v": vs})]), T0)

    driver = BucketDriver(spec, sink_rows=("f.out", schema), timers=False)
    driver.flat, driver.bare = path == "flat", path != "logic"
    driver.run = RUN
    texts = []
    for old in (([(3,)], None), ([(3,)], None, b"another run")):  # an int state: `[*3, v]` raises
        with pytest.raises(RuntimeError) as info:
            call({"b": old, "a": ([([1],)], None)}, [("a", 2), ("b", 4)])
        err = decode_task_error(str(info.value))
        assert type(err) is FlowsparkRuntimeError  # not a TypeError, as in Bytewax
        assert (err.step_id, err.key) == ("f.seen.stateful_batch", "b")
        assert type(err.__cause__) is TypeError
        texts.append(str(err))
    assert texts[0] == texts[1]
    want = (
        f"error in step 'f.seen.stateful_batch' for key 'b': TypeError: {err.__cause__}; the key's state was "
        "resumed from a snapshot written by an earlier run of the step (received int 3), and the state's shape "
        "may have changed with the code since; to start over, run with a new checkpoint directory; to keep the "
        "state, migrate it (make the step's builder or function accept the old shape and convert it)"
    )
    assert texts[0] == want
    # The same state written by this run (its token): the error of today.
    with pytest.raises(RuntimeError) as info:
        call({"b": ([(3,)], None, RUN)}, [("b", 4)])
    err = decode_task_error(str(info.value))
    assert str(err) == f"error in step 'f.seen.stateful_batch' for key 'b': TypeError: {err.__cause__}"


def test_dump_state_pickles_importable_classes_by_reference_and_loads_what_older_versions_wrote():
    import pickle

    import cloudpickle
    from streaming_helpers import Tally

    from flowspark.spark.streaming.keylayout import dump_state
    from flowspark.spark.streaming.state import _load

    entry = ([(Tally(3),)], None, RUN)
    blob = dump_state({"k": entry})
    assert b"streaming_helpers" in blob  # by reference: the module and the class name
    assert b"Tally" in blob
    assert b"cloudpickle" not in blob  # no class rebuilt by value
    assert b"__init__" not in blob  # none of the class's code
    assert blob == pickle.dumps({"k": entry}, protocol=5)
    assert _load(blob) == {"k": entry}

    class Local:  # not importable by name: by value, as before
        def __init__(self, n):
            self.n = n

    blob = dump_state({"k": ([(Local(2),)], None, RUN)})
    assert b"cloudpickle" in blob
    assert _load(blob)["k"][0][0][0].n == 2
    # What earlier versions wrote: entries without a run token, pickled or cloudpickled.
    for old in (
        pickle.dumps({"b": ([(Tally(3),)], None)}, protocol=5),
        cloudpickle.dumps({"b": ([(Local(3),)], None)}),
    ):
        table = _load(old)
        assert len(table["b"]) == 2
        spec = StageSpec(1, "rows", "s", chain=_map_steps(), depth_in=len(source_seq(0, 0, 0)), modes=BARE)
        driver = BucketDriver(spec, timers=False)
        assert driver.earlier(table["b"])
        assert not driver.earlier(([(1,)], None, driver.run))


def _seen_flow(source):
    """`key_on` -> a `stateful_map` keeping the values seen (discarded at a 0) -> `map` to a dict."""
    flow = Dataflow("f")

    def seen(st, v):
        if v["v"] < 0:
            raise ValueError("negative")
        st = [*(st or []), v["v"]] if v["v"] else None
        return st, (st or [])[-3:]

    k = op.key_on("key", op.input("inp", flow, source), lambda r: r["user"])
    rows = op.map("row", op.stateful_map("seen", k, seen), lambda kv: {"user": kv[0], "last": kv[1]})
    op.output("out", rows, SparkSink("parquet", "/nowhere", schema="user STRING, last ARRAY<LONG>"))
    return compile_flow(flow)


@pytest.mark.parametrize("column_key", [False, True])
def test_a_flat_bucket_call_gives_the_same_state_entries_and_sink_rows(column_key):
    """One `batch_fn` step writing a sink's rows (`BucketDriver.flat`) against the bare and the logic paths."""
    import pandas as pd
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType  # noqa: TID251

    plan = _seen_flow(
        SparkSource("parquet", "/x", schema="user STRING, v LONG", streaming=True) if column_key else TestingSource([])
    )
    columns = {0: (("user", "string"), ("v", "bigint"))}
    plan = physical(plan, columns=columns, writer_sink="f.out", atomic_sinks=frozenset({"f.out"}))
    assert plan.decision("flat_driver", "stage 1").applied
    assert plan.decision("spark_keys", "stage 1").applied is column_key
    spec = next(st.spec for st in plan.stages if st.spec.chain)
    # A StructType, not DDL: parsing DDL needs a session, and this test needs none.
    struct = StructType([StructField("user", StringType()), StructField("last", ArrayType(LongType()))])
    schema = RowSchema("f.out", struct, "UTC")
    rows = [("a", 1), ("b", 2), ("a", 0), ("e", 9), ("a", 3), ("c", 4), ("b", 5), ("a", 6), ("e", 0)]

    def frame_of(rows):  # a group's rows come in any order: sequences (row numbers) order each key's values
        if column_key:
            us, vs = [u for u, _ in rows], [v for _, v in rows]
            pdf = pd.DataFrame({"_0": range(len(rows)), "user": us, "v": vs, "bucket": 0})
        else:
            vs = [dumps({"user": u, "v": v} if spec.input_value_only else (u, {"user": u, "v": v})) for u, v in rows]
            pdf = pd.DataFrame(
                {"k": [u for u, _ in rows], "seq": [source_seq(0, 0, 0, i) for i in range(len(rows))], "v": vs}
            )
        return pdf.iloc[::-1]

    out, errors = {}, []
    for path in ("flat", "bare", "logic"):
        driver = BucketDriver(spec, sink_rows=("f.out", schema), timers=False, column_key=column_key)
        assert driver.flat
        assert driver.bare
        driver.flat = path == "flat"
        driver.bare = path != "logic"
        driver.run = RUN
        table = {"b": ([([7],)], None), "d": ([([8],)], None), "e": ([([5],)], None)}
        frame = driver.call(table, iter([frame_of(rows)]), T0)
        out[path] = (sorted((r["user"], tuple(r["last"])) for r in frame.to_dict("records")), table)
        with pytest.raises(RuntimeError) as info:
            driver.call({}, iter([frame_of([("a", 1), ("b", -1)])]), T0)
        errors.append(str(info.value))
    assert out["flat"] == out["bare"] == out["logic"]
    assert errors[0] == errors[1] == errors[2]
    assert "step 'f.seen.stateful_batch' for key 'b': ValueError: negative" in errors[0]
    got = out["flat"]
    assert got[1] == {
        "a": ([([3, 6],)], None, RUN),
        "b": ([([7, 2, 5],)], None, RUN),
        "c": ([([4],)], None, RUN),
        "d": ([([8],)], None),  # untouched: as an earlier version wrote it
    }
    assert got[0] == sorted(
        [
            ("a", (1,)),
            ("a", ()),
            ("a", (3,)),
            ("a", (3, 6)),
            ("b", (7, 2)),
            ("b", (7, 2, 5)),
            ("c", (4,)),
            ("e", (5, 9)),
            ("e", ()),
        ]
    )


def test_end_of_key_emits_sort_after_the_key_values_and_by_key():
    step = KeyedStep("f.st", stateful_builder(Sum))
    a, _ = drive_key("a", [(source_seq(0, 0, 5), 1), (source_seq(0, 0, 7), 1)], (step,), now=T0)
    b, _ = drive_key("b", [(source_seq(0, 0, 3), 1)], (step,), now=T0)
    eof_a, eof_b = a[-1][0], b[-1][0]
    assert eof_a > a[-2][0]
    assert eof_a < eof_b  # on_eof in sorted key order (as Bytewax), though "b" came first
    assert eof_a > source_seq(2**16, 2**16, 2**40)  # after any regular item


@pytest.mark.parametrize("pad", [b"", b"\0\0\0\1" + b"\0" * 8])
def test_end_of_key_tags_compare_as_their_keys(pad):
    # Keys that share prefixes, hold NUL, surrogates or characters beyond the BMP; a
    # merge's pad (upstream index after the header, zeros appended) keeps the order.
    keys = [
        "",
        "\0",
        "a",
        "a\0",
        "a\0\0",
        "a\1",
        "ab",
        "abcdefghijklmnopq",
        "abcdefghijklmnopr",
        "b",
        "\ud800",
        "\ue000",
        "\U00010000",
    ]
    step = KeyedStep("f.st", stateful_builder(Sum))
    tags = {k: apply_pad(drive_key(k, [(source_seq(0, 0, 1), 1)], (step,), now=T0)[0][-1][0], pad) for k in keys}
    assert sorted(keys, key=tags.__getitem__) == sorted(keys)
    assert not any(t != u and u.startswith(t) for t in tags.values() for u in tags.values())


def test_error_marker_round_trip():
    fail = step_error("f.step", ZeroDivisionError("division by zero"))
    text = "py4j.protocol.Py4JJavaError: ... " + encode_task_error(fail) + " ... at org.apache.spark"
    err = decode_task_error(text)
    assert isinstance(err, FlowsparkRuntimeError)
    assert err.step_id == "f.step"
    assert str(err) == "error in step 'f.step': ZeroDivisionError: division by zero"
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert decode_task_error("no marker here") is None


def test_unpicklable_exception_still_carries_type_and_message():
    fail = step_error("f.s", LockedBoom("boom"))  # holds a lock: neither pickle nor cloudpickle takes it
    text = encode_task_error(fail)
    assert text.startswith(str(fail) + " FLOWSPARK_TASK_ERROR<<")
    err = decode_task_error(text)
    assert err is not None
    assert err.__cause__ is None
    assert (err.exc_type, err.exc_message, str(err)) == ("LockedBoom", "boom", "error in step 'f.s': LockedBoom: boom")


def test_the_marker_carries_the_users_exception_as_the_cause():
    class LocalBoom(Exception):  # plain pickle refuses a local class; cloudpickle carries it
        pass

    for cause in (Boom("kaboom on 2"), LocalBoom("kaboom on 2")):
        fail = step_error("f.m", cause, item=2)
        text = "py4j.protocol.Py4JJavaError: ... " + encode_task_error(fail) + "\n\tat org.apache.spark"
        err = decode_task_error(text)
        assert err is not None
        assert str(err) == f"error in step 'f.m': {type(cause).__name__}: kaboom on 2 (item: 2)"
        assert type(err.__cause__) is type(cause)
        assert err.__cause__ is not cause
        assert err.__cause__.args == ("kaboom on 2",)


class _NeedsTwo(Exception):
    def __init__(self, message, n):
        super().__init__(message)
        self.n = n


def test_a_cause_too_large_or_that_does_not_unpickle_is_left_out():
    big = Boom("x" * (CAUSE_LIMIT + 1))
    small = _NeedsTwo("two args", 2)  # pickles, but unpickling calls _NeedsTwo("two args") and fails
    for cause in (big, small):
        err = decode_task_error(encode_task_error(step_error("f.m", cause)))
        assert err is not None
        assert err.__cause__ is None
        assert err.exc_type == type(cause).__name__
    near = Boom("x" * (CAUSE_LIMIT - 200))
    assert isinstance(decode_task_error(encode_task_error(step_error("f.m", near))).__cause__, Boom)


def test_run_needs_an_aware_start_time():
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink([]))
    with pytest.raises(FlowsparkTypeError, match="start_time must be an aware datetime"):
        run(flow, start_time=datetime(2024, 1, 1))


class Point(NamedTuple):
    x: int
    y: int


class Color(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    "item",
    [
        5,
        -(2**80),
        1.5,
        "é",
        b"\x80raw",
        None,
        True,
        ("k", 1),
        ["a", None, 2.0],
        {"user": "u1", "amount": 3},
        {1: "a", (1, 2): "tuple key"},
        ("nested", ("deeper", [1])),
        Point(1, 2),
        Color.RED,
        bytearray(b"ab"),
        ("k", bytearray(b"ab")),
        np.array([1, 2, 3]),
        np.int64(7),
        {"v": np.float64(1.5)},
        datetime(2024, 1, 1, tzinfo=timezone.utc),
        ("key", Point(3, 4)),
    ],
)
def test_codec_round_trips_every_item_with_its_exact_type(item):
    back = loads(dumps(item))
    assert type(back) is type(item)
    if isinstance(item, np.ndarray):
        assert back.tolist() == item.tolist()
    else:
        assert back == item
    if isinstance(item, (tuple, list)):
        assert [type(x) for x in back] == [type(x) for x in item]
    if isinstance(item, dict):
        assert [type(v) for v in back.values()] == [type(v) for v in item.values()]
    assert loads_all([dumps(item), dumps(1)])[0] == back if not isinstance(item, np.ndarray) else True


def test_codec_takes_marshal_only_for_atomic_values_and_pickle_otherwise():
    import marshal

    assert [dumps(x)[0] == 0x80 for x in ("k", 1, None, 2.5, b"x")] == [False] * 5  # marshal
    assert dumps(("k", 1))[0] == 0x80  # pickle: checking a container's elements costs more than pickle
    assert dumps(np.int64(1))[0] == 0x80  # pickle: marshal would write bytes
    assert loads(marshal.dumps(("k", [1, {"a": 2.5}]))) == ("k", [1, {"a": 2.5}])  # what older versions wrote
    assert dumps(Point(1, 2))[0] == 0x80
    assert loads_all([dumps(1), dumps(Point(1, 2)), dumps("x")]) == [1, Point(1, 2), "x"]


def test_dumps_all_pickles_a_column_of_containers_and_falls_back_to_cloudpickle():
    from flowspark.spark.worker.codec import dumps_all

    assert [loads(b) for b in dumps_all([("k", 1), Point(1, 2)])] == [("k", 1), Point(1, 2)]
    local = [("k", 1), (lambda x: x + 1, 2)]  # plain pickle refuses the lambda
    back = [loads(b) for b in dumps_all(local)]
    assert back[0] == ("k", 1)
    assert back[1][0](1) == 2


def test_loads_arrow_decodes_columns_of_pickles_marshals_or_both():
    import pyarrow as pa

    for items in ([1, "a", None, b"x"], [("k", 1), Point(1, 2), {"a": [1]}], [1, ("k", 1), "x", Point(3, 4)], []):
        for kind in (pa.binary(), pa.large_binary()):
            arr = pa.array([dumps(x) for x in items], kind)
            assert loads_arrow(arr) == items
            assert loads_arrow(arr.slice(1)) == items[1:]  # an offset into the buffers
            assert loads_arrow(pa.chunked_array([arr.slice(0, 2), arr.slice(2)], kind)) == items


@pytest.mark.parametrize("width", [None, 3, 8, 21])
def test_sequence_order_sorts_bytes_as_arrow_does(width):
    import random

    import pyarrow as pa

    from flowspark.spark.io.columns import sequence_order

    rng = random.Random(width)
    alphabet = [0, 0, 0, 1, 255]  # many zero bytes: a fixed-width sort must not drop trailing ones
    rows = []
    for _ in range(400):
        n = width if width is not None else rng.randint(1, 6)
        rows.append((bytes(rng.choice(alphabet) for _ in range(n)), rng.randint(0, 2), rng.randint(0, 1)))
    table = pa.table(
        {
            "st": pa.array([r[1] for r in rows], pa.int32()),
            "p": pa.array([r[2] for r in rows], pa.int32()),
            "seq": pa.array([r[0] for r in rows], pa.binary()),
        }
    )
    expected = sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1], rows[i][2], i))
    assert sequence_order(table).tolist() == expected
    assert sequence_order(table.slice(7)).tolist() == [i - 7 for i in expected if i >= 7]


@pytest.mark.parametrize("n", [5, 40])  # below and above the numpy path's threshold
def test_source_items_stamp_activations_and_offsets(n):
    xs = list(range(n))
    # One source batch: one activation, offsets from 0.
    assert source_items(3, 7, 1000, xs) == [(source_seq(3, 7, 1000, i), x) for i, x in enumerate(xs)]
    # Items of one per activation (SparkSource rows, streaming chunks).
    singles = source_items(1, 2, 5, xs, per_batch=SINGLES)
    assert singles == [(source_seq(1, 2, 5 + i, 0), x) for i, x in enumerate(xs)]
    # A chunk of driver items that starts at offset 2 of activation 9, batches of 3.
    got = source_items(0, 0, 9, xs, offset=2, per_batch=3)
    assert got == [(source_seq(0, 0, 9 + (2 + i) // 3, (2 + i) % 3), x) for i, x in enumerate(xs)]
    for stamped in (got, singles):
        assert [s for s, _ in stamped] == sorted(s for s, _ in stamped)
        assert {read_head(s)[:2] for s, _ in stamped} == {read_head(stamped[0][0])[:2]}


def test_chunk_bounds_keep_source_batches_across_chunks_and_cuts():
    from flowspark.spark.worker.codec import chunk_bounds

    # 10 items, batches of 3, a PAUSE before item 4 (a batch starts there), chunks of 4.
    chunks = list(chunk_bounds(10, 4, 3, [4]))
    assert chunks == [(0, 4, 0, 0), (4, 8, 2, 0), (8, 10, 3, 1)]
    acts = [source_items(0, 0, a, [None] * (e - s), o, 3) for s, e, a, o in chunks]
    heads = [read_head(q)[2:] for items in acts for q, _ in items]
    # As TestingSource.next_batch polls them: [0,1,2] [3] | [4,5,6] [7,8,9].
    assert heads == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]
    assert list(chunk_bounds(0, 4, 3, [])) == []


def test_emits_of_an_activation_sort_by_key_then_as_their_values():
    step = KeyedStep("f.st", stateful_builder(Sum))
    # Activation 0 holds b0, a1, b2; activation 1 holds a0. Bytewax's order: a1, b0, b2, a0.
    a, _ = drive_key("a", [(source_seq(0, 0, 0, 1), 1), (source_seq(0, 0, 1, 0), 10)], (step,), now=T0, eof=False)
    b, _ = drive_key("b", [(source_seq(0, 0, 0, 0), 2), (source_seq(0, 0, 0, 2), 20)], (step,), now=T0, eof=False)
    got = [(k, v) for _s, k, v in sorted([(s, "a", v) for s, v in a] + [(s, "b", v) for s, v in b])]
    assert got == [("a", 1), ("b", 2), ("b", 22), ("a", 11)]
    # A merge's index (after the header) keeps upstreams apart within the activation.
    assert apply_pad(a[0][0], idx(0)) < apply_pad(b[0][0], idx(1))
    assert apply_pad(b[1][0], idx(0)) < apply_pad(a[0][0], idx(1))


def test_port_rows_check_keys_column_wise_and_name_the_first_bad_item():
    spec = StageSpec(0, "rows", "s", ports=(Port("s", "f.st", value_only=True),))
    cols = run_stage_rows(spec, [(source_seq(0, 0, 0), ("a", 1)), (source_seq(0, 0, 1), ("b", 2))])
    assert cols[1] == ["a", "b"]
    assert [loads(v) for v in cols[3]] == [1, 2]  # only the value: the key is in `k`
    whole = StageSpec(0, "rows", "s", ports=(Port("s", "f.st", value_only=False),))
    assert [loads(v) for v in run_stage_rows(whole, [(source_seq(0, 0, 0), ("a", 1))])[3]] == [("a", 1)]
    for bad, what in [(("a", 1, 2), "2-tuple"), ((1, 2), "keys must be str"), ("ab", "2-tuple")]:
        with pytest.raises(StepFailure, match=what) as info:
            run_stage_rows(spec, [(source_seq(0, 0, 0), ("ok", 1)), (source_seq(0, 0, 1), bad)])
        assert info.value.step_id == "f.st"
        assert repr(bad) in str(info.value)


def test_a_new_logic_is_not_notified_before_its_first_value():
    """No runtime reads `notify_at()` before a logic's first values: the first activation fires nothing first."""
    from flowspark.runtime.driver import StepDriver
    from flowspark.testing import run_main

    driver = StepDriver("f.st", stateful_builder(lambda _resume: AlwaysPast()))
    one = [(source_seq(0, 0, 0, i), i) for i in range(3)]  # one activation
    emits, _ = driver.drive("a", one, None, T0, True)
    assert [w for _t, w in emits] == [("item", 0), ("item", 1), ("item", 2), ("notify",), ("eof",)]
    three = [(source_seq(0, 0, i), i) for i in range(3)]  # three activations of one value
    emits, _ = driver.drive("a", three, None, T0, True)
    want = [("item", 0), ("item", 1), ("notify",), ("item", 2), ("notify",), ("notify",), ("eof",)]
    assert [w for _t, w in emits] == want
    # The in-memory executor on the fixed clock follows the same timeline.
    for batch_size, got_want in ((1, want), (3, [("item", 0), ("item", 1), ("item", 2), ("notify",), ("eof",)])):
        out: list = []
        flow = Dataflow("f")
        s = op.input("inp", flow, TestingSource([("a", i) for i in range(3)], batch_size=batch_size))
        op.output("out", op.stateful("st", s, lambda _r: AlwaysPast()), TestingSink(out))
        run_main(flow, clock="fixed")
        assert [w for _k, w in out] == got_want


class CountingTimer(Timer):
    """`Timer` that counts the calls of its `notify_at()` (class-wide)."""

    asked = 0

    def __init__(self, state):
        super().__init__(state)
        self.at = state

    def notify_at(self):
        CountingTimer.asked += 1
        return self.at


def _timer_spec(cls, modes=frozenset()):
    chain = (KeyedStep("f.t", stateful_builder(cls)),)
    return StageSpec(1, "rows", "s", chain=chain, depth_in=len(seqs(1)[0]), modes=frozenset(modes))


@pytest.mark.parametrize("tags", [True, False])
def test_the_one_step_bucket_call_keeps_the_chain_paths_entries_and_emits(tags):
    """`BucketDriver._process_one` against the chain path: keys new, due, not due, discarded, of an earlier run."""
    past, future = T0 - timedelta(seconds=1), T0 + timedelta(seconds=1)
    runs = [
        ("new", list(zip(seqs(2), [past, future], strict=True))),
        ("due", [(seqs(1)[0], future)]),
        ("later", [(seqs(1)[0], past)]),
        ("idle", [(seqs(1)[0], None)]),
    ]
    old = {"due": ([(past,)], past), "later": ([(future,)], future, RUN), "idle": ([(None,)], None, RUN)}
    out = {}
    for one in (True, False):
        driver = BucketDriver(_timer_spec(CountingTimer, {"one_step"}))  # the rule one_step applied
        assert driver.one
        driver.one = one
        driver.run = RUN
        if not tags:
            driver.sink_rows = ("f.out", None)  # emits of a stage writing a sink's rows carry no tags
        table = copy.deepcopy(old)
        emits = driver.process_runs(table, runs, T0)
        out[one] = (emits, table)
    assert out[True] == out[False]
    emits, table = out[True]
    assert [w for _s, (k, w) in emits if k == "due"] == [("notify", past), ("item", future)]
    assert [w for _s, (k, w) in emits if k == "later"] == [("item", past), ("notify", past)]  # due after the values
    assert table["later"] == ([(None,)], None, RUN)
    # Its second activation follows the first: the values, then what the first one made due.
    assert table["new"] == ([(None,)], None, RUN)
    assert [w for _s, (k, w) in emits if k == "new"] == [("item", past), ("item", future), ("notify", future)]


def test_a_rebuilt_logic_that_is_not_due_is_asked_for_notify_at_once_per_call():
    """The entry's `notify_at` is the logic's schedule: not due by now, it is not read again before the values."""
    future = T0 + timedelta(minutes=1)
    driver = BucketDriver(_timer_spec(CountingTimer))
    driver.run = RUN
    table = {"k": ([(future,)], future, RUN)}
    CountingTimer.asked = 0
    emits = driver.process_runs(table, [("k", [(seqs(1)[0], future)])], T0)
    assert [w for _s, (_k, w) in emits] == [("item", future)]
    assert CountingTimer.asked == 1  # after the values, for the entry
    # Due by now: it is read (and fires) before the values, then read again after them.
    CountingTimer.asked = 0
    emits = driver.process_runs(table, [("k", [(seqs(1)[0], None)])], future)
    assert [w for _s, (_k, w) in emits] == [("notify", future), ("item", None)]
    assert CountingTimer.asked == 3  # before, after the fire, after the values
    assert table["k"] == ([(None,)], None, RUN)


def _branchy_flow(fail_on=None):
    """`stateful_map` (running sum) -> `flat_map` (twice, 0 dropped) -> `branch` (even) -> `merge` -> `map` to a row."""
    flow = Dataflow("f")
    k = op.key_on("key", op.input("inp", flow, TestingSource([])), lambda r: r["user"])
    sums = op.stateful_map("sum", k, lambda st, v: ((st or 0) + v["v"],) * 2)

    def twice(kv):
        if kv[1] == fail_on:
            raise ValueError("unlucky")
        return [kv, kv] if kv[1] else []

    twin = op.flat_map("twice", sums, twice)
    b = op.branch("even", twin, lambda kv: kv[1] % 2 == 0)
    both = op.merge("both", b.trues, op.map("neg", b.falses, lambda kv: (kv[0], -kv[1])))
    rows = op.map("row", both, lambda kv: {"user": kv[0], "n": kv[1]})
    op.output("out", rows, SparkSink("parquet", "/nowhere", schema="user STRING, n LONG"))
    return compile_flow(flow)


def test_a_sink_stages_steps_over_whole_lists_give_each_streams_items():
    """`unordered_streams` against `stage_streams`: the same items in every stream (any order); an error falls back."""
    from flowspark.spark.worker.ops import stage_streams, unordered_streams

    spec = next(st.spec for st in _branchy_flow().stages if st.spec.chain)
    chain_out = [("a", 1), ("b", 0), ("a", 3), ("c", 2), ("b", 5), ("c", 0)]
    whole = unordered_streams(spec, chain_out)
    assert whole is not None
    step = stage_streams(spec, [(source_seq(0, 0, i), x) for i, x in enumerate(chain_out)])
    assert set(whole) == set(step)
    for stream, items in step.items():
        assert sorted(map(repr, whole[stream])) == sorted(repr(x) for _s, x in items), stream
    rows = whole[spec.ports[0].stream]
    assert sorted((r["user"], r["n"]) for r in rows) == sorted(
        [("a", -1), ("a", -1), ("a", -3), ("a", -3), ("c", 2), ("c", 2), ("b", -5), ("b", -5)]
    )
    bad = next(st.spec for st in _branchy_flow(fail_on=3).stages if st.spec.chain)
    assert unordered_streams(bad, chain_out) is None  # the caller reruns item by item for the error
    with pytest.raises(FlowsparkRuntimeError, match="step 'f.twice.flat_map_batch'.*unlucky") as info:
        stage_streams(bad, [(b"", x) for x in chain_out])
    assert "('a', 3)" in str(info.value)


def test_a_bucket_call_writing_a_sink_runs_its_steps_over_whole_lists_and_words_a_steps_error():
    import pandas as pd
    from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: TID251

    struct = StructType([StructField("user", StringType()), StructField("n", LongType())])
    schema = RowSchema("f.out", struct, "UTC")
    rows = [("a", 1), ("c", 2), ("a", 2), ("b", 5)]
    got = []
    for fail_on in (None, 3):
        plan = physical(_branchy_flow(fail_on), writer_sink="f.out", atomic_sinks=frozenset({"f.out"}))
        spec = next(st.spec for st in plan.stages if st.spec.chain)
        assert "sink_fusion" in spec.modes
        driver = BucketDriver(spec, sink_rows=("f.out", schema), timers=False)
        assert driver.sink_line is None
        v = [dumps({"user": u, "v": n} if spec.input_value_only else (u, {"user": u, "v": n})) for u, n in rows]
        seq = [source_seq(0, 0, 0, i) for i in range(len(rows))]
        pdf = pd.DataFrame({"k": [u for u, _ in rows], "seq": seq, "v": v})
        try:
            frame = driver.call({}, iter([pdf]), T0)
            got.append(sorted(zip(frame["user"], frame["n"], strict=True)))
        except RuntimeError as e:
            got.append(str(e))
    assert got[0] == sorted([("a", -1), ("a", -1), ("a", -3), ("a", -3), ("c", 2), ("c", 2), ("b", -5), ("b", -5)])
    assert "step 'f.twice.flat_map_batch'" in got[1]
    assert "unlucky" in got[1]


class _Halts(CountingTimer):
    """A `Timer` that discards itself on a `None` value and whose notification discards it too."""

    def on_item(self, value):
        self.at = value
        return [("item", value)], self.DISCARD if value is None else self.RETAIN

    def on_notify(self):
        fired, self.at = self.at, None
        return [("notify", fired)], self.DISCARD


@pytest.mark.parametrize("cls", [Sum, CountingTimer, _Halts, Burst])
def test_drive_values_gives_drives_untagged_emits_and_logic(cls):
    """`StepDriver.drive_values` against `drive` with empty tags: new and rebuilt logics, due or not, EOF or not."""
    from flowspark.runtime.driver import UNKNOWN, StepDriver

    driver = StepDriver("f.st", stateful_builder(cls))
    past, future = T0 - timedelta(seconds=1), T0 + timedelta(seconds=1)
    values = {Sum: [1, 2, 3], Burst: [2, 0, 3]}.get(cls, [future, past, None, future])
    for state in (None, past, future, 5):
        if state is not None and (cls in (Sum, Burst)) != (type(state) is int):
            continue
        for due, n, eof in itertools.product((UNKNOWN, None, past, future), (0, 1, 2, len(values)), (False, True)):
            if eof and n == 0:
                continue  # a key's end of input comes after its values (batch runs drive keys that got some)
            logic = None if state is None else driver.build("k", state)
            want, want_logic = driver.drive("k", [(b"", v) for v in values[:n]], logic, T0, eof, False, due)
            logic = None if state is None else driver.build("k", state)
            got, got_logic = driver.drive_values("k", values[:n], logic, T0, due, eof=eof)
            assert got == [w for _t, w in want]
            assert (got_logic is None) == (want_logic is None)
            if got_logic is not None:
                assert got_logic.snapshot() == want_logic.snapshot()


def test_a_one_step_bucket_call_writing_a_sink_drives_values_without_sequences():
    """`BucketDriver._process_values` against `process_runs`: the same items (any order) and state entries."""
    past, future = T0 - timedelta(seconds=1), T0 + timedelta(seconds=1)
    runs = [("new", [past, future]), ("due", [future]), ("later", [past]), ("idle", [None])]
    old = {"due": ([(past,)], past), "later": ([(future,)], future, RUN), "idle": ([(None,)], None, RUN)}
    old["waits"] = ([(past,)], past, RUN)  # no values, due: fires
    got = {}
    for values in (True, False):
        # the rules one_step and values_driver applied
        driver = BucketDriver(_timer_spec(_Halts, {"one_step", "values_driver"}), sink_rows=("f.out", None))
        assert driver.sink_values
        driver.run = RUN
        table = copy.deepcopy(old)
        if values:
            items = driver._process_values(table, runs, T0)
        else:
            tagged = [(k, [(b"", v) for v in vs]) for k, vs in runs]
            items = [x for _s, x in driver.process_runs(table, tagged, T0)]
        got[values] = (sorted(map(repr, items)), table)
    assert got[True] == got[False]
    # "later" and "waits" fire after the values and discard, "idle" discards on its value; "due"
    # fires and discards before its value, then a fresh logic takes it.
    assert got[True][1] == {"new": ([(future,)], future, RUN), "due": ([(future,)], future, RUN)}
    assert got[True][0] == sorted(
        repr(x)
        for x in [
            ("new", ("item", past)),
            ("new", ("item", future)),
            ("due", ("notify", past)),
            ("due", ("item", future)),
            ("later", ("item", past)),
            ("later", ("notify", past)),
            ("idle", ("item", None)),
            ("waits", ("notify", past)),
        ]
    )


def test_the_state_processors_unpickle_where_flowspark_cannot_be_imported(tmp_path):
    """Spark runs a processor's `init` in a driver-side process without flowspark's shipped zip.

    That process unpickles the processor (cloudpickle, as pyspark sends it): the processors of
    the bucket (chained), key and chunk layouts must name nothing of flowspark until their
    first call, which runs on the workers (measured: `No module named 'flowspark'` from the
    chunk layout on workers flowspark shipped itself to, tests/spark/test_worker_environment.py).
    """
    import subprocess
    import sys

    import cloudpickle

    pytest.importorskip("pyspark")
    spec = StageSpec(1, "rows", "s", chain=_map_steps(), depth_in=len(source_seq(0, 0, 0)), modes=BARE)
    driver = BucketDriver(spec, timers=False)
    for name, proc in [
        ("bucket", driver.processor()),
        ("key", driver.key_processor()),
        ("chunk", driver.chunk_processor(timed=False)),
    ]:
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(cloudpickle.dumps(proc))
        code = (
            "import sys, pickle; sys.modules['flowspark'] = None\n"  # `import flowspark` now fails
            f"p = pickle.loads(open({str(path)!r}, 'rb').read()); print(type(p).__name__)"
        )
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
        assert res.returncode == 0, f"{name}: {res.stderr[-600:]}"
        # The first call loads the rest: here, where flowspark is importable, it does.
        loaded = pickle.loads(path.read_bytes())  # noqa: S301 - the test's own pickle
        assert hasattr(loaded, "handleInputRows")


def _count_then_total(items):
    """`stateful_map` running count, then `fold_final` of `(count, value)` pairs: no step notifies."""
    flow = Dataflow("vd")
    keyed = op.key_on("key", op.input("inp", flow, TestingSource(items)), lambda x: x["user"])
    counts = op.stateful_map("count", op.map_value("v", keyed, lambda x: x["v"]), lambda s, v: ((s or 0) + 1,) * 2)
    totals = op.fold_final("total", counts, list, lambda acc, n: [*acc, n])
    op.output("out", op.map("row", totals, lambda kv: (kv[0], len(kv[1]))), TestingSink([]))
    return flow


@pytest.mark.parametrize("sequences", [True, False])
def test_a_stage_driven_on_values_gives_the_chains_port_rows(sequences):
    """`values_driver` in a batch keyed stage writing port rows: the same `(p, k, seq, v)` rows as the chain path.

    Its last step emits only at end of input, so its rows' sequences are the end-of-input ones;
    the sampling job (`sequences=False`) reads the items alone.
    """
    import pyarrow as pa

    from flowspark.spark.worker.stage import stage_function

    plan = optimize(compile_flow(_count_then_total([{"user": "a", "v": 1}])), Env("batch"))
    assert plan.decision("values_driver", "stage 1").applied
    spec = plan.stages[1].spec
    rows = [(k, s, v) for k in ("a", "b", "c") for s, v in zip(seqs(5000 if k == "b" else 3), itertools.count())]
    value = (lambda k, v: v) if spec.input_value_only else (lambda k, v: (k, v))
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([k for k, _s, _v in rows], pa.string()),
            pa.array([s for _k, s, _v in rows], pa.binary()),
            pa.array([dumps(value(k, v)) for k, _s, v in rows], pa.binary()),
        ],
        names=["k", "seq", "v"],
    )
    out = {}
    for values in (True, False):
        modes = spec.modes if values else spec.modes - {"values_driver"}
        fn = stage_function(dataclasses.replace(spec, modes=modes), T0, out_batch_rows=2, sequences=sequences)
        got = pa.Table.from_batches(list(fn(iter([batch.slice(0, 4), batch.slice(4)])))).to_pylist()
        out[values] = [(r["p"], r["k"], r["seq"] if sequences else None, loads(r["v"])) for r in got]
    assert out[True] == out[False]
    assert [x[3] for x in out[True]] == [("a", 3), ("b", 5000), ("c", 3)]
