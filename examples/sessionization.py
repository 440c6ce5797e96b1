"""User sessions with a 30-minute inactivity gap, on event time (`StatefulLogic`).

Input: click events `{"user", "ts", "page"}` (`ts` an ISO-8601 time with a UTC
offset), from a JSON-lines file (default `examples/data/clicks.jsonl`) or a list
of dicts. Output: one `(user, start, end, count)` per session, `start`/`end`
as ISO strings.

A user's session ends when their next event is *more than* `gap` after the
session's last event (exactly `gap` later still continues it); the closed
session is emitted when that next event arrives. Sessions still open at the
end of the input are emitted at EOF. Events are expected per user in time
order; an event older than the session's last event is counted in the open
session (it can move its start earlier, never split it).

This keeps one small tuple per user and needs no windowing operator; see
`flowspark.operators.windowing.SessionWindower` for watermark-based sessions.

Run it:

    python examples/sessionization.py
    python -m flowspark.run examples/sessionization.py
    python -m flowspark.run "examples/sessionization.py:get_flow('clicks.jsonl', gap_minutes=10)"
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream
from flowspark.inputs import FileSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "clicks.jsonl"
GAP = timedelta(minutes=30)

# (start, end, count) of the open session.
Session = tuple[datetime, datetime, int]


def read_events(flow: Dataflow, path: Any, events: Optional[list[Any]]) -> Stream[dict[str, Any]]:
    """Where the events come from: a list of dicts if given, else the JSON-lines file."""
    if events is not None:
        return op.input("inp", flow, TestingSource(events))
    lines = op.input("inp", flow, FileSource(path))
    return op.filter_map("parse_json", lines, lambda line: json.loads(line) if line.strip() else None)


def user_and_time(event: dict[str, Any]) -> tuple[str, datetime]:
    """`{"user": "bob", "ts": "2024-05-01T09:00:00+00:00", ...}` -> `("bob", datetime)`."""
    ts = event["ts"]
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts)
    if not isinstance(ts, datetime) or ts.tzinfo is None:
        msg = f"event time must be an ISO-8601 string with a UTC offset (or an aware datetime); received {event!r}"
        raise ValueError(msg)
    return str(event["user"]), ts


class SessionLogic(op.StatefulLogic[datetime, Session, Optional[Session]]):
    """One user's open session."""

    def __init__(self, gap: timedelta, resume: Optional[Session]) -> None:
        self.gap = gap
        self.session = resume

    def on_item(self, value: datetime) -> tuple[list[Session], bool]:
        s = self.session
        if s is None:
            self.session = (value, value, 1)
            return [], self.RETAIN
        start, end, count = s
        if value - end > self.gap:
            self.session = (value, value, 1)
            return [s], self.RETAIN
        self.session = (min(start, value), max(end, value), count + 1)
        return [], self.RETAIN

    def on_eof(self) -> tuple[list[Session], bool]:
        s = self.session
        return ([s] if s is not None else []), self.DISCARD

    def snapshot(self) -> Optional[Session]:
        return self.session


def flatten_session(user_session: tuple[str, Session]) -> tuple[str, str, str, int]:
    user, (start, end, count) = user_session
    return user, start.isoformat(), end.isoformat(), count


def get_flow(
    path: Any = DATA, events: Optional[list[Any]] = None, sink: Any = None, gap_minutes: float = 30
) -> Dataflow:
    """Build the flow.

    Args:
        path: JSON-lines file of click events.
        events: Use these dicts instead of the file.
        sink: Where to write `(user, start, end, count)` (default: standard output).
        gap_minutes: Inactivity (event time) that ends a session.
    """
    gap = timedelta(minutes=gap_minutes)
    flow = Dataflow("sessionization")
    s = read_events(flow, path, events)
    keyed = op.map("user_and_time", s, user_and_time)
    sessions = op.stateful("sessions", keyed, lambda resume: SessionLogic(gap, resume))
    op.output("out", op.map("flatten", sessions, flatten_session), sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
