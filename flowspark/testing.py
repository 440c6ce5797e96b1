"""Testing helpers: TestingSource, TestingSink and `run_main`, the in-memory executor.

```python
from flowspark.dataflow import Dataflow
import flowspark.operators as op
from flowspark.testing import TestingSource, TestingSink, run_main

flow = Dataflow("counts")
s = op.input("inp", flow, TestingSource([("a", 1), ("b", 1), ("a", 1)]))
s = op.stateful_map("count", s, lambda n, v: ((n or 0) + v, (n or 0) + v))
out = []
op.output("out", s, TestingSink(out))
run_main(flow)
assert out == [("a", 1), ("b", 1), ("a", 2)]
```
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from itertools import chain, islice
from typing import Any, Optional, TypeVar, Union

from typing_extensions import override

from flowspark._time import utc_now
from flowspark.errors import FlowsparkCompileError
from flowspark.inputs import (
    AbortExecution,
    DriverItems,
    FixedPartitionedSource,
    StatefulSourcePartition,
    StatelessSourcePartition,
)
from flowspark.outputs import DriverSink, StatelessSinkPartition
from flowspark.recovery import RecoveryConfig
from flowspark.runtime.local import run_main

X = TypeVar("X")

__all__ = [
    "TestingSink",
    "TestingSource",
    "TimeTestingGetter",
    "cluster_main",
    "ffwd_iter",
    "per_key",
    "poll_next_batch",
    "run_main",
]


@dataclass
class TimeTestingGetter:
    """A clock you move by hand, for tests.

    Args:
        now: The current time.

    Example:
        >>> from datetime import datetime, timedelta, timezone
        >>> clock = TimeTestingGetter(datetime(2024, 1, 1, tzinfo=timezone.utc))
        >>> clock.advance(timedelta(seconds=5))
        >>> clock.get().second
        5
    """

    now: datetime

    def advance(self, td: timedelta) -> None:
        """Move the clock forward.

        Args:
            td: By this much.
        """
        self.now += td

    def get(self) -> datetime:
        """Return the current time.

        Returns:
            The time.
        """
        return self.now


def ffwd_iter(it: Iterator[Any], n: int) -> None:
    """Skip `n` items of an iterator.

    Args:
        it: The iterator.
        n: How many items to skip.
    """
    next(islice(it, n, n), None)


class _IterSourcePartition(StatefulSourcePartition[X, int]):
    def __init__(self, ib: Iterable[Any], batch_size: int, resume_state: Optional[int]) -> None:
        self._idx = 0 if resume_state is None else resume_state
        self._batch_size = batch_size
        self._next_awake: Optional[datetime] = None
        self._it = iter(ib)
        ffwd_iter(self._it, self._idx)
        self._raise: Optional[BaseException] = None

    @override
    def next_batch(self) -> list[X]:
        if self._raise is not None:
            raise self._raise
        self._next_awake = None
        if self._batch_size == 1:
            # The default batch size: one item per call, so this is the executor's hot loop
            # (a call per item); a marker goes the general way.
            item: Any = next(self._it, _DONE)
            if item is _DONE:
                raise StopIteration
            if type(item) not in _MARKER_TYPES:
                self._idx += 1
                return [item]
            return self._batch(chain((item,), self._it))
        return self._batch(self._it)

    def _batch(self, items: Iterable[Any]) -> list[X]:
        batch: list[X] = []
        size = self._batch_size
        for item in items:
            if isinstance(item, _MARKERS):
                if isinstance(item, TestingSource.EOF):
                    self._raise = StopIteration()
                    self._idx += 1
                    break
                if isinstance(item, TestingSource.ABORT):
                    if not item._triggered:
                        item._triggered = True
                        self._raise = AbortExecution()
                        break
                    self._idx += 1
                    continue
                if isinstance(item, TestingSource.PAUSE):
                    self._idx += 1
                    self._next_awake = utc_now() + item.for_duration
                    break
            batch.append(item)
            if len(batch) >= size:
                break
        if batch or self._raise is not None or self._next_awake is not None:
            self._idx += len(batch)
            return batch
        raise StopIteration

    @override
    def next_awake(self) -> Optional[datetime]:
        return self._next_awake

    @override
    def snapshot(self) -> int:
        return self._idx


class TestingSource(FixedPartitionedSource[X, int], DriverItems):
    """Produce items from a Python iterable (one partition, resumable by index).

    Markers in the iterable control the execution: `TestingSource.EOF()` ends this
    execution's input (a resumed run continues after it), `TestingSource.ABORT()`
    aborts the execution once (no EOF; `run_main` returns), and
    `TestingSource.PAUSE(timedelta)` idles the input for that much system time
    (`flowspark._time.utc_now()`, so a clock installed with `use_clock` drives it too)
    while the rest of the dataflow keeps running.

    Args:
        ib: The items (a list is safest: a half-consumed generator cannot be replayed).
        batch_size: Items per poll.

    Example:
        >>> src = TestingSource([1, 2, TestingSource.EOF(), 3])
    """

    __test__ = False

    @dataclass
    class EOF:
        """End this execution's input here."""

    @dataclass
    class ABORT:
        """Abort the execution (once) when the input reaches this point."""

        _triggered: bool = False

    @dataclass
    class PAUSE:
        """Emit nothing from this source for `for_duration` of wall-clock time."""

        for_duration: timedelta

    def __init__(self, ib: Iterable[Union[X, EOF, ABORT, PAUSE]], batch_size: int = 1) -> None:
        """Read `ib`, `batch_size` items per poll."""
        if not isinstance(batch_size, int) or batch_size < 1:
            msg = f"TestingSource batch_size must be an int >= 1; received {batch_size!r}"
            raise ValueError(msg)
        self._ib = ib
        self._batch_size = batch_size

    @property
    def items(self) -> Iterable[Any]:
        """The iterable this source reads (runtimes that ship it elsewhere use it)."""
        return self._ib

    @property
    def batch_size(self) -> int:
        """Items per poll."""
        return self._batch_size

    @override
    def is_bounded(self) -> bool:
        return True

    @override
    def list_parts(self) -> list[str]:
        return ["iterable"]

    @override
    def driver_items(self, step_id: str) -> list[Any]:
        return self._driver_scan(step_id)[0]

    @override
    def driver_batch_size(self) -> int:
        return self._batch_size

    @override
    def driver_cuts(self, step_id: str) -> list[int]:
        return self._driver_scan(step_id)[1]

    def _driver_scan(self, step_id: str) -> tuple[list[Any], list[int]]:
        """The items up to the first EOF, and where a PAUSE ends a batch early (as `next_batch` does)."""
        raw = self._ib
        if isinstance(raw, list) and _MARKER_TYPES.isdisjoint(set(map(type, raw))):
            return raw, []  # fast path: no marker (subclasses of the markers are not expected)
        items: list[Any] = []
        cuts: list[int] = []
        for x in raw:
            if isinstance(x, TestingSource.EOF):
                break
            if isinstance(x, TestingSource.PAUSE):
                if not cuts or cuts[-1] != len(items):
                    cuts.append(len(items))
                continue
            if isinstance(x, TestingSource.ABORT):
                msg = (
                    f"step {step_id!r}: TestingSource.ABORT cannot run on the Spark batch runtime "
                    "(a batch job has no epochs to abort between); remove the marker or use run_main"
                )
                raise FlowsparkCompileError(msg)
            items.append(x)
        return items, cuts

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _IterSourcePartition[X]:
        return _IterSourcePartition(self._ib, self._batch_size, resume_state)


_MARKERS = (TestingSource.EOF, TestingSource.ABORT, TestingSource.PAUSE)
_MARKER_TYPES = frozenset(_MARKERS)
#: The end of a partition's items (`_IterSourcePartition.next_batch`).
_DONE = object()


class _ListSinkPartition(StatelessSinkPartition[X]):
    def __init__(self, ls: list[X]) -> None:
        self._ls = ls

    @override
    def write_batch(self, items: list[X]) -> None:
        self._ls += items


class TestingSink(DriverSink[X]):
    """Append every item to a list (never cleared between executions).

    Args:
        ls: The list to append to.

    Example:
        >>> out = []
        >>> sink = TestingSink(out)
    """

    __test__ = False

    def __init__(self, ls: list[X]) -> None:
        """Append to `ls`."""
        self.ls = ls

    @override
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _ListSinkPartition[X]:
        return _ListSinkPartition(self.ls)


def cluster_main(
    flow: Any,
    addresses: list[str],
    proc_id: int,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Optional[RecoveryConfig] = None,
    worker_count_per_proc: int = 1,
) -> None:
    """Run a dataflow as one process of a cluster (Bytewax's `cluster_main`): its workers, in this thread.

    Runs `worker_count_per_proc` workers with the in-memory executor, each with the
    source partitions and keys Bytewax gives it (see `flowspark.runtime.workers`), so
    a flow's partition-sensitive behaviour can be tested as in Bytewax:
    `cluster_main(flow, [], 0, worker_count_per_proc=2)`. The workers take turns in
    this thread. `addresses` may name this one process (no address or a single one,
    `proc_id` 0); a process of a larger cluster raises `SingleProcessError` instead of
    running a part of the flow: run a cluster on Spark (`flowspark submit`).

    Args:
        flow: The `Dataflow`.
        addresses: Every process's `"host:port"` (at most one here).
        proc_id: This process's index in `addresses` (0 here).
        epoch_interval: Time between epochs (snapshots); default 10 s.
        recovery_config: Snapshot state to this store and resume from it. The store
            does not depend on the worker count: a run may resume one written with
            another number of workers (as Bytewax allows rescaling).
        worker_count_per_proc: Workers in this process.

    Raises:
        SingleProcessError: The arguments describe more than one process (a `ValueError`).
        ValueError: `proc_id` is not an index of `addresses`, or a count is out of range.
        FlowsparkTypeError: An argument of the wrong type.
        FlowsparkRuntimeError: A step failed (as for `run_main`).

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 1), ("b", 1), ("a", 1)]))
        >>> s = op.inspect_debug("where", op.stateful_map("sum", s, lambda n, v: ((n or 0) + v, (n or 0) + v)))
        >>> cluster_main(flow, [], 0, worker_count_per_proc=2)
        eg.where W1 @1: ('a', 1)
        eg.where W0 @1: ('b', 1)
        eg.where W1 @1: ('a', 2)
        >>> cluster_main(flow, ["localhost:2101", "localhost:2102"], 0)
        Traceback (most recent call last):
        ...
        flowspark.errors.SingleProcessError: cluster_main: the in-memory executor runs its workers ...
    """
    from flowspark.run import workers_of
    from flowspark.runtime.workers import run_workers

    n = workers_of(
        "cluster_main",
        workers=worker_count_per_proc,
        workers_name="worker_count_per_proc",
        process_id=proc_id,
        pid_name="proc_id",
        addresses=list(addresses) if isinstance(addresses, (list, tuple)) else addresses,
    )
    logging.getLogger(__name__).info(
        "running dataflow %r with the in-memory executor (%d worker%s)", getattr(flow, "flow_id", flow), n, "s"[: n - 1]
    )
    run_workers("cluster_main", flow, n, epoch_interval=epoch_interval, recovery_config=recovery_config)


def poll_next_batch(
    part: Union[StatefulSourcePartition[X, Any], StatelessSourcePartition[X]],
    timeout: timedelta = timedelta(seconds=5),
) -> list[X]:
    """Poll a source partition until it returns a non-empty batch (for testing connectors).

    Args:
        part: The partition.
        timeout: Give up after this long.

    Returns:
        The batch.

    Raises:
        TimeoutError: Nothing arrived in time.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        awake = part.next_awake()
        if awake is not None:
            wait = (awake - datetime.now(timezone.utc)).total_seconds()
            if wait > 0:
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
        batch = list(part.next_batch())
        if batch:
            return batch
        if time.monotonic() >= deadline:
            msg = f"no batch within {timeout}"
            raise TimeoutError(msg)
        time.sleep(0.001)


def per_key(items: Iterable[tuple[str, Any]]) -> dict[str, list[Any]]:
    """Group `(key, value)` items by key, keeping each key's order.

    Runtimes give the same order within a key (the in-memory executor's), but
    distributed runtimes may interleave keys differently: compare per key.

    Args:
        items: `(key, value)` items, e.g. what a `TestingSink` collected.

    Returns:
        `{key: [values in order]}`.

    Example:
        >>> per_key([("a", 1), ("b", 2), ("a", 3)])
        {'a': [1, 3], 'b': [2]}
    """
    out: dict[str, list[Any]] = {}
    for k, v in items:
        out.setdefault(k, []).append(v)
    return out


def _main(argv: Optional[list[str]] = None) -> int:
    """`python -m flowspark.testing IMPORT_STR`: Bytewax's `python -m bytewax.testing`.

    The flags of `python -m flowspark.run` plus Bytewax's `-p/--processes`. Bytewax
    starts P processes of W workers (`-p P -w W`); the in-memory executor runs those
    P x W workers in this one process, numbered as Bytewax numbers them (process `i`
    has workers `i * W` to `i * W + W - 1`).

    Args:
        argv: Arguments (default: `sys.argv[1:]`).

    Returns:
        The exit code.
    """
    from flowspark.run import main

    return main(argv, prog="python -m flowspark.testing", processes=True)


if __name__ == "__main__":
    import sys

    sys.exit(_main())
