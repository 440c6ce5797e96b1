"""N workers in one process: Bytewax's `cluster_main(flow, [], 0, worker_count_per_proc=N)` in memory.

Each worker is a single-worker executor (`flowspark.runtime.local.Executor`) with its
own step runtimes over its share of the flow, as Bytewax 0.21.1 shares it
(`flowspark.runtime.routing`):

- a `FixedPartitionedSource`'s partitions, in sorted order, go round robin to the
  workers; a `DynamicSource` is built on every worker with `build(step_id,
  worker_index, worker_count)`;
- a stateful step's keys go to worker `siphash13(key) % N`; each worker keeps the
  logics of its keys (and resumes only those from a recovery store);
- a `FixedPartitionedSink`'s partitions go round robin to the workers and every item
  goes to the worker of its partition; a `DynamicSink` is built on every worker and
  writes what reaches that worker;
- `redistribute` sends each item to a worker drawn at random (a fixed seed, so a run
  repeats); every other step runs on the worker that holds the item.

The workers take turns in one thread. A pass polls one batch from every source
partition (Bytewax's activation) and runs each core step on worker 0, 1, ... before
the next step, moving items to their worker where a step needs it (an *exchange*,
which keeps each sending worker's order). So the workers' outputs interleave batch by
batch, a pass stays a consistent cut for epochs and snapshots (all workers take them
together), and per key a stateful step gets the same values in the same activations
as with one worker when they come from one source partition; a key's values from
several partitions in one pass arrive worker by worker (in Bytewax, in whatever order
the threads deliver them). A stream reaches end of input on a worker when it has on
every worker, as a Timely frontier does. Moving one batch at a time makes N workers
slower than one: they are for testing how a flow behaves when partitioned.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Optional, cast

from flowspark import ir
from flowspark.outputs import FixedPartitionedSink, part_of
from flowspark.recovery import RecoveryStore
from flowspark.runtime.local import Executor, run_flow
from flowspark.runtime.routing import key_worker, primaries
from flowspark.runtime.steps import OutputRuntime, StepRuntime

__all__ = ["run_workers"]

#: Where an item goes: `route(item, this worker's index) -> worker index`.
_Route = Callable[[Any, int], int]
_SEED = 0


class _Loaded:
    """A recovery store read once for every worker (each builds its share from it)."""

    def __init__(self, store: RecoveryStore) -> None:
        self.states = store.load()
        self.epoch = store.resume_epoch()

    def load(self) -> dict[str, dict[str, Any]]:
        return self.states

    def resume_epoch(self) -> int:
        return self.epoch


class _Worker(Executor):
    """One worker: the step runtimes of the single-worker executor over this worker's share."""

    def __init__(self, graph: ir.Graph, worker: tuple[int, int], cluster: list[_Worker], **options: Any) -> None:
        self.worker = worker
        self.cluster = cluster
        super().__init__(graph, **options)

    def _build_rt(self, node: ir.Node, resume: dict[str, Any], consumers: dict[str, list[ir.Node]]) -> StepRuntime:
        if isinstance(node, ir.StatefulBatch) and resume:
            index, count = self.worker
            resume = {k: v for k, v in resume.items() if key_worker(k, count) == index}
        return super()._build_rt(node, resume, consumers)

    def is_eof(self, stream_id: str) -> bool:
        return all(w.producer[stream_id].eof for w in self.cluster)


class _Workers(Executor):
    """Runs the passes of N `_Worker`s in turn; `Executor.run` drives it (epochs, idling, closing)."""

    def __init__(
        self,
        graph: ir.Graph,
        *,
        workers: int,
        epoch_interval: Any,
        store: Optional[RecoveryStore],
        clock: Any,
        fixed_time: bool = False,
        dead_letter: Any = None,
        **options: Any,
    ) -> None:
        # Not `super().__init__`: the workers hold the step runtimes; this object holds what
        # `Executor.run` reads (`rts`, `store`, `epoch`, the clock) for all of them.
        self.epoch_interval = epoch_interval
        self.store = store
        self.clock = clock
        self.fixed_time = fixed_time
        self.dead_letter = dead_letter
        self.polled = 0
        self.closing = False
        loaded = None if store is None else cast(RecoveryStore, _Loaded(store))
        self.epoch = 1 if loaded is None else loaded.resume_epoch() + 1
        self.workers: list[_Worker] = []
        for i in range(workers):
            w = _Worker(
                graph,
                (i, workers),
                self.workers,
                epoch_interval=epoch_interval,
                store=loaded,
                clock=clock,
                fixed_time=fixed_time,
                dead_letter=dead_letter,
                **options,
            )
            self.workers.append(w)
        self.rts = [rt for w in self.workers for rt in w.rts]
        self.nodes = list(ir.walk(graph))
        # One source batch (Bytewax's activation) per partition moves through every worker in
        # a pass, so the workers' outputs interleave batch by batch, and a pass carries no
        # activation bounds to keep apart across an exchange.
        for w in self.workers:
            w.one_batch_per_pass = True
            w.needs_bounds = set()
        self.rng = random.Random(_SEED)
        #: Step index -> the route of its input, for the steps whose input is exchanged.
        self.routes: dict[int, _Route] = {}
        for i, node in enumerate(self.nodes):
            if isinstance(node, ir.StatefulBatch):
                self.routes[i] = _by_key(workers)
            elif isinstance(node, ir.Output) and isinstance(node.sink, FixedPartitionedSink):
                self.routes[i] = _by_part(node, cast(OutputRuntime, self.workers[0].rts[i]).part_keys, workers)

    def run_pass(self) -> None:
        workers = self.workers
        for w in workers:
            w.epoch = self.epoch
            w.closing = self.closing
            w.polled = 0
            w.vals = {}
        for i, node in enumerate(self.nodes):
            route = self.routes.get(i)
            if route is not None:
                self._step_exchanged(i, node.ups[0], route)
            else:
                for w in workers:
                    w.rts[i].step(w)
            if isinstance(node, ir.Redistribute):
                self._redistribute(node.down)
        self.polled = sum(w.polled for w in workers)
        dead: list[dict[str, Any]] = []
        for w in workers:
            w.vals = {}
            if w.dead:
                dead.extend(w.dead)
                w.dead = []
        if dead:
            assert self.dead_letter is not None
            self.dead_letter.write(dead, self.epoch)

    def _step_exchanged(self, i: int, stream: str, route: _Route) -> None:
        """Run step `i` on every worker over the items of `stream` that `route` sends there.

        The stream's items stay where they were for its other consumers.
        """
        for w, items in zip(self.workers, self._exchange(stream, route), strict=True):
            kept = _place(w, stream, items)
            w.rts[i].step(w)
            _place(w, stream, kept)

    def _redistribute(self, stream: str) -> None:
        """Move each item of a `redistribute` step's output to a worker drawn at random."""
        n = len(self.workers)
        pick = self.rng.randrange
        for w, items in zip(self.workers, self._exchange(stream, lambda _x, _here: pick(n)), strict=True):
            _place(w, stream, items)

    def _exchange(self, stream: str, route: _Route) -> list[list[Any]]:
        """Every worker's items of `stream`, sent where `route` says (worker by worker, each one's order kept)."""
        outs: list[list[Any]] = [[] for _ in self.workers]
        for w in self.workers:
            here = w.worker[0]
            for x in w.vals.get(stream, ()):
                outs[route(x, here)].append(x)
        return outs


def _place(w: _Worker, stream: str, items: Optional[list[Any]]) -> Optional[list[Any]]:
    """Make `items` the worker's items of `stream` in this pass; return what they were."""
    kept = w.vals.pop(stream, None)
    if items:
        w.vals[stream] = items
    return kept


def _by_key(count: int) -> _Route:
    """A stateful step's route: a `(str key, value)` item goes to the worker of its key.

    Anything else stays where it is: the step there raises or dead-letters it, as with one worker.
    """
    owner: dict[str, int] = {}

    def route(kv: Any, here: int) -> int:
        if isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str):
            w = owner.get(kv[0])
            if w is None:
                w = owner[kv[0]] = key_worker(kv[0], count)
            return w
        return here

    return route


def _by_part(node: ir.Output, part_keys: list[str], count: int) -> _Route:
    """A `FixedPartitionedSink`'s route: an item goes to the worker of its partition.

    An item it cannot route (not `(str key, value)`, or `part_fn` raised) stays where it
    is: the output step there raises the same error, naming the step, as with one worker.
    """
    owner = primaries(part_keys, count)
    sink = node.sink
    n = len(part_keys)

    def route(kv: Any, here: int) -> int:
        try:
            return owner[part_keys[part_of(node.step_id, sink, kv, n)]]
        except Exception:  # noqa: BLE001
            return here

    return route


def run_workers(fn: str, flow: Any, workers: int, **options: Any) -> None:
    """Run a dataflow on `workers` workers in this thread (one worker: exactly `run_main`).

    Args:
        fn: The caller's name, for messages.
        flow: The `Dataflow`.
        workers: Number of workers (>= 1).
        **options: `run_main`'s keyword arguments (`epoch_interval`, `recovery_config`, ...).

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 1), ("b", 2)]))
        >>> _ = op.inspect_debug("show", op.map_value("m", s, str), lambda sid, x, ep, w: print(x, "on", w))
        >>> run_workers("cluster_main", flow, 2)
        ('a', '1') on 0
        ('b', '2') on 0
    """
    if workers == 1:
        run_flow(fn, flow, Executor, **options)
    else:
        run_flow(fn, flow, lambda graph, **kw: _Workers(graph, workers=workers, **kw), **options)
