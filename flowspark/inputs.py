"""Sources: the contracts input connectors implement, and the batching helpers (`bytewax.inputs`).

Subclass `FixedPartitionedSource` (partitions with resumable state) or
`DynamicSource` (one stateless partition per worker), never `Source` itself.
A partition's `next_batch()` returns the next items (possibly an empty list
when nothing is ready) and raises `StopIteration` at end of input.

The built-in file sources live in `flowspark.connectors.files` (as Bytewax's do in
`bytewax.connectors.files`); `FileSource`, `DirSource` and `CSVSource` are importable from here
too, imported on first use.
"""

from __future__ import annotations

import asyncio
import queue
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any, Callable, Generic, Optional, cast

from typing_extensions import TypeVar, override

from flowspark._lazy import lazy_names
from flowspark._time import utc_now
from flowspark.errors import FlowsparkTypeError

X = TypeVar("X")
S = TypeVar("S")
#: A polling source's state type: optional, as in Bytewax (`SimplePollingSource[int]` polls with no state).
Sn = TypeVar("Sn", default=None)

__all__ = [
    "DriverItems",
    "AbortExecution",
    "DynamicSource",
    "FixedPartitionedSource",
    "SimplePollingSource",
    "Source",
    "StatefulSourcePartition",
    "StatelessSourcePartition",
    "batch",
    "batch_async",
    "batch_getter",
    "batch_getter_ex",
]


class AbortExecution(RuntimeError):
    """Raise from `next_batch` to abort the execution without EOF (for tests)."""


class Source(ABC, Generic[X]):  # noqa: B024
    """Base class of every source. Subclass one of its subclasses instead."""

    def is_bounded(self) -> bool:
        """Whether this source ends by itself (used by runtimes to pick batch or streaming).

        Returns:
            True for sources that reach end of input; the default is False.
        """
        return False


class StatefulSourcePartition(ABC, Generic[X, S]):
    """One partition of a `FixedPartitionedSource`: items plus a resume position."""

    @abstractmethod
    def next_batch(self) -> Iterable[X]:
        """Return the next items; an empty batch if none are ready now.

        Returns:
            Items.

        Raises:
            StopIteration: At end of input.
        """

    def next_awake(self) -> Optional[datetime]:
        """When to call `next_batch` next; `None` means as soon as possible.

        Returns:
            An aware UTC datetime or `None`.
        """
        return None

    @abstractmethod
    def snapshot(self) -> S:
        """Return the position to resume from; picklable and immutable.

        Returns:
            Resume state handed back to `build_part`.
        """

    def close(self) -> None:  # noqa: B027
        """Release resources at the end of an execution."""


class FixedPartitionedSource(Source[X], Generic[X, S]):
    """A source with a fixed set of named partitions, each with resumable state."""

    @abstractmethod
    def list_parts(self) -> list[str]:
        """Return the names of this source's partitions.

        Returns:
            Partition keys.
        """

    @abstractmethod
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[S]) -> StatefulSourcePartition[X, S]:
        """Build one partition.

        Args:
            step_id: Fully qualified id of the input step.
            for_part: Which partition (one of `list_parts()`).
            resume_state: The partition's last snapshot, or `None` on a fresh start.

        Returns:
            The partition.
        """


class StatelessSourcePartition(ABC, Generic[X]):
    """One partition of a `DynamicSource`."""

    @abstractmethod
    def next_batch(self) -> Iterable[X]:
        """Return the next items; an empty batch if none are ready now.

        Returns:
            Items.

        Raises:
            StopIteration: At end of input.
        """

    def next_awake(self) -> Optional[datetime]:
        """When to call `next_batch` next; `None` means as soon as possible.

        Returns:
            An aware UTC datetime or `None`.
        """
        return None

    def close(self) -> None:  # noqa: B027
        """Release resources at the end of an execution."""


class DynamicSource(Source[X]):
    """A source that builds one stateless partition per worker."""

    @abstractmethod
    def build(self, step_id: str, worker_index: int, worker_count: int) -> StatelessSourcePartition[X]:
        """Build this worker's partition.

        Args:
            step_id: Fully qualified id of the input step.
            worker_index: This worker's index.
            worker_count: Number of workers.

        Returns:
            The partition.
        """


class DriverItems(ABC):
    """A bounded source whose items are already in this (the driver's) process.

    `TestingSource` is one. A distributed runtime may ship such items as data
    instead of reading the source's partitions in its workers (the Spark batch
    runtime sends them in chunks through Arrow).
    """

    @abstractmethod
    def driver_items(self, step_id: str) -> list[Any]:
        """The items one execution reads, in order (up to the first end-of-input marker).

        Args:
            step_id: Fully qualified id of the input step (for error messages).

        Returns:
            The items.

        Raises:
            FlowsparkCompileError: The items hold something only the in-memory
                executor can run (e.g. `TestingSource.ABORT`).
        """

    def driver_batch_size(self) -> int:
        """Items per source batch when the source is polled (Bytewax's activation).

        A runtime that ships `driver_items` keeps these batches: before a stateful
        step, each batch's items are grouped by key as in Bytewax. Default: 1.

        Returns:
            The batch size (>= 1).
        """
        return 1

    def driver_cuts(self, step_id: str) -> list[int]:
        """Positions in `driver_items` where a batch starts before the previous one is full.

        Args:
            step_id: Fully qualified id of the input step (for error messages).

        Returns:
            Sorted positions; the batches after a cut are counted from it. Default: none.
        """
        return []


class _SimplePollingPartition(StatefulSourcePartition[X, Sn]):
    """The one partition of a `SimplePollingSource`: calls `getter` every `interval`.

    Same constructor as Bytewax's (a ported test builds one directly with a fixed `now`).
    """

    def __init__(
        self,
        now: datetime,
        interval: timedelta,
        align_to: Optional[datetime],
        getter: Callable[[], X],
        snapshot: Callable[[], Sn],
    ) -> None:
        self._interval = interval
        self._getter = getter
        self._snapshot = snapshot
        if align_to is not None:
            # The next mark at or after `now`: a start exactly on a mark polls at once.
            since_mark = (now - align_to) % interval
            self._next_awake = now if since_mark == timedelta(0) else now + (interval - since_mark)
        else:
            self._next_awake = now

    @override
    def next_batch(self) -> list[X]:
        try:
            item = self._getter()
        except SimplePollingSource.Retry as retry:
            self._next_awake += retry.timeout
            return []
        self._next_awake += self._interval
        return [] if item is None else [item]

    @override
    def next_awake(self) -> Optional[datetime]:
        return self._next_awake

    @override
    def snapshot(self) -> Sn:
        return self._snapshot()


class SimplePollingSource(FixedPartitionedSource[X, Sn]):
    """Call `next_item()` every `interval`; for polling an API.

    One partition (`"singleton"`): only one worker polls. `next_item` returns
    the next item (`None`: nothing this time), raises `SimplePollingSource.Retry`
    to poll again sooner, and raises `StopIteration` at end of input. The type
    parameters are the item type and the resume-state type, as in Bytewax:
    override `snapshot` (the position after the last item returned) and `resume`
    (called once, before the first `next_item`, when an execution resumes).

    Args:
        interval: Time between polls.
        align_to: Poll on the marks `align_to + k * interval` (e.g. on the hour):
            the first poll is at the first mark at or after the start (at once
            when the start is exactly on a mark). `None` polls at once.

    Example:
        >>> from datetime import timedelta
        >>> class Ticker(SimplePollingSource[str, int]):
        ...     def __init__(self):
        ...         super().__init__(timedelta(seconds=1))
        ...         self.n = 0
        ...     def next_item(self):
        ...         self.n += 1
        ...         return "tick"
        ...     def snapshot(self):
        ...         return self.n
        ...     def resume(self, resume_state):
        ...         self.n = resume_state
        >>> part = Ticker().build_part("flow.inp", "singleton", 41)
        >>> part.next_batch(), part.snapshot()
        (['tick'], 42)
    """

    class Retry(Exception):  # noqa: N818
        """Raise from `next_item` to poll again after `timeout` instead of the interval.

        Args:
            timeout: How long to wait before the next `next_item` call.
        """

        def __init__(self, timeout: timedelta) -> None:
            """Retry after `timeout`."""
            super().__init__(timeout)
            self.timeout = timeout

    def __init__(self, interval: timedelta, align_to: Optional[datetime] = None) -> None:
        """Poll every `interval`."""
        self._interval = interval
        self._align_to = align_to

    @override
    def list_parts(self) -> list[str]:
        return ["singleton"]

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[Sn]) -> _SimplePollingPartition[X, Sn]:
        now = utc_now()
        if resume_state is not None:
            self.resume(resume_state)
        return _SimplePollingPartition(now, self._interval, self._align_to, self.next_item, self.snapshot)

    @abstractmethod
    def next_item(self) -> X:
        """Return the next item; `None` for no item this time.

        Returns:
            An item.

        Raises:
            SimplePollingSource.Retry: To try again sooner than the interval.
            StopIteration: At end of input.
        """

    def snapshot(self) -> Sn:
        """Return the position to resume after the last item `next_item` returned (default `None`).

        Returns:
            Picklable state, handed to `resume` when an execution resumes.
        """
        return cast(Sn, None)

    def resume(self, resume_state: Sn) -> None:  # noqa: B027
        """Go back to a snapshot; called once before `next_item` when an execution resumes.

        Args:
            resume_state: What `snapshot` returned.
        """


def batch(ib: Iterable[X], batch_size: int) -> Iterator[list[X]]:
    """Group an iterable into lists of at most `batch_size` items.

    Args:
        ib: Items.
        batch_size: Largest batch.

    Yields:
        Lists of items.
    """
    it = iter(ib)
    while True:
        chunk = []
        for item in it:
            chunk.append(item)
            if len(chunk) >= batch_size:
                break
        if not chunk:
            return
        yield chunk


def _check_size(fn: str, batch_size: Any) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        msg = f"{fn}: batch_size must be an int >= 1; received {batch_size!r}"
        raise ValueError(msg)
    return batch_size


def _check_getter(fn: str, getter: Any) -> None:
    if not callable(getter):
        msg = f"{fn}: getter must be a function of no arguments; received {getter!r} of type {type(getter).__name__}"
        raise FlowsparkTypeError(msg)


def batch_getter(getter: Callable[[], X], batch_size: int, yield_on: Optional[X] = None) -> Iterator[list[X]]:
    """Gather batches from a function that returns `yield_on` (default `None`) while nothing is ready.

    Each batch calls `getter()` until it has `batch_size` items or `getter()`
    returns `yield_on` (the batch is then cut short, possibly empty). When
    `getter()` raises `StopIteration` the current batch (possibly empty) is the
    last one. Use it in a partition's `next_batch`: `return next(self._batches)`.

    Args:
        getter: Called for each item; returns `yield_on` when no item is ready
            yet and raises `StopIteration` at the end of the input.
        batch_size: Most items per batch.
        yield_on: The "nothing yet" value (compared with `!=`).

    Returns:
        An iterator of batches (lists).

    Raises:
        ValueError: `batch_size` is not an int >= 1.
        FlowsparkTypeError: `getter` is not callable.

    Example:
        >>> feed = iter([1, 2, None, 3, 4, 5])
        >>> list(batch_getter(lambda: next(feed), 2))
        [[1, 2], [], [3, 4], [5]]
    """
    _check_getter("batch_getter", getter)
    size = _check_size("batch_getter", batch_size)

    def gen() -> Iterator[list[X]]:
        while True:
            chunk: list[X] = []
            while len(chunk) < size:
                try:
                    item = getter()
                except StopIteration:
                    yield chunk
                    return
                if item != yield_on:
                    chunk.append(item)
                else:
                    break
            yield chunk

    return gen()


def batch_getter_ex(
    getter: Callable[[], X], batch_size: int, yield_ex: type[BaseException] = queue.Empty
) -> Iterator[list[X]]:
    """Gather batches from a function that raises `yield_ex` (default `queue.Empty`) while nothing is ready.

    Like `batch_getter`, but "nothing ready yet" is signalled by raising
    `yield_ex`, so any value (also `None`) can be an item. Suits
    `queue.Queue.get_nowait`.

    Args:
        getter: Called for each item; raises `yield_ex` when no item is ready
            yet and `StopIteration` at the end of the input.
        batch_size: Most items per batch.
        yield_ex: The exception class that means "nothing yet".

    Returns:
        An iterator of batches (lists).

    Raises:
        ValueError: `batch_size` is not an int >= 1.
        FlowsparkTypeError: `getter` is not callable or `yield_ex` is not an exception class.

    Example:
        >>> import queue
        >>> q = queue.Queue()
        >>> for x in (1, None, 3):
        ...     q.put(x)
        >>> batches = batch_getter_ex(q.get_nowait, 2)
        >>> next(batches), next(batches), next(batches)
        ([1, None], [3], [])
    """
    _check_getter("batch_getter_ex", getter)
    size = _check_size("batch_getter_ex", batch_size)
    if not (isinstance(yield_ex, type) and issubclass(yield_ex, BaseException)):
        msg = f"batch_getter_ex: yield_ex must be an exception class such as queue.Empty; received {yield_ex!r}"
        raise FlowsparkTypeError(msg)

    def gen() -> Iterator[list[X]]:
        while True:
            chunk: list[X] = []
            while len(chunk) < size:
                try:
                    chunk.append(getter())
                except yield_ex:
                    break
                except StopIteration:
                    yield chunk
                    return
            yield chunk

    return gen()


def batch_async(
    aib: AsyncIterable[X],
    timeout: timedelta,
    batch_size: int,
    loop: Optional[asyncio.AbstractEventLoop] = None,
) -> Iterator[list[X]]:
    """Read an async iterable in batches, waiting at most `timeout` for each batch.

    A partition's `next_batch` must not block; this runs the async iterator on
    an event loop for up to `timeout` per batch and returns what arrived (up to
    `batch_size` items, possibly none). An item still on its way when the time
    is up is not lost: it is awaited again for the next batch. When the async
    iterator ends, the items gathered so far are the last batch.

    Args:
        aib: The async iterable (e.g. an async generator).
        timeout: Longest wait for one batch.
        batch_size: Most items per batch.
        loop: Event loop to run on (default: a new one, used for every batch).

    Returns:
        An iterator of batches (lists).

    Raises:
        ValueError: `batch_size` is not an int >= 1 or `timeout` is negative.
        FlowsparkTypeError: `aib` is not async iterable or `timeout` is not a `timedelta`.

    Example:
        >>> from datetime import timedelta
        >>> async def numbers():
        ...     for i in range(5):
        ...         yield i
        >>> list(batch_async(numbers(), timedelta(seconds=1), 2))
        [[0, 1], [2, 3], [4]]
    """
    if not hasattr(aib, "__aiter__"):
        msg = (
            f"batch_async: aib must be an async iterable (an async generator or an object with "
            f"__aiter__); received {aib!r} of type {type(aib).__name__}"
        )
        raise FlowsparkTypeError(msg)
    if not isinstance(timeout, timedelta):
        msg = f"batch_async: timeout must be a timedelta (e.g. timedelta(seconds=1)); received {timeout!r}"
        raise FlowsparkTypeError(msg)
    if timeout < timedelta(0):
        msg = f"batch_async: timeout must not be negative; received {timeout!r}"
        raise ValueError(msg)
    size = _check_size("batch_async", batch_size)
    ait = aib.__aiter__()
    ev_loop = loop if loop is not None else asyncio.new_event_loop()
    wait_secs = timeout.total_seconds()
    pending: Optional[asyncio.Future[X]] = None

    async def next_item() -> X:
        return await ait.__anext__()

    async def gather() -> tuple[list[X], bool]:
        nonlocal pending
        chunk: list[X] = []
        deadline = ev_loop.time() + wait_secs
        while len(chunk) < size:
            if pending is None:
                pending = ev_loop.create_task(next_item())
            done, _ = await asyncio.wait({pending}, timeout=max(0.0, deadline - ev_loop.time()))
            if not done:
                break
            task, pending = pending, None
            try:
                chunk.append(task.result())
            except StopAsyncIteration:
                return chunk, True
        return chunk, False

    def gen() -> Iterator[list[X]]:
        while True:
            chunk, ended = ev_loop.run_until_complete(gather())
            if chunk or not ended:
                yield chunk
            if ended:
                return

    return gen()


#: The file sources, kept importable from here (`flowspark.connectors.files` is their home).
_HOMES = {name: "flowspark.connectors.files" for name in ("CSVSource", "DirSource", "FileSource")}

__getattr__ = lazy_names(__name__, _HOMES, globals())
