"""Hypothesis: random flows over random keyed inputs give the same result locally and on Spark.

Per key the items must come in exactly the same order; across keys the result is
compared as a multiset (Spark gives no global order after a shuffle). The local
run uses `clock="fixed"` with the same start time as the Spark run, so timers
fire on the same per-key timeline.

Each property also runs with every optimizer rule switched off (`rules="none"`: the reference
lowering, `flowspark.spark.rules.optimizer`), on fewer examples: the fast paths and the reference must
both agree with the in-memory executor.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from examples_budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streaming_helpers import AlwaysPast, PastOnItem

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.operators import StatefulLogic
from flowspark.spark import run
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

pytestmark = [pytest.mark.spark, pytest.mark.slow]

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


class Ticker(StatefulLogic):
    """Counts values; every value divisible by 3 arms a notification that is already due."""

    def __init__(self, state):
        self.n, self.armed = state or (0, None)

    def on_item(self, value):
        self.n += 1
        if value % 3 == 0:
            self.armed = T0 - timedelta(seconds=value)
        return [self.n * 1000 + value], self.RETAIN

    def on_notify(self):
        self.armed = None
        return [-self.n], self.RETAIN

    def on_eof(self):
        return [self.n], self.DISCARD

    def notify_at(self):
        return self.armed

    def snapshot(self):
        return (self.n, self.armed)


def _running(state, v):
    total = ((state or 0) + v) % 1000
    return total, total


def apply(name: str, i: int, s):
    sid = f"{name}{i}"
    if name == "map":
        return op.map_value(sid, s, lambda v: (v * 3 + 1) % 50)
    if name == "filter":
        return op.filter_value(sid, s, lambda v: v % 3 != 0)
    if name == "flat":
        return op.flat_map_value(sid, s, lambda v: [v, v + 1] if v % 2 else [])
    if name == "running":
        return op.stateful_map(sid, s, _running)
    if name == "fold":
        return op.fold_final(sid, s, lambda: 0, lambda a, v: (a * 7 + v) % 10007)
    if name == "rekey":
        return op.map(sid, s, lambda kv: (str(kv[1] % 3), kv[1]))
    if name == "branch_merge":
        b = op.branch(sid, s, lambda kv: kv[1] % 2 == 0)
        return op.merge(f"{sid}m", op.map_value(f"{sid}t", b.trues, lambda v: v + 100), b.falses)
    if name == "collect":
        c = op.collect(sid, s, timedelta(hours=1), 2)
        return op.map_value(f"{sid}s", c, lambda vs: sum(vs) % 1000)
    if name == "timer":
        return op.stateful(sid, s, Ticker)
    raise AssertionError(name)


STEPS = st.sampled_from(["map", "filter", "flat", "running", "fold", "rekey", "branch_merge", "collect", "timer"])
ITEMS = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 40)), max_size=40)


def build(items: list[Any], steps: list[str]) -> tuple[Dataflow, list[Any]]:
    flow = Dataflow("d")
    s = op.input("inp", flow, TestingSource(items))
    for i, name in enumerate(steps):
        s = apply(name, i, s)
    out: list[Any] = []
    op.output("out", s, TestingSink(out))
    return flow, out


def _check_batch(spark: Any, items: list[Any], steps: list[str], rules: Any) -> None:
    flow_l, out_l = build(items, steps)
    run_main(flow_l, clock="fixed", start_time=T0)
    flow_s, out_s = build(items, steps)
    run(flow_s, spark=spark, start_time=T0, rules=rules)
    assert per_key(out_s) == per_key(out_l)
    assert sorted(out_s, key=repr) == sorted(out_l, key=repr)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=ITEMS, steps=st.lists(STEPS, min_size=1, max_size=4))
def test_local_and_spark_agree(spark, items, steps):
    _check_batch(spark, items, steps, None)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=ITEMS, steps=st.lists(STEPS, min_size=1, max_size=4))
def test_local_and_spark_with_every_rule_off_agree(spark, items, steps):
    _check_batch(spark, items, steps, "none")


def test_two_timers_then_a_branch_and_merge_keep_the_in_memory_order(spark):
    steps = ["map", "timer", "timer", "branch_merge"]
    flow_l, out_l = build([("a", 0)], steps)
    run_main(flow_l, clock="fixed", start_time=T0)
    flow_s, out_s = build([("a", 0)], steps)
    run(flow_s, spark=spark, start_time=T0)
    # Bytewax's order, {'a': [2001, 2001, 102]}: the second timer step sees end of input in a later
    # activation than the first one's on_eof emits (memory once gave [2001, 102, 2001]).
    assert per_key(out_s) == per_key(out_l) == {"a": [2001, 2001, 102]}


def _past_outputs(logic: Any, batch_size: int, runners: list[Any]) -> list[list[Any]]:
    """Each runner's output of three values of key 'a' through `op.stateful` with `logic`."""
    outs = []
    for go in runners:
        out: list = []
        flow = Dataflow("past")
        s = op.input("inp", flow, TestingSource([("a", i) for i in range(3)], batch_size=batch_size))
        op.output("out", op.stateful("st", s, lambda _r: logic()), TestingSink(out))
        go(flow)
        outs.append(out)
    return outs


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_notification_always_past_fires_as_in_memory_on_the_fixed_clock(spark, batch_size):
    """Spark batch's timeline is the fixed clock's: nothing fires before a new logic's first value."""
    outs = _past_outputs(
        AlwaysPast,
        batch_size,
        [lambda f: run_main(f, clock="fixed", start_time=T0), lambda f: run(f, spark=spark, start_time=T0)],
    )
    assert outs[0] == outs[1]
    assert outs[0][0] == ("a", ("item", 0))


@pytest.mark.parametrize(
    ("batch_size", "bytewax"),
    [
        (1, ["item", "item", "notify", "item", "notify", "eof"]),
        (3, ["item", "item", "item", "notify", "eof"]),
    ],
)
def test_a_notification_made_due_by_an_item_fires_on_spark_batch_in_bytewaxs_order(spark, batch_size, bytewax):
    """What an activation makes due fires after the next activation's values, on every clock and on Spark batch.

    The lists are bytewax 0.21.1's for this logic with its default `epoch_interval`
    (tests/unit/test_bytewax_sources_timers_errors.py runs bytewax itself on such a logic).
    """
    outs = _past_outputs(
        PastOnItem,
        batch_size,
        [run_main, lambda f: run_main(f, clock="fixed", start_time=T0), lambda f: run(f, spark=spark, start_time=T0)],
    )
    assert [[w[0] for _k, w in out] for out in outs] == [bytewax, bytewax, bytewax]


#: Steps whose output never depends on end of input or on when timers fire within a batch.
STREAM_STEPS = st.sampled_from(["map", "filter", "flat", "running", "rekey", "branch_merge"])


def _check_streaming(spark: Any, items: list[Any], steps: list[str], rules: Any) -> None:
    """The same random flow as a stream (two available_now runs on one checkpoint) and in memory."""
    import tempfile

    from flowspark.spark.streaming import run_streaming

    flow_l, out_l = build(items, steps)
    run_main(flow_l, roundtrip_state=True)
    half = len(items) // 2
    flow_s, out_s = build([*items[:half], TestingSource.EOF(), *items[half:]], steps)
    with tempfile.TemporaryDirectory() as chk:
        for _ in range(2):
            run_streaming(
                flow_s, spark=spark, checkpoint=chk, trigger="available_now", progress=False, max_items=7, rules=rules
            )
    assert per_key(out_s) == per_key(out_l)
    assert sorted(out_s, key=repr) == sorted(out_l, key=repr)


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=ITEMS, steps=st.lists(STREAM_STEPS, min_size=1, max_size=3))
def test_local_and_spark_streaming_agree(spark, items, steps):
    _check_streaming(spark, items, steps, None)


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=ITEMS, steps=st.lists(STREAM_STEPS, min_size=1, max_size=3))
def test_local_and_spark_streaming_with_every_rule_off_agree(spark, items, steps):
    _check_streaming(spark, items, steps, "none")
