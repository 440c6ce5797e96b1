"""Sources: the contracts input connectors implement, and the built-in connectors.

Subclass `FixedPartitionedSource` (partitions with resumable state) or
`DynamicSource` (one stateless partition per worker), never `Source` itself.
A partition's `next_batch()` returns the next items (possibly an empty list
when nothing is ready) and raises `StopIteration` at end of input.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, Generic, Optional, TypeVar

from typing_extensions import override

X = TypeVar("X")
S = TypeVar("S")

__all__ = [
    "AbortExecution",
    "DynamicSource",
    "FixedPartitionedSource",
    "SimplePollingSource",
    "Source",
    "StatefulSourcePartition",
    "StatelessSourcePartition",
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


class _SimplePollingPartition(StatefulSourcePartition[X, Any]):
    def __init__(
        self,
        now: datetime,
        interval: timedelta,
        align_to: Optional[datetime],
        source: SimplePollingSource[X],
    ) -> None:
        self._interval = interval
        self._source = source
        if align_to is not None:
            since = now - align_to
            self._next_awake = align_to + ((since // interval) + 1) * interval
        else:
            self._next_awake = now

    @override
    def next_batch(self) -> list[X]:
        try:
            item = self._source.next_item()
        except SimplePollingSource.Retry as retry:
            self._next_awake += retry.timeout
            return []
        self._next_awake += self._interval
        return [] if item is None else [item]

    @override
    def next_awake(self) -> Optional[datetime]:
        return self._next_awake

    @override
    def snapshot(self) -> Any:
        return self._source.snapshot()


class SimplePollingSource(FixedPartitionedSource[X, Any]):
    """Call `next_item()` every `interval`; for polling an API.

    Args:
        interval: Time between polls.
        align_to: Align polls to this time (e.g. on the hour); `None` polls at once.

    Example:
        >>> from datetime import timedelta
        >>> class Ticker(SimplePollingSource):
        ...     def next_item(self):
        ...         return "tick"
        >>> src = Ticker(timedelta(seconds=1))
    """

    class Retry(Exception):  # noqa: N818
        """Raise from `next_item` to try again after `timeout`."""

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
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[Any]) -> _SimplePollingPartition[X]:
        now = datetime.now(timezone.utc)
        if resume_state is not None:
            self.resume(resume_state)
        return _SimplePollingPartition(now, self._interval, self._align_to, self)

    @abstractmethod
    def next_item(self) -> X:
        """Return the next item; `None` for no item this time.

        Returns:
            An item.

        Raises:
            SimplePollingSource.Retry: To try again sooner than the interval.
        """

    def snapshot(self) -> Any:
        """Return resume state (default `None`).

        Returns:
            Picklable state.
        """
        return None

    def resume(self, resume_state: Any) -> None:  # noqa: B027
        """Restore from a snapshot."""


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
