"""Sinks: the contracts output connectors implement, and the built-in connectors.

Subclass `FixedPartitionedSink` (items are `(key, value)`; the key picks the
partition, the partition receives values and has resumable state) or
`DynamicSink` (one stateless partition per worker), never `Sink` itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, Optional, TypeVar
from zlib import adler32

X = TypeVar("X")
S = TypeVar("S")

__all__ = [
    "DynamicSink",
    "FixedPartitionedSink",
    "Sink",
    "StatefulSinkPartition",
    "StatelessSinkPartition",
]


class Sink(ABC, Generic[X]):  # noqa: B024
    """Base class of every sink. Subclass one of its subclasses instead."""


class StatefulSinkPartition(ABC, Generic[X, S]):
    """One partition of a `FixedPartitionedSink`."""

    @abstractmethod
    def write_batch(self, values: list[X]) -> None:
        """Write a batch of values.

        Args:
            values: Values, in order.
        """

    @abstractmethod
    def snapshot(self) -> S:
        """Return state to resume writing from (e.g. a file offset).

        Returns:
            Picklable resume state.
        """

    def close(self) -> None:  # noqa: B027
        """Release resources at the end of an execution."""


class FixedPartitionedSink(Sink[tuple[str, X]], Generic[X, S]):
    """A sink with named partitions; `(key, value)` items are routed by key."""

    @abstractmethod
    def list_parts(self) -> list[str]:
        """Return the names of this sink's partitions.

        Returns:
            Partition keys.
        """

    def part_fn(self, item_key: str) -> int:
        """Hash a key to pick its partition (`hash % len(parts)`).

        Args:
            item_key: The item's key.

        Returns:
            A stable integer hash (adler32 by default).
        """
        return adler32(item_key.encode())

    @abstractmethod
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[S]) -> StatefulSinkPartition[X, S]:
        """Build one partition.

        Args:
            step_id: Fully qualified id of the output step.
            for_part: Which partition.
            resume_state: Its last snapshot, or `None`.

        Returns:
            The partition.
        """


class StatelessSinkPartition(ABC, Generic[X]):
    """One partition of a `DynamicSink`."""

    @abstractmethod
    def write_batch(self, items: list[X]) -> None:
        """Write a batch of items.

        Args:
            items: Items, in order.
        """

    def close(self) -> None:  # noqa: B027
        """Release resources at the end of an execution."""


class DynamicSink(Sink[X]):
    """A sink that builds one stateless partition per worker."""

    @abstractmethod
    def build(self, step_id: str, worker_index: int, worker_count: int) -> StatelessSinkPartition[X]:
        """Build this worker's partition.

        Args:
            step_id: Fully qualified id of the output step.
            worker_index: This worker's index.
            worker_count: Number of workers.

        Returns:
            The partition.
        """
