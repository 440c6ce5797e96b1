"""`flowspark.now()`: the public "now" of a logic, following the clock the runtime injects."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import flowspark
import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.operators import StatefulLogic
from flowspark.testing import TestingSink, TestingSource, run_main

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
GAP = timedelta(minutes=5)


class Session(StatefulLogic[str, Any, Any]):
    """A session per key: it ends when the key is idle for GAP of processing time; records what `now()` said."""

    def __init__(self, resume: Optional[tuple[Any, ...]]) -> None:
        self.start, self.last, self.n = resume or (None, None, 0)

    def on_item(self, value: str) -> tuple[list[Any], bool]:
        now = flowspark.now()
        self.start = self.start or now
        self.last, self.n = now, self.n + 1
        return [], False

    def on_notify(self) -> tuple[list[Any], bool]:
        return [("closed at", flowspark.now(), self.start, self.last, self.n)], StatefulLogic.DISCARD

    def on_eof(self) -> tuple[list[Any], bool]:
        return [("eof", flowspark.now(), self.start, self.last, self.n)], StatefulLogic.DISCARD

    def notify_at(self) -> Optional[datetime]:
        return None if self.last is None else self.last + GAP

    def snapshot(self) -> tuple[Any, ...]:
        return (self.start, self.last, self.n)


def _sessions(items: list[Any], **run: Any) -> list[Any]:
    flow = Dataflow("sessions")
    s = op.key_on("user", op.input("inp", flow, TestingSource(items)), lambda u: u)
    out: list[Any] = []
    op.output("out", op.stateful("session", s, Session), TestingSink(out))
    run_main(flow, **run)
    return out


def test_now_follows_run_mains_logical_clock():
    pause = TestingSource.PAUSE(timedelta(minutes=10))
    out = _sessions(["ann", "ann", pause, "ann"], clock="logical", start_time=T0)
    ten = T0 + timedelta(minutes=10)
    assert out == [
        ("ann", ("closed at", T0 + GAP, T0, T0, 2)),  # idle for GAP: the clock jumped to the notification
        ("ann", ("eof", ten, ten, ten, 1)),  # the pause moved the clock 10 minutes
    ]


def test_now_is_the_wall_clock_outside_an_injected_clock():
    before = datetime.now(timezone.utc)
    now = flowspark.now()
    assert now.tzinfo is timezone.utc
    assert before <= now <= datetime.now(timezone.utc)
    [(_key, (what, at, start, last, n))] = _sessions(["ann"])
    assert (what, n) == ("eof", 1)
    assert before <= start == last <= at <= datetime.now(timezone.utc)
