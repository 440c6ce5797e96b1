"""The in-memory executor's stateful step: its time model over the per-key driver.

`StatefulRuntime` drives a stateful step's keys through `flowspark.runtime.driver.StepDriver`
in Bytewax's order (each activation grouped by key in sorted key order, notifications in a
heap), or, with `clock="fixed"`, on the Spark batch runtime's per-key timeline; it checks
`roundtrip_state` (every touched key resumed from its pickled snapshot) and writes the
keys' snapshots for the recovery store. The stateless step runtimes are in
`flowspark.runtime.steps`.
"""

from __future__ import annotations

import heapq
import pickle
from datetime import datetime, timedelta
from typing import Any, Optional

from typing_extensions import override

from flowspark import ir
from flowspark.deadletter import record as dead_record
from flowspark.errors import FlowsparkRuntimeError
from flowspark.logic import StatefulBatchLogic
from flowspark.recovery import DELETED
from flowspark.runtime.bounds import SINGLES as _SINGLES
from flowspark.runtime.bounds import remap_bounds as _remap_bounds
from flowspark.runtime.driver import StepDriver, bad_item_error
from flowspark.runtime.steps import StepRuntime

__all__ = ["StatefulRuntime"]


class StatefulRuntime(StepRuntime):
    """A stateful step: the executor's time model over the per-key driver.

    With the system or logical clock, each activation's values go to `on_batch`
    grouped by key in sorted key order (`StepDriver.feed_grouped`) and
    notifications are kept in a heap (those due after a pass fire in sorted key
    order, then are re-read for every key touched). With `clock="fixed"` the step
    groups each activation by key the same way and follows the Spark batch runtime's
    per-key timeline (`StepDriver.drive`).
    """

    def __init__(
        self,
        node: ir.StatefulBatch,
        resume: dict[str, Any],
        track: bool,
        fixed_now: Optional[datetime] = None,
        roundtrip: bool = False,
        ttl: Optional[timedelta] = None,
    ) -> None:
        self.fixed_now = fixed_now
        #: The run's `state_ttl`, and each key's time of its last value, least recent first.
        self.ttl = ttl
        self.last: dict[str, datetime] = {}
        self.ttl_started = False
        self.step_id = node.step_id
        self.up = node.up
        self.down = node.down
        self.driver = StepDriver(node.step_id, node.builder)
        self.driver.store = "recovery directory (`python -m flowspark.recovery DIR COUNT`)"
        # The IR says whether this step's logics can ask for a notification at all
        # (`stateful_map`, `fold_final`, ... cannot): then nothing is ever scheduled.
        self.notifies = node.notifies
        self.logics: dict[str, StatefulBatchLogic[Any, Any, Any]] = {}
        self.sched: dict[str, datetime] = {}
        self.heap: list[tuple[datetime, str]] = []
        self.track = track
        self.touched_epoch: set[str] = set()
        self.eof_done = False
        #: With `clock="fixed"`: the keys the last pass woke (Bytewax fires a key's due
        #: notification after the next activation's items: `StepDriver.drive`'s `follows`).
        self.woke: set[str] = set()
        #: With `roundtrip_state`: the same step, never resumed, to compare with.
        self.reference = StatefulRuntime(node, resume, False, fixed_now, ttl=ttl) if roundtrip else None
        for key in sorted(resume):  # states an earlier run wrote to the recovery store
            self.logics[key] = self.driver.build(key, resume[key], resumed=True)
            self._schedule(key)

    def _schedule(self, key: str) -> None:
        logic = self.logics.get(key)
        at = None if logic is None else self.driver.notify_at(key, logic)
        if at is None:
            self.sched.pop(key, None)
        elif self.sched.get(key) != at:
            self.sched[key] = at
            heapq.heappush(self.heap, (at, key))

    def _emit(self, key: str, res: tuple[list[Any], bool], out: list[Any]) -> None:
        emits, discard = res
        out.extend([(key, w) for w in emits])
        if discard:
            del self.logics[key]

    @override
    def step(self, ex: Any) -> None:
        items = ex.take(self.up)
        bounds = ex.take_bounds(self.up) if items else None
        if items and ex.dead is not None:
            items, bounds = self._screen(ex.dead, items, bounds)
        out_ends: Optional[list[int]] = [] if self.down in ex.needs_bounds else None
        out, touched = self._process(ex, items, bounds, out_ends)
        if self.reference is not None:
            self._check_resumed(ex, items, bounds, out, touched)
        if self.track:
            self.touched_epoch.update(touched)
        if out:
            ex.emit(self.down, out, None if out_ends is None or len(out_ends) <= 1 else out_ends)
        self.eof = self.eof_done

    def _screen(self, dead: list[dict[str, Any]], items: list[Any], bounds: Any) -> tuple[list[Any], Any]:
        """Send items that are not `(str key, value)` to the dead letter; keep the others (and their bounds)."""
        ok = [isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str) for kv in items]
        if all(ok):
            return items, bounds
        kept: list[Any] = []
        for good, kv in zip(ok, items, strict=True):
            if good:
                kept.append(kv)
            else:
                dead.append(dead_record(self.step_id, bad_item_error(self.step_id, kv), kv))
        if bounds is not None and bounds is not _SINGLES:
            bounds = _remap_bounds(bounds, list(map(int, ok)))
        return kept, bounds

    def _process(
        self, ex: Any, items: list[Any], bounds: Any, out_ends: Optional[list[int]] = None
    ) -> tuple[list[Any], dict[str, None]]:
        out: list[Any] = []
        touched: dict[str, None] = {}
        if self.fixed_now is not None:
            self._step_fixed(ex, items, bounds, out, touched, out_ends)
        else:
            driver = self.driver
            expired = self._expire(ex.now()) if self.ttl is not None else ()
            if items:
                if bounds is _SINGLES:
                    driver.feed_singles(self.logics, items, out, touched, out_ends)
                else:
                    driver.feed_grouped(self.logics, items, bounds, out, touched, out_ends)
            if self.ttl is not None:
                now = ex.now()
                for key in touched:  # the keys that got values
                    self.last.pop(key, None)
                    self.last[key] = now
                for key in expired:
                    touched[key] = None
            if self.notifies and not self.eof_done:
                # After an activation's items, the notifications due by the schedule read at the
                # end of the earlier activations fire; each key awoken here (items, notification)
                # has its `notify_at` read after that, so a time its items make due fires in the
                # next activation: as in Bytewax.
                if self.heap:
                    self._on_notify(ex.now(), out, touched)
                for key in touched:
                    self._schedule(key)
                if ex.closing and self.heap:
                    # The epoch closes after this pass: Bytewax processes the closed epoch before
                    # the next activation's items, so what is due by then fires now (epoch_interval=0:
                    # every activation's notifications before the next one's items).
                    if out_ends is not None and len(out) != (out_ends[-1] if out_ends else 0):
                        out_ends.append(len(out))
                    self._notify_due(ex, out, touched)
            if self._eof_now(ex, items):
                self.eof_done = True
                for key in sorted(self.logics):
                    touched[key] = None
                    self._emit(key, driver.eof(key, self.logics[key]), out)
            # Notifications and end of input: one more activation (Bytewax's next wake-up).
            if out_ends is not None and len(out) != (out_ends[-1] if out_ends else 0):
                out_ends.append(len(out))
        return out, touched

    def _eof_now(self, ex: Any, items: list[Any]) -> bool:
        """Whether end of input reaches this step in this pass.

        In Bytewax a stateful step sees end of input in a later activation than the last
        items its upstream sent (the upstream's `on_eof` emits included). Where a pass is
        one activation (`one_batch_per_pass`: streams merge downstream), a pass that
        brought items therefore leaves end of input to the next pass, so a `merge` below
        gets the items' emits and the `on_eof` emits apart, in that order. Otherwise the
        pass's activation bounds keep them apart (`out_ends`).
        """
        return not self.eof_done and ex.is_eof(self.up) and not (items and ex.one_batch_per_pass)

    def _expire(self, now: datetime) -> list[str]:
        """Drop the logics of keys that got no value for `ttl` (no `on_eof`, no notification); return their keys."""
        assert self.ttl is not None
        last = self.last
        if not self.ttl_started:  # keys resumed from a snapshot: the TTL counts from the first pass
            self.ttl_started = True
            for key in sorted(self.logics):
                last.setdefault(key, now)
        cut = now - self.ttl
        dropped: list[str] = []
        while last:
            key = next(iter(last))
            if last[key] > cut:
                break
            del last[key]
            if self.logics.pop(key, None) is not None:
                self.sched.pop(key, None)
                dropped.append(key)
        return dropped

    # -- roundtrip_state: resume every touched key from its pickled snapshot ----------
    def _check_resumed(self, ex: Any, items: list[Any], bounds: Any, out: list[Any], touched: dict[str, None]) -> None:
        """Compare with the reference (never resumed) logics, then resume every touched key.

        The Spark streaming runtime rebuilds each key's logic from its snapshot in every
        micro-batch; a builder that ignores `resume_state` or a snapshot that leaves state
        out then loses state there only. This mode makes the in-memory executor do the same
        after every pass and fail, naming the step and the key, as soon as the resumed logics
        emit something else than the live ones.
        """
        assert self.reference is not None
        want, _ = self.reference._process(ex, items, bounds)
        if want != out and not _same_pickles(want, out):
            got_by_key, want_by_key = _by_key(out), _by_key(want)
            key = next(k for k in sorted(set(got_by_key) | set(want_by_key)) if got_by_key.get(k) != want_by_key.get(k))
            msg = (
                f"step {self.step_id!r} for key {key!r}: the logic resumed from its snapshot emitted "
                f"{got_by_key.get(key, [])!r} where the live logic emitted {want_by_key.get(key, [])!r}; "
                "snapshot() must return all of the logic's state and the builder must rebuild it from "
                "resume_state (the Spark streaming runtime resumes every key from its snapshot in every "
                "micro-batch; run_main(roundtrip_state=True) does the same after every pass)"
            )
            raise FlowsparkRuntimeError(self.step_id, msg, key)
        driver = self.driver
        for key in touched:
            logic = self.logics.get(key)
            if logic is not None:
                state = pickle.loads(pickle.dumps(driver.snapshot(key, logic)))  # noqa: S301
                self.logics[key] = driver.build(key, state)

    def _notify_due(self, ex: Any, out: list[Any], touched: dict[str, None]) -> None:
        """Fire the notifications due now (in sorted key order), then read the notified keys' `notify_at`."""
        if not self.heap:
            return
        fired = self._on_notify(ex.now(), out, touched)
        for key in fired:
            self._schedule(key)

    def _on_notify(self, now: datetime, out: list[Any], touched: dict[str, None]) -> list[str]:
        """Fire the notifications due at `now` in sorted key order; return the keys notified."""
        heap = self.heap
        due: list[tuple[datetime, str]] = []
        while heap and heap[0][0] <= now:
            at, key = heapq.heappop(heap)
            if self.sched.get(key) == at:
                del self.sched[key]
                due.append((at, key))
        # Due notifications fire in sorted key order (as in Bytewax), not in time order.
        fired: list[str] = []
        for _at, key in sorted(due, key=_second):
            logic = self.logics.get(key)
            if logic is None:
                continue
            touched[key] = None
            fired.append(key)
            self._emit(key, self.driver.notify(key, logic), out)
        return fired

    # -- clock="fixed": the per-key timeline of the Spark batch runtime ------------------
    def _step_fixed(
        self,
        ex: Any,
        items: list[Any],
        bounds: Any,
        out: list[Any],
        touched: dict[str, None],
        out_ends: Optional[list[int]],
    ) -> None:
        # Time is fixed at `fixed_now` for the whole run. Each activation's items are
        # grouped by key in sorted key order (as in Bytewax, and as the Spark batch
        # runtime's sequences sort: `flowspark.runtime.tags.regroup`); each key's values
        # of the activation go through the driver's fixed-time timeline (tags unused). At
        # EOF, key by key in sorted key order (as the Spark batch runtime's end-of-key tags
        # sort), its due notifications fire, then its on_eof.
        # A key's activation that follows the one that last woke it gets its values first,
        # then what was due (Bytewax's default `epoch_interval`); one after a gap, or after
        # an epoch closed (`epoch_interval=timedelta(0)`: every pass), or the upstream's end
        # of input (its `on_eof` emits) fires what is due first. A flow with a step that may
        # notify runs one source batch per pass, so a pass is one activation.
        now = self.fixed_now
        assert now is not None
        logics = self.logics
        ends = None if bounds is None else list(range(1, len(items) + 1)) if bounds is _SINGLES else bounds
        follows = self.woke if self.notifies and not ex.is_eof(self.up) else None
        self.driver.feed_grouped(logics, items, ends, out, touched, out_ends, now=now, follows=follows)
        if self.notifies:
            self.woke = set() if ex.closing else set(touched)
        if self._eof_now(ex, items):
            self.eof_done = True
            for key in sorted(logics):
                touched[key] = None
                self._drive_fixed(key, [], now, True, out)
            # End of input: one more activation downstream.
            if out_ends is not None and len(out) != (out_ends[-1] if out_ends else 0):
                out_ends.append(len(out))

    def _drive_fixed(self, key: str, run: list[tuple[bytes, Any]], now: datetime, eof: bool, out: list[Any]) -> None:
        emits, logic = self.driver.drive(key, run, self.logics.get(key), now, eof)
        out.extend([(key, w) for _tag, w in emits])
        if logic is None:
            self.logics.pop(key, None)
        else:
            self.logics[key] = logic

    @override
    def next_wake(self) -> Optional[datetime]:
        while self.heap and self.sched.get(self.heap[0][1]) != self.heap[0][0]:
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else None

    @override
    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        keys = self.touched_epoch
        for key in sorted(keys):
            logic = self.logics.get(key)
            out.append((self.step_id, key, DELETED if logic is None else self.driver.snapshot(key, logic)))
        self.touched_epoch = set()


def _second(pair: tuple[Any, Any]) -> Any:
    return pair[1]


def _same_pickles(a: Any, b: Any) -> bool:
    """Equal as pickles (for emitted objects without `__eq__`)."""
    try:
        return pickle.dumps(a) == pickle.dumps(b)
    except Exception:  # noqa: BLE001
        return False


def _by_key(items: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for k, v in items:
        out.setdefault(k, []).append(v)
    return out
