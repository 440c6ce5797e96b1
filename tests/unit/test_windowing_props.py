"""Property tests: window operators against a small reference model of the semantics.

With the system time frozen, an `EventClock`'s watermark per key is the largest
`timestamp - wait` seen so far; a value is late when its timestamp is below the
watermark after seeing it. The model computes, per key, the late values (with
the ids they would have had) and the contents of every window; the fast fold
path (`fold_window` over tumbling/sliding windows), the generic `window` driver
and `collect_window` over sessions must all agree with it, for any batching.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.testing import TestingSink, TestingSource, run_main

T0 = datetime(2100, 1, 1, tzinfo=timezone.utc)


def sec(s: float) -> timedelta:
    return timedelta(seconds=s)


def now() -> datetime:
    return T0


def ts_of(tv: tuple[datetime, Any]) -> datetime:
    return tv[0]


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


def window_ids(windower: win.Windower, ts: datetime) -> list[int]:
    if isinstance(windower, win.SessionWindower):
        return [win.LATE_SESSION_ID]
    length = windower.length
    offset = windower.offset if isinstance(windower, win.SlidingWindower) else windower.length
    # every i with align + i*offset <= ts < align + i*offset + length, by brute force
    d = ts - windower.align_to
    first = d // offset - (length // offset) - 2
    return [i for i in range(first, d // offset + 2) if i * offset <= d < i * offset + length]


def model(items: list[tuple[str, tuple[datetime, int]]], wait: timedelta, windower: win.Windower, ordered: bool):
    """Return ({key: {wid_or_session: [values]}}, {key: [(wid, v)]}) in the model's order."""
    wms: dict[str, datetime] = {}
    on_time: dict[str, list[tuple[datetime, int, int]]] = defaultdict(list)
    late: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for seq, (key, (ts, v)) in enumerate(items):
        wm = max(wms.get(key, win.UTC_MIN), ts - wait)
        wms[key] = wm
        if ts < wm:
            late[key].extend((wid, v) for wid in window_ids(windower, ts))
        else:
            on_time[key].append((ts, seq, v))
    windows: dict[str, dict[Any, list[int]]] = {}
    for key, vals in on_time.items():
        applied = sorted(vals) if ordered else vals
        per: dict[Any, list[int]] = defaultdict(list)
        if isinstance(windower, win.SessionWindower):
            # sessions = clusters of timestamps no more than `gap` apart
            stamps = sorted(ts for ts, _s, _v in vals)
            bounds: list[list[datetime]] = []
            for ts in stamps:
                if bounds and ts - bounds[-1][1] <= windower.gap:
                    bounds[-1][1] = ts
                else:
                    bounds.append([ts, ts])
            for ts, _s, v in applied:
                [b] = [(o, c) for o, c in bounds if o <= ts <= c]
                per[b].append(v)
        else:
            for ts, _s, v in applied:
                for wid in window_ids(windower, ts):
                    per[wid].append(v)
        windows[key] = dict(per)
    return windows, dict(late)


# ---------------------------------------------------------------------------
# Running the operators
# ---------------------------------------------------------------------------


class _Collect(win.WindowLogic):
    def __init__(self, state: Optional[list[int]]):
        self.vs = state or []

    def on_value(self, value):
        self.vs.append(value[1])
        return ()

    def on_merge(self, original):
        self.vs = self.vs + original.vs
        return ()

    def on_close(self):
        return (list(self.vs),)

    def snapshot(self):
        return list(self.vs)


def run(items, wait, windower, ordered, how: str, batch_size: int):
    flow = Dataflow("p")
    s = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
    clock = win.EventClock(ts_of, wait, now_getter=now)
    if how == "fold":
        w = win.fold_window("w", s, clock, windower, list, lambda acc, tv: [*acc, tv[1]], list.__add__, ordered)
    elif how == "window":
        w = win.window("w", s, clock, windower, _Collect, ordered)
    else:
        w = win.collect_window("w", s, clock, windower, ordered=ordered)
        w = win.WindowOut(op.map_value("strip", w.down, lambda iv: (iv[0], [v for _t, v in iv[1]])), w.late, w.meta)
    down: list[Any] = []
    late: list[Any] = []
    meta: list[Any] = []
    op.output("down", w.down, TestingSink(down))
    op.output("late", w.late, TestingSink(late))
    op.output("meta", w.meta, TestingSink(meta))
    run_main(flow)
    windows: dict[str, dict[Any, list[int]]] = defaultdict(dict)
    metas = {(k, wid): m for k, (wid, m) in meta}
    assert len(metas) == len(meta), "one meta per closed window"
    for key, (wid, vs) in down:
        m = metas[(key, wid)]
        if isinstance(windower, win.SessionWindower):
            assert (key, (m.open_time, m.close_time)) not in windows, "each session once"
            windows[key][(m.open_time, m.close_time)] = vs
        else:
            assert wid not in windows[key], "each window once"
            assert m.close_time - m.open_time == windower.length
            windows[key][wid] = vs
    assert len(metas) == len(down)
    lates: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, (wid, (_ts, v)) in late:
        lates[key].append((wid, v))
    return dict(windows), dict(lates)


def normalize(windows, ordered: bool):
    if ordered:
        return windows
    return {k: {w: sorted(vs) for w, vs in per.items()} for k, per in windows.items()}


# ---------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------

items_st = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(-40, 120), st.sampled_from([0, 0, 0, 1])), min_size=0, max_size=40
).map(lambda rows: [(k, (T0 + sec(t) + timedelta(microseconds=us), i)) for i, (k, t, us) in enumerate(rows)])
wait_st = st.sampled_from([0, 1, 5, 30, 10_000]).map(sec)
align_st = st.integers(-30, 30).map(lambda s: T0 + sec(s))


@st.composite
def fixed_windower(draw):
    length = draw(st.integers(1, 40))
    align = draw(align_st)
    if draw(st.booleans()):
        return win.TumblingWindower(sec(length), align)
    return win.SlidingWindower(sec(length), sec(draw(st.integers(1, length))), align)


session_st = st.integers(0, 25).map(lambda g: win.SessionWindower(sec(g)))

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(items_st, wait_st, fixed_windower(), st.booleans(), st.integers(1, 4))
def test_fixed_windows_match_model(items, wait, windower, ordered, batch_size):
    want = model(items, wait, windower, ordered)
    for how in ("fold", "window"):
        got = run(items, wait, windower, ordered, how, batch_size)
        assert normalize(got[0], ordered) == normalize(want[0], ordered), how
        assert got[1] == want[1], how


@SETTINGS
@given(items_st, wait_st, session_st, st.booleans(), st.integers(1, 4))
@example([("a", (T0, 0)), ("a", (T0 + sec(10), 1))], sec(0), win.SessionWindower(sec(10)), True, 1)
@example([("a", (T0 + sec(10), 0)), ("a", (T0, 1))], sec(30), win.SessionWindower(sec(10)), False, 1)
def test_sessions_match_model(items, wait, windower, ordered, batch_size):
    want = model(items, wait, windower, ordered)
    for how in ("collect", "window"):
        got = run(items, wait, windower, ordered, how, batch_size)
        assert normalize(got[0], ordered) == normalize(want[0], ordered), how
        assert got[1] == want[1], how


@SETTINGS
@given(items_st, wait_st, fixed_windower(), st.booleans())
def test_fast_and_generic_paths_agree_step_by_step(items, wait, windower, ordered):
    # Drive both logics directly, one value per batch, and compare every emission.
    clock = win.EventClock(ts_of, wait, now_getter=now)
    flow = Dataflow("d")
    s = op.input("inp", flow, TestingSource([]))
    win.fold_window("fast", s, clock, windower, list, lambda acc, tv: [*acc, tv[1]], list.__add__, ordered)
    win.window("generic", s, clock, windower, _Collect, ordered)
    from flowspark import ir

    fast_b, generic_b = [n.builder for n in ir.walk(flow.graph()) if isinstance(n, ir.StatefulBatch)]
    logics: dict[str, list[Any]] = {}
    for key, value in items:
        pair = logics.get(key)
        if pair is None:
            pair = logics[key] = [fast_b(None), generic_b(None)]
        (fe, fd), (ge, gd) = pair[0].on_batch([value]), pair[1].on_batch([value])
        assert fe == ge
        assert fd == gd
        if fd:  # what the runtime does with a discarded logic
            del logics[key]
        else:
            # The fast path does not wake for queued values (folding them emits
            # nothing), only for window closes: never earlier than the generic driver.
            fast_at, generic_at = pair[0].notify_at(), pair[1].notify_at()
            assert (fast_at is None) == (generic_at is None)
            assert fast_at is None or fast_at >= generic_at
    for fast, generic in logics.values():
        assert fast.on_eof() == generic.on_eof()
