"""The in-memory executor: runs a dataflow's core steps in this thread.

The executor works in *passes*. Each pass polls every source partition for up to
`BATCH_TARGET` items (several `next_batch` calls), then runs every core step
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

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark import ir
from flowspark._args import ttl_arg
from flowspark._time import use_clock, utc_now
from flowspark.deadletter import DeadLetters, dead_letter_arg, dead_letter_step
from flowspark.errors import (
    FlowsparkCompileError,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    IncompleteDataflowError,
)
from flowspark.recovery import RecoveryConfig, RecoveryStore, epochs_per
from flowspark.runtime.bounds import ends as _ends
from flowspark.runtime.bounds import leading_to_stateful as _leading_to_stateful
from flowspark.runtime.stateful import StatefulRuntime
from flowspark.runtime.steps import (
    Abort,
    BranchRuntime,
    InputRuntime,
    MapRuntime,
    MergeRuntime,
    OutputRuntime,
    StepRuntime,
)

__all__ = ["LogicalClock", "run_main"]

_log = logging.getLogger("flowspark")
_IDLE_SLEEP = 0.001


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
        #: Whether the epoch closes after the current pass (`run`).
        self.closing = False
        # Where streams meet again (merge, hence join), the interleaving of their items
        # depends on how much input one pass carries. Bytewax moves one source batch at a
        # time through the graph, so `join` of two `TestingSource`s pairs a0/b0, a1/b1...
        # Do the same when the graph has a merge; otherwise gather up to BATCH_TARGET
        # items per pass (fewer, larger passes; same results).
        # With roundtrip_state, one source batch per pass too: logics are resumed after every batch.
        # With a state TTL too: each batch's values get the time of their own pass.
        # And where time can be seen between activations (`_time_observable`).
        self.one_batch_per_pass = (
            roundtrip_state
            or state_ttl is not None
            or any(isinstance(n, ir.Merge) and len(n.ups) > 1 for n in graph.nodes)
            or _time_observable(graph)
        )
        self.bounds: dict[str, Any] = {}
        resume: dict[str, dict[str, Any]] = {}
        if store is not None:
            resume = store.load()
            self.epoch = store.resume_epoch() + 1
        consumers = graph.consumers()
        self.rts: list[StepRuntime] = []
        self.producer: dict[str, StepRuntime] = {}
        for node in ir.walk(graph):
            rt = self._build_rt(node, resume.get(node.step_id, {}), consumers)
            self.rts.append(rt)
            for d in node.downs:
                self.producer[d] = rt
        # Bytewax polls one batch from every partition of a source in one activation.
        if any(isinstance(rt, InputRuntime) and len(rt.parts) > 1 for rt in self.rts):
            self.one_batch_per_pass = True
        #: Streams whose activation bounds matter: a stateful step is downstream. With one
        #: source batch per pass, a pass is one activation and no bounds are kept.
        self.needs_bounds: set[str] = set() if self.one_batch_per_pass else _leading_to_stateful(graph)

    def _build_rt(self, node: ir.Node, resume: dict[str, Any], consumers: dict[str, list[ir.Node]]) -> StepRuntime:
        shared = any(len(consumers.get(up, [])) > 1 for up in node.ups)
        match node:
            case ir.Input():
                return InputRuntime(node, resume, self.worker)
            case ir.Output():
                out_rt = OutputRuntime(node, resume, self.worker)
                out_rt.copy_input = shared
                return out_rt
            # A list read from a stream with several consumers is copied before user code
            # (mapper, sink) may mutate it, and before a pass-through step (inspect,
            # redistribute) hands it on to consumers of its own.
            case ir.FlatMapBatch():
                return MapRuntime(node, node.mapper, shared)
            case ir.InspectDebug():
                return MapRuntime(node, self._inspector(node), shared)
            case ir.Redistribute():
                return MapRuntime(node, _passthrough, shared)
            case ir.Branch():
                return BranchRuntime(node)
            case ir.Merge():
                return MergeRuntime(node)
            case ir.StatefulBatch():
                fixed_now = self.clock.now if self.clock is not None and self.fixed_time else None
                return StatefulRuntime(
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
                # Whether the epoch closes after this pass (decided before it: a stateful step
                # fires what is due when its epoch closes, as Bytewax does).
                self.closing = time.monotonic() - epoch_started >= interval
                try:
                    self.run_pass()
                except Abort:
                    return
                if self.all_eof():
                    self.snapshot(final=True)
                    return
                if self.closing:
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

# For `flowspark.runtime.workers`, which runs one executor per worker over the step runtimes.
Executor = _Executor


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def _time_observable(graph: ir.Graph) -> bool:
    """Whether the flow can tell one pass of many source batches from one batch per pass.

    In Bytewax each source batch (activation) goes through the dataflow on its own and due
    notifications fire between activations: a stateful step that can ask for notifications
    (`ir.StatefulBatch.notifies`: timers, windows, `collect`) gets `on_notify` before the next
    activation's items, and everything upstream of it (an `inspect`) sees one activation at
    a time; a mapper reading the clock per call (`ir.FlatMapBatch.clocked`: `enrich_cached`
    with a `ttl`) gets one call per activation. The IR says so; elsewhere the executor fuses
    up to `BATCH_TARGET` items per pass (same results, fewer passes). With `clock="fixed"`
    too: a key's due notification fires after its next activation's items when that
    activation follows the one that woke it (`StepDriver.drive`'s `follows`), which the
    stateful step tells by counting passes.
    """
    return any(
        (isinstance(n, ir.StatefulBatch) and n.notifies) or (isinstance(n, ir.FlatMapBatch) and n.clocked)
        for n in graph.nodes
    )


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
