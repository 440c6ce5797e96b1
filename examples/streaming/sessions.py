"""Sessions that end after 30 minutes without activity, as a stream (`notify_at` on processing time).

Input: JSON files of click events `{"user", "page"}` in a directory; new files are new
clicks. State per user: the open session (start, last click, clicks), kept in the Spark
checkpoint. `notify_at` asks to be woken 30 minutes after the user's last click; the session
is then emitted as a row `{"user", "start", "end", "clicks"}` and the user's state dropped.
Sessions are emitted when they time out, never at end of input (a stream has none); a
session still open when a run stops goes on in the next run.

Run it (two runs on one checkpoint, new files arriving between them, 31 minutes apart on an
injected clock so the first run's sessions time out):

    python examples/streaming/sessions.py
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
from flowspark._time import utc_now
from flowspark.dataflow import Stream

sys.path.insert(0, str(Path(__file__).parent))
from common import demo, local_flow, streaming_flow  # noqa: E402

GAP = timedelta(minutes=30)
IN_SCHEMA = "user STRING, page STRING"
OUT_SCHEMA = "user STRING, start STRING, `end` STRING, clicks LONG"
BATCH_1 = [{"user": u, "page": p} for u, p in [("ann", "/"), ("bob", "/docs"), ("ann", "/pricing"), ("cid", "/")]]
BATCH_2 = [{"user": u, "page": p} for u, p in [("bob", "/blog"), ("dee", "/"), ("bob", "/docs")]]

# (start, last click, clicks) of the open session, in processing time.
Session = tuple[datetime, datetime, int]


class SessionLogic(op.StatefulLogic[Any, dict[str, Any], Optional[tuple[str, Session]]]):
    """One user's open session; it ends `GAP` after the last click."""

    def __init__(self, resume: Optional[tuple[str, Session]]) -> None:
        self.user, self.session = resume if resume is not None else ("", None)

    def on_item(self, value: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
        now = utc_now()
        self.user = str(value["user"])
        start, _last, clicks = self.session if self.session is not None else (now, now, 0)
        self.session = (start, now, clicks + 1)
        return [], self.RETAIN

    def notify_at(self) -> Optional[datetime]:
        return self.session[1] + GAP if self.session is not None else None

    def on_notify(self) -> tuple[list[dict[str, Any]], bool]:
        assert self.session is not None
        start, last, clicks = self.session
        return [
            {"user": self.user, "start": start.isoformat(), "end": last.isoformat(), "clicks": clicks}
        ], self.DISCARD

    def snapshot(self) -> Optional[tuple[str, Session]]:
        return (self.user, self.session) if self.session is not None else None


def pipeline(events: Stream[dict[str, Any]]) -> Stream[dict[str, Any]]:
    """Click events -> session rows."""
    keyed = op.key_on("by_user", events, lambda e: str(e["user"]))
    return op.key_rm("rows", op.stateful("sessions", keyed, SessionLogic))


def streaming(in_dir: Path, out_dir: Path) -> Any:
    """The flow on Spark streaming."""
    return streaming_flow("sessions", in_dir, IN_SCHEMA, pipeline, out_dir, OUT_SCHEMA)


def local(events: list[Any], out: list[Any]) -> Any:
    """The flow in memory."""
    return local_flow("sessions", events, pipeline, out)


def main() -> None:
    t0 = datetime(2026, 1, 1, 9, tzinfo=timezone.utc)
    demo("sessions", streaming, [BATCH_1, BATCH_2], [t0, t0 + timedelta(minutes=31)])


if __name__ == "__main__":
    main()
