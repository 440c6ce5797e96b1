"""Active users with an inactivity timeout, as a stream (reuses `examples/active_users.py`'s logic).

Input: JSON files of activity events `{"user", "page"}`. Output rows `{"status", "user"}`:
`active` on a user's first event, `inactive` once 5 minutes of processing time passed without
one (the user's state is then dropped). Run it with `python examples/streaming/active_users.py`.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import flowspark.operators as op
from flowspark.dataflow import Stream

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from active_users import ActivityLogic  # noqa: E402
from common import demo, local_flow, streaming_flow  # noqa: E402

TIMEOUT = timedelta(minutes=5)
IN_SCHEMA = "user STRING, page STRING"
OUT_SCHEMA = "status STRING, user STRING"
BATCH_1 = [{"user": u, "page": "/"} for u in ("ann", "bob", "ann", "cid")]
BATCH_2 = [{"user": u, "page": "/docs"} for u in ("bob", "dee", "bob")]


def _logic(resume: Any) -> ActivityLogic:
    return ActivityLogic(TIMEOUT, resume)


def _row(change: tuple[str, str]) -> dict[str, Any]:
    return {"status": change[0], "user": change[1]}


def pipeline(events: Stream[dict[str, Any]]) -> Stream[dict[str, Any]]:
    """Activity events -> status rows."""
    keyed = op.key_on("by_user", events, lambda e: str(e["user"]))
    return op.map("rows", op.key_rm("unkey", op.stateful("activity", keyed, _logic)), _row)


def streaming(in_dir: Path, out_dir: Path) -> Any:
    """The flow on Spark streaming."""
    return streaming_flow("active_users", in_dir, IN_SCHEMA, pipeline, out_dir, OUT_SCHEMA)


def local(events: list[Any], out: list[Any]) -> Any:
    """The flow in memory."""
    return local_flow("active_users", events, pipeline, out)


def main() -> None:
    t0 = datetime(2026, 1, 1, 9, tzinfo=timezone.utc)
    demo("active", streaming, [BATCH_1, BATCH_2], [t0, t0 + timedelta(minutes=6)])


if __name__ == "__main__":
    main()
