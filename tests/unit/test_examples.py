"""The examples under examples/: run through run_main, the script itself and `python -m flowspark.run`.

Every expected output is computed here with plain Python from the same sample
data, independently of the examples' own code, in input order; `one_activation`
then puts it in Bytewax's order for a sample file, which its source reads in one
batch (bytewax 0.21.1 runs these examples to the same lists).
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import math
import random
import statistics
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from operator import itemgetter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flowspark._time import use_clock
from flowspark.errors import FlowsparkRuntimeError
from flowspark.testing import TestingSink, TestingSource, TimeTestingGetter, run_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = EXAMPLES / "data"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def collect(mod: ModuleType, clock: str = "system", **kw: Any) -> list[Any]:
    """Run the example's `get_flow(**kw)` into a list."""
    out: list[Any] = []
    run_main(mod.get_flow(sink=TestingSink(out), **kw), clock=clock)
    return out


FILE_BATCH = 1000  # FileSource's and CSVSource's default batch_size


def read_csv(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) < FILE_BATCH  # the whole file is one source batch
    return rows


def read_jsonl(name: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line]
    assert len(rows) < FILE_BATCH  # the whole file is one source batch
    return rows


def one_activation(out: list[Any]) -> list[Any]:
    """Outputs of a stateful step fed one source batch, in Bytewax's order.

    The batch's items are grouped by key, keys in sorted order, each key's values in
    input order: `out` (per-item outputs in input order, keyed by their first field)
    sorted stably by key.
    """
    return sorted(out, key=itemgetter(0))


# ---------------------------------------------------------------------------
# Independent computations of the expected outputs
# ---------------------------------------------------------------------------


def expected_running_totals(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    totals: dict[str, int] = {}
    out = []
    for r in rows:
        whole, _, frac = str(r["amount"]).partition(".")
        cents = int(whole) * 100 + int((frac + "00")[:2])
        totals[r["user"]] = totals.get(r["user"], 0) + cents
        out.append((r["user"], totals[r["user"]] / 100))
    return out


def expected_sessions(events: list[dict[str, Any]], gap_s: float = 1800) -> tuple[list[Any], list[Any]]:
    """(sessions closed by a later event, in order; sessions open at EOF)."""
    times: dict[str, list[datetime]] = {}
    closed = []
    for e in events:
        ts = datetime.fromisoformat(e["ts"])
        cur = times.setdefault(e["user"], [])
        if cur and (ts - max(cur)).total_seconds() > gap_s:
            closed.append((e["user"], min(cur).isoformat(), max(cur).isoformat(), len(cur)))
            cur.clear()
        cur.append(ts)
    still_open = [(u, min(c).isoformat(), max(c).isoformat(), len(c)) for u, c in times.items() if c]
    return closed, still_open


def expected_conversions(events: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    # Per user, the events since the previous purchase; a purchase converts when that
    # stretch has a view and, after the first view, an add_to_cart.
    pending: dict[str, list[tuple[str, str]]] = {}
    out = []
    for e in events:
        seq = pending.setdefault(e["user"], [])
        if e["event"] != "purchase":
            seq.append((e["event"], e["ts"]))
            continue
        views = [i for i, (k, _) in enumerate(seq) if k == "view"]
        if views:
            carts = [ts for k, ts in seq[views[0] + 1 :] if k == "add_to_cart"]
            if carts:
                out.append((e["user"], seq[views[0]][1], carts[0], e["ts"]))
        pending[e["user"]] = []
    return out


def expected_anomalies(rows: list[dict[str, Any]], window: int = 100, min_history: int = 10, threshold: float = 3.0):
    hist: dict[str, list[float]] = {}
    out = []
    for r in rows:
        v = float(r["value"])
        h = hist.setdefault(r["sensor"], [])
        past = h[-window:]
        if len(past) >= min_history:
            std = statistics.pstdev(past)
            mean = statistics.fmean(past)
            if std == 0:
                z = math.inf if v > mean else (-math.inf if v < mean else None)
            else:
                z = (v - mean) / std
            if z is not None and abs(z) > threshold:
                out.append((r["sensor"], v, z))
        h.append(v)
    return out


def expected_activity(segments: list[list[str]], pause: float, timeout: float) -> list[tuple[str, str]]:
    """Segment i of the input arrives at time i * pause (processing takes no time); a user
    goes inactive `timeout` after their latest event if that comes before the next segment
    (timers due at the same time fire in key order); nothing is reported at EOF."""
    out = []
    last: dict[str, float] = {}
    for i, seg in enumerate(segments):
        now = i * pause
        for _at, u in sorted((t + timeout, u) for u, t in last.items() if t + timeout <= now):
            out.append(("inactive", u))
            del last[u]
        for u in seg:
            if u not in last:
                out.append(("active", u))
            last[u] = now
    return out


# ---------------------------------------------------------------------------
# running_total
# ---------------------------------------------------------------------------


def test_sample_files_tell_input_order_from_key_order() -> None:
    # Otherwise the file tests below could not see a flow that keeps input order.
    for out in [
        expected_running_totals(read_csv("purchases.csv")),
        expected_sessions(read_jsonl("clicks.jsonl"))[0],
        expected_conversions(read_jsonl("shop_events.jsonl")),
        expected_anomalies(read_csv("sensor_readings.csv")),
    ]:
        assert one_activation(out) != out


def test_running_total_file() -> None:
    rows = read_csv("purchases.csv")
    assert len(rows) > 20
    assert collect(load("running_total")) == one_activation(expected_running_totals(rows))


def test_running_total_list() -> None:
    rows = [
        {"user": "x", "amount": "1.10"},
        {"user": "y", "amount": 2.2},
        {"user": "x", "amount": "0.05"},
        {"user": "x", "amount": 3},
    ]
    assert collect(load("running_total"), purchases=rows) == [("x", 1.1), ("y", 2.2), ("x", 1.15), ("x", 4.15)]


def test_running_total_rejects_sub_cent_amounts() -> None:
    mod = load("running_total")
    with pytest.raises(FlowsparkRuntimeError, match=r"more than 2 decimals") as ei:
        collect(mod, purchases=[{"user": "x", "amount": "1.005"}])
    assert "running_total.to_cents" in ei.value.step_id


# ---------------------------------------------------------------------------
# sessionization
# ---------------------------------------------------------------------------


def check_sessions(out: list[Any], events: list[dict[str, Any]], gap_s: float = 1800, *, from_file: bool) -> None:
    """Sessions closed by a later event (in input order, or Bytewax's order for a file read
    in one batch), then the sessions still open at EOF in sorted key order (`on_eof`)."""
    closed, still_open = expected_sessions(events, gap_s)
    assert out[: len(closed)] == (one_activation(closed) if from_file else closed)
    assert out[len(closed) :] == sorted(still_open)


def test_sessionization_file() -> None:
    events = read_jsonl("clicks.jsonl")
    # The sample data covers the cases: sessions closed by a later event and a gap of exactly 30 min.
    closed, _ = expected_sessions(events)
    assert closed
    by_user: dict[str, list[datetime]] = {}
    for e in events:
        by_user.setdefault(e["user"], []).append(datetime.fromisoformat(e["ts"]))
    gaps = {b - a for ts in by_user.values() for a, b in zip(ts, ts[1:], strict=False)}
    assert timedelta(minutes=30) in gaps
    check_sessions(collect(load("sessionization")), events, from_file=True)


def test_sessionization_gap_boundary_and_late_event() -> None:
    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)

    def ev(user: str, minutes: float) -> dict[str, Any]:
        return {"user": user, "ts": (t0 + timedelta(minutes=minutes)).isoformat()}

    events = [ev("a", 0), ev("a", 30), ev("b", 5), ev("a", 60.01), ev("a", 58), ev("b", 40), ev("a", 85)]
    out = collect(load("sessionization"), events=events)
    iso = lambda m: (t0 + timedelta(minutes=m)).isoformat()  # noqa: E731
    # Exactly 30 min continues a session, 30.01 min ends it; the closed session is emitted
    # when the event that ends it arrives.
    assert out[:2] == [("a", iso(0), iso(30), 2), ("b", iso(5), iso(5), 1)]
    # At EOF, in key order: "a" with the late 58-minute event folded in (85 is 24.99 min
    # after 60.01), and "b".
    assert out[2:] == [("a", iso(58), iso(85), 3), ("b", iso(40), iso(40), 1)]
    check_sessions(out, events, from_file=False)


def test_sessionization_gap_parameter() -> None:
    events = read_jsonl("clicks.jsonl")
    check_sessions(collect(load("sessionization"), gap_minutes=10), events, gap_s=600, from_file=True)


def test_sessionization_bad_time_names_step() -> None:
    with pytest.raises(FlowsparkRuntimeError, match="UTC offset") as ei:
        collect(load("sessionization"), events=[{"user": "a", "ts": "2024-01-01T00:00:00"}])
    assert "sessionization.user_and_time" in ei.value.step_id


# ---------------------------------------------------------------------------
# event_sequencing
# ---------------------------------------------------------------------------


def test_event_sequencing_file() -> None:
    events = read_jsonl("shop_events.jsonl")
    expected = expected_conversions(events)
    purchases = sum(1 for e in events if e["event"] == "purchase")
    assert 0 < len(expected) < purchases  # some funnels convert, some are out of order
    assert collect(load("event_sequencing")) == one_activation(expected)


@pytest.mark.parametrize(
    ("steps", "converts"),
    [
        (["view", "add_to_cart", "purchase"], True),
        (["view", "view", "add_to_cart", "add_to_cart", "purchase"], True),
        (["add_to_cart", "view", "purchase"], False),
        (["view", "purchase", "add_to_cart", "purchase"], False),
        (["add_to_cart", "purchase", "view", "add_to_cart", "purchase"], True),
        (["purchase", "add_to_cart", "view"], False),
    ],
)
def test_event_sequencing_orders(steps: list[str], converts: bool) -> None:
    events = [{"user": "u", "ts": f"t{i}", "event": s} for i, s in enumerate(steps)]
    out = collect(load("event_sequencing"), events=events)
    assert out == expected_conversions(events)
    assert bool(out) == converts


def test_event_sequencing_random_against_reference() -> None:
    rng = random.Random(3)
    kinds = ["view", "add_to_cart", "purchase"]
    events = [{"user": rng.choice("abc"), "ts": f"t{i}", "event": rng.choice(kinds)} for i in range(400)]
    out = collect(load("event_sequencing"), events=events)
    assert out == expected_conversions(events)
    assert len(out) > 5


def test_event_sequencing_unknown_event() -> None:
    with pytest.raises(FlowsparkRuntimeError, match="unknown event type 'refund'"):
        collect(load("event_sequencing"), events=[{"user": "u", "ts": "t", "event": "refund"}])


# ---------------------------------------------------------------------------
# active_users
# ---------------------------------------------------------------------------

SEGMENTS = [["alice", "bob", "alice"], ["carol", "alice"], ["bob", "dave", "dave"]]


def with_pauses(segments: list[list[str]], pause: timedelta) -> list[Any]:
    items: list[Any] = []
    for i, seg in enumerate(segments):
        if i:
            items.append(TestingSource.PAUSE(pause))
        items.extend({"user": u, "page": "/"} for u in seg)
    return items


@pytest.mark.parametrize(("pause_min", "timeout_min"), [(10, 5), (3, 5), (1, 5)])
def test_active_users_logical_clock(pause_min: int, timeout_min: int) -> None:
    # With clock="logical" the PAUSEs and the timers run on the same logical clock, which
    # does not move while items flow and jumps to the next due time when idle: timers fire
    # during the pauses, deterministically and without waiting.
    items = with_pauses(SEGMENTS, timedelta(minutes=pause_min))
    out = collect(load("active_users"), timeout=timedelta(minutes=timeout_min), events=items, clock="logical")
    assert out == expected_activity(SEGMENTS, pause_min, timeout_min)


def _sorted_inactive_runs(out: list[tuple[str, str]]) -> list[tuple[str, str]]:
    res: list[tuple[str, str]] = []
    run_: list[tuple[str, str]] = []
    for rec in [*out, ("end", "")]:
        if rec[0] == "inactive":
            run_.append(rec)
            continue
        res.extend(sorted(run_))
        run_ = []
        if rec[0] != "end":
            res.append(rec)
    return res


def test_active_users_system_clock_short_timeout() -> None:
    # Real time: a 0.15 s timeout and pauses of 0.5 s (timers of one segment fire in order
    # of their users' latest events, so runs of "inactive" are compared sorted).
    items = with_pauses(SEGMENTS, timedelta(seconds=0.5))
    out = collect(load("active_users"), timeout=0.15, events=items)
    assert _sorted_inactive_runs(out) == expected_activity(SEGMENTS, 0.5, 0.15)


def test_active_users_file_reports_only_active_at_eof() -> None:
    events = read_jsonl("activity.jsonl")
    first_seen = list(dict.fromkeys(e["user"] for e in events))
    assert len(first_seen) < len(events)  # repeated users do not re-activate
    out = collect(load("active_users"))
    # One source batch: each user's first event, users in sorted order.
    assert out == [("active", u) for u in sorted(first_seen)]


def test_active_users_logic_with_injected_clock() -> None:
    mod = load("active_users")
    clock = TimeTestingGetter(datetime(2024, 1, 1, tzinfo=timezone.utc))
    with use_clock(clock.get):
        logic = mod.ActivityLogic(timedelta(minutes=5), None)
        assert logic.on_item({"user": "a"}) == ([("active", "a")], False)
        clock.advance(timedelta(minutes=4))
        assert logic.on_item({"user": "a"}) == ([], False)
        assert logic.notify_at() == clock.now + timedelta(minutes=5)
        assert logic.on_eof() == ([], False)
        resumed = mod.ActivityLogic(timedelta(minutes=5), logic.snapshot())
        assert resumed.notify_at() == logic.notify_at()
        assert resumed.on_notify() == ([("inactive", "a")], True)


def test_active_users_rejects_bad_timeout() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        load("active_users").get_flow(timeout=0)


# ---------------------------------------------------------------------------
# anomaly_detection
# ---------------------------------------------------------------------------


def check_anomalies(out: list[Any], expected: list[Any]) -> None:
    assert [(s, v) for s, v, _ in out] == [(s, v) for s, v, _ in expected]
    for (_, _, z), (_, _, ez) in zip(out, expected, strict=True):
        assert z == pytest.approx(ez, rel=1e-9)


def test_anomaly_detection_file() -> None:
    rows = read_csv("sensor_readings.csv")
    expected = expected_anomalies(rows)
    assert len(expected) >= 4
    check_anomalies(collect(load("anomaly_detection")), one_activation(expected))


def _readings(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        sensor = rng.choice(["s1", "s2"])
        base = 1000.0 if sensor == "s1" else -3.0
        v = base + rng.gauss(0, 1.5)
        if i % 97 == 0:
            v += rng.choice([-12, 12])
        rows.append({"sensor": sensor, "value": round(v, 3)})
    return rows


def test_anomaly_detection_long_input_evicts_old_values() -> None:
    rows = _readings(1500, seed=9)
    expected = expected_anomalies(rows)
    assert len(expected) >= 10
    check_anomalies(collect(load("anomaly_detection"), readings=rows), expected)


def test_anomaly_detection_small_window() -> None:
    rows = _readings(600, seed=10)
    expected = expected_anomalies(rows, window=20, min_history=5, threshold=2.5)
    check_anomalies(
        collect(load("anomaly_detection"), readings=rows, window=20, min_history=5, threshold=2.5), expected
    )


def test_anomaly_detection_flat_window() -> None:
    rows = [{"sensor": "s", "value": 5}] * 12 + [{"sensor": "s", "value": 5.5}]
    out = collect(load("anomaly_detection"), readings=rows)
    assert out == [("s", 5.5, math.inf)] == expected_anomalies(rows)


def test_anomaly_detection_state_is_bounded() -> None:
    mod = load("anomaly_detection")
    detect = mod.make_detector(100, 10, 3.0)
    stats = None
    for v in _readings(1000, seed=1):
        if v["sensor"] == "s1":
            stats, _ = detect(stats, v["value"])
    assert len(stats.values) == 100


# ---------------------------------------------------------------------------
# The examples as users run them: the script itself and `python -m flowspark.run`
# ---------------------------------------------------------------------------


def check_cli_output(name: str, out: list[Any]) -> None:
    if name == "running_total":
        assert out == one_activation(expected_running_totals(read_csv("purchases.csv")))
    elif name == "sessionization":
        check_sessions(out, read_jsonl("clicks.jsonl"), from_file=True)
    elif name == "event_sequencing":
        assert out == one_activation(expected_conversions(read_jsonl("shop_events.jsonl")))
    elif name == "active_users":
        assert out == [("active", u) for u in sorted({e["user"] for e in read_jsonl("activity.jsonl")})]
    else:
        check_anomalies(out, one_activation(expected_anomalies(read_csv("sensor_readings.csv"))))


NAMES = ["running_total", "sessionization", "event_sequencing", "active_users", "anomaly_detection"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["script", "cli"])
def test_example_runs_from_command_line(name: str, how: str) -> None:
    cmd = [sys.executable, f"examples/{name}.py"]
    if how == "cli":
        cmd = [sys.executable, "-m", "flowspark.run", f"examples/{name}.py"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    check_cli_output(name, [ast.literal_eval(line) for line in proc.stdout.splitlines()])


def test_cli_factory_call_with_arguments() -> None:
    cmd = [sys.executable, "-m", "flowspark.run", "examples/sessionization.py:get_flow(gap_minutes=10)"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    check_sessions(
        [ast.literal_eval(line) for line in proc.stdout.splitlines()], read_jsonl("clicks.jsonl"), 600, from_file=True
    )
