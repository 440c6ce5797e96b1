"""The windowing examples (examples/windowing_*.py): run in process and as scripts.

Expected outputs are computed here with plain Python from the same sample data
(per key: watermark = latest time - wait; older items are late), independently
of the examples' code.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flowspark.testing import TestingSink, run_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = EXAMPLES / "data"
MIDNIGHT = datetime.fromisoformat("2024-05-01T00:00:00+00:00")


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_example(name: str, **kw: Any) -> list[Any]:
    out: list[Any] = []
    run_main(load(name).get_flow(sink=TestingSink(out), **kw))
    return out


def trades() -> list[dict[str, str]]:
    with open(DATA / "windowing_trades.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def split_late(rows: list[tuple[str, datetime, Any]], wait: timedelta) -> tuple[list[Any], list[Any]]:
    """Per key, in arrival order: (on-time rows, late rows)."""
    wm: dict[str, datetime] = {}
    on_time, late = [], []
    for key, ts, v in rows:
        if key in wm and ts < max(wm[key], ts - wait):
            late.append((key, ts, v))
            continue
        wm[key] = max(wm.get(key, ts - wait), ts - wait)
        on_time.append((key, ts, v))
    return on_time, late


def test_trades_profit_per_tumbling_window_with_a_late_trade():
    rows = []
    for t in trades():
        cents = int(Decimal(t["price"]) * 100) * int(t["qty"])
        rows.append((t["symbol"], datetime.fromisoformat(t["time"]), cents if t["side"] == "buy" else -cents))
    on_time, late = split_late(rows, timedelta(minutes=1))
    profit: dict[tuple[str, datetime], int] = defaultdict(int)
    for sym, ts, cents in on_time:
        start = MIDNIGHT + (ts - MIDNIGHT) // timedelta(minutes=5) * timedelta(minutes=5)
        profit[(sym, start)] += cents
    want = sorted(("profit", s, start.isoformat(), f"{Decimal(c) / 100:.2f}") for (s, start), c in profit.items())
    five = timedelta(minutes=5)
    want_late = [
        ("late", s, (MIDNIGHT + (ts - MIDNIGHT) // five * five).isoformat(), ts.isoformat()) for s, ts, _c in late
    ]
    out = run_example("windowing_trades")
    assert sorted(x for x in out if x[0] == "profit") == want
    assert [x for x in out if x[0] == "late"] == want_late
    # the sample data has exactly one late trade, after its window closed
    assert want_late == [("late", "AAPL", "2024-05-01T09:00:00+00:00", "2024-05-01T09:04:30+00:00")]
    assert ("profit", "AAPL", "2024-05-01T09:00:00+00:00", "-9.60") in out
    # the 09:00 AAPL window is emitted before the late trade arrives
    assert out.index(("profit", "AAPL", "2024-05-01T09:00:00+00:00", "-9.60")) < out.index(want_late[0])


def test_trades_example_takes_a_list_of_dicts():
    out = run_example(
        "windowing_trades",
        trades=[
            {"time": "2024-05-01T10:00:00+00:00", "symbol": "X", "side": "buy", "qty": "2", "price": "1.25"},
            {"time": "2024-05-01T10:01:00+00:00", "symbol": "X", "side": "sell", "qty": "1", "price": "3.00"},
        ],
    )
    assert out == [("profit", "X", "2024-05-01T10:00:00+00:00", "-0.50")]


def test_sliding_ten_minute_windows_every_five_minutes():
    rows = [(t["symbol"], datetime.fromisoformat(t["time"]), int(t["qty"])) for t in trades()]
    on_time, late = split_late(rows, timedelta(minutes=1))
    five = timedelta(minutes=5)
    acc: dict[tuple[str, datetime], list[int]] = defaultdict(lambda: [0, 0])
    for sym, ts, qty in on_time:
        last_start = MIDNIGHT + (ts - MIDNIGHT) // five * five
        for start in (last_start - five, last_start):  # the two 10-minute windows holding ts
            acc[(sym, start)][0] += 1
            acc[(sym, start)][1] += qty
    want = sorted(("window", s, st.isoformat(), (st + 2 * five).isoformat(), n, q) for (s, st), (n, q) in acc.items())
    out = run_example("windowing_sliding")
    assert sorted(x for x in out if x[0] == "window") == want
    late_want = []
    for s, ts, _q in late:
        last_start = MIDNIGHT + (ts - MIDNIGHT) // five * five
        late_want += [("late", s, (last_start - five).isoformat(), ts.isoformat())]
        late_want += [("late", s, last_start.isoformat(), ts.isoformat())]
    assert [x for x in out if x[0] == "late"] == late_want
    assert len(late_want) == 2


def test_user_sessions_with_a_thirty_minute_gap():
    clicks = [json.loads(line) for line in (DATA / "windowing_clicks.jsonl").read_text().splitlines() if line]
    rows = [(c["user"], datetime.fromisoformat(c["time"]), c["page"]) for c in clicks]
    on_time, late = split_late(rows, timedelta(minutes=5))
    sessions = []
    for user in sorted({u for u, _t, _p in on_time}):
        mine = sorted((ts, p) for u, ts, p in on_time if u == user)
        cur = [mine[0]]
        for ts, p in mine[1:]:
            if ts - cur[-1][0] <= timedelta(minutes=30):
                cur.append((ts, p))
            else:
                sessions.append(("session", user, cur[0][0].isoformat(), cur[-1][0].isoformat(), [x for _t, x in cur]))
                cur = [(ts, p)]
        sessions.append(("session", user, cur[0][0].isoformat(), cur[-1][0].isoformat(), [x for _t, x in cur]))
    out = run_example("windowing_sessions")
    assert sorted(x for x in out if x[0] == "session") == sorted(sessions)
    # The file is one source batch: late clicks come grouped by user, users in sorted order.
    late_by_user = sorted(late, key=lambda r: r[0])
    assert [x for x in out if x[0] == "late"] == [("late", u, ts.isoformat(), p) for u, ts, p in late_by_user]
    assert late_by_user != late  # the sample data tells the two orders apart
    # bob's clicks exactly 30 minutes apart are one session
    assert ("session", "bob", "2024-05-01T09:00:00+00:00", "2024-05-01T09:30:00+00:00", ["home", "cart"]) in out
    assert len(late) == 2


@pytest.mark.parametrize("name", ["windowing_trades", "windowing_sliding", "windowing_sessions"])
def test_example_scripts_print_their_results(name):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")], capture_output=True, text=True, timeout=120, check=True
    )
    printed = proc.stdout.splitlines()
    assert sorted(printed) == sorted(str(x) for x in run_example(name))
    assert printed
