"""Event-time windowing: clocks, windowers and the window operators (Bytewax 0.21 semantics).

Users write `import flowspark.operators.windowing as win`. Every operator here is
a composite over the core `stateful_batch` step (the step `op.stateful` itself
compiles to), so every runtime that runs `stateful` runs windows unchanged.

Per key, a *clock* gives each value a timestamp and a watermark ("no value
older than this will come"); a *windower* maps timestamps to window ids and
decides when windows close. A value is **late** when its timestamp is older
than the watermark: it goes to the `late` stream, tagged with the windows it
would have belonged to, and never into a window. Every operator returns
`WindowOut(down, late, meta)`, each keyed by the original key with values
`(window_id, x)`.

State is released as soon as it is no longer needed: a closed window's state is
dropped, and a key with no open window and no queued value holds no state at
all (its logic is discarded; the next value for the key starts afresh, with a new
clock). As in Bytewax for tumbling and sliding windows, a released key's
watermark is forgotten: an old value arriving after that opens a window again
instead of being late. For sessions this differs from Bytewax, which keeps every
session key forever: after all of a key's sessions closed, its next session is
numbered from 0 again.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Generic, Optional, TypeVar

from typing_extensions import Self, override

import flowspark.operators as op
from flowspark import _time, reducers
from flowspark._keyfn import column_of
from flowspark._time import utc_now
from flowspark.dataflow import KeyedStream, Stream, operator
from flowspark.errors import FlowsparkBuildError, FlowsparkTypeError
from flowspark.ir import WindowCount
from flowspark.operators import JoinEmitMode, JoinInsertMode, StatefulBatchLogic

V = TypeVar("V")
W = TypeVar("W")
S = TypeVar("S")
X = TypeVar("X")
SC = TypeVar("SC")
SW = TypeVar("SW")

__all__ = [
    "LATE_SESSION_ID",
    "UTC_MAX",
    "UTC_MIN",
    "ZERO_TD",
    "Clock",
    "ClockLogic",
    "EventClock",
    "SessionWindower",
    "SlidingWindower",
    "SystemClock",
    "TumblingWindower",
    "WindowLogic",
    "WindowMetadata",
    "WindowOut",
    "Windower",
    "WindowerLogic",
    "collect_window",
    "count_window",
    "fold_window",
    "join_window",
    "max_window",
    "min_window",
    "reduce_window",
    "window",
]

ZERO_TD: timedelta = timedelta(0)
"""A zero length of time."""
UTC_MAX: datetime = datetime.max.replace(tzinfo=timezone.utc)
"""The latest representable UTC time."""
UTC_MIN: datetime = datetime.min.replace(tzinfo=timezone.utc)
"""The earliest representable UTC time."""
LATE_SESSION_ID: int = -1
"""Window id given to late values of session windows."""

_ONE_US = timedelta(microseconds=1)

# Event tags of the internal stream between the stateful step and the three outputs.
_E = 0  # emitted downstream value
_L = 1  # late value
_M = 2  # metadata of a closed window


def _aware(what: str, t: Any) -> datetime:
    if not isinstance(t, datetime) or t.tzinfo is None:
        msg = (
            f"{what} must be an aware datetime (e.g. datetime(2024, 1, 1, tzinfo=timezone.utc)); "
            f"received {t!r} of type {type(t).__name__}"
        )
        raise FlowsparkTypeError(msg)
    return t


def _td(what: str, t: Any, *, positive: bool) -> timedelta:
    if not isinstance(t, timedelta):
        msg = f"{what} must be a timedelta; received {t!r} of type {type(t).__name__}"
        raise FlowsparkTypeError(msg)
    if (t <= ZERO_TD) if positive else (t < ZERO_TD):
        need = "positive" if positive else "zero or positive"
        msg = f"{what} must be {need}; received {t!r}"
        raise FlowsparkBuildError(msg)
    return t


def _bad_timestamp(step_id: str, ts: Any, value: Any) -> FlowsparkTypeError:
    msg = (
        f"step {step_id!r}: the clock's timestamp must be an aware UTC datetime; the ts_getter returned "
        f"{ts!r} of type {type(ts).__name__} for value {value!r}; return e.g. "
        "`datetime.fromisoformat(s).replace(tzinfo=timezone.utc)`"
    )
    return FlowsparkTypeError(msg)


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass
class WindowMetadata:
    """What a closed window covered.

    For tumbling and sliding windows `close_time` is exclusive; for session
    windows it is the timestamp of the last value (inclusive).

    Attributes:
        open_time: When the window opened.
        close_time: When the window closed.
        merged_ids: Ids of the windows merged into this one (sessions only), also transitively.
    """

    open_time: datetime
    close_time: datetime
    merged_ids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class WindowOut(Generic[V, W]):
    """The streams a windowing operator returns.

    Attributes:
        down: `(key, (window_id, emitted))`.
        late: `(key, (window_id, value))` for values older than the watermark; one item per window
            the value would have belonged to (`LATE_SESSION_ID` for session windows).
        meta: `(key, (window_id, WindowMetadata))` once per closed window (not for windows
            merged away).
    """

    down: KeyedStream[tuple[int, W]]
    late: KeyedStream[tuple[int, V]]
    meta: KeyedStream[tuple[int, WindowMetadata]]


# ---------------------------------------------------------------------------
# Clocks
# ---------------------------------------------------------------------------


class ClockLogic(ABC, Generic[V, S]):
    """Per-key time keeping: gives values timestamps and keeps the watermark.

    The watermark must never go backwards.
    """

    @abstractmethod
    def before_batch(self) -> None:
        """Called before each batch of values (read the system time here)."""

    @abstractmethod
    def on_item(self, value: V) -> tuple[datetime, datetime]:
        """Return `(timestamp, watermark)` for a value.

        Args:
            value: The value.

        Returns:
            The value's timestamp and the watermark after seeing it.
        """

    @abstractmethod
    def on_notify(self) -> datetime:
        """Return the watermark when woken by a notification.

        Returns:
            The watermark.
        """

    @abstractmethod
    def on_eof(self) -> datetime:
        """Return the watermark at end of input (usually `UTC_MAX`).

        Returns:
            The watermark.
        """

    @abstractmethod
    def to_system_utc(self, timestamp: datetime) -> Optional[datetime]:
        """Return the system time at which the watermark will have reached `timestamp`.

        Args:
            timestamp: A time in this clock's time.

        Returns:
            An aware UTC system time, or `None` to not be woken up.
        """

    @abstractmethod
    def snapshot(self) -> S:
        """Return picklable, immutable state.

        Returns:
            State.
        """


class Clock(ABC, Generic[V, S]):
    """A definition of time; builds one `ClockLogic` per key."""

    @abstractmethod
    def build(self, resume_state: Optional[S]) -> ClockLogic[V, S]:
        """Build the logic for a key.

        Args:
            resume_state: A snapshot of a previous logic, or `None`.

        Returns:
            The logic.
        """


class _SystemClockLogic(ClockLogic[Any, None]):
    __slots__ = ("now", "now_getter")

    def __init__(self, now_getter: Callable[[], datetime]) -> None:
        self.now_getter = now_getter
        self.now = now_getter()

    @override
    def before_batch(self) -> None:
        now = self.now_getter()
        if now > self.now:
            self.now = now

    @override
    def on_item(self, value: Any) -> tuple[datetime, datetime]:
        return (self.now, self.now)

    @override
    def on_notify(self) -> datetime:
        self.before_batch()
        return self.now

    @override
    def on_eof(self) -> datetime:
        return UTC_MAX

    @override
    def to_system_utc(self, timestamp: datetime) -> Optional[datetime]:
        return timestamp

    @override
    def snapshot(self) -> None:
        return None


@dataclass
class SystemClock(Clock[Any, None]):
    """Timestamp every value with the system time (`flowspark._time.utc_now`) when it is processed.

    The watermark is the system time, so nothing is ever late. End of input closes every window.
    """

    @override
    def build(self, resume_state: None) -> ClockLogic[Any, None]:
        return _SystemClockLogic(utc_now)


class _EventClockLogic(ClockLogic[V, tuple[datetime, datetime]]):
    """Watermark = `max_ts - wait + (system now - system time when max_ts was seen)`."""

    __slots__ = ("base", "now", "now_getter", "sys_max", "to_system", "ts_getter", "wait")

    def __init__(self, clock: EventClock[V], state: Optional[tuple[datetime, datetime]]) -> None:
        self.ts_getter = clock.ts_getter
        self.wait = clock.wait_for_system_duration
        self.now_getter = _now_getter_of(clock)
        self.to_system = clock.to_system_utc
        self.now = self.now_getter()
        if state is None:
            self.sys_max, self.base = self.now, UTC_MIN
        else:
            self.sys_max, self.base = state

    def watermark(self) -> datetime:
        try:
            return self.base + (self.now - self.sys_max)
        except OverflowError:
            return UTC_MAX

    @override
    def before_batch(self) -> None:
        now = self.now_getter()
        if now > self.now:  # the system clock may step back: hold the watermark
            self.now = now

    @override
    def on_item(self, value: V) -> tuple[datetime, datetime]:
        ts = self.ts_getter(value)
        wm = self.watermark()
        try:
            cand = ts - self.wait
        except OverflowError:  # the watermark would be before UTC_MIN: it stays where it is
            return (ts, wm)
        if cand > wm:
            self.base = cand
            self.sys_max = self.now
            return (ts, cand)
        return (ts, wm)

    @override
    def on_notify(self) -> datetime:
        self.before_batch()
        return self.watermark()

    @override
    def on_eof(self) -> datetime:
        return UTC_MAX

    @override
    def to_system_utc(self, timestamp: datetime) -> Optional[datetime]:
        return _event_system_time(self.to_system, self.sys_max, self.base, timestamp)

    @override
    def snapshot(self) -> tuple[datetime, datetime]:
        return (self.sys_max, self.base)


def _event_system_time(
    to_system: Callable[[datetime], Optional[datetime]], sys_max: datetime, base: datetime, t: datetime
) -> Optional[datetime]:
    # The user's mapping, but never before the system time at which the watermark
    # really reaches `t`: waking earlier could do nothing and would wake again at once.
    at = to_system(t)
    if at is None:
        return None
    try:
        exact = sys_max + (t - base)
    except OverflowError:
        return None  # the watermark never gets there (e.g. an infinite wait)
    return exact if exact > at else at


def _identity_time(t: datetime) -> Optional[datetime]:
    return t


_coarse: list[Any] = [-(10**18), UTC_MIN]  # [monotonic ns, utc time read then]


def _coarse_utc_now(_t: Any = _time, _mono: Callable[[], int] = time.monotonic_ns, _c: list[Any] = _coarse) -> datetime:
    # `utc_now`, reading the real clock at most once per millisecond (datetime.now
    # costs about a microsecond, more than the rest of a value's processing).
    getter = _t._getter
    if getter is not None:
        return getter()
    mono = _mono()
    if mono - _c[0] < 1_000_000:
        return _c[1]
    now = datetime.now(timezone.utc)
    _c[0] = mono
    _c[1] = now
    return now


def _now_getter_of(clock: EventClock[Any]) -> Callable[[], datetime]:
    return _coarse_utc_now if clock.now_getter is utc_now else clock.now_getter


@dataclass
class EventClock(Clock[V, tuple[datetime, datetime]]):
    """Use a timestamp carried by each value.

    The watermark is the largest timestamp seen minus `wait_for_system_duration`,
    plus the system time elapsed since that timestamp was seen. Values that are
    out of order by less than the wait are on time; older ones are late.

    Args:
        ts_getter: `ts_getter(value) -> aware UTC datetime`.
        wait_for_system_duration: How long to wait for out-of-order values.
        now_getter: The system time (default `flowspark._time.utc_now`).
        to_system_utc: Maps a timestamp to the system time at which to wake up and
            close windows (`None`: only new values or end of input close them).
            Flowspark never wakes before the watermark can have reached it.
    """

    ts_getter: Callable[[V], datetime]
    wait_for_system_duration: timedelta
    now_getter: Callable[[], datetime] = utc_now
    to_system_utc: Callable[[datetime], Optional[datetime]] = _identity_time

    def __post_init__(self) -> None:
        if not callable(self.ts_getter):
            msg = f"EventClock: ts_getter must be callable; received {self.ts_getter!r}"
            raise FlowsparkTypeError(msg)
        _td("EventClock: wait_for_system_duration", self.wait_for_system_duration, positive=False)

    @override
    def build(self, resume_state: Optional[tuple[datetime, datetime]]) -> ClockLogic[V, tuple[datetime, datetime]]:
        return _EventClockLogic(self, resume_state)


# ---------------------------------------------------------------------------
# Windowers
# ---------------------------------------------------------------------------


class WindowerLogic(ABC, Generic[S]):
    """Per-key window bookkeeping: which windows a timestamp falls in, and when they close."""

    @abstractmethod
    def open_for(self, timestamp: datetime) -> Iterable[int]:
        """Open (or reuse) and return the ids of the windows an on-time timestamp falls in.

        Args:
            timestamp: An on-time timestamp.

        Returns:
            Window ids.
        """

    @abstractmethod
    def late_for(self, timestamp: datetime) -> Iterable[int]:
        """Return the ids of the windows a late timestamp would have fallen in.

        Args:
            timestamp: A late timestamp.

        Returns:
            Window ids.
        """

    @abstractmethod
    def merged(self) -> Iterable[tuple[int, int]]:
        """Return and forget the `(original_id, into_id)` merges since the last call.

        Returns:
            Merges, in the order they happened.
        """

    @abstractmethod
    def close_for(self, watermark: datetime) -> Iterable[tuple[int, WindowMetadata]]:
        """Close and forget the windows the watermark has passed.

        Args:
            watermark: The watermark.

        Returns:
            `(window_id, metadata)` of each closed window.
        """

    @abstractmethod
    def notify_at(self) -> Optional[datetime]:
        """Return the watermark at which the next window will close, or `None`.

        Returns:
            A time in the clock's time.
        """

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether no window is open (then the key's state can be released).

        Returns:
            True if empty.
        """

    @abstractmethod
    def snapshot(self) -> S:
        """Return picklable, immutable state.

        Returns:
            State.
        """


class Windower(ABC, Generic[S]):
    """A kind of window; builds one `WindowerLogic` per key."""

    @abstractmethod
    def build(self, resume_state: Optional[S]) -> WindowerLogic[S]:
        """Build the logic for a key.

        Args:
            resume_state: A snapshot of a previous logic, or `None`.

        Returns:
            The logic.
        """


class _SlidingWindowerLogic(WindowerLogic[list[int]]):
    __slots__ = ("align_to", "length", "offset", "opened")

    def __init__(self, length: timedelta, offset: timedelta, align_to: datetime, opened: Optional[list[int]]):
        self.length = length
        self.offset = offset
        self.align_to = align_to
        self.opened: set[int] = set(opened) if opened else set()

    def ids_for(self, timestamp: datetime) -> range:
        d = timestamp - self.align_to
        return range((d - self.length) // self.offset + 1, d // self.offset + 1)

    def meta_for(self, window_id: int) -> WindowMetadata:
        open_time = self.align_to + self.offset * window_id
        return WindowMetadata(open_time, open_time + self.length)

    @override
    def open_for(self, timestamp: datetime) -> Iterable[int]:
        ids = self.ids_for(timestamp)
        self.opened.update(ids)
        return ids

    @override
    def late_for(self, timestamp: datetime) -> Iterable[int]:
        return self.ids_for(timestamp)

    @override
    def merged(self) -> Iterable[tuple[int, int]]:
        return ()

    @override
    def close_for(self, watermark: datetime) -> Iterable[tuple[int, WindowMetadata]]:
        if not self.opened:
            return ()
        last = (watermark - self.align_to - self.length) // self.offset
        closed = sorted(i for i in self.opened if i <= last)
        for i in closed:
            self.opened.discard(i)
        return [(i, self.meta_for(i)) for i in closed]

    @override
    def notify_at(self) -> Optional[datetime]:
        if not self.opened:
            return None
        return self.align_to + self.offset * min(self.opened) + self.length

    @override
    def is_empty(self) -> bool:
        return not self.opened

    @override
    def snapshot(self) -> list[int]:
        return sorted(self.opened)


@dataclass
class SlidingWindower(Windower[list[int]]):
    """Fixed-length windows that start every `offset`; they overlap when `offset < length`.

    Window `i` is `[align_to + i * offset, align_to + i * offset + length)` (open
    inclusive, close exclusive); ids before `align_to` are negative. A window
    closes when the watermark reaches its close time.

    Args:
        length: Length of each window.
        offset: Time between the starts of consecutive windows (`<= length`).
        align_to: An instant at which a window starts (aware UTC).
    """

    length: timedelta
    offset: timedelta
    align_to: datetime

    def __post_init__(self) -> None:
        _td("SlidingWindower: length", self.length, positive=True)
        _td("SlidingWindower: offset", self.offset, positive=True)
        _aware("SlidingWindower: align_to", self.align_to)
        if self.offset > self.length:
            msg = (
                f"SlidingWindower: offset ({self.offset}) can't be longer than length ({self.length}); "
                "there would be gaps between windows that lose values"
            )
            raise FlowsparkBuildError(msg)

    @override
    def build(self, resume_state: Optional[list[int]]) -> WindowerLogic[list[int]]:
        return _SlidingWindowerLogic(self.length, self.offset, self.align_to, resume_state)


@dataclass
class TumblingWindower(Windower[list[int]]):
    """Back-to-back fixed-length windows; each timestamp falls in exactly one.

    Window `i` is `[align_to + i * length, align_to + (i + 1) * length)` (open
    inclusive, close exclusive); ids before `align_to` are negative.

    Args:
        length: Length of each window.
        align_to: An instant at which a window starts (aware UTC).
    """

    length: timedelta
    align_to: datetime

    def __post_init__(self) -> None:
        _td("TumblingWindower: length", self.length, positive=True)
        _aware("TumblingWindower: align_to", self.align_to)

    @override
    def build(self, resume_state: Optional[list[int]]) -> WindowerLogic[list[int]]:
        return _SlidingWindowerLogic(self.length, self.length, self.align_to, resume_state)


class _SessionWindowerLogic(WindowerLogic[tuple[int, dict[int, tuple[datetime, datetime, list[int]]]]]):
    __slots__ = ("gap", "max_id", "merge_queue", "sessions")

    def __init__(self, gap: timedelta, state: Optional[tuple[int, dict[int, tuple[datetime, datetime, list[int]]]]]):
        self.gap = gap
        self.merge_queue: list[tuple[int, int]] = []
        self.sessions: dict[int, WindowMetadata] = {}
        if state is None:
            self.max_id = LATE_SESSION_ID
        else:
            self.max_id = state[0]
            for wid, (o, c, merged) in state[1].items():
                self.sessions[wid] = WindowMetadata(o, c, set(merged))

    def _find_merges(self) -> None:
        sessions = self.sessions
        if len(sessions) < 2:
            return
        ordered = sorted(sessions.items(), key=lambda im: (im[1].open_time, im[0]))
        last_id, last = ordered[0]
        gap = self.gap
        for this_id, this in ordered[1:]:
            if this.open_time - last.close_time <= gap:
                if this.close_time > last.close_time:
                    last.close_time = this.close_time
                last.merged_ids.add(this_id)
                last.merged_ids |= this.merged_ids
                self.merge_queue.append((this_id, last_id))
                del sessions[this_id]
            else:
                last_id, last = this_id, this

    @override
    def open_for(self, timestamp: datetime) -> Iterable[int]:
        gap = self.gap
        for wid, meta in self.sessions.items():
            until_open = meta.open_time - timestamp
            since_close = timestamp - meta.close_time
            if until_open <= ZERO_TD and since_close <= ZERO_TD:
                return (wid,)
            if ZERO_TD < until_open <= gap:
                meta.open_time = timestamp
                self._find_merges()
                return (wid,)
            if ZERO_TD < since_close <= gap:
                meta.close_time = timestamp
                self._find_merges()
                return (wid,)
        self.max_id += 1
        self.sessions[self.max_id] = WindowMetadata(timestamp, timestamp)
        return (self.max_id,)

    @override
    def late_for(self, timestamp: datetime) -> Iterable[int]:
        return (LATE_SESSION_ID,)

    @override
    def merged(self) -> Iterable[tuple[int, int]]:
        q = self.merge_queue
        self.merge_queue = []
        return q

    @override
    def close_for(self, watermark: datetime) -> Iterable[tuple[int, WindowMetadata]]:
        if not self.sessions:
            return ()
        try:
            close_before = watermark - self.gap
        except OverflowError:
            return ()
        closed = sorted(wid for wid, meta in self.sessions.items() if meta.close_time < close_before)
        return [(wid, self.sessions.pop(wid)) for wid in closed]

    @override
    def notify_at(self) -> Optional[datetime]:
        if not self.sessions:
            return None
        try:
            # The first watermark strictly past `close + gap`.
            return min(m.close_time for m in self.sessions.values()) + self.gap + _ONE_US
        except OverflowError:
            return None

    @override
    def is_empty(self) -> bool:
        return not self.sessions and not self.merge_queue

    @override
    def snapshot(self) -> tuple[int, dict[int, tuple[datetime, datetime, list[int]]]]:
        return (
            self.max_id,
            {wid: (m.open_time, m.close_time, sorted(m.merged_ids)) for wid, m in self.sessions.items()},
        )


@dataclass
class SessionWindower(Windower[Any]):
    """Per-key sessions of activity separated by more than `gap` of inactivity.

    A value within `gap` (inclusive) of a session joins it; sessions that come
    within `gap` of each other merge into the one that opened first (its
    `WindowMetadata.merged_ids` lists the others). A session closes when the
    watermark is more than `gap` past its last value. Session ids count from 0
    per key; late values get `LATE_SESSION_ID`.

    Args:
        gap: Inactivity that ends a session (not negative).
    """

    gap: timedelta

    def __post_init__(self) -> None:
        _td("SessionWindower: gap", self.gap, positive=False)

    @override
    def build(self, resume_state: Optional[Any]) -> WindowerLogic[Any]:
        return _SessionWindowerLogic(self.gap, resume_state)


# ---------------------------------------------------------------------------
# Window logic and the generic driver
# ---------------------------------------------------------------------------


class WindowLogic(ABC, Generic[V, W, S]):
    """The state of one window of one key; `window` builds one per window."""

    @abstractmethod
    def on_value(self, value: V) -> Iterable[W]:
        """Add a value (in timestamp order when `ordered=True`).

        Args:
            value: The value.

        Returns:
            Values to emit now (wrapped with key and window id).
        """

    @abstractmethod
    def on_merge(self, original: Self) -> Iterable[W]:
        """Absorb the state of `original`, a window merged into this one (sessions only).

        Args:
            original: The window merged away; it is dropped afterwards.

        Returns:
            Values to emit now.
        """

    @abstractmethod
    def on_close(self) -> Iterable[W]:
        """Called once when the window closes; the logic is dropped afterwards.

        Returns:
            Values to emit now.
        """

    @abstractmethod
    def snapshot(self) -> S:
        """Return picklable, immutable state; the builder gets it back on resume.

        Returns:
            State.
        """


def _ts_key(entry: tuple[Any, datetime]) -> datetime:
    return entry[1]


class _WindowLogic(StatefulBatchLogic[V, tuple[int, int, Any], tuple[Any, Any, dict[int, Any], list[Any]]]):
    """Drives any clock, windower and `WindowLogic` for one key."""

    __slots__ = ("builder", "clock", "last_wm", "logics", "ordered", "queue", "step_id", "windower")

    def __init__(
        self,
        step_id: str,
        clock: ClockLogic[V, Any],
        windower: WindowerLogic[Any],
        builder: Callable[[Optional[Any]], WindowLogic[V, Any, Any]],
        ordered: bool,
        logics: dict[int, WindowLogic[V, Any, Any]],
        queue: list[tuple[V, datetime]],
    ) -> None:
        self.step_id = step_id
        self.clock = clock
        self.windower = windower
        self.builder = builder
        self.ordered = ordered
        self.logics = logics
        self.queue = queue
        self.last_wm = UTC_MIN

    def _advance(self, wm: datetime) -> datetime:
        if wm < self.last_wm:
            return self.last_wm  # a custom clock regressed: hold the watermark
        self.last_wm = wm
        return wm

    def _new(self, wid: int) -> WindowLogic[V, Any, Any]:
        logic = self.builder(None)
        if not isinstance(logic, WindowLogic):
            msg = f"step {self.step_id!r}: the window builder must return a WindowLogic; returned {logic!r}"
            raise FlowsparkTypeError(msg)
        self.logics[wid] = logic
        return logic

    def _flush(self, wm: datetime, events: list[Any]) -> None:
        queue = self.queue
        if queue:
            if self.ordered:
                due = [e for e in queue if e[1] <= wm]
                if due:
                    self.queue = [e for e in queue if e[1] > wm]
                    due.sort(key=_ts_key)
            else:
                due = queue
                self.queue = []
            logics = self.logics
            open_for = self.windower.open_for
            for value, ts in due:
                for wid in open_for(ts):
                    logic = logics.get(wid)
                    if logic is None:
                        logic = self._new(wid)
                    for w in logic.on_value(value):
                        events.append((_E, wid, w))
        for orig, into in self.windower.merged():
            if orig == into:
                continue
            consumed = self.logics.pop(orig, None)
            if consumed is None:  # a custom windower merged a window that got no value
                continue
            target = self.logics.get(into)
            if target is None:
                self.logics[into] = consumed
                continue
            for w in target.on_merge(consumed):
                events.append((_E, into, w))
        for wid, meta in self.windower.close_for(wm):
            logic = self.logics.pop(wid, None)
            if logic is not None:
                for w in logic.on_close():
                    events.append((_E, wid, w))
            events.append((_M, wid, meta))

    def _empty(self) -> bool:
        return not self.logics and not self.queue and self.windower.is_empty()

    def _diagnose(self, value: V) -> None:
        clock = self.clock
        if isinstance(clock, _EventClockLogic):
            ts = clock.ts_getter(value)
            if not isinstance(ts, datetime) or ts.tzinfo is None:
                raise _bad_timestamp(self.step_id, ts, value) from None

    @override
    def on_batch(self, values: list[V]) -> tuple[list[Any], bool]:
        clock = self.clock
        clock.before_batch()
        events: list[Any] = []
        on_item = clock.on_item
        queue = self.queue
        wm = self.last_wm
        for value in values:
            try:
                ts, wm = on_item(value)
                late = ts < wm
            except TypeError:
                self._diagnose(value)
                raise
            if late:
                for wid in self.windower.late_for(ts):
                    events.append((_L, wid, value))
            else:
                queue.append((value, ts))
        self._flush(self._advance(wm), events)
        return (events, self._empty())

    @override
    def on_notify(self) -> tuple[list[Any], bool]:
        events: list[Any] = []
        self._flush(self._advance(self.clock.on_notify()), events)
        return (events, self._empty())

    @override
    def on_eof(self) -> tuple[list[Any], bool]:
        events: list[Any] = []
        self._flush(self._advance(self.clock.on_eof()), events)
        return (events, self._empty())

    @override
    def notify_at(self) -> Optional[datetime]:
        at = self.windower.notify_at()
        if self.ordered and self.queue:
            q = min(ts for _v, ts in self.queue)
            if at is None or q < at:
                at = q
        if at is None:
            return None
        return self.clock.to_system_utc(at)

    @override
    def snapshot(self) -> tuple[Any, Any, dict[int, Any], list[Any]]:
        return (
            self.clock.snapshot(),
            self.windower.snapshot(),
            {wid: logic.snapshot() for wid, logic in self.logics.items()},
            list(self.queue),
        )


def _unwrapper(tag: int) -> Callable[[list[Any]], list[Any]]:
    def unwrap(items: list[Any]) -> list[Any]:
        return [(k, (ev[1], ev[2])) for k, ev in items if ev[0] == tag]

    return unwrap


def closed_window_events(facts: WindowCount, wid: int, n: int) -> tuple[tuple[int, int, Any], tuple[int, int, Any]]:
    """The events a window count (`ir.WindowCount`) emits when window `wid` closes with count `n`.

    For a runtime that computes the counts itself (the Spark batch aggregate): the value
    `(wid, n)` for `down`, then the window's `WindowMetadata` for `meta`, as the step emits them.

    Args:
        facts: The step's window count.
        wid: The window id.
        n: The number of its values on time.

    Returns:
        The two events.
    """
    opened = facts.align_to + facts.offset * wid
    return (_E, wid, n), (_M, wid, WindowMetadata(opened, opened + facts.length))


def _split(
    events: KeyedStream[Any], counts: Optional[tuple[Clock[Any, Any], Windower[Any]]] = None
) -> WindowOut[Any, Any]:
    """The three streams of a window step's events.

    `counts`: the step counts values per window with this clock and windower (`count_window`,
    `fold_window` with a count's builder and folder); the IR says so (`ir.WindowCount`) when it
    is an `EventClock` with tumbling or sliding windows.
    """
    down = op.flat_map_batch("unwrap_down", events, _unwrapper(_E))
    late = op.flat_map_batch("unwrap_late", events, _unwrapper(_L))
    meta = op.flat_map_batch("unwrap_meta", events, _unwrapper(_M))
    if counts is not None and _fast_fold_ok(*counts):
        clock, windower = counts
        assert isinstance(clock, EventClock)
        assert isinstance(windower, (TumblingWindower, SlidingWindower))
        facts = WindowCount(
            column_of(clock.ts_getter),
            clock.now_getter is utc_now,
            clock.wait_for_system_duration,
            windower.length,
            _offset_of(windower),
            windower.align_to,
            late.stream_id,
        )
        op._declare(events, window_count=facts)
    return WindowOut(down, late, meta)


def _check_common(step_id: str, up: Any, clock: Any, windower: Any) -> None:
    op._check_stream(step_id, "up", up)
    if not isinstance(clock, Clock):
        msg = (
            f"step {step_id!r}: clock must be a Clock such as EventClock(...) or SystemClock(); "
            f"received {clock!r} of type {type(clock).__name__}"
        )
        raise FlowsparkTypeError(msg)
    if not isinstance(windower, Windower):
        msg = (
            f"step {step_id!r}: windower must be a Windower such as TumblingWindower(...), "
            f"SlidingWindower(...) or SessionWindower(...); received {windower!r} of type {type(windower).__name__}"
        )
        raise FlowsparkTypeError(msg)


def _check_callable(step_id: str, name: str, fn: Any) -> None:
    if not callable(fn):
        msg = (
            f"step {step_id!r}: {name} must be callable; received {fn!r} of type "
            f"{type(fn).__name__}; pass a function or lambda"
        )
        raise FlowsparkTypeError(msg)


@operator
def window(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    builder: Callable[[Optional[S]], WindowLogic[V, W, S]],
    ordered: bool = True,
) -> WindowOut[V, W]:
    """Run a `WindowLogic` per window of each key (the general windowing operator).

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        clock: Timestamps and watermark (one clock logic per key).
        windower: Which windows a timestamp falls in and when they close.
        builder: `builder(resume_state_or_None) -> WindowLogic`, called for each new window.
        ordered: Apply values in timestamp order, holding each until the watermark
            reaches it (default); otherwise in arrival order, at once.

    Returns:
        `WindowOut`: what the logics emit, late values and closed windows' metadata.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> class First(win.WindowLogic):
        ...     def __init__(self): self.first = None
        ...     def on_value(self, v):
        ...         if self.first is None: self.first = v; return [v]
        ...         return []
        ...     def on_merge(self, other): return []
        ...     def on_close(self): return []
        ...     def snapshot(self): return self.first
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", t0), ("a", t0 + timedelta(seconds=1))]))
        >>> clock = win.EventClock(lambda t: t, timedelta(0))
        >>> w = win.window("first", s, clock, win.TumblingWindower(timedelta(minutes=1), t0), lambda _s: First())
        >>> out = []; op.output("out", w.down, TestingSink(out)); run_main(flow); out
        [('a', (0, datetime.datetime(2024, 1, 1, 0, 0, tzinfo=datetime.timezone.utc)))]
    """
    _check_common(step_id, up, clock, windower)
    _check_callable(step_id, "builder", builder)
    return _split(_window_events(step_id, up, clock, windower, builder, ordered))


def _window_events(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    builder: Callable[[Optional[S]], WindowLogic[V, W, S]],
    ordered: bool,
) -> KeyedStream[Any]:
    def shim_builder(resume: Optional[tuple[Any, Any, dict[int, Any], list[Any]]]) -> _WindowLogic[V]:
        if resume is None:
            return _WindowLogic(step_id, clock.build(None), windower.build(None), builder, ordered, {}, [])
        clock_state, windower_state, logic_states, queue = resume
        logics = {wid: builder(s) for wid, s in logic_states.items()}
        return _WindowLogic(
            step_id, clock.build(clock_state), windower.build(windower_state), builder, ordered, logics, list(queue)
        )

    return op.stateful_batch("stateful_batch", up, shim_builder)


# ---------------------------------------------------------------------------
# fold_window and its fast path
# ---------------------------------------------------------------------------


class _FoldWindowLogic(WindowLogic[V, S, S]):
    __slots__ = ("folder", "merger", "state")

    def __init__(self, folder: Callable[[S, V], S], merger: Callable[[S, S], S], state: S) -> None:
        self.folder = folder
        self.merger = merger
        self.state = state

    @override
    def on_value(self, value: V) -> Iterable[S]:
        self.state = self.folder(self.state, value)
        return ()

    @override
    def on_merge(self, original: Self) -> Iterable[S]:
        self.state = self.merger(self.state, original.state)
        return ()

    @override
    def on_close(self) -> Iterable[S]:
        return (self.state,)

    @override
    def snapshot(self) -> S:
        return copy.deepcopy(self.state)


_MISSING: Any = object()
#: Immutable types whose values a snapshot may share (see `_FastFoldLogic.snapshot`).
_ATOMIC = frozenset({int, float, bool, str, bytes, type(None)})


class _FastFoldLogic(StatefulBatchLogic[V, tuple[int, int, Any], tuple[Any, ...]]):
    """`fold_window` for `EventClock` with tumbling or sliding windows, without per-window objects.

    Same results as `_WindowLogic` + `_FoldWindowLogic` (tests compare them): the
    clock and the windower are inlined, window accumulators live in one dict, the
    current tumbling window's bounds are cached (no division per value), and the
    ordered queue is kept sorted as values arrive (mostly an append).
    """

    __slots__ = (
        "accs",
        "align",
        "base",
        "builder",
        "cur_close",
        "cur_open",
        "cur_wid",
        "folder",
        "length",
        "lo_close",
        "now",
        "now_getter",
        "offset",
        "ordered",
        "qmin",
        "queue",
        "step_id",
        "sys_max",
        "to_system",
        "ts_getter",
        "tumbling",
        "wait",
    )

    def __init__(
        self,
        step_id: str,
        clock: EventClock[V],
        length: timedelta,
        offset: timedelta,
        align_to: datetime,
        builder: Callable[[], S],
        folder: Callable[[S, V], S],
        ordered: bool,
        resume: Optional[tuple[Any, ...]],
    ) -> None:
        self.step_id = step_id
        self.ts_getter = clock.ts_getter
        self.wait = clock.wait_for_system_duration
        self.now_getter = _now_getter_of(clock)
        self.to_system = None if clock.to_system_utc is _identity_time else clock.to_system_utc
        self.length = length
        self.offset = offset
        self.tumbling = length == offset
        self.align = align_to
        self.builder = builder
        self.folder = folder
        self.ordered = ordered
        self.now = self.now_getter()
        self.accs: dict[int, Any]
        self.queue: list[tuple[V, datetime]]
        if resume is None:
            self.sys_max, self.base = self.now, UTC_MIN
            self.accs = {}
            self.queue = []
        else:
            self.sys_max, self.base, accs, queue = resume
            self.accs = dict(accs)
            self.queue = sorted(queue, key=_ts_key) if queue else []
        # Rebuilt once per key and micro-batch by a streaming runtime: no generator or call here.
        self.qmin = self.queue[0][1] if self.queue else UTC_MAX
        self.cur_wid = 0
        self.cur_open = self.cur_close = UTC_MAX  # no cached window yet
        # The close time of the oldest open window.
        self.lo_close = align_to + offset * min(self.accs) + length if self.accs else UTC_MAX

    def _watermark(self) -> datetime:
        try:
            return self.base + (self.now - self.sys_max)
        except OverflowError:
            return UTC_MAX

    def _ids(self, ts: datetime) -> range:
        d = ts - self.align
        if self.tumbling:
            i = d // self.length
            return range(i, i + 1)
        return range((d - self.length) // self.offset + 1, d // self.offset + 1)

    def _apply(self, value: V, ts: datetime) -> None:
        accs = self.accs
        if self.tumbling:
            if self.cur_open <= ts < self.cur_close:
                wid = self.cur_wid
            else:
                wid = (ts - self.align) // self.length
                self.cur_wid = wid
                self.cur_open = open_time = self.align + self.length * wid
                self.cur_close = close = open_time + self.length
                if wid not in accs and close < self.lo_close:
                    self.lo_close = close
            acc = accs.get(wid, _MISSING)
            accs[wid] = self.folder(self.builder() if acc is _MISSING else acc, value)
            return
        d = ts - self.align
        for wid in range((d - self.length) // self.offset + 1, d // self.offset + 1):
            acc = accs.get(wid, _MISSING)
            if acc is _MISSING:
                acc = self.builder()
                close = self.align + self.offset * wid + self.length
                if close < self.lo_close:
                    self.lo_close = close
            accs[wid] = self.folder(acc, value)

    def _flush_due(self, wm: datetime) -> None:
        # The queue is kept sorted by timestamp (ties in arrival order): apply its due head.
        queue = self.queue
        n = len(queue)
        i = 0
        accs, folder, apply, tumbling = self.accs, self.folder, self._apply, self.tumbling
        while i < n:
            value, ts = queue[i]
            if ts > wm:
                break
            i += 1
            if tumbling and self.cur_open <= ts < self.cur_close:
                wid = self.cur_wid
                accs[wid] = folder(accs[wid], value)
            else:
                apply(value, ts)
        del queue[:i]
        self.qmin = queue[0][1] if queue else UTC_MAX

    def _close(self, wm: datetime, events: list[Any]) -> None:
        # Close windows oldest first while their close time has passed; few are open.
        accs = self.accs
        align, offset, length = self.align, self.offset, self.length
        self.lo_close = UTC_MAX
        while accs:
            wid = min(accs)
            open_time = align + offset * wid
            close = open_time + length
            if close > wm:
                self.lo_close = close
                break
            events.append((_E, wid, accs.pop(wid)))
            events.append((_M, wid, WindowMetadata(open_time, close)))
        self.cur_open = self.cur_close = UTC_MAX

    def _finish(self, wm: datetime, events: list[Any]) -> tuple[list[Any], bool]:
        if self.qmin <= wm:
            self._flush_due(wm)
        if wm >= self.lo_close:
            self._close(wm, events)
        return (events, not self.accs and not self.queue)

    def _batch_start(self) -> tuple[datetime, datetime]:
        """`(now, watermark)` at the start of a batch; queued values system time alone made due are applied."""
        now = self.now_getter()
        if now > self.now:
            self.now = now
        else:
            now = self.now
        sys_max = self.sys_max
        if now is sys_max:
            return now, self.base
        try:
            wm = self.base + (now - sys_max)
        except OverflowError:
            wm = UTC_MAX
        if self.qmin <= wm:  # system time alone moved the watermark past queued values
            self._flush_due(wm)
        return now, wm

    @override
    def on_batch(self, values: list[V]) -> tuple[list[Any], bool]:
        # The hot loop: the same steps as `_WindowLogic` with `_FoldWindowLogic`, inlined.
        now, wm = self._batch_start()
        events: list[Any] = []
        ts_getter = self.ts_getter
        wait = self.wait
        waits = wait > ZERO_TD
        ordered = self.ordered
        tumbling = self.tumbling
        accs = self.accs
        folder = self.folder
        advanced = False
        for value in values:
            ts = ts_getter(value)
            try:
                cand = ts - wait
                if cand > wm:
                    # The newest value so far: it moves the watermark to `ts - wait`, so it
                    # is on time, and due at once only if there is no wait.
                    wm = cand
                    advanced = True
                    if self.qmin <= wm:
                        queue = self.queue
                        if len(queue) == 1:  # the common case: the previous value became due
                            v0, t0 = queue[0]
                            queue.clear()
                            self.qmin = UTC_MAX
                            if tumbling and self.cur_open <= t0 < self.cur_close:
                                wid = self.cur_wid
                                accs[wid] = folder(accs[wid], v0)
                            else:
                                self._apply(v0, t0)
                        else:
                            self._flush_due(wm)
                    late = False
                    hold = ordered and waits
                else:
                    late = ts < wm
                    hold = ordered and ts > wm
            except OverflowError:
                late = ts < wm
                hold = ordered and ts > wm
            except TypeError:
                raise _bad_timestamp(self.step_id, ts, value) from None
            if late:
                for wid in self._ids(ts):
                    events.append((_L, wid, value))
            elif hold:
                queue = self.queue
                if not queue or ts >= queue[-1][1]:
                    queue.append((value, ts))
                else:
                    bisect.insort_right(queue, (value, ts), key=_ts_key)
                if ts < self.qmin:
                    self.qmin = ts
            elif tumbling and self.cur_open <= ts < self.cur_close:
                wid = self.cur_wid
                accs[wid] = folder(accs[wid], value)
            else:
                self._apply(value, ts)
        if advanced:
            self.base = wm
            self.sys_max = now
        if wm >= self.lo_close:
            self._close(wm, events)
        return (events, not accs and not self.queue)

    @override
    def on_notify(self) -> tuple[list[Any], bool]:
        now = self.now_getter()
        if now > self.now:
            self.now = now
        return self._finish(self._watermark(), [])

    @override
    def on_eof(self) -> tuple[list[Any], bool]:
        return self._finish(UTC_MAX, [])

    @override
    def notify_at(self) -> Optional[datetime]:
        # Wake when the watermark reaches the first close: of an open window, or of the
        # first window a queued value will open. Queued values need no wake-up of their
        # own: folding them emits nothing, and `_finish` applies them before closing.
        # (The generic driver wakes for them; the emitted results and their timing are
        # the same, and the wake-up time changes only when windows open and close.)
        t = self.lo_close if self.accs else UTC_MAX
        if self.queue:
            q = self.qmin
            if self.cur_open <= q < self.cur_close:
                qclose = self.cur_close
            else:
                d = q - self.align
                first = (d - self.length) // self.offset + 1
                qclose = self.align + self.offset * first + self.length
            if qclose < t:
                t = qclose
        if t == UTC_MAX:
            return None
        if self.to_system is not None:
            return _event_system_time(self.to_system, self.sys_max, self.base, t)
        if self.base >= self.sys_max:  # then sys_max + (t - base) <= t
            return t
        try:
            return self.sys_max + (t - self.base)
        except OverflowError:
            return None

    @override
    def snapshot(self) -> tuple[Any, ...]:
        accs = self.accs
        # Accumulators of immutable atomic types (count_window's ints, sums) need no deep copy:
        # a copy of the dict is the same snapshot at a fifth of the cost.
        copied = dict(accs) if _ATOMIC.issuperset(map(type, accs.values())) else copy.deepcopy(accs)
        return (self.sys_max, self.base, copied, self.queue[:])


def _offset_of(windower: TumblingWindower | SlidingWindower) -> timedelta:
    """The time between the starts of consecutive windows (a tumbling window's length)."""
    return windower.offset if isinstance(windower, SlidingWindower) else windower.length


def _fast_fold_ok(clock: Clock[Any, Any], windower: Windower[Any]) -> bool:
    return type(clock) is EventClock and type(windower) in (TumblingWindower, SlidingWindower)


def _fold_events(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    builder: Callable[[], S],
    folder: Callable[[S, V], S],
    merger: Callable[[S, S], S],
    ordered: bool,
) -> KeyedStream[Any]:
    if _fast_fold_ok(clock, windower):
        assert isinstance(clock, EventClock)
        assert isinstance(windower, (TumblingWindower, SlidingWindower))
        length = windower.length
        offset = _offset_of(windower)
        align_to = windower.align_to

        def fast_builder(resume: Optional[tuple[Any, ...]]) -> _FastFoldLogic[V]:
            return _FastFoldLogic(step_id, clock, length, offset, align_to, builder, folder, ordered, resume)

        return op.stateful_batch("stateful_batch", up, fast_builder)

    def logic_builder(resume: Optional[S]) -> _FoldWindowLogic[V, S]:
        return _FoldWindowLogic(folder, merger, builder() if resume is None else resume)

    return _window_events(step_id, up, clock, windower, logic_builder, ordered)


@operator
def fold_window(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    builder: Callable[[], S],
    folder: Callable[[S, V], S],
    merger: Callable[[S, S], S],
    ordered: bool = True,
) -> WindowOut[V, S]:
    """Fold the values of each window into an accumulator; emit it when the window closes.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        clock: Time definition.
        windower: Window definition.
        builder: `builder() -> new accumulator`, called for each new window.
        folder: `folder(acc, value) -> acc`.
        merger: `merger(acc, acc_of_merged_window) -> acc` when session windows merge.
        ordered: Fold values in timestamp order (default) or in arrival order.

    Returns:
        `WindowOut`; `down` has `(key, (window_id, accumulator))` per closed window.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> items = [("a", (t0, 1)), ("a", (t0 + timedelta(seconds=30), 2)), ("a", (t0 + timedelta(minutes=1), 5))]
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource(items))
        >>> clock = win.EventClock(lambda tv: tv[0], timedelta(seconds=10))
        >>> w = win.fold_window("sum", s, clock, win.TumblingWindower(timedelta(minutes=1), t0),
        ...                     lambda: 0, lambda acc, tv: acc + tv[1], lambda a, b: a + b)
        >>> out = []; op.output("out", w.down, TestingSink(out)); run_main(flow); out
        [('a', (0, 3)), ('a', (1, 5))]
    """
    _check_common(step_id, up, clock, windower)
    for name, fn in (("builder", builder), ("folder", folder), ("merger", merger)):
        _check_callable(step_id, name, fn)
    counts = (clock, windower) if builder is reducers.zero and folder is reducers.count else None
    return _split(_fold_events(step_id, up, clock, windower, builder, folder, merger, ordered), counts)


def _list_folder(s: list[Any], v: Any) -> list[Any]:
    s.append(v)
    return s


def _set_folder(s: set[Any], v: Any) -> set[Any]:
    s.add(v)
    return s


def _list_merger(a: list[Any], b: list[Any]) -> list[Any]:
    return a + b


def _set_merger(a: set[Any], b: set[Any]) -> set[Any]:
    return a | b


def _dict_merger(a: dict[Any, Any], b: dict[Any, Any]) -> dict[Any, Any]:
    a.update(b)
    return a


@operator
def collect_window(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    into: type = list,
    ordered: bool = True,
) -> WindowOut[V, Any]:
    """Collect the values of each window into a `list`, `set` or `dict`.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream; for `dict`, values are `(dict_key, dict_value)` pairs.
        clock: Time definition.
        windower: Window definition.
        into: `list` (default), `set` or `dict`.
        ordered: Values in timestamp order (default) or in arrival order.

    Returns:
        `WindowOut`; `down` has `(key, (window_id, container))` per closed window.

    Raises:
        FlowsparkTypeError: `into` is not list, set or dict.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> items = [("a", (t0 + timedelta(seconds=5), "y")), ("a", (t0, "x"))]
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource(items))
        >>> clock = win.EventClock(lambda tv: tv[0], timedelta(seconds=10))
        >>> w = win.collect_window("c", s, clock, win.TumblingWindower(timedelta(minutes=1), t0))
        >>> w = op.map_value("names", w.down, lambda iv: (iv[0], [n for _t, n in iv[1]]))
        >>> out = []; op.output("out", w, TestingSink(out)); run_main(flow); out
        [('a', (0, ['x', 'y']))]
    """
    _check_common(step_id, up, clock, windower)
    builder: Callable[[], Any]
    folder: Callable[[Any, Any], Any]
    merger: Callable[[Any, Any], Any]
    if isinstance(into, type) and issubclass(into, list):
        builder, folder, merger = list, _list_folder, _list_merger
    elif isinstance(into, type) and issubclass(into, set):
        builder, folder, merger = set, _set_folder, _set_merger
    elif isinstance(into, type) and issubclass(into, dict):
        sid = step_id

        def dict_folder(d: dict[Any, Any], kv: Any) -> dict[Any, Any]:
            if type(kv) is not tuple or len(kv) != 2:
                msg = (
                    f"step {sid!r}: collect_window(into=dict) needs `(dict_key, dict_value)` 2-tuples as "
                    f"values; received {kv!r} of type {type(kv).__name__}; map values to pairs first"
                )
                raise FlowsparkTypeError(msg)
            d[kv[0]] = kv[1]
            return d

        builder, folder, merger = dict, dict_folder, _dict_merger
    else:
        msg = f"step {step_id!r}: collect_window into must be list, set or dict; received {into!r}"
        raise FlowsparkTypeError(msg)
    fold_events: Callable[..., KeyedStream[Any]] = _fold_events
    return _split(fold_events(step_id, up, clock, windower, builder, folder, merger, ordered))


def _count_folder(n: int, _v: Any) -> int:
    return n + 1


def _add(a: int, b: int) -> int:
    return a + b


def _zero() -> int:
    return 0


@operator
def count_window(
    step_id: str,
    up: Stream[X],
    clock: Clock[X, Any],
    windower: Windower[Any],
    key: Callable[[X], str],
) -> WindowOut[X, int]:
    """Count the items of an unkeyed stream per `key(item)` and window.

    Args:
        step_id: Unique id.
        up: Stream (not keyed).
        clock: Time definition (it sees the items).
        windower: Window definition.
        key: `key(item) -> str`.

    Returns:
        `WindowOut`; `down` has `(key, (window_id, count))` per closed window.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> items = [{"t": t0, "w": "x"}, {"t": t0, "w": "x"}, {"t": t0, "w": "y"}]
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource(items))
        >>> clock = win.EventClock(lambda e: e["t"], timedelta(0))
        >>> w = win.count_window("n", s, clock, win.TumblingWindower(timedelta(minutes=1), t0), lambda e: e["w"])
        >>> out = []; op.output("out", w.down, TestingSink(out)); run_main(flow); sorted(out)
        [('x', (0, 2)), ('y', (0, 1))]
    """
    _check_common(step_id, up, clock, windower)
    _check_callable(step_id, "key", key)
    keyed = op.key_on("keyed", up, key)
    return _split(_fold_events(step_id, keyed, clock, windower, _zero, _count_folder, _add, False), (clock, windower))


def _none() -> Any:
    return None


@operator
def reduce_window(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    reducer: Callable[[V, V], V],
) -> WindowOut[V, V]:
    """Reduce the values of each window; the first value starts the accumulator.

    Values are reduced in arrival order (as in Bytewax).

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        clock: Time definition.
        windower: Window definition.
        reducer: `reducer(acc, value) -> acc`; also merges session accumulators.

    Returns:
        `WindowOut`; `down` has `(key, (window_id, reduced))` per closed window.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", (t0, 2)), ("a", (t0, 3))]))
        >>> clock = win.EventClock(lambda tv: tv[0], timedelta(0))
        >>> w = win.reduce_window("r", s, clock, win.TumblingWindower(timedelta(minutes=1), t0),
        ...                       lambda a, b: (a[0], a[1] * b[1]))
        >>> out = []; op.output("out", w.down, TestingSink(out)); run_main(flow); [v[1][1][1] for v in out]
        [6]
    """
    _check_common(step_id, up, clock, windower)
    _check_callable(step_id, "reducer", reducer)

    def folder(s: Any, v: V) -> V:
        return v if s is None else reducer(s, v)

    return _split(_fold_events(step_id, up, clock, windower, _none, folder, reducer, False))


def _by_reducer(fn: Callable[..., Any], by: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    def reducer(a: Any, b: Any) -> Any:
        return fn(a, b, key=by)

    return reducer


@operator
def max_window(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    by: Callable[[V], Any] = op._identity,
) -> WindowOut[V, V]:
    """Emit the largest value (by `by(value)`) of each window.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        clock: Time definition.
        windower: Window definition.
        by: Sort key of a value.

    Returns:
        `WindowOut`; `down` has `(key, (window_id, max_value))` per closed window.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", (t0, 2)), ("a", (t0, 7)), ("a", (t0, 3))]))
        >>> clock = win.EventClock(lambda tv: tv[0], timedelta(0))
        >>> w = win.max_window("m", s, clock, win.TumblingWindower(timedelta(minutes=1), t0), by=lambda tv: tv[1])
        >>> out = []; op.output("out", w.down, TestingSink(out)); run_main(flow); out[0][1][1][1]
        7
    """
    _check_callable(step_id, "by", by)
    return reduce_window("reduce_window", up, clock, windower, _by_reducer(max, by))


@operator
def min_window(
    step_id: str,
    up: KeyedStream[V],
    clock: Clock[V, Any],
    windower: Windower[Any],
    by: Callable[[V], Any] = op._identity,
) -> WindowOut[V, V]:
    """Emit the smallest value (by `by(value)`) of each window.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        clock: Time definition.
        windower: Window definition.
        by: Sort key of a value.

    Returns:
        `WindowOut`; `down` has `(key, (window_id, min_value))` per closed window.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", (t0, 2)), ("a", (t0, 1))]))
        >>> clock = win.EventClock(lambda tv: tv[0], timedelta(0))
        >>> w = win.min_window("m", s, clock, win.TumblingWindower(timedelta(minutes=1), t0), by=lambda tv: tv[1])
        >>> out = []; op.output("out", w.down, TestingSink(out)); run_main(flow); out[0][1][1][1]
        1
    """
    _check_callable(step_id, "by", by)
    return reduce_window("reduce_window", up, clock, windower, _by_reducer(min, by))


# ---------------------------------------------------------------------------
# join_window
# ---------------------------------------------------------------------------


class _JoinWindowLogic(WindowLogic[tuple[int, Any], tuple[Any, ...], list[list[Any]]]):
    __slots__ = ("emit_mode", "insert_mode", "seen")

    def __init__(self, insert_mode: str, emit_mode: str, seen: list[list[Any]]) -> None:
        self.insert_mode = insert_mode
        self.emit_mode = emit_mode
        self.seen = seen

    def _rows(self) -> list[tuple[Any, ...]]:
        import itertools

        return list(itertools.product(*(vs if vs else [None] for vs in self.seen)))

    def _check_emit(self) -> Iterable[tuple[Any, ...]]:
        if self.emit_mode == "complete":
            if all(self.seen):
                rows = self._rows()
                for vs in self.seen:
                    vs.clear()
                return rows
            return ()
        if self.emit_mode == "running":
            return self._rows()
        return ()

    @override
    def on_value(self, value: tuple[int, Any]) -> Iterable[tuple[Any, ...]]:
        side, v = value
        mode = self.insert_mode
        if mode == "first":
            if not self.seen[side]:
                self.seen[side] = [v]
        elif mode == "last":
            self.seen[side] = [v]
        else:
            self.seen[side].append(v)
        return self._check_emit()

    @override
    def on_merge(self, original: Self) -> Iterable[tuple[Any, ...]]:
        # `self` is the session that opened first, so its values are the older ones.
        mode = self.insert_mode
        if mode == "first":
            self.seen = [mine if mine else theirs for mine, theirs in zip(self.seen, original.seen, strict=True)]
        elif mode == "last":
            self.seen = [theirs if theirs else mine for mine, theirs in zip(self.seen, original.seen, strict=True)]
        else:
            self.seen = [mine + theirs for mine, theirs in zip(self.seen, original.seen, strict=True)]
        return self._check_emit()

    @override
    def on_close(self) -> Iterable[tuple[Any, ...]]:
        if self.emit_mode == "final":
            return self._rows()
        return ()

    @override
    def snapshot(self) -> list[list[Any]]:
        return copy.deepcopy(self.seen)


def _side_ts_getter(getter: Callable[[Any], datetime]) -> Callable[[tuple[int, Any]], datetime]:
    def ts_getter(side_value: tuple[int, Any]) -> datetime:
        return getter(side_value[1])

    return ts_getter


@operator
def join_window(
    step_id: str,
    clock: Clock[Any, Any],
    windower: Windower[Any],
    *sides: KeyedStream[Any],
    insert_mode: JoinInsertMode = "last",
    emit_mode: JoinEmitMode = "final",
    ordered: bool = True,
) -> WindowOut[Any, tuple[Any, ...]]:
    """Join keyed streams per key and window; rows have one slot per side, in argument order.

    Args:
        step_id: Unique id.
        clock: Time definition; an `EventClock`'s `ts_getter` gets each side's values
            (other clocks get `(side_index, value)`).
        windower: Window definition.
        *sides: Keyed streams.
        insert_mode: `"first"`, `"last"` (default) or `"product"` values kept per side.
        emit_mode: `"final"` (default: when the window closes, missing sides `None`),
            `"complete"` (as soon as every side has a value, then clear) or `"running"`
            (on every value).
        ordered: Apply values in timestamp order (default) or in arrival order.

    Returns:
        `WindowOut`; `down` has `(key, (window_id, row))`; `late` has `(key, (window_id, (side, value)))`.

    Raises:
        FlowsparkBuildError: Unknown mode or no side.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> import flowspark.operators.windowing as win
        >>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        >>> flow = Dataflow("eg")
        >>> names = op.input("names", flow, TestingSource([("1", (t0, "ann"))]))
        >>> ages = op.input("ages", flow, TestingSource([("1", (t0, 31))]))
        >>> clock = win.EventClock(lambda tv: tv[0], timedelta(0))
        >>> w = win.join_window("j", clock, win.TumblingWindower(timedelta(minutes=1), t0), names, ages)
        >>> w = op.map_value("vals", w.down, lambda iv: (iv[0], tuple(tv[1] for tv in iv[1])))
        >>> out = []; op.output("out", w, TestingSink(out)); run_main(flow); out
        [('1', (0, ('ann', 31)))]
    """
    op._check_join_modes(step_id, insert_mode, emit_mode)
    if not sides:
        msg = f"step {step_id!r}: join_window needs at least one side"
        raise FlowsparkBuildError(msg)
    side_count = len(sides)
    merged = op._join_label_merge("add_names", *sides)
    _check_common(step_id, merged, clock, windower)
    if isinstance(clock, EventClock):
        clock = dataclasses.replace(clock, ts_getter=_side_ts_getter(clock.ts_getter))

    def builder(resume: Optional[list[list[Any]]]) -> _JoinWindowLogic:
        seen = resume if resume is not None else [[] for _ in range(side_count)]
        return _JoinWindowLogic(insert_mode, emit_mode, seen)

    return _split(_window_events(step_id, merged, clock, windower, builder, ordered))
