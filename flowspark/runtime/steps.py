"""The in-memory executor's step runtimes: one object per core step, run once per pass.

`InputRuntime` polls a source's partitions (and resumes them), `MapRuntime` runs a
`flat_map_batch`, `BranchRuntime` and `MergeRuntime` route items, `OutputRuntime` writes a sink's
partitions; the stateful step's runtime is `flowspark.runtime.stateful.StatefulRuntime`. The executor
(`flowspark.runtime.local`) builds them from the IR and calls `step(executor)` on each in
topological order; they read and write the executor's streams.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Callable, Optional

from typing_extensions import override

from flowspark import ir
from flowspark._checks import check_bool
from flowspark.deadletter import record as dead_record
from flowspark.errors import (
    FlowsparkCompileError,
    FlowsparkError,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    step_error,
)
from flowspark.inputs import (
    AbortExecution,
    DynamicSource,
    FixedPartitionedSource,
)
from flowspark.outputs import DynamicSink, FixedPartitionedSink, route_to_parts
from flowspark.runtime.bounds import SINGLES as _SINGLES
from flowspark.runtime.bounds import remap_bounds as _remap_bounds
from flowspark.runtime.bounds import segments as _segments
from flowspark.runtime.driver import NOT_FOUND, failing_item
from flowspark.runtime.routing import primaries

__all__ = [
    "BATCH_TARGET",
    "Abort",
    "BranchRuntime",
    "InputRuntime",
    "MapRuntime",
    "MergeRuntime",
    "OutputRuntime",
    "StepRuntime",
    "step_failure",
]

_log = logging.getLogger("flowspark")

BATCH_TARGET = 1024


class Abort(Exception):  # noqa: N818
    """A source asked the run to stop (`AbortExecution`, `TestingSource.ABORT`): the executor ends without EOF."""

    pass


def step_failure(step_id: str, ex: BaseException) -> FlowsparkRuntimeError:
    """A user error in step `step_id` as the runtime error every runtime raises."""
    return step_error(step_id, ex)


class StepRuntime:
    """Run-time state of one core step."""

    step_id: str
    eof: bool = False

    def step(self, ex: Any) -> None:
        """Run one pass of this step over the executor `ex`'s streams (`flowspark.runtime.local`)."""
        raise NotImplementedError

    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        """Append this step's recovery snapshots."""

    def next_wake(self) -> Optional[datetime]:
        """When this step next needs a pass (a partition's `next_awake`, a due notification), or `None`."""
        return None

    def close(self) -> None:
        """Release resources."""


class InputRuntime(StepRuntime):
    """An `input` step: polls its source's partitions (this worker's), resumes them, and snapshots them."""

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
            raise step_failure(self.step_id, e) from e
        for key, _ in self.parts:
            self.part_eof[key] = False
        self.awake: dict[str, Optional[datetime]] = {k: None for k, _ in self.parts}
        self.aborting = False
        if not self.parts:
            self.eof = True

    @override
    def step(self, ex: Any) -> None:
        if self.aborting:
            raise Abort()
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
                while n < BATCH_TARGET:
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
                    raise Abort() from None
                # Items read before the abort in this pass still go through the flow (as
                # in Bytewax, where they left in an earlier batch); abort at the next pass.
                self.aborting = True
                break
            except FlowsparkError:
                raise
            except Exception as e:
                raise step_failure(self.step_id, e) from e
        if out:
            ex.polled += len(out)
            n = len(out)
            ex.emit(self.down, out, None if len(ends) <= 1 else _SINGLES if len(ends) == n else ends)
        if all(self.part_eof.values()):
            self.eof = True

    @override
    def next_wake(self) -> Optional[datetime]:
        wakes = [w for k, w in self.awake.items() if w is not None and not self.part_eof[k]]
        return min(wakes) if wakes else None

    @override
    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        if not self.stateful:
            return
        for key, part in self.parts:
            if key in self.final_snaps:
                out.append((self.step_id, key, self.final_snaps[key]))
            else:
                out.append((self.step_id, key, part.snapshot()))

    @override
    def close(self) -> None:
        for _key, part in self.parts:
            part.close()


class OutputRuntime(StepRuntime):
    """An `output` step: writes its items to the sink's partitions (this worker's) and snapshots them."""

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
            raise step_failure(self.step_id, e) from e

    @override
    def step(self, ex: Any) -> None:
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
                raise step_failure(self.step_id, e) from e
        self.eof = ex.is_eof(self.up)

    def _write_fixed(self, items: list[Any]) -> None:
        routed = route_to_parts(self.step_id, self.sink, items, len(self.parts))
        for idx in sorted(routed):
            part = self.parts[idx]
            assert part is not None, "items reach the worker of their partition (flowspark.runtime.workers)"
            part.write_batch(routed[idx])

    @override
    def snapshots(self, out: list[tuple[str, str, Any]], final: bool) -> None:
        if self.fixed:
            for key, part in zip(self.part_keys, self.parts, strict=True):
                if part is not None:
                    out.append((self.step_id, key, part.snapshot()))

    @override
    def close(self) -> None:
        if self.fixed:
            for part in self.parts:
                if part is not None:
                    part.close()
        else:
            self.part.close()


class MapRuntime(StepRuntime):
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

    @override
    def step(self, ex: Any) -> None:
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

    def _call(self, ex: Any, items: list[Any], counts: list[int]) -> list[Any]:
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
            raise (
                step_error(self.step_id, e, item=bad) if bad is not NOT_FOUND else step_failure(self.step_id, e)
            ) from e
        return out

    def _not_iterable(self, res: Any) -> FlowsparkTypeError:
        msg = (
            f"step {self.step_id!r}: mapper must return an iterable (e.g. a list) for "
            f"each batch; returned {res!r} of type {type(res).__name__}"
        )
        return FlowsparkTypeError(msg)

    def _each(self, ex: Any, items: list[Any], counts: list[int]) -> list[Any]:
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


class BranchRuntime(StepRuntime):
    """A `branch` step: routes each item to its true or false stream by the predicate."""

    def __init__(self, node: ir.Branch) -> None:
        self.step_id = node.step_id
        self.up = node.up
        self.node = node

    @override
    def step(self, ex: Any) -> None:
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

    def _split(self, ex: Any, items: list[Any], trues: list[Any], falses: list[Any]) -> None:
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


class MergeRuntime(StepRuntime):
    """A `merge` step: its upstreams' items, each upstream's in order."""

    def __init__(self, node: ir.Merge) -> None:
        self.step_id = node.step_id
        self.ups = node.ups
        self.down = node.down

    @override
    def step(self, ex: Any) -> None:
        out: list[Any] = []
        for up in self.ups:
            out.extend(ex.take(up))
        if out:
            # Streams meet only in one-batch-per-pass mode, where a pass is one activation.
            ex.emit(self.down, out, ex.take_bounds(self.ups[0]) if len(self.ups) == 1 else None)
        self.eof = all(ex.is_eof(up) for up in self.ups)
