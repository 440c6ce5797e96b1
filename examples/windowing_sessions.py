"""User sessions: clicks no more than 30 minutes apart (`collect_window`, `SessionWindower`).

Input: JSON lines `{"user", "time", "page"}` (default
`examples/data/windowing_clicks.jsonl`) or a list of dicts. Clicks may arrive out
of order by up to `WAIT` (5 minutes) of click time; older clicks are late and
reported separately (session id `LATE_SESSION_ID`, -1).

A click at most `GAP` (30 minutes, inclusive) after the previous one continues the
session. A session is reported when the user's watermark passes its last click by
more than the gap (or when the input ends); its state is released then.

Output: `("session", user, start, end, [pages in time order])` and
`("late", user, time, page)`.

Run it:

    python examples/windowing_sessions.py
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.inputs import FileSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "windowing_clicks.jsonl"
GAP = timedelta(minutes=30)
WAIT = timedelta(minutes=5)


def parse(click: Any) -> tuple[str, tuple[datetime, str]]:
    """A JSON line or dict -> `(user, (time, page))`."""
    if isinstance(click, str):
        click = json.loads(click)
    ts = datetime.fromisoformat(str(click["time"]))
    if ts.tzinfo is None:
        msg = f"click time {click['time']!r} has no UTC offset; write e.g. 2024-05-01T09:00:00+00:00"
        raise ValueError(msg)
    return str(click["user"]), (ts, str(click["page"]))


def click_time(click: tuple[datetime, str]) -> datetime:
    return click[0]


def format_session(item: tuple[str, tuple[int, list[tuple[datetime, str]]]]) -> tuple[Any, ...]:
    user, (_session_id, clicks) = item
    return ("session", user, clicks[0][0].isoformat(), clicks[-1][0].isoformat(), [page for _ts, page in clicks])


def format_late(item: tuple[str, tuple[int, tuple[datetime, str]]]) -> tuple[Any, ...]:
    user, (_late_id, (ts, page)) = item
    return ("late", user, ts.isoformat(), page)


def get_flow(path: Any = DATA, clicks: Optional[list[Any]] = None, sink: Any = None) -> Dataflow:
    """Build the flow.

    Args:
        path: JSON-lines file of clicks.
        clicks: Use these dicts instead of the file.
        sink: Where to write sessions and late clicks (default: standard output).
    """
    flow = Dataflow("windowing_sessions")
    src = TestingSource(clicks) if clicks is not None else FileSource(path)
    keyed = op.map("parse", op.input("inp", flow, src), parse)
    clock = win.EventClock(click_time, wait_for_system_duration=WAIT)
    sessions = win.collect_window("sessions", keyed, clock, win.SessionWindower(gap=GAP))
    out = op.merge(
        "all",
        op.map("format_session", sessions.down, format_session),
        op.map("format_late", sessions.late, format_late),
    )
    op.output("out", out, sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
