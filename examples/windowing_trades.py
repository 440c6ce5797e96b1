"""Profit per symbol and 5-minute tumbling window of trade time (`fold_window`, `EventClock`).

Input: trades with `time` (ISO 8601, UTC), `symbol`, `side` (`buy`/`sell`), `qty`
and `price`, from a CSV file (default `examples/data/windowing_trades.csv`) or a
list of dicts. A buy adds `qty * price` to its window's profit, a sell subtracts it
(amounts are summed as integer cents, so results are exact).

Trades may arrive out of order by up to `WAIT` (1 minute) of trade time. A trade
older than that (older than the symbol's watermark) is *late*: it is not added to
any window but reported on the `late` stream with the window it would have been
in. The sample data has one: the AAPL trade stamped 09:04:30 arrives after AAPL's
09:07:10 trade, when the 09:00-09:05 window has already closed.

Output: `("profit", symbol, window_start, "123.45")` when a window closes (the
watermark passes its end, or the input ends) and `("late", symbol, window_start,
trade_time)` for each late trade.

Run it:

    python examples/windowing_trades.py
    python -m flowspark.run examples/windowing_trades.py
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.inputs import CSVSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "windowing_trades.csv"
WINDOW = timedelta(minutes=5)
WAIT = timedelta(minutes=1)
ALIGN_TO = datetime.fromisoformat("2024-05-01T00:00:00+00:00")


def parse(trade: dict[str, Any]) -> tuple[str, tuple[datetime, int]]:
    """`{"time", "symbol", "side", "qty", "price"}` -> `(symbol, (time, signed_cents))`."""
    ts = datetime.fromisoformat(str(trade["time"]))
    if ts.tzinfo is None:
        msg = f"trade time {trade['time']!r} has no UTC offset; write e.g. 2024-05-01T09:00:00+00:00"
        raise ValueError(msg)
    cents = int(trade["qty"]) * int(Decimal(str(trade["price"])) * 100)
    side = str(trade["side"])
    if side not in ("buy", "sell"):
        msg = f"trade side must be 'buy' or 'sell'; received {side!r} in {trade!r}"
        raise ValueError(msg)
    return str(trade["symbol"]), (ts, cents if side == "buy" else -cents)


def trade_time(trade: tuple[datetime, int]) -> datetime:
    return trade[0]


def add_trade(profit: int, trade: tuple[datetime, int]) -> int:
    return profit + trade[1]


def merge_profits(a: int, b: int) -> int:
    return a + b


def window_start(window_id: int) -> str:
    return (ALIGN_TO + WINDOW * window_id).isoformat()


def format_profit(symbol_win: tuple[str, tuple[int, int]]) -> tuple[str, str, str, str]:
    symbol, (window_id, cents) = symbol_win
    return ("profit", symbol, window_start(window_id), f"{Decimal(cents) / 100:.2f}")


def format_late(symbol_win: tuple[str, tuple[int, tuple[datetime, int]]]) -> tuple[str, str, str, str]:
    symbol, (window_id, (ts, _cents)) = symbol_win
    return ("late", symbol, window_start(window_id), ts.isoformat())


def get_flow(path: Any = DATA, trades: Optional[list[Any]] = None, sink: Any = None) -> Dataflow:
    """Build the flow.

    Args:
        path: CSV file with `time,symbol,side,qty,price` columns.
        trades: Use these dicts instead of the file.
        sink: Where to write profits and late trades (default: standard output).
    """
    flow = Dataflow("windowing_trades")
    src = TestingSource(trades) if trades is not None else CSVSource(path)
    keyed = op.map("parse", op.input("inp", flow, src), parse)
    clock = win.EventClock(trade_time, wait_for_system_duration=WAIT)
    windows = win.fold_window(
        "profit", keyed, clock, win.TumblingWindower(WINDOW, ALIGN_TO), int, add_trade, merge_profits
    )
    profits = op.map("format_profit", windows.down, format_profit)
    late = op.map("format_late", windows.late, format_late)
    op.output("out", op.merge("all", profits, late), sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
