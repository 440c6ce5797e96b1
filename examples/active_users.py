"""Active-user tracking with an inactivity timeout on system time (`StatefulLogic`).

Input: activity events `{"user", ...}`, from a JSON-lines file (default
`examples/data/activity.jsonl`) or a list (which may hold `TestingSource`
markers such as `TestingSource.PAUSE`). Output: `("active", user)` on a user's
first event, and `("inactive", user)` once `timeout` of *system* time
(`flowspark._time.utc_now()`, so tests can inject a clock) has passed since that
user's latest event; after that the user's state is dropped, and a new event
makes them active again.

At the end of a bounded input (EOF) nothing special happens: users still
active get no `("inactive", ...)` record, because the run ends before their
timeout (a file read at full speed therefore only shows `"active"` records).
Their state is retained, so an execution resumed from a recovery store picks
their timers up again and reports them then.

Run it:

    python examples/active_users.py
    python -m flowspark.run "examples/active_users.py:get_flow(timeout=60)"
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Optional, Union

import flowspark.operators as op
from flowspark._time import utc_now
from flowspark.dataflow import Dataflow, Stream
from flowspark.inputs import FileSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "activity.jsonl"
TIMEOUT = timedelta(minutes=5)

# (user, system time of the user's latest event)
State = tuple[str, datetime]


def read_events(flow: Dataflow, path: Any, events: Optional[list[Any]]) -> Stream[dict[str, Any]]:
    """Where the events come from: a list if given, else the JSON-lines file."""
    if events is not None:
        return op.input("inp", flow, TestingSource(events))
    lines = op.input("inp", flow, FileSource(path))
    return op.filter_map("parse_json", lines, lambda line: json.loads(line) if line.strip() else None)


class ActivityLogic(op.StatefulLogic[Any, tuple[str, str], Optional[State]]):
    """One user's activity: active until `timeout` passes without an event."""

    def __init__(self, timeout: timedelta, resume: Optional[State]) -> None:
        self.timeout = timeout
        self.state = resume

    def on_item(self, value: Any) -> tuple[list[tuple[str, str]], bool]:
        user = str(value["user"])
        first = self.state is None
        self.state = (user, utc_now())
        return ([("active", user)] if first else []), self.RETAIN

    def notify_at(self) -> Optional[datetime]:
        return self.state[1] + self.timeout if self.state is not None else None

    def on_notify(self) -> tuple[list[tuple[str, str]], bool]:
        assert self.state is not None
        return [("inactive", self.state[0])], self.DISCARD

    def on_eof(self) -> tuple[list[tuple[str, str]], bool]:
        # Documented choice: no "inactive" at EOF; keep the state for a resumed execution.
        return [], self.RETAIN

    def snapshot(self) -> Optional[State]:
        return self.state


def get_flow(
    timeout: Union[float, timedelta] = TIMEOUT,
    path: Any = DATA,
    events: Optional[list[Any]] = None,
    sink: Any = None,
) -> Dataflow:
    """Build the flow.

    Args:
        timeout: Inactivity (system time) after which a user is inactive; seconds or a timedelta.
        path: JSON-lines file of activity events.
        events: Use these instead of the file.
        sink: Where to write `("active" | "inactive", user)` (default: standard output).
    """
    td = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    if td <= timedelta(0):
        msg = f"timeout must be positive; received {timeout!r}"
        raise ValueError(msg)
    flow = Dataflow("active_users")
    s = read_events(flow, path, events)
    keyed = op.key_on("by_user", s, lambda e: str(e["user"]))
    changes = op.stateful("activity", keyed, lambda resume: ActivityLogic(td, resume))
    op.output("out", op.key_rm("unkey", changes), sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
