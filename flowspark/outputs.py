"""Sinks: the contracts output connectors implement, and the built-in connectors.

Subclass `FixedPartitionedSink` (items are `(key, value)`; the key picks the
partition, the partition receives values and has resumable state) or
`DynamicSink` (one stateless partition per worker), never `Sink` itself.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar, Union
from zlib import adler32

from typing_extensions import override

from flowspark._paths import cwd_note
from flowspark.errors import FlowsparkBuildError, FlowsparkTypeError, RecoveryError

X = TypeVar("X")
S = TypeVar("S")

__all__ = [
    "part_of",
    "route_to_parts",
    "DriverSink",
    "DirSink",
    "DynamicSink",
    "FileSink",
    "FixedPartitionedSink",
    "Sink",
    "StatefulSinkPartition",
    "StatelessSinkPartition",
    "StdOutSink",
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


# -- built-in connectors: local files and stdout --------------------------------


class _FileSinkPartition(StatefulSinkPartition[str, int]):
    """Appends `value + end` to one file; the snapshot is the byte offset written so far.

    On resume the file is cut back to the snapshot's offset, so lines written
    after the last snapshot (and replayed by the resumed execution) are not
    duplicated. A fresh start (no snapshot) empties the file.
    """

    def __init__(self, owner: str, step_id: str, path: Path, resume_state: Optional[int], end: str) -> None:
        self._owner = owner
        self._step_id = step_id
        self._path = path
        self._end = end
        offset = 0 if resume_state is None else resume_state
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        self._f = os.fdopen(fd, "r+b")
        size = os.fstat(fd).st_size
        if offset > size:
            self._f.close()
            msg = (
                f"step {step_id!r}: {owner} cannot resume writing {str(path)!r}: the snapshot's offset "
                f"{offset} is past the end of the file ({size} bytes), so the file changed since the "
                "snapshot; restore the file or start over with an empty recovery directory"
            )
            raise RecoveryError(msg)
        self._f.seek(offset)
        self._f.truncate()
        self._offset = offset

    @override
    def write_batch(self, values: list[str]) -> None:
        end = self._end
        chunks = []
        for v in values:
            if not isinstance(v, str):
                msg = (
                    f"step {self._step_id!r}: {self._owner} writes str values; received {v!r} of type "
                    f'{type(v).__name__}; format it first, e.g. `op.map_value("fmt", s, str)` or '
                    '`op.map("fmt", s, lambda kv: (kv[0], f"{kv[0]},{kv[1]}"))`'
                )
                raise FlowsparkTypeError(msg)
            chunks.append(v)
            chunks.append(end)
        data = "".join(chunks).encode("utf-8")
        self._f.write(data)
        self._f.flush()
        self._offset += len(data)

    @override
    def snapshot(self) -> int:
        # Make the bytes up to the recorded offset durable before the epoch commits.
        self._f.flush()
        os.fsync(self._f.fileno())
        return self._offset

    @override
    def close(self) -> None:
        self._f.close()


def _check_end(owner: str, end: Any) -> str:
    if not isinstance(end, str):
        msg = f"{owner}: end must be a str such as '\\n'; received {end!r}"
        raise FlowsparkTypeError(msg)
    return end


class FileSink(FixedPartitionedSink[str, int]):
    r"""Write `(key, str)` items' values to one file, each followed by `end`.

    One partition (the key is ignored). A fresh execution truncates the file;
    a resumed execution cuts it back to the offset of the last snapshot, so
    items replayed after a failure are not written twice (exactly-once for
    bounded inputs). Values must be `str`: format them in a `map` first.

    Args:
        path: The file (created if missing; its directory must exist).
        end: Written after each value.

    Example:
        >>> import tempfile, pathlib
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, run_main
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
        >>> flow = Dataflow("write")
        >>> s = op.input("inp", flow, TestingSource([("k", "a"), ("k", "b")]))
        >>> op.output("out", s, FileSink(p))
        >>> run_main(flow)
        >>> p.read_text()
        'a\nb\n'
    """

    def __init__(self, path: Union[Path, str], end: str = "\n") -> None:
        """Write to `path`."""
        self._path = Path(path)
        self._end = _check_end("FileSink", end)

    @property
    def path(self) -> Path:
        """The file written."""
        return self._path

    @property
    def end(self) -> str:
        """Written after each value."""
        return self._end

    @override
    def list_parts(self) -> list[str]:
        return [str(self._path)]

    @override
    def part_fn(self, item_key: str) -> int:
        return 0

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _FileSinkPartition:
        if for_part != str(self._path):
            msg = f"step {step_id!r}: FileSink writes {str(self._path)!r}; asked to build partition {for_part!r}"
            raise ValueError(msg)
        _require_parent("FileSink", self._path)
        return _FileSinkPartition("FileSink", step_id, self._path, resume_state, self._end)


def _require_parent(owner: str, path: Path) -> None:
    parent = path.parent
    if not parent.is_dir():
        msg = f"{owner} cannot write {str(path)!r}: directory {str(parent)!r} does not exist; create it first"
        raise FileNotFoundError(msg)


def _part_name(i: int, _n: int) -> str:
    return f"part_{i}"


def _adler32_key(key: str) -> int:
    return adler32(key.encode())


class DirSink(FixedPartitionedSink[str, int]):
    """Write `(key, str)` items to `file_count` files in a directory, one partition per file.

    The key picks the file (`assign_file(key) % file_count`), so all values of a
    key land in the same file, in order. Each file resumes like `FileSink`.

    Args:
        dir_path: The directory (must exist).
        file_count: Number of files.
        file_namer: `(index, count) -> file name`; default `part_{index}`.
        assign_file: `key -> int` picking the file; default adler32 of the key.
        end: Written after each value.

    Raises:
        FileNotFoundError: `dir_path` does not exist.

    Example:
        >>> import tempfile, pathlib
        >>> sink = DirSink(pathlib.Path(tempfile.mkdtemp()), 2)
        >>> sink.list_parts()
        ['part_0', 'part_1']
    """

    def __init__(
        self,
        dir_path: Union[Path, str],
        file_count: int,
        file_namer: Callable[[int, int], str] = _part_name,
        assign_file: Callable[[str], int] = _adler32_key,
        end: str = "\n",
    ) -> None:
        """Write to `file_count` files in `dir_path`."""
        self._dir_path = Path(dir_path)
        if not isinstance(file_count, int) or isinstance(file_count, bool) or file_count < 1:
            msg = f"DirSink: file_count must be an int >= 1; received {file_count!r}"
            raise FlowsparkTypeError(msg)
        if not self._dir_path.is_dir():
            msg = (
                f"DirSink: output directory {str(self._dir_path)!r} does not exist"
                f"{cwd_note(self._dir_path)}; create it first"
            )
            raise FileNotFoundError(msg)
        self._file_count = file_count
        self._file_namer = file_namer
        self._assign_file = assign_file
        self._end = _check_end("DirSink", end)
        names = self.list_parts()
        if len(set(names)) != len(names):
            msg = f"DirSink: file_namer must give {file_count} distinct names; gave {names!r}"
            raise FlowsparkBuildError(msg)

    @property
    def dir_path(self) -> Path:
        """The directory written."""
        return self._dir_path

    @property
    def file_count(self) -> int:
        """Number of files."""
        return self._file_count

    @override
    def list_parts(self) -> list[str]:
        names = [self._file_namer(i, self._file_count) for i in range(self._file_count)]
        for name in names:
            if not isinstance(name, str) or not name:
                msg = f"DirSink: file_namer must return non-empty str file names; returned {name!r}"
                raise FlowsparkTypeError(msg)
        return names

    @override
    def part_fn(self, item_key: str) -> int:
        return self._assign_file(item_key)

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _FileSinkPartition:
        path = self._dir_path / for_part
        _require_parent("DirSink", path)
        return _FileSinkPartition("DirSink", step_id, path, resume_state, self._end)


class _StdOutPartition(StatelessSinkPartition[Any]):
    @override
    def write_batch(self, items: list[Any]) -> None:
        out = sys.stdout
        out.write("".join(f"{item}\n" for item in items))
        out.flush()


class DriverSink(DynamicSink[X]):
    """A sink written in this (the driver's) process, in the in-memory executor's order.

    `TestingSink` and `StdOutSink` are such sinks. A distributed runtime collects
    their items at the driver, sorts them into the order the in-memory executor
    would write them, and writes them there (the Spark runtimes do).
    """


class StdOutSink(DriverSink[Any]):
    """Print each item (`str(item)`) on its own line to standard output.

    At-least-once: after a resume, items of the replayed epoch are printed again.

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, run_main
        >>> flow = Dataflow("show")
        >>> op.output("out", op.input("inp", flow, TestingSource(["a", 1])), StdOutSink())
        >>> run_main(flow)
        a
        1
    """

    @override
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _StdOutPartition:
        return _StdOutPartition()


def part_of(step_id: str, sink: FixedPartitionedSink[Any, Any], kv: Any, n: int) -> int:
    """The index of the partition of a `FixedPartitionedSink` an item goes to (`part_fn(key) % n`).

    Every runtime writing such a sink routes with this function.

    Args:
        step_id: The output step (for the error).
        sink: The sink.
        kv: A `(str key, value)` item.
        n: Number of partitions (`len(sink.list_parts())`).

    Returns:
        The partition index.

    Raises:
        FlowsparkTypeError: The item is not `(str key, value)`.
    """
    if type(kv) is not tuple or len(kv) != 2 or not isinstance(kv[0], str):
        msg = (
            f"step {step_id!r}: {type(sink).__name__} is partitioned and needs "
            f"`(str key, value)` items; received {kv!r}; add `op.key_on` before the output"
        )
        raise FlowsparkTypeError(msg)
    return sink.part_fn(kv[0]) % n


def route_to_parts(
    step_id: str, sink: FixedPartitionedSink[Any, Any], items: list[Any], n: int
) -> dict[int, list[Any]]:
    """Route `(key, value)` items to the partitions of a `FixedPartitionedSink` (see `part_of`).

    Args:
        step_id: The output step (for the error).
        sink: The sink.
        items: `(str key, value)` items.
        n: Number of partitions.

    Returns:
        Partition index -> the values routed there, in order.
    """
    routed: dict[int, list[Any]] = {}
    for kv in items:
        routed.setdefault(part_of(step_id, sink, kv, n), []).append(kv[1])
    return routed
