"""Purchase funnel per user: view -> add_to_cart -> purchase (`stateful_flat_map`).

Input: shop events `{"user", "ts", "event"}` with `event` one of `view`,
`add_to_cart`, `purchase`, from a JSON-lines file (default
`examples/data/shop_events.jsonl`) or a list of dicts. Output: one
`(user, viewed_at, carted_at, purchased_at)` conversion record each time a user
completes the funnel in order.

Rules, per user, in arrival order:

- `view` opens the funnel (a later `view` while it is open changes nothing);
- `add_to_cart` after a `view` moves it on; an `add_to_cart` with no open
  funnel (no `view` first) is ignored;
- `purchase` ends the funnel: it converts only if `view` and then
  `add_to_cart` came before it; either way the user starts over, so out of
  order steps (`add_to_cart, view, purchase` or `view, purchase`) never convert.

The state is `None` between funnels (so it is dropped, not kept per user forever).

Run it:

    python examples/event_sequencing.py
    python -m flowspark.run examples/event_sequencing.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream
from flowspark.inputs import FileSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "shop_events.jsonl"
STEPS = ("view", "add_to_cart", "purchase")

# None (no open funnel), ("viewed", view_ts) or ("carted", view_ts, cart_ts).
Funnel = Optional[tuple[str, ...]]


def read_events(flow: Dataflow, path: Any, events: Optional[list[Any]]) -> Stream[dict[str, Any]]:
    """Where the events come from: a list of dicts if given, else the JSON-lines file."""
    if events is not None:
        return op.input("inp", flow, TestingSource(events))
    lines = op.input("inp", flow, FileSource(path))
    return op.filter_map("parse_json", lines, lambda line: json.loads(line) if line.strip() else None)


def by_user(event: dict[str, Any]) -> tuple[str, tuple[str, str]]:
    """`{"user": "bob", "ts": ..., "event": "view"}` -> `("bob", ("view", ts))`."""
    kind = event["event"]
    if kind not in STEPS:
        msg = f"unknown event type {kind!r} in {event!r}; expected one of {', '.join(STEPS)}"
        raise ValueError(msg)
    return str(event["user"]), (kind, str(event["ts"]))


def advance(funnel: Funnel, step: tuple[str, str]) -> tuple[Funnel, list[tuple[str, str, str]]]:
    """stateful_flat_map mapper: move the user's funnel on by one event."""
    kind, ts = step
    if kind == "view":
        return (funnel if funnel is not None else ("viewed", ts)), []
    if kind == "add_to_cart":
        if funnel is not None and funnel[0] == "viewed":
            return ("carted", funnel[1], ts), []
        return funnel, []
    # purchase: ends the funnel whatever its stage.
    if funnel is not None and funnel[0] == "carted":
        return None, [(funnel[1], funnel[2], ts)]
    return None, []


def flatten(user_conv: tuple[str, tuple[str, str, str]]) -> tuple[str, str, str, str]:
    user, (viewed, carted, purchased) = user_conv
    return user, viewed, carted, purchased


def get_flow(path: Any = DATA, events: Optional[list[Any]] = None, sink: Any = None) -> Dataflow:
    """Build the flow.

    Args:
        path: JSON-lines file of shop events.
        events: Use these dicts instead of the file.
        sink: Where to write `(user, viewed_at, carted_at, purchased_at)` (default: standard output).
    """
    flow = Dataflow("event_sequencing")
    s = read_events(flow, path, events)
    keyed = op.map("by_user", s, by_user)
    conversions = op.stateful_flat_map("funnel", keyed, advance)
    op.output("out", op.map("flatten", conversions, flatten), sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
