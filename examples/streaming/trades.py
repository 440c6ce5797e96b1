"""Profit per symbol in 5-minute tumbling windows, late trades to their own output, as a stream.

Reuses `examples/windowing_trades.py`'s parsing and folding. Input: JSON files of trades
`{"time", "symbol", "side", "qty", "price"}`; windows are on event time (`EventClock`, one
minute of lateness allowed). A window's profit is written to `out/profits` when the
watermark passes its end; a trade for a window already closed goes to `out/late`. (Two
`SparkSink`s: each micro-batch reaches them through `foreachBatch`, at least once.)
Run it with `python examples/streaming/trades.py`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow, Stream
from flowspark.spark import SparkSink, SparkSource
from flowspark.testing import TestingSink, TestingSource

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from common import read_rows, run, stage_file  # noqa: E402
from windowing_trades import (
    ALIGN_TO,
    WAIT,
    WINDOW,
    add_trade,
    format_late,
    format_profit,
    merge_profits,
    parse,
    trade_time,
)  # noqa: E402

IN_SCHEMA = "time STRING, symbol STRING, side STRING, qty LONG, price STRING"
PROFIT_SCHEMA = "symbol STRING, window_start STRING, profit STRING"
LATE_SCHEMA = "symbol STRING, window_start STRING, trade_time STRING"


def _t(minute: int, second: int = 0) -> str:
    return f"2024-05-01T09:{minute:02d}:{second:02d}+00:00"


def _trade(minute: int, symbol: str, side: str, qty: int, price: str, second: int = 0) -> dict[str, Any]:
    return {"time": _t(minute, second), "symbol": symbol, "side": side, "qty": qty, "price": price}


BATCH_1 = [
    _trade(0, "AAPL", "buy", 10, "170.00"),
    _trade(2, "MSFT", "buy", 5, "410.00"),
    _trade(6, "AAPL", "sell", 10, "171.50"),
]
# 09:12 closes every window up to 09:10 (watermark 09:11); the 09:01 trade then is late.
BATCH_2 = [
    _trade(8, "MSFT", "sell", 5, "412.00"),
    _trade(12, "AAPL", "buy", 1, "172.00"),
    _trade(1, "AAPL", "buy", 1, "169.00"),
]


def _profit_row(x: tuple[str, tuple[int, int]]) -> dict[str, Any]:
    _, symbol, start, profit = format_profit(x)
    return {"symbol": symbol, "window_start": start, "profit": profit}


def _late_row(x: tuple[str, tuple[int, Any]]) -> dict[str, Any]:
    _, symbol, start, ts = format_late(x)
    return {"symbol": symbol, "window_start": start, "trade_time": ts}


def pipeline(trades: Stream[dict[str, Any]]) -> tuple[Stream[dict[str, Any]], Stream[dict[str, Any]]]:
    """Trades -> (profit rows, late-trade rows)."""
    keyed = op.map("parse", trades, parse)
    clock = win.EventClock(trade_time, wait_for_system_duration=WAIT)
    windows = win.fold_window(
        "profit", keyed, clock, win.TumblingWindower(WINDOW, ALIGN_TO), int, add_trade, merge_profits
    )
    return op.map("profit_rows", windows.down, _profit_row), op.map("late_rows", windows.late, _late_row)


def streaming(in_dir: Path, out_dir: Path) -> Dataflow:
    """The flow on Spark streaming: two parquet outputs."""
    flow = Dataflow("trades")
    trades = op.input("trades", flow, SparkSource("json", str(in_dir), schema=IN_SCHEMA, streaming=True))
    profits, late = pipeline(trades)
    op.output("profits", profits, SparkSink("parquet", str(out_dir / "profits"), schema=PROFIT_SCHEMA))
    op.output("late", late, SparkSink("parquet", str(out_dir / "late"), schema=LATE_SCHEMA))
    return flow


def local(trades: list[Any], profits: list[Any], late: list[Any]) -> Dataflow:
    """The flow in memory."""
    flow = Dataflow("trades")
    p, lt = pipeline(op.input("trades", flow, TestingSource(trades)))
    op.output("profits", p, TestingSink(profits))
    op.output("late", lt, TestingSink(late))
    return flow


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="flowspark-trades-"))
    for i, batch in enumerate([BATCH_1, BATCH_2], start=1):
        stage_file(work / "in", f"{i:04d}.json", batch)
        run(streaming(work / "in", work / "out"), work / "chk")
    print("profits:", read_rows(work / "out" / "profits"))
    print("late:", read_rows(work / "out" / "late"))


if __name__ == "__main__":
    main()
