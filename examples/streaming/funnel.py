"""Event sequencing (a view -> add_to_cart -> purchase funnel), as a stream (reuses `examples/event_sequencing.py`).

Input: JSON files of shop events `{"user", "ts", "event"}`. A user's funnel state lives in
the checkpoint; each completed funnel is written as `{"user", "viewed", "carted",
"purchased"}`. Run it with `python examples/streaming/funnel.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import flowspark.operators as op
from flowspark.dataflow import Stream

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from common import demo, local_flow, streaming_flow  # noqa: E402
from event_sequencing import advance, by_user  # noqa: E402

IN_SCHEMA = "user STRING, ts STRING, event STRING"
OUT_SCHEMA = "user STRING, viewed STRING, carted STRING, purchased STRING"


def _ev(user: str, minute: int, event: str) -> dict[str, Any]:
    return {"user": user, "ts": f"2024-05-01T09:{minute:02d}:00+00:00", "event": event}


BATCH_1 = [_ev("ann", 0, "view"), _ev("bob", 1, "view"), _ev("ann", 2, "add_to_cart"), _ev("cid", 3, "purchase")]
BATCH_2 = [_ev("ann", 4, "purchase"), _ev("bob", 5, "add_to_cart"), _ev("bob", 6, "purchase"), _ev("cid", 7, "view")]


def _row(conv: tuple[str, tuple[str, str, str]]) -> dict[str, Any]:
    user, (viewed, carted, purchased) = conv
    return {"user": user, "viewed": viewed, "carted": carted, "purchased": purchased}


def pipeline(events: Stream[dict[str, Any]]) -> Stream[dict[str, Any]]:
    """Shop events -> completed funnels."""
    return op.map("rows", op.stateful_flat_map("funnel", op.map("by_user", events, by_user), advance), _row)


def streaming(in_dir: Path, out_dir: Path) -> Any:
    """The flow on Spark streaming."""
    return streaming_flow("funnel", in_dir, IN_SCHEMA, pipeline, out_dir, OUT_SCHEMA)


def local(events: list[Any], out: list[Any]) -> Any:
    """The flow in memory."""
    return local_flow("funnel", events, pipeline, out)


def main() -> None:
    demo("funnel", streaming, [BATCH_1, BATCH_2])


if __name__ == "__main__":
    main()
