"""Trades and traded shares per symbol over 10-minute windows starting every 5 minutes.

`fold_window` with a `SlidingWindower(length=10 min, offset=5 min)`: each trade
counts in the two overlapping windows that contain its time. Input: the trades of
`examples/data/windowing_trades.csv` (see `windowing_trades.py`); trades may be
out of order by up to `WAIT` (1 minute); older ones are reported as late, once
per window they would have been in.

Output: `("window", symbol, start, end, trades, shares)` per closed window and
`("late", symbol, start, trade_time)` per late trade and window.

Run it:

    python examples/windowing_sliding.py
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.inputs import CSVSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "windowing_trades.csv"
LENGTH = timedelta(minutes=10)
EVERY = timedelta(minutes=5)
WAIT = timedelta(minutes=1)
ALIGN_TO = datetime.fromisoformat("2024-05-01T00:00:00+00:00")


def parse(trade: dict[str, Any]) -> tuple[str, tuple[datetime, int]]:
    """`{"time", "symbol", "qty", ...}` -> `(symbol, (time, qty))`."""
    ts = datetime.fromisoformat(str(trade["time"]))
    if ts.tzinfo is None:
        msg = f"trade time {trade['time']!r} has no UTC offset; write e.g. 2024-05-01T09:00:00+00:00"
        raise ValueError(msg)
    return str(trade["symbol"]), (ts, int(trade["qty"]))


def trade_time(trade: tuple[datetime, int]) -> datetime:
    return trade[0]


def add_trade(acc: tuple[int, int], trade: tuple[datetime, int]) -> tuple[int, int]:
    return (acc[0] + 1, acc[1] + trade[1])


def merge_counts(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] + b[0], a[1] + b[1])


def no_trades() -> tuple[int, int]:
    return (0, 0)


def bounds(window_id: int) -> tuple[str, str]:
    start = ALIGN_TO + EVERY * window_id
    return start.isoformat(), (start + LENGTH).isoformat()


def format_window(item: tuple[str, tuple[int, tuple[int, int]]]) -> tuple[Any, ...]:
    symbol, (window_id, (trades, shares)) = item
    return ("window", symbol, *bounds(window_id), trades, shares)


def format_late(item: tuple[str, tuple[int, tuple[datetime, int]]]) -> tuple[Any, ...]:
    symbol, (window_id, (ts, _qty)) = item
    return ("late", symbol, bounds(window_id)[0], ts.isoformat())


def get_flow(path: Any = DATA, trades: Optional[list[Any]] = None, sink: Any = None) -> Dataflow:
    """Build the flow.

    Args:
        path: CSV file with `time,symbol,side,qty,price` columns.
        trades: Use these dicts instead of the file.
        sink: Where to write windows and late trades (default: standard output).
    """
    flow = Dataflow("windowing_sliding")
    src = TestingSource(trades) if trades is not None else CSVSource(path)
    keyed = op.map("parse", op.input("inp", flow, src), parse)
    clock = win.EventClock(trade_time, wait_for_system_duration=WAIT)
    windower = win.SlidingWindower(length=LENGTH, offset=EVERY, align_to=ALIGN_TO)
    windows = win.fold_window("volume", keyed, clock, windower, no_trades, add_trade, merge_counts)
    out = op.merge(
        "all", op.map("format_window", windows.down, format_window), op.map("format_late", windows.late, format_late)
    )
    op.output("out", out, sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
