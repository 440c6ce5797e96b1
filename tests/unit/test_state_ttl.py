"""State TTL in the in-memory executor: a key's state goes when the key got no value for `state_ttl`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest

import flowspark.operators as op
from flowspark._time import use_clock
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkTypeError
from flowspark.inputs import FixedPartitionedSource, StatefulSourcePartition
from flowspark.operators import StatefulLogic
from flowspark.testing import TestingSink, TestingSource, run_main

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Clock:
    """The injected processing time: the source moves it to each event's minute before handing it over."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class _TimedPart(StatefulSourcePartition):
    def __init__(self, events: list[tuple[int, str]], clock: Clock, pos: Optional[int]) -> None:
        self.events, self.clock, self.pos = events, clock, pos or 0

    def next_batch(self) -> list[Any]:
        if self.pos >= len(self.events):
            raise StopIteration
        minute, user = self.events[self.pos]
        self.pos += 1
        self.clock.now = T0 + timedelta(minutes=minute)
        return [user]

    def snapshot(self) -> int:
        return self.pos


class TimedSource(FixedPartitionedSource):
    """One event per batch; event (m, user) arrives at minute m of the injected clock."""

    def __init__(self, events: list[tuple[int, str]], clock: Clock) -> None:
        self.events, self.clock = events, clock

    def list_parts(self) -> list[str]:
        return ["0"]

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _TimedPart:
        return _TimedPart(self.events, self.clock, resume_state)


def _count(state: Optional[int], _v: Any) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def _count_flow(events: list[tuple[int, str]], clock: Clock, out: list) -> Dataflow:
    flow = Dataflow("ttl")
    s = op.input("inp", flow, TimedSource(events, clock))
    op.output("out", op.stateful_map("count", op.key_on("key", s, lambda u: u), _count), TestingSink(out))
    return flow


def _run(flow: Dataflow, clock: Clock, **kw: Any) -> None:
    with use_clock(clock):
        run_main(flow, **kw)


def test_a_key_idle_for_the_ttl_starts_again_from_fresh_state():
    events = [(0, "a"), (1, "b"), (4, "a"), (9, "a"), (14, "a"), (15, "b")]
    out: list = []
    clock = Clock()
    _run(_count_flow(events, clock, out), clock, state_ttl=timedelta(minutes=5))
    # a: 0, 4 (gap 4 < 5), 9 (gap 5: expired), 14 (gap 5: expired); b: 1, 15 (gap 14: expired).
    assert out == [("a", 1), ("b", 1), ("a", 2), ("a", 1), ("a", 1), ("b", 1)]
    out.clear()
    clock = Clock()
    _run(_count_flow(events, clock, out), clock)  # without the option nothing expires
    assert out == [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 2)]


class _Session(StatefulLogic):
    """Counts; asks to be notified 20 minutes after its first value; says goodbye at EOF."""

    def __init__(self, state: Any) -> None:
        self.n, self.at = state if state is not None else (0, None)

    def on_item(self, value: Any) -> tuple[list[Any], bool]:
        from flowspark._time import utc_now

        self.n += 1
        if self.at is None:
            self.at = utc_now() + timedelta(minutes=20)
        return [("item", self.n)], False

    def on_notify(self) -> tuple[list[Any], bool]:
        return [("notified", self.n)], True

    def on_eof(self) -> tuple[list[Any], bool]:
        return [("eof", self.n)], True

    def notify_at(self) -> Optional[datetime]:
        return self.at

    def snapshot(self) -> Any:
        return (self.n, self.at)


def test_an_expired_key_gets_no_notification_and_no_eof():
    # a: values at 0 and 3, then idle; its TTL (10 min) passes at 13, before its notification (20).
    # b: values at 0, 8, 16, 24: never idle for 10 minutes; its notification (20) fires at 24.
    # Without the TTL a would get its notification at the first activation after minute 20.
    # c: a value at 25, still live at EOF: on_eof.
    events = [(0, "a"), (0, "b"), (3, "a"), (8, "b"), (16, "b"), (24, "b"), (25, "c")]
    out: list = []
    clock = Clock()
    flow = Dataflow("ttl_notify")
    s = op.input("inp", flow, TimedSource(events, clock))
    op.output("out", op.stateful("s", op.key_on("key", s, lambda u: u), _Session), TestingSink(out))
    _run(flow, clock, state_ttl=timedelta(minutes=10))
    assert [x for x in out if x[0] == "a"] == [("a", ("item", 1)), ("a", ("item", 2))]
    assert [x for x in out if x[0] == "b"] == [
        ("b", ("item", 1)),
        ("b", ("item", 2)),
        ("b", ("item", 3)),
        ("b", ("item", 4)),
        ("b", ("notified", 4)),  # an activation's values come before its due notifications
    ]
    assert [x for x in out if x[0] == "c"] == [("c", ("item", 1)), ("c", ("eof", 1))]
    out.clear()
    clock = Clock()
    _run(flow, clock)
    assert [x for x in out if x[0] == "a"][2:] in ([("a", ("notified", 2))], [("a", ("eof", 2))])


def test_a_fixed_clock_never_expires_state():
    out: list = []
    flow = Dataflow("ttl_fixed")
    s = op.input("inp", flow, TestingSource(["a", "a", "a"]))
    op.output("out", op.stateful_map("count", op.key_on("key", s, lambda u: u), _count), TestingSink(out))
    run_main(flow, clock="fixed", start_time=T0, state_ttl=timedelta(microseconds=1))
    assert out == [("a", 1), ("a", 2), ("a", 3)]


@pytest.mark.parametrize("bad", [0, timedelta(0), timedelta(seconds=-1), "5m"])
def test_a_bad_state_ttl_is_refused(bad):
    flow = Dataflow("ttl_bad")
    op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink([]))
    with pytest.raises(FlowsparkTypeError, match=r"run_main: state_ttl must be a positive timedelta .* received"):
        run_main(flow, state_ttl=bad)
