"""The in-memory executor: runs a dataflow's core steps in this thread.

The executor works in *passes*. Each pass polls every source partition for up to
`_BATCH_TARGET` items (several `next_batch` calls), then runs every core step
once in topological order, so everything polled in a pass is fully processed by
the end of it. A pass boundary is therefore a consistent cut, which is where
epochs close and recovery snapshots are taken. When the graph merges two or more
streams (`merge`, `join`), a pass carries one `next_batch` per partition instead,
so streams meet batch by batch as in Bytewax (see `_Executor.one_batch_per_pass`).

Order, as in Bytewax: the items of one source partition keep their order through
stateless steps; `merge` keeps each upstream's order. A stateful step works per
*activation*: in Bytewax one source batch (one `next_batch` per partition; where
streams merge, the batches of every partition polled together). It groups an
activation's items by key, keys in sorted order, and hands each key's values of the
activation (in arrival order) to one `on_batch`; due notifications fire in sorted
key order, and `on_eof` runs for every live key in sorted key order. A pass that
gathers several source batches records where each batch ends (*bounds*), and
stateless steps keep those bounds on the streams that lead to a stateful step.

Time: notifications (`notify_at`) are checked after every pass against
`flowspark._time.utc_now()`, also while inputs are idle (PAUSE), after the pass's
items (those made due by them fire in that pass). Where time can be seen between
activations (`_time_observable`: a step with timers, a clock-reading mapper), a pass
carries one source batch, so notifications fire between activations as in Bytewax.
With `clock="logical"` the executor uses no wall clock at all: see `run_main`.
"""

from __future__ import annotations

import heapq
import logging
import pickle
import time
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark import ir
from flowspark._args import ttl_arg
from flowspark._checks import check_bool
from flowspark._time import use_clock, utc_now
from flowspark.deadletter import DeadLetters, dead_letter_arg, dead_letter_step
from flowspark.deadletter import record as dead_record
from flowspark.errors import (
    FlowsparkCompileError,
    FlowsparkError,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    IncompleteDataflowError,
    step_error,
)
from flowspark.inputs import (
    AbortExecution,
    DynamicSource,
    FixedPartitionedSource,
)
from flowspark.logic import StatefulBatchLogic
from flowspark.outputs import DynamicSink, FixedPartitionedSink, route_to_parts
from flowspark.recovery import DELETED, RecoveryConfig, RecoveryStore, epochs_per
from flowspark.runtime.bounds import SINGLES as _SINGLES
from flowspark.runtime.bounds import ends as _ends
from flowspark.runtime.bounds import leading_to_stateful as _leading_to_stateful
from flowspark.runtime.bounds import remap_bounds as _remap_bounds
from flowspark.runtime.bounds import segments as _segments
from flowspark.runtime.driver import NOT_FOUND, StepDriver, bad_item_error, failing_item
from flowspark.runtime.routing import primaries

__all__ = ["LogicalClock", "run_main"]

_log = logging.getLogger("flowspark")
_BATCH_TARGET = 1024
_IDLE_SLEEP = 0.001


class _Abort(Exception):  # noqa: N818
    pass


def _fail(step_id: str, ex: BaseException) -> FlowsparkRuntimeError:
    return step_error(step_id, ex)


class LogicalClock:
    """A clock that moves only when told (used by `clock="logical"`)."""

    def __init__(self, start: datetime) -> None:
        """Start at `start`."""
        self.now = start

    def get(self) -> datetime:
        """Return the clock's time.

        Returns:
            The time.
        """
        return self.now


class _Rt:
    """Run-time state of one core step."""

    step_id: str
    eof: bool = False

    def step(self, ex: _Executor) -> None:
        raise NotImplementedError

    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        """Append this step's recovery snapshots."""

    def next_wake(self) -> Optional[datetime]:
        return None

    def close(self) -> None:
        """Release resources."""


class _InputRt(_Rt):
    def __init__(self, node: ir.Input, resume: dict[str, Any], worker: tuple[int, int] = (0, 1)) -> None:
        """Build the partitions worker `worker[0]` of `worker[1]` reads (as Bytewax assigns them)."""
        self.step_id = node.step_id
        self.down = node.down
        src = node.source
        self.parts: list[tuple[str, Any]] = []
        self.part_eof: dict[str, bool] = {}
        self.final_snaps: dict[str, Any] = {}
        self.stateful = isinstance(src, FixedPartitionedSource)
        try:
            if isinstance(src, FixedPartitionedSource):
                owner = primaries(src.list_parts(), worker[1])
                for key in sorted(owner):  # polled in sorted order, as in Bytewax
                    if owner[key] == worker[0]:
                        self.parts.append((key, src.build_part(self.step_id, key, resume.get(key))))
            elif isinstance(src, DynamicSource):
                self.parts.append((str(worker[0]), src.build(self.step_id, *worker)))
            else:
                msg = (
                    f"step {self.step_id!r}: source {type(src).__name__} must subclass "
                    "FixedPartitionedSource or DynamicSource"
                )
                raise FlowsparkCompileError(msg)
        except FlowsparkError:
            raise
        except Exception as e:
            raise _fail(self.step_id, e) from e
        for key, _ in self.parts:
            self.part_eof[key] = False
        self.awake: dict[str, Optional[datetime]] = {k: None for k, _ in self.parts}
        self.aborting = False
        if not self.parts:
            self.eof = True

    def step(self, ex: _Executor) -> None:
        if self.aborting:
            raise _Abort()
        out: list[Any] = []
        ends: list[int] = []
        now: Optional[datetime] = None
        for key, part in self.parts:
            if self.part_eof[key]:
                continue
            awake = self.awake[key]
            if awake is not None and not ex.fixed_time:
                if now is None:
                    now = ex.now()
                if awake > now:
                    continue
            try:
                # Hot loop (one call per item with batch_size=1): bound methods and
                # the running length are kept in locals.
                next_batch = part.next_batch
                next_awake = part.next_awake
                one_batch = ex.one_batch_per_pass
                n = len(out)
                awake = None
                while n < _BATCH_TARGET:
                    batch = next_batch()
                    got = n
                    out.extend(batch)
                    n = len(out)
                    if n != got:
                        ends.append(n)
                    awake = next_awake()
                    if awake is not None or n == got or one_batch:
                        break
                # Only the last batch's can be set: a wake-up time ends the loop.
                self.awake[key] = awake
            except StopIteration:
                self.part_eof[key] = True
                if self.stateful and ex.store is not None:
                    self.final_snaps[key] = part.snapshot()
            except AbortExecution:
                if not out:
                    raise _Abort() from None
                # Items read before the abort in this pass still go through the flow (as
                # in Bytewax, where they left in an earlier batch); abort at the next pass.
                self.aborting = True
                break
            except FlowsparkError:
                raise
            except Exception as e:
                raise _fail(self.step_id, e) from e
        if out:
            ex.polled += len(out)
            n = len(out)
            ex.emit(self.down, out, None if len(ends) <= 1 else _SINGLES if len(ends) == n else ends)
        if all(self.part_eof.values()):
            self.eof = True

    def next_wake(self) -> Optional[datetime]:
        wakes = [w for k, w in self.awake.items() if w is not None and not self.part_eof[k]]
        return min(wakes) if wakes else None

    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        if not self.stateful:
            return
        for key, part in self.parts:
            if key in self.final_snaps:
                out.append((self.step_id, key, self.final_snaps[key]))
            else:
                out.append((self.step_id, key, part.snapshot()))

    def close(self) -> None:
        for _key, part in self.parts:
            part.close()


class _OutputRt(_Rt):
    copy_input = False

    def __init__(self, node: ir.Output, resume: dict[str, Any], worker: tuple[int, int] = (0, 1)) -> None:
        """Build the sink partitions worker `worker[0]` of `worker[1]` writes (as Bytewax assigns them)."""
        self.step_id = node.step_id
        self.up = node.up
        sink = node.sink
        self.fixed = isinstance(sink, FixedPartitionedSink)
        self.sink = sink
        try:
            if isinstance(sink, FixedPartitionedSink):
                # `part_fn(key)` indexes the partitions in sorted order, as in Bytewax.
                self.part_keys = sorted(sink.list_parts())
                if not self.part_keys:
                    msg = f"step {self.step_id!r}: sink {type(sink).__name__}.list_parts() returned no partitions"
                    raise FlowsparkCompileError(msg)
                # Another worker's partitions stay `None`: their items are routed to that worker.
                owner = primaries(self.part_keys, worker[1])
                self.parts = [
                    sink.build_part(self.step_id, k, resume.get(k)) if owner[k] == worker[0] else None
                    for k in self.part_keys
                ]
            elif isinstance(sink, DynamicSink):
                self.part = sink.build(self.step_id, *worker)
            else:
                msg = (
                    f"step {self.step_id!r}: sink {type(sink).__name__} must subclass "
                    "FixedPartitionedSink or DynamicSink"
                )
                raise FlowsparkCompileError(msg)
        except FlowsparkError:
            raise
        except Exception as e:
            raise _fail(self.step_id, e) from e

    def step(self, ex: _Executor) -> None:
        items = ex.take(self.up)
        if items:
            try:
                if self.fixed:
                    self._write_fixed(items)
                else:
                    self.part.write_batch(list(items) if self.copy_input else items)
            except FlowsparkError:
                raise
            except Exception as e:
                raise _fail(self.step_id, e) from e
        self.eof = ex.is_eof(self.up)

    def _write_fixed(self, items: list[Any]) -> None:
        routed = route_to_parts(self.step_id, self.sink, items, len(self.parts))
        for idx in sorted(routed):
            part = self.parts[idx]
            assert part is not None, "items reach the worker of their partition (flowspark.runtime.workers)"
            part.write_batch(routed[idx])

    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        if self.fixed:
            for key, part in zip(self.part_keys, self.parts, strict=True):
                if part is not None:
                    out.append((self.step_id, key, part.snapshot()))

    def close(self) -> None:
        if self.fixed:
            for part in self.parts:
                if part is not None:
                    part.close()
        else:
            self.part.close()


class _MapRt(_Rt):
    """flat_map_batch, inspect_debug, redistribute."""

    def __init__(self, node: Any, fn: Callable[[list[Any]], Iterable[Any]], copy_input: bool) -> None:
        self.step_id = node.step_id
        self.up = node.up
        self.down = node.down
        self.fn = fn
        self.copy_input = copy_input
        # On failure, a flat_map_batch's error names the item (the mapper runs again item by item).
        self.locate = isinstance(node, ir.FlatMapBatch)
        # One output per input, in order: activation bounds stay as they are.
        self.keeps_bounds = not self.locate or node.one_to_one

    def step(self, ex: _Executor) -> None:
        items = ex.take(self.up)
        if items:
            bounds = ex.take_bounds(self.up) if self.down in ex.needs_bounds else None
            if bounds is None or self.keeps_bounds:
                counts: list[int] = []
                out = self._call(ex, items, counts)
                if counts and bounds is not None and bounds is not _SINGLES:
                    bounds = _remap_bounds(bounds, counts)  # items went to the dead letter
            else:
                # Keep the activations apart: the mapper runs once per source batch, as in Bytewax.
                out = []
                ends: list[int] = []
                for seg in _segments(items, bounds):
                    out.extend(self._call(ex, seg, []))
                    if len(out) != (ends[-1] if ends else 0):
                        ends.append(len(out))
                bounds = None if len(ends) <= 1 else _SINGLES if len(ends) == len(out) else ends
            if out:
                ex.emit(self.down, out, bounds)
        self.eof = ex.is_eof(self.up)

    def _call(self, ex: _Executor, items: list[Any], counts: list[int]) -> list[Any]:
        """Run the mapper over a batch; with a dead letter, item by item once the batch failed.

        `counts` receives the number of outputs of each item when the batch was redone
        item by item (else stays empty).
        """
        out: list[Any]
        try:
            res = self.fn(list(items) if self.copy_input else items)
            if type(res) is list:
                out = res
            elif isinstance(res, Iterable):
                out = list(res)
            else:
                raise self._not_iterable(res)
        except Exception as e:
            if ex.dead is not None and self.locate:
                return self._each(ex, items, counts)
            bad = failing_item(self.fn, list(items)) if self.locate else NOT_FOUND
            raise step_error(self.step_id, e, item=bad) if bad is not NOT_FOUND else _fail(self.step_id, e) from e
        return out

    def _not_iterable(self, res: Any) -> FlowsparkTypeError:
        msg = (
            f"step {self.step_id!r}: mapper must return an iterable (e.g. a list) for "
            f"each batch; returned {res!r} of type {type(res).__name__}"
        )
        return FlowsparkTypeError(msg)

    def _each(self, ex: _Executor, items: list[Any], counts: list[int]) -> list[Any]:
        """The mapper over each item alone: items it fails on go to the dead letter."""
        assert ex.dead is not None
        out: list[Any] = []
        for x in items:
            try:
                res = self.fn([x])
                if not isinstance(res, Iterable):
                    raise self._not_iterable(res)
                ys = list(res)
            except Exception as e:  # noqa: BLE001
                ex.dead.append(dead_record(self.step_id, e, x))
                counts.append(0)
                continue
            out.extend(ys)
            counts.append(len(ys))
        return out


class _BranchRt(_Rt):
    def __init__(self, node: ir.Branch) -> None:
        self.step_id = node.step_id
        self.up = node.up
        self.node = node

    def step(self, ex: _Executor) -> None:
        items = ex.take(self.up)
        if items:
            trues: list[Any] = []
            falses: list[Any] = []
            node = self.node
            keep = node.trues in ex.needs_bounds or node.falses in ex.needs_bounds
            bounds = ex.take_bounds(self.up) if keep else None
            t_ends: list[int] = []
            f_ends: list[int] = []
            for seg in (items,) if bounds is None or bounds is _SINGLES else _segments(items, bounds):
                self._split(ex, seg, trues, falses)
                if len(trues) != (t_ends[-1] if t_ends else 0):
                    t_ends.append(len(trues))
                if len(falses) != (f_ends[-1] if f_ends else 0):
                    f_ends.append(len(falses))
            if bounds is not None and bounds is not _SINGLES:
                t_bounds = None if len(t_ends) <= 1 else t_ends
                f_bounds = None if len(f_ends) <= 1 else f_ends
            else:
                t_bounds = f_bounds = bounds
            if trues:
                ex.emit(node.trues, trues, t_bounds)
            if falses:
                ex.emit(node.falses, falses, f_bounds)
        self.eof = ex.is_eof(self.up)

    def _split(self, ex: _Executor, items: list[Any], trues: list[Any], falses: list[Any]) -> None:
        pred = self.node.predicate
        dead = ex.dead
        for x in items:
            try:
                r = pred(x)
                if r is not True and r is not False:
                    check_bool(self.step_id, "branch predicate", x, r)
            except Exception as e:
                if dead is None:
                    raise step_error(self.step_id, e, item=x) from e
                dead.append(dead_record(self.step_id, e, x))
                continue
            (trues if r else falses).append(x)


class _MergeRt(_Rt):
    def __init__(self, node: ir.Merge) -> None:
        self.step_id = node.step_id
        self.ups = node.ups
        self.down = node.down

    def step(self, ex: _Executor) -> None:
        out: list[Any] = []
        for up in self.ups:
            out.extend(ex.take(up))
        if out:
            # Streams meet only in one-batch-per-pass mode, where a pass is one activation.
            ex.emit(self.down, out, ex.take_bounds(self.ups[0]) if len(self.ups) == 1 else None)
        self.eof = all(ex.is_eof(up) for up in self.ups)


class _StatefulRt(_Rt):
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
        #: With `roundtrip_state`: the same step, never resumed, to compare with.
        self.reference = _StatefulRt(node, resume, False, fixed_now, ttl=ttl) if roundtrip else None
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

    def step(self, ex: _Executor) -> None:
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
        self, ex: _Executor, items: list[Any], bounds: Any, out_ends: Optional[list[int]] = None
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
                # After an activation's items, the notifications due by now fire (those its
                # items made due included), before the next activation: as in Bytewax.
                for key in touched:
                    self._schedule(key)
                if self.heap:
                    for key in self._on_notify(ex.now(), out, touched):
                        self._schedule(key)
            if self._eof_now(ex, items):
                self.eof_done = True
                for key in sorted(self.logics):
                    touched[key] = None
                    self._emit(key, driver.eof(key, self.logics[key]), out)
            # Notifications and end of input: one more activation (Bytewax's next wake-up).
            if out_ends is not None and len(out) != (out_ends[-1] if out_ends else 0):
                out_ends.append(len(out))
        return out, touched

    def _eof_now(self, ex: _Executor, items: list[Any]) -> bool:
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
    def _check_resumed(
        self, ex: _Executor, items: list[Any], bounds: Any, out: list[Any], touched: dict[str, None]
    ) -> None:
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
        ex: _Executor,
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
        now = self.fixed_now
        assert now is not None
        logics = self.logics
        ends = None if bounds is None else list(range(1, len(items) + 1)) if bounds is _SINGLES else bounds
        self.driver.feed_grouped(logics, items, ends, out, touched, out_ends, now=now)
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

    def next_wake(self) -> Optional[datetime]:
        while self.heap and self.sched.get(self.heap[0][1]) != self.heap[0][0]:
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else None

    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        keys = self.touched_epoch
        for key in sorted(keys):
            logic = self.logics.get(key)
            out.append((self.step_id, key, DELETED if logic is None else self.driver.snapshot(key, logic)))
        self.touched_epoch = set()


class _Executor:
    #: This executor's worker index and the number of workers (`flowspark.runtime.workers` runs several).
    worker: tuple[int, int] = (0, 1)

    def __init__(
        self,
        graph: ir.Graph,
        *,
        epoch_interval: timedelta,
        store: Optional[RecoveryStore],
        clock: Optional[LogicalClock],
        fixed_time: bool = False,
        roundtrip_state: bool = False,
        state_ttl: Optional[timedelta] = None,
        dead_letter: Optional[DeadLetters] = None,
    ) -> None:
        self.graph = graph
        self.state_ttl = state_ttl
        #: The dead letter's writer, and the records of the current pass (`None`: no dead letter).
        self.dead_letter = dead_letter
        self.dead: Optional[list[dict[str, Any]]] = None if dead_letter is None else []
        self.epoch_interval = epoch_interval
        self.store = store
        self.clock = clock
        self.fixed_time = fixed_time
        self.roundtrip_state = roundtrip_state
        self.vals: dict[str, list[Any]] = {}
        self.pending: dict[str, list[Any]] = {}
        self.polled = 0
        self.epoch = 1
        # Where streams meet again (merge, hence join), the interleaving of their items
        # depends on how much input one pass carries. Bytewax moves one source batch at a
        # time through the graph, so `join` of two `TestingSource`s pairs a0/b0, a1/b1...
        # Do the same when the graph has a merge; otherwise gather up to _BATCH_TARGET
        # items per pass (fewer, larger passes; same results).
        # With roundtrip_state, one source batch per pass too: logics are resumed after every batch.
        # With a state TTL too: each batch's values get the time of their own pass.
        # And where time can be seen between activations (`_time_observable`).
        self.one_batch_per_pass = (
            roundtrip_state
            or state_ttl is not None
            or any(isinstance(n, ir.Merge) and len(n.ups) > 1 for n in graph.nodes)
            or (not fixed_time and _time_observable(graph))
        )
        self.bounds: dict[str, Any] = {}
        resume: dict[str, dict[str, Any]] = {}
        if store is not None:
            resume = store.load()
            self.epoch = store.resume_epoch() + 1
        consumers = graph.consumers()
        self.rts: list[_Rt] = []
        self.producer: dict[str, _Rt] = {}
        for node in ir.walk(graph):
            rt = self._build_rt(node, resume.get(node.step_id, {}), consumers)
            self.rts.append(rt)
            for d in node.downs:
                self.producer[d] = rt
        # Bytewax polls one batch from every partition of a source in one activation.
        if any(isinstance(rt, _InputRt) and len(rt.parts) > 1 for rt in self.rts):
            self.one_batch_per_pass = True
        #: Streams whose activation bounds matter: a stateful step is downstream. With one
        #: source batch per pass, a pass is one activation and no bounds are kept.
        self.needs_bounds: set[str] = set() if self.one_batch_per_pass else _leading_to_stateful(graph)

    def _build_rt(self, node: ir.Node, resume: dict[str, Any], consumers: dict[str, list[ir.Node]]) -> _Rt:
        shared = any(len(consumers.get(up, [])) > 1 for up in node.ups)
        match node:
            case ir.Input():
                return _InputRt(node, resume, self.worker)
            case ir.Output():
                out_rt = _OutputRt(node, resume, self.worker)
                out_rt.copy_input = shared
                return out_rt
            # A list read from a stream with several consumers is copied before user code
            # (mapper, sink) may mutate it, and before a pass-through step (inspect,
            # redistribute) hands it on to consumers of its own.
            case ir.FlatMapBatch():
                return _MapRt(node, node.mapper, shared)
            case ir.InspectDebug():
                return _MapRt(node, self._inspector(node), shared)
            case ir.Redistribute():
                return _MapRt(node, _passthrough, shared)
            case ir.Branch():
                return _BranchRt(node)
            case ir.Merge():
                return _MergeRt(node)
            case ir.StatefulBatch():
                fixed_now = self.clock.now if self.clock is not None and self.fixed_time else None
                return _StatefulRt(
                    node, resume, self.store is not None, fixed_now, self.roundtrip_state, self.state_ttl
                )
        msg = f"step {getattr(node, 'step_id', node)!r}: the local runtime has no core step {type(node).__name__}"
        raise FlowsparkCompileError(msg)

    def _inspector(self, node: ir.InspectDebug) -> Callable[[list[Any]], list[Any]]:
        inspector = node.inspector
        step_id = node.step_id
        worker = self.worker[0]

        def run(items: list[Any]) -> list[Any]:
            epoch = self.epoch
            for x in items:
                inspector(step_id, x, epoch, worker)
            return items

        return run

    # -- data movement used by the step runtimes --------------------------
    def emit(self, stream_id: str, items: list[Any], bounds: Any = None) -> None:
        cur = self.vals.get(stream_id)
        if cur is None:
            self.vals[stream_id] = items
            if bounds is not None and stream_id in self.needs_bounds:
                self.bounds[stream_id] = bounds
        else:
            if stream_id in self.needs_bounds:
                before = _ends(self.bounds.get(stream_id), len(cur))
                self.bounds[stream_id] = before + [len(cur) + e for e in _ends(bounds, len(items))]
            cur.extend(items)

    def take(self, stream_id: str) -> list[Any]:
        return self.vals.get(stream_id, _NONE)

    def take_bounds(self, stream_id: str) -> Any:
        return self.bounds.get(stream_id)

    def is_eof(self, stream_id: str) -> bool:
        return self.producer[stream_id].eof

    def now(self) -> datetime:
        return utc_now()

    # -- the main loop -----------------------------------------------------
    def run_pass(self) -> None:
        self.vals = self.pending
        self.pending = {}
        for rt in self.rts:
            rt.step(self)
        self.vals = {}
        if self.bounds:
            self.bounds = {}
        if self.dead:
            assert self.dead_letter is not None
            self.dead_letter.write(self.dead, self.epoch)
            self.dead = []

    def all_eof(self) -> bool:
        return all(rt.eof for rt in self.rts)

    def snapshot(self, final: bool) -> None:
        if self.store is None:
            return
        snaps: list[tuple[str, str, Any]] = []
        for rt in self.rts:
            rt.snapshots(snaps, final)
        self.store.write(self.epoch, snaps)

    def next_wake(self) -> Optional[datetime]:
        wakes = [w for rt in self.rts if (w := rt.next_wake()) is not None]
        return min(wakes) if wakes else None

    def run(self) -> None:
        epoch_started = time.monotonic()
        interval = self.epoch_interval.total_seconds()
        try:
            while True:
                self.polled = 0
                try:
                    self.run_pass()
                except _Abort:
                    return
                if self.all_eof():
                    self.snapshot(final=True)
                    return
                if time.monotonic() - epoch_started >= interval:
                    self.snapshot(final=False)
                    self.epoch += 1
                    epoch_started = time.monotonic()
                if self.polled == 0:
                    self._idle()
        finally:
            for rt in self.rts:
                try:
                    rt.close()
                except Exception:  # noqa: BLE001,S110
                    pass

    def _idle(self) -> None:
        wake = self.next_wake()
        if self.fixed_time:
            return
        if self.clock is not None:
            # Logical time: jump straight to the next due time (nothing else can happen).
            if wake is not None and wake > self.clock.now:
                self.clock.now = wake
            return
        if wake is None:
            time.sleep(_IDLE_SLEEP)
            return
        wait = (wake - utc_now()).total_seconds()
        if wait > 0:
            time.sleep(min(wait, 0.05))


_NONE: list[Any] = []

# For `flowspark.runtime.workers`, which runs one executor per worker over these step runtimes.
Executor = _Executor
StepRuntime = _Rt
OutputRuntime = _OutputRt


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def _second(pair: tuple[Any, Any]) -> Any:
    return pair[1]


def _time_observable(graph: ir.Graph) -> bool:
    """Whether the flow can tell one pass of many source batches from one batch per pass.

    In Bytewax each source batch (activation) goes through the dataflow on its own and due
    notifications fire between activations: a stateful step that can ask for notifications
    (`ir.StatefulBatch.notifies`: timers, windows, `collect`) gets `on_notify` before the next
    activation's items, and everything upstream of it (an `inspect`) sees one activation at
    a time; a mapper reading the clock per call (`ir.FlatMapBatch.clocked`: `enrich_cached`
    with a `ttl`) gets one call per activation. The IR says so; elsewhere the executor fuses
    up to `_BATCH_TARGET` items per pass (same results, fewer passes).
    """
    return any(
        (isinstance(n, ir.StatefulBatch) and n.notifies) or (isinstance(n, ir.FlatMapBatch) and n.clocked)
        for n in graph.nodes
    )


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


_NO_TAG = b""


def _passthrough(items: list[Any]) -> list[Any]:
    return items


def run_main(
    flow: Any,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Optional[RecoveryConfig] = None,
    clock: str = "system",
    start_time: Optional[datetime] = None,
    roundtrip_state: bool = False,
    state_ttl: Optional[timedelta] = None,
    dead_letter: Any = None,
) -> None:
    """Run a dataflow to completion in this thread with the in-memory executor.

    Args:
        flow: The `Dataflow`.
        epoch_interval: Time between epochs (snapshots); default 10 s.
        recovery_config: Snapshot state to this store and resume from it.
        clock: `"system"` (default: notifications fire on wall-clock UTC time, also
            while input is paused) or `"logical"`: no wall clock; time starts at
            `start_time` and, whenever the flow is idle, jumps to the next due
            notification (deterministic tests of timers without waiting).
            Or `"fixed"`: time stands still at `start_time` for the whole run, input
            pauses are skipped, and each key's notifications fire on the timeline of
            the Spark batch runtime: before each value, every notification due at or
            before `start_time` fires; after the key's last value due ones fire, then
            `on_eof` (see docs/spark.md). `flowspark.spark.run(flow, start_time=t)`
            and `run_main(flow, clock="fixed", start_time=t)` give the same items.
        start_time: Start of the logical clock (default: the Unix epoch, UTC; for
            `"fixed"`: the wall-clock time when the run starts).
        roundtrip_state: After every batch a source delivers, snapshot every key a stateful step touched,
            pickle and unpickle the snapshot and rebuild the key's logic from it with the
            builder, as the Spark streaming runtime does in every micro-batch. The step
            also runs a copy that is never resumed; as soon as the two emit something
            different the run fails, naming the step and the key (a builder that ignores
            `resume_state`, or a `snapshot()` that leaves state out). For tests.
        state_ttl: Drop a stateful step's state for a key when the key got no value at
            that step for this long (processing time, checked at each activation before
            its values): no `on_eof`, its notifications are dropped with it, and the next
            value starts from fresh state. Default: state lives until its logic discards
            it. With `clock="fixed"` time stands still, so nothing expires. See
            docs/concepts.md "State TTL".
        dead_letter: Where items a step cannot take go instead of stopping the run (see
            `flowspark.deadletter`): a `DynamicSink` such as `DeadLetterDir(path)` or
            `TestingSink(list)`, or a directory path (parquet files). Each row's
            `batch_id` is the epoch. Default: the run fails naming the step.

    Raises:
        FlowsparkRuntimeError: A user callable failed (names the step and chains the
            error), or the flow has no input or no output (caused by an
            `IncompleteDataflowError`, a `ValueError`, as in Bytewax).

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> _ = op.inspect("show", op.input("inp", flow, TestingSource(["hi"])))
        >>> run_main(flow)
        eg.show: 'hi'
    """
    options: dict[str, Any] = {"epoch_interval": epoch_interval, "recovery_config": recovery_config, "clock": clock}
    options.update(start_time=start_time, roundtrip_state=roundtrip_state, state_ttl=state_ttl, dead_letter=dead_letter)
    run_flow("run_main", flow, _Executor, **options)


def run_flow(fn: str, flow: Any, make: Callable[..., _Executor], **options: Any) -> None:
    """Check `run_main`'s arguments (`fn` names the caller), then run the flow on `make(graph, **options)`.

    `make` is `_Executor` for one worker (`run_main`), `flowspark.runtime.workers` builds several.
    `options` are `run_main`'s keyword arguments.
    """
    epoch_interval, recovery_config = options.pop("epoch_interval", None), options.pop("recovery_config", None)
    clock, start_time = options.pop("clock", "system"), options.pop("start_time", None)
    roundtrip_state, state_ttl = options.pop("roundtrip_state", False), options.pop("state_ttl", None)
    dead_letter = options.pop("dead_letter", None)
    if options:
        msg = f"{fn}() got unexpected keyword arguments {sorted(options)}"
        raise TypeError(msg)
    from flowspark.dataflow import Dataflow

    if not isinstance(flow, Dataflow):
        msg = f"{fn} needs a Dataflow; received {flow!r} of type {type(flow).__name__}"
        raise FlowsparkTypeError(msg)
    try:
        graph = flow.validate()
    except IncompleteDataflowError as incomplete:
        # As Bytewax: a runtime error (not a ValueError) caused by the ValueError.
        msg = f"error building dataflow {flow.flow_id!r}: {incomplete}"
        raise FlowsparkRuntimeError(flow.flow_id, msg) from incomplete
    if epoch_interval is None:
        epoch_interval = timedelta(seconds=10)
    if not isinstance(epoch_interval, timedelta):
        msg = f"{fn}: epoch_interval must be a timedelta (e.g. timedelta(seconds=10)); received {epoch_interval!r}"
        raise FlowsparkTypeError(msg)
    if epoch_interval < timedelta(0):
        msg = f"{fn}: epoch_interval must not be negative; received {epoch_interval!r}"
        raise ValueError(msg)
    if recovery_config is not None and not isinstance(recovery_config, RecoveryConfig):
        msg = (
            f"{fn}: recovery_config must be a flowspark.recovery.RecoveryConfig; received "
            f"{recovery_config!r} of type {type(recovery_config).__name__}"
        )
        raise FlowsparkTypeError(msg)
    if clock not in ("system", "logical", "fixed"):
        msg = f"{fn}: clock must be 'system', 'logical' or 'fixed'; received {clock!r}"
        raise ValueError(msg)
    state_ttl = ttl_arg(fn, state_ttl)
    dead_sink = dead_letter_arg(fn, dead_letter)
    dead = None if dead_sink is None else DeadLetters(dead_sink, dead_letter_step(flow.flow_id))
    store = None
    if recovery_config is not None:
        store = RecoveryStore(recovery_config, epochs_per(epoch_interval, recovery_config.backup_interval))
    logical = None
    if clock == "logical":
        logical = LogicalClock(start_time or datetime(1970, 1, 1, tzinfo=timezone.utc))
    elif clock == "fixed":
        logical = LogicalClock(start_time or datetime.now(timezone.utc))
    try:
        ex = make(
            graph,
            epoch_interval=epoch_interval,
            store=store,
            clock=logical,
            fixed_time=clock == "fixed",
            roundtrip_state=roundtrip_state,
            state_ttl=state_ttl,
            dead_letter=dead,
        )
        if logical is not None:
            with use_clock(logical.get):
                ex.run()
        else:
            ex.run()
    finally:
        if store is not None:
            store.close()
        if dead is not None:
            dead.close()
            if dead.count:
                _log.warning("flowspark: %d item(s) went to the dead letter %r", dead.count, dead_sink)
