"""The IR facts of a window count (`ir.WindowCount`) and when `native_reduction` takes one: no session needed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark import reducers
from flowspark.dataflow import Dataflow
from flowspark.ir import StatefulBatch
from flowspark.spark import SparkSink, SparkSource, compile_flow
from flowspark.spark.rules.optimizer import Env, optimize
from flowspark.spark.worker.times import fixed_offset
from flowspark.testing import TestingSink, TestingSource, run_main

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
COLUMNS = {0: (("user", "string"), ("ts", "timestamp"), ("naive", "timestamp_ntz"))}


def _user(r):
    return r["user"]


def _ts(r):
    return r["ts"]


def _flow(
    clock: Any = None,
    windower: Any = None,
    late: bool = False,
    sink: Any = None,
    folded: Any = None,
    fmt: str = "parquet",
    between: bool = False,
) -> Dataflow:
    flow = Dataflow("w")
    s = op.input("inp", flow, SparkSource(fmt, "/nowhere"))
    clock = clock or win.EventClock(_ts, timedelta(seconds=5))
    windower = windower or win.TumblingWindower(timedelta(minutes=1), T0)
    if folded is not None:
        keyed = op.key_on("key", s, _user)
        if between:
            keyed = op.map_value("same", keyed, lambda r: r)
        out = win.fold_window("n", keyed, clock, windower, *folded, reducers.sum)
    else:
        out = win.count_window("n", s, clock, windower, _user)
    op.output("down", out.down, sink or SparkSink("parquet", "/out"))
    if late:
        op.output("late", out.late, SparkSink("parquet", "/late"))
    return flow


def _decision(flow: Dataflow, zone: str = "UTC") -> str:
    plan = optimize(compile_flow(flow), Env("batch", columns=COLUMNS, time_zone=zone))
    return next(str(d) for d in plan.decisions if d.rule == "native_reduction" and d.where == "stage 1")


def test_count_window_records_its_windows_clock_and_late_stream():
    flow = _flow(windower=win.SlidingWindower(timedelta(minutes=2), timedelta(seconds=30), T0))
    nodes = [n for n in flow.graph().nodes if isinstance(n, StatefulBatch)]
    facts = nodes[0].window_count
    assert facts is not None
    assert (facts.ts_column, facts.default_now, facts.wait) == ("ts", True, timedelta(seconds=5))
    assert (facts.length, facts.offset, facts.align_to) == (timedelta(minutes=2), timedelta(seconds=30), T0)
    assert facts.late == "w.n.unwrap_late.down"
    # A fold that is not a count, and a session windower: no fact.
    for flow in (
        _flow(folded=(reducers.zero, reducers.sum)),
        _flow(windower=win.SessionWindower(timedelta(minutes=1))),
    ):
        assert all(n.window_count is None for n in flow.graph().nodes if isinstance(n, StatefulBatch))


def test_the_events_of_a_closed_window_are_the_steps():
    """`closed_window_events` (what the Spark aggregate emits) equals what the window step emits."""
    items = [{"user": "a", "ts": T0 + timedelta(seconds=s)} for s in (5, 70, 65, 200)]
    flow = Dataflow("e")
    s = op.input("inp", flow, TestingSource(items))
    windower = win.SlidingWindower(timedelta(minutes=2), timedelta(seconds=40), T0 + timedelta(seconds=3))
    out = win.count_window("n", s, win.EventClock(_ts, timedelta(0)), windower, _user)
    downs: list[Any] = []
    metas: list[Any] = []
    op.output("d", out.down, TestingSink(downs))
    op.output("m", out.meta, TestingSink(metas))
    run_main(flow, clock="fixed")
    facts = next(n for n in flow.graph().nodes if isinstance(n, StatefulBatch)).window_count
    assert facts is not None
    events = [win.closed_window_events(facts, wid, n) for _k, (wid, n) in downs]
    assert [(k, (e[1], e[2])) for (k, _), (e, _m) in zip(downs, events, strict=True)] == downs
    assert [("a", (m[1], m[2])) for _e, m in events] == metas


def test_native_reduction_takes_a_window_count():
    assert _decision(_flow()) == "rule native_reduction: applied"
    assert _decision(_flow(folded=(reducers.zero, reducers.count))) == "rule native_reduction: applied"


@pytest.mark.parametrize(
    ("flow", "zone", "why"),
    [
        (
            lambda: _flow(clock=win.EventClock(lambda r: r["ts"] + timedelta(0), timedelta(0))),
            "UTC",
            "ts_getter is not proven",
        ),
        (
            lambda: _flow(clock=win.EventClock(_ts, timedelta(0), now_getter=lambda: T0)),
            "UTC",
            "its EventClock has a now_getter of its own",
        ),
        (
            lambda: _flow(clock=win.EventClock(lambda r: r["naive"], timedelta(0))),
            "UTC",
            "is timestamp_ntz, not timestamp",
        ),
        (lambda: _flow(late=True), "UTC", "its late values are read (by w.late)"),
        (lambda: _flow(sink=TestingSink([])), "UTC", "(unordered_emits did not apply)"),
        (lambda: _flow(fmt="table"), "UTC", "the SparkSource reads a table, whose row order may depend"),
        (lambda: _flow(), "Europe/Paris", "the session time zone 'Europe/Paris' has no fixed UTC offset"),
        (
            lambda: _flow(clock=win.EventClock(_ts, timedelta(days=4_000_000))),
            "UTC",
            "is longer than Python's datetime range",
        ),
        (
            lambda: _flow(folded=(reducers.zero, reducers.count), between=True),
            "UTC",
            "is between the key_on and the window count",
        ),
        (lambda: _flow(folded=(reducers.zero, reducers.sum)), "UTC", "is not a built-in reduction"),
        (
            lambda: _flow(windower=win.SlidingWindower(timedelta(days=1), timedelta(seconds=1), T0)),
            "UTC",
            "a value falls in more than 10000 windows (length 1 day, 0:00:00, every 0:00:01)",
        ),
    ],
)
def test_native_reduction_says_why_it_does_not_take_a_window_count(flow, zone, why):
    decision = _decision(flow(), zone)
    assert decision.startswith("rule native_reduction: not applied (")
    assert why in decision


def test_fixed_offset_zones():
    assert fixed_offset("UTC")
    assert fixed_offset("+02:00")
    assert fixed_offset("Etc/UTC")
    assert not fixed_offset("Europe/Paris")
