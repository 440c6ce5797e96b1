"""Connectors for local text files (`bytewax.connectors.files` equivalents).

Lines of a file (`FileSource`), of every file of a directory (`DirSource`), or rows of a CSV
file (`CSVSource`), each partition resumable from a byte offset; `FileSink` and `DirSink`
(`flowspark.outputs`) write them.

Example:
    >>> from flowspark.connectors.files import FileSource
    >>> from flowspark.inputs import FileSource as Same
    >>> FileSource is Same
    True
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Optional, Union

from typing_extensions import override

from flowspark._paths import cwd_note
from flowspark.errors import FlowsparkTypeError, MissingPathError, NotADirectoryPathError
from flowspark.inputs import FixedPartitionedSource, StatefulSourcePartition
from flowspark.outputs import DirSink, FileSink

__all__ = ["CSVSource", "DirSink", "DirSource", "FileSink", "FileSource"]


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
