"""Sources: the contracts input connectors implement, and the built-in connectors.

Subclass `FixedPartitionedSource` (partitions with resumable state) or
`DynamicSource` (one stateless partition per worker), never `Source` itself.
A partition's `next_batch()` returns the next items (possibly an empty list
when nothing is ready) and raises `StopIteration` at end of input.
"""

from __future__ import annotations

import asyncio
import csv
import os
import queue
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, Iterable, Iterator
from datetime import datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar, Union, cast

from typing_extensions import override

from flowspark._time import utc_now
from flowspark.errors import FlowsparkTypeError, MissingPathError, NotADirectoryPathError

X = TypeVar("X")
S = TypeVar("S")

__all__ = [
    "DriverItems",
    "AbortExecution",
    "CSVSource",
    "DirSource",
    "DynamicSource",
    "FileSource",
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


class _SimplePollingPartition(StatefulSourcePartition[X, S]):
    """The one partition of a `SimplePollingSource`: calls `getter` every `interval`.

    Same constructor as Bytewax's (a ported test builds one directly with a fixed `now`).
    """

    def __init__(
        self,
        now: datetime,
        interval: timedelta,
        align_to: Optional[datetime],
        getter: Callable[[], X],
        snapshot: Callable[[], S],
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
    def snapshot(self) -> S:
        return self._snapshot()


class SimplePollingSource(FixedPartitionedSource[X, S]):
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
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[S]) -> _SimplePollingPartition[X, S]:
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

    def snapshot(self) -> S:
        """Return the position to resume after the last item `next_item` returned (default `None`).

        Returns:
            Picklable state, handed to `resume` when an execution resumes.
        """
        return cast(S, None)

    def resume(self, resume_state: S) -> None:  # noqa: B027
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


# -- built-in connectors: local files ------------------------------------------


def _get_path_dev(path: Path) -> str:
    return hex(path.stat().st_dev)


def _check_fs_id(fs_id: Any) -> str:
    if not isinstance(fs_id, str) or "::" in fs_id:
        msg = f"get_fs_id must return a str without '::'; returned {fs_id!r}"
        raise FlowsparkTypeError(msg)
    return fs_id


def _check_batch_size(owner: str, batch_size: Any) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        msg = f"{owner}: batch_size must be an int >= 1; received {batch_size!r}"
        raise FlowsparkTypeError(msg)
    return batch_size


def cwd_note(path: Path) -> str:
    """For a relative path, say what it was resolved against (empty for absolute paths)."""
    return "" if path.is_absolute() else f" (relative to the current directory {os.getcwd()!r})"


def _require_file(owner: str, path: Path) -> None:
    if not path.exists():
        msg = f"{owner}: input file {str(path)!r} does not exist{cwd_note(path)}; create it or fix the path"
        raise FileNotFoundError(msg)
    if path.is_dir():
        msg = f"{owner}: {str(path)!r} is a directory, not a file; use DirSource to read every file in it"
        raise IsADirectoryError(msg)


def _part_path(owner: str, for_part: str, expected: str) -> None:
    _fs_id, _, path = for_part.partition("::")
    if path != expected:
        msg = (
            f"{owner}: asked to build partition {for_part!r}, which is not this source's file "
            f"{expected!r}; the recovery store belongs to another flow or path"
        )
        raise ValueError(msg)


class _FileSourcePartition(StatefulSourcePartition[str, int]):
    """Lines of one file, read in binary so the snapshot is an exact byte offset."""

    def __init__(self, path: Path, batch_size: int, resume_state: Optional[int]) -> None:
        self._f = open(path, "rb")  # noqa: SIM115
        self._offset = 0 if resume_state is None else resume_state
        self._f.seek(self._offset)
        self._batch_size = batch_size

    @override
    def next_batch(self) -> list[str]:
        readline = self._f.readline
        out: list[str] = []
        offset = self._offset
        for _ in range(self._batch_size):
            raw = readline()
            if not raw:
                break
            offset += len(raw)
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            out.append(raw.decode("utf-8"))
        self._offset = offset
        if not out:
            raise StopIteration
        return out

    @override
    def snapshot(self) -> int:
        return self._offset

    @override
    def close(self) -> None:
        self._f.close()


class FileSource(FixedPartitionedSource[str, int]):
    r"""Read a text file (UTF-8) line by line; lines come without their newline.

    One partition per file. The resume state is the byte offset after the last
    line read, so a resumed execution (or a continuation after EOF, when lines
    were appended to the file) reads only lines it has not emitted. A last line
    without a newline is emitted as it is; text appended to that same line
    later is read as a new line by the continuation. `\r\n` endings are
    stripped like `\n`.

    Args:
        path: The file.
        batch_size: Lines per poll.
        get_fs_id: Called with the file's directory; returns an id of its
            filesystem, so that several workers that mount the same file read it
            once (default: the device number). Must not contain `::`.

    Raises:
        FileNotFoundError: The file does not exist (when the flow is built, and
            again when it runs if the file was removed in between).

    Example:
        >>> import tempfile, pathlib
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSink, run_main
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "in.txt"
        >>> _ = p.write_text("one\ntwo\n")
        >>> flow = Dataflow("lines")
        >>> out = []
        >>> op.output("out", op.input("inp", flow, FileSource(p)), TestingSink(out))
        >>> run_main(flow)
        >>> out
        ['one', 'two']
    """

    def __init__(
        self,
        path: Union[Path, str],
        batch_size: int = 1000,
        get_fs_id: Callable[[Path], str] = _get_path_dev,
    ) -> None:
        """Read `path`, `batch_size` lines per poll."""
        self._path = Path(path)
        self._batch_size = _check_batch_size(type(self).__name__, batch_size)
        _require_file(type(self).__name__, self._path)
        self._fs_id = _check_fs_id(get_fs_id(self._path.parent))

    @property
    def path(self) -> Path:
        """The file read."""
        return self._path

    @property
    def batch_size(self) -> int:
        """Lines per poll."""
        return self._batch_size

    @override
    def is_bounded(self) -> bool:
        return True

    @override
    def list_parts(self) -> list[str]:
        _require_file(type(self).__name__, self._path)
        return [f"{self._fs_id}::{self._path}"]

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _FileSourcePartition:
        _part_path(type(self).__name__, for_part, str(self._path))
        return _FileSourcePartition(self._path, self._batch_size, resume_state)


class DirSource(FixedPartitionedSource[str, int]):
    r"""Read every file of a directory that matches a glob, line by line.

    One partition per file (sub-directories that match are skipped), named
    `"<fs id>::<path relative to dir_path>"`; files are the unit of
    parallelism, so lines of different files interleave. Each file resumes at
    its own byte offset.

    Args:
        dir_path: The directory.
        glob_pat: Which files (`pathlib` glob, e.g. `"*.log"` or `"**/*.txt"`).
        batch_size: Lines per poll.
        get_fs_id: Called with the directory; returns an id of its filesystem
            (default: the device number). Must not contain `::`.

    Raises:
        MissingPathError: `dir_path` does not exist (a `ValueError`, as in Bytewax,
            and a `FileNotFoundError`).
        NotADirectoryPathError: `dir_path` is a file (a `ValueError` and a
            `NotADirectoryError`).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "a.txt").write_text("a1\n")
        >>> _ = (d / "b.txt").write_text("b1\n")
        >>> DirSource(d, "*.txt").list_parts()[0].endswith("::a.txt")
        True
    """

    def __init__(
        self,
        dir_path: Union[Path, str],
        glob_pat: str = "*",
        batch_size: int = 1000,
        get_fs_id: Callable[[Path], str] = _get_path_dev,
    ) -> None:
        """Read the files in `dir_path` matching `glob_pat`."""
        self._dir_path = Path(dir_path)
        self._glob_pat = glob_pat
        self._batch_size = _check_batch_size("DirSource", batch_size)
        self._check_dir()
        self._fs_id = _check_fs_id(get_fs_id(self._dir_path))

    def _check_dir(self) -> None:
        d = self._dir_path
        if not d.exists():
            msg = f"DirSource: input directory `{d}` does not exist{cwd_note(d)}; create it or fix the path"
            raise MissingPathError(msg)
        if not d.is_dir():
            msg = f"DirSource: input directory `{d}` is not a directory; use FileSource to read a single file"
            raise NotADirectoryPathError(msg)

    @property
    def dir_path(self) -> Path:
        """The directory read."""
        return self._dir_path

    @property
    def glob_pat(self) -> str:
        """The glob selecting files."""
        return self._glob_pat

    @property
    def batch_size(self) -> int:
        """Lines per poll."""
        return self._batch_size

    def files(self) -> list[Path]:
        """Return the files this source reads, sorted.

        Returns:
            Paths of the matching regular files.
        """
        self._check_dir()
        return sorted(p for p in self._dir_path.glob(self._glob_pat) if p.is_file())

    @override
    def is_bounded(self) -> bool:
        return True

    @override
    def list_parts(self) -> list[str]:
        return [f"{self._fs_id}::{p.relative_to(self._dir_path)}" for p in self.files()]

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _FileSourcePartition:
        _fs_id, _, rel = for_part.partition("::")
        return _FileSourcePartition(self._dir_path / rel, self._batch_size, resume_state)


class _CSVPartition(StatefulSourcePartition[dict[str, str], int]):
    def __init__(self, path: Path, batch_size: int, resume_state: Optional[int], fmtparams: dict[str, Any]) -> None:
        self._f = open(path, "rb")  # noqa: SIM115
        self._offset = 0
        self._batch_size = batch_size
        self._reader = csv.DictReader(self._lines(), **fmtparams)
        _ = self._reader.fieldnames  # read the header now
        if resume_state is not None:
            self._f.seek(resume_state)
            self._offset = resume_state

    def _lines(self) -> Iterator[str]:
        # A generator over `readline` keeps `_offset` exact: the csv reader pulls
        # exactly the lines of each row, so after a row `_offset` is its end.
        readline = self._f.readline
        while True:
            raw = readline()
            if not raw:
                return
            self._offset += len(raw)
            yield raw.decode("utf-8")

    @override
    def next_batch(self) -> list[dict[str, str]]:
        out = list(islice(self._reader, self._batch_size))
        if not out:
            raise StopIteration
        return out

    @override
    def snapshot(self) -> int:
        return self._offset

    @override
    def close(self) -> None:
        self._f.close()


class CSVSource(FixedPartitionedSource[dict[str, str], int]):
    r"""Read a CSV file with a header row; each row becomes a `{column: value}` dict.

    One partition; resumes at the byte offset after the last row read (the
    header is re-read on resume for the column names).

    Args:
        path: The file (UTF-8).
        batch_size: Rows per poll.
        get_fs_id: As for `FileSource`.
        **fmtparams: Passed to `csv.DictReader` (`delimiter`, `quotechar`, ...).

    Raises:
        FileNotFoundError: The file does not exist.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "in.csv"
        >>> _ = p.write_text("k;v\na;1\n")
        >>> src = CSVSource(p, delimiter=";")
        >>> part = src.build_part("f.inp", src.list_parts()[0], None)
        >>> part.next_batch()
        [{'k': 'a', 'v': '1'}]
    """

    def __init__(
        self,
        path: Union[Path, str],
        batch_size: int = 1000,
        get_fs_id: Callable[[Path], str] = _get_path_dev,
        **fmtparams: Any,
    ) -> None:
        """Read `path` as CSV, `batch_size` rows per poll."""
        self._path = Path(path)
        self._batch_size = _check_batch_size("CSVSource", batch_size)
        _require_file("CSVSource", self._path)
        self._fs_id = _check_fs_id(get_fs_id(self._path.parent))
        try:
            csv.reader([], **fmtparams)
        except (TypeError, csv.Error) as e:
            msg = f"CSVSource: bad csv format parameters {fmtparams!r}: {e}"
            raise FlowsparkTypeError(msg) from None
        self._fmtparams = fmtparams

    @property
    def path(self) -> Path:
        """The file read."""
        return self._path

    @property
    def batch_size(self) -> int:
        """Rows per poll."""
        return self._batch_size

    @property
    def fmtparams(self) -> dict[str, Any]:
        """The `csv` format parameters."""
        return dict(self._fmtparams)

    @override
    def is_bounded(self) -> bool:
        return True

    @override
    def list_parts(self) -> list[str]:
        _require_file("CSVSource", self._path)
        return [f"{self._fs_id}::{self._path}"]

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _CSVPartition:
        _part_path("CSVSource", for_part, str(self._path))
        return _CSVPartition(self._path, self._batch_size, resume_state, self._fmtparams)
