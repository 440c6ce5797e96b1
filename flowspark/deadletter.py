"""Dead letter: items a step could not take, kept as rows while the run goes on.

With the run option `dead_letter=<sink>` (`run_main`, `flowspark.spark.run`,
`flowspark run --dead-letter PATH`), an item goes to the dead letter instead of
stopping the run when

- a user callable of a stateless step (`map`, `filter`, `flat_map`, `key_on`,
  `map_value`, `branch`'s predicate ... every `flat_map_batch` and `branch`) raises
  for it or returns something malformed for it;
- it enters a stateful step without being a `(str key, value)` pair;
- it does not fit a `SparkSink`'s schema (or is not a dict);
- it is a row of a JSON or CSV `SparkSource` that Spark could not parse
  (`malformed_record`: no item was ever made of it).

Each such item becomes one dead-letter row (`FIELDS`): the step id, the error's
type and message, the item's `repr` (a malformed row's raw text itself), and the
batch id (the micro-batch id in a stream; the executor's epoch in memory; 0 in a
Spark batch job). Every other item goes on. Without the option nothing changes:
the run fails naming the step.

An exception inside a stateful step's logic still stops the run: the key's state
would be undefined. An inspector's exception (`op.inspect`) stops it too.

When a `flat_map_batch` mapper raises for a batch, the runtime calls it again on
each item of that batch alone, to keep the items that pass: a mapper with side
effects sees those items twice.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

from flowspark.errors import (
    MALFORMED_INPUT,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    malformed_input_text,
    step_error,
)
from flowspark.outputs import DynamicSink, Sink, StatelessSinkPartition

__all__ = [
    "FIELDS",
    "SCHEMA",
    "DeadLetterDir",
    "DeadLetters",
    "dead_letter_arg",
    "dead_letter_step",
    "malformed_record",
    "record",
]

#: The fields of a dead-letter row, in order.
FIELDS = ("step_id", "error_type", "error_message", "item", "batch_id")
#: The dead-letter rows' Spark schema (DDL).
SCHEMA = "step_id STRING, error_type STRING, error_message STRING, item STRING, batch_id LONG"
_FORMATS = ("parquet", "json")


def record(step_id: str, error: BaseException, item: Any) -> dict[str, Any]:
    """A dead-letter row without its batch id (the runtime adds it when it writes the row).

    Args:
        step_id: The step that could not take the item.
        error: What it raised (or the error flowspark raises for the item). A
            `FlowsparkRuntimeError` wrapping a user error is unwrapped to that error.
        item: The item.

    Returns:
        `{"step_id", "error_type", "error_message", "item"}`.

    Example:
        >>> record("f.parse", KeyError("user"), {"id": 7})
        {'step_id': 'f.parse', 'error_type': 'KeyError', 'error_message': "'user'", 'item': "{'id': 7}"}
    """
    if isinstance(error, FlowsparkRuntimeError) and error.exc_type is not None:
        etype, emsg = error.exc_type, error.exc_message or ""
    else:
        etype, emsg = type(error).__name__, str(error)
    try:
        text = repr(item)
    except Exception as e:  # noqa: BLE001
        text = f"<{type(item).__name__} whose repr() raised {type(e).__name__}: {e}>"
    return {"step_id": step_id, "error_type": etype, "error_message": emsg, "item": text}


def malformed_record(step_id: str, file: str, raw: str) -> dict[str, Any]:
    """The dead-letter row (without its batch id) of a row an input step could not parse.

    Args:
        step_id: The input step.
        file: The file the row came from.
        raw: The row's raw text.

    Returns:
        `error_type` `"MalformedInput"`, `error_message` naming the file with the raw text's
        first 200 characters (`flowspark.errors.malformed_input_text`), `item` the whole raw
        text as read (not a `repr`).

    Example:
        >>> malformed_record("f.inp", "file:/data/p1.json", "{bad")["error_message"]
        'malformed input row in file:/data/p1.json: {bad'
    """
    return {
        "step_id": step_id,
        "error_type": MALFORMED_INPUT,
        "error_message": malformed_input_text(file, raw),
        "item": raw,
    }


def dead_letter_step(flow_id: str) -> str:
    """The step id dead-letter writes are reported under (`<flow id>.dead_letter`).

    Args:
        flow_id: The dataflow's id.

    Returns:
        The id.
    """
    return f"{flow_id}.dead_letter"


class _DirPartition(StatelessSinkPartition[dict[str, Any]]):
    def __init__(self, sink: DeadLetterDir) -> None:
        self.sink = sink
        self.started: set[int] = set()

    def write_batch(self, values: list[dict[str, Any]]) -> None:
        by_batch: dict[int, list[dict[str, Any]]] = {}
        for row in values:
            by_batch.setdefault(int(row["batch_id"]), []).append(row)
        for batch_id, rows in by_batch.items():
            folder = self.sink.batch_folder(batch_id)
            if batch_id not in self.started:
                # The first write of a batch id in a run replaces what an earlier run wrote for
                # it (as Spark's dynamic partition overwrite does): a replayed batch is not doubled.
                shutil.rmtree(folder, ignore_errors=True)
                self.started.add(batch_id)
            folder.mkdir(parents=True, exist_ok=True)
            self.sink.write_file(folder, [{f: r[f] for f in FIELDS[:-1]} for r in rows])


class DeadLetterDir(DynamicSink[dict[str, Any]]):
    """A directory of dead-letter rows, one sub-directory per batch id (`batch_id=N`).

    Spark reads it back with `spark.read.parquet(path)` (or `.json(path)`), the batch id
    coming from the directory names. Each batch id's rows are written once: a batch
    written again (a micro-batch replayed from the checkpoint after a crash) replaces
    its own directory, so every dead item is there exactly once. On Spark the rows are
    written by Spark (dynamic partition overwrite); in memory by Python (parquet needs
    `pyarrow`).

    Args:
        path: The directory.
        format: `"parquet"` (default) or `"json"` (JSON lines).

    Raises:
        FlowsparkTypeError: A bad path or format.

    Example:
        >>> sink = DeadLetterDir("/tmp/dead", format="json")
    """

    def __init__(self, path: str, format: str = "parquet") -> None:  # noqa: A002
        """Describe the directory."""
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            msg = f"DeadLetterDir: path must be a directory path (str); received {path!r}"
            raise FlowsparkTypeError(msg)
        if format not in _FORMATS:
            msg = f"DeadLetterDir: format must be 'parquet' or 'json'; received {format!r}"
            raise FlowsparkTypeError(msg)
        self.path = os.fspath(path)
        self.format = format

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _DirPartition:  # noqa: ARG002
        """Open the directory for writing (in memory).

        Args:
            step_id: The dead letter's step id.
            worker_index: Unused.
            worker_count: Unused.

        Returns:
            The partition.
        """
        if self.format == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                msg = (
                    f"step {step_id!r}: DeadLetterDir(format='parquet') needs pyarrow in memory; "
                    "pip install pyarrow, or use format='json'"
                )
                raise FlowsparkTypeError(msg) from None
        return _DirPartition(self)

    def write_file(self, folder: Path, rows: list[dict[str, Any]], name: Optional[str] = None) -> None:
        """Write rows (without `batch_id`) as one file of `folder`, atomically (written aside, then renamed).

        Args:
            folder: The batch's directory.
            rows: The rows.
            name: The file's name without extension (a file of that name is replaced);
                default a new unique name.
        """
        name = name or f"part-{uuid.uuid4().hex}"
        final = folder / f"{name}.{self.format}"
        tmp = folder / f".{name}.{uuid.uuid4().hex}.tmp"
        if self.format == "json":
            with open(tmp, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pylist(rows, schema=pa.schema([(f, pa.string()) for f in FIELDS[:-1]]))
            pq.write_table(table, tmp)
        os.replace(tmp, final)

    def batch_folder(self, batch_id: int) -> Path:
        """The directory of one batch's rows.

        Args:
            batch_id: The batch id.

        Returns:
            `path/batch_id=N`.
        """
        return Path(self.path) / f"batch_id={batch_id}"

    def count(self, batch_id: int) -> int:
        """How many rows a batch has in the directory.

        Args:
            batch_id: The batch id.

        Returns:
            The number of rows (0 when there is no such batch).
        """
        folder = self.batch_folder(batch_id)
        if not folder.is_dir():
            return 0
        n = 0
        for f in folder.iterdir():
            if f.name.startswith((".", "_")):
                continue
            if self.format == "json":
                with open(f, encoding="utf-8") as fh:
                    n += sum(1 for line in fh if line.strip())
            else:
                import pyarrow.parquet as pq

                n += pq.read_metadata(f).num_rows
        return n

    def __repr__(self) -> str:
        """Show where rows go."""
        return f"DeadLetterDir({self.path!r}, format={self.format!r})"


def dead_letter_arg(where: str, value: Any) -> Optional[Sink[Any]]:
    """Check a `dead_letter` run option.

    Args:
        where: The function, for the message.
        value: `None`, a directory path (a `DeadLetterDir` of parquet files) or a sink.

    Returns:
        The sink, or `None`.

    Raises:
        FlowsparkTypeError: Anything else.
    """
    if value is None or isinstance(value, Sink):
        return value
    if isinstance(value, (str, os.PathLike)) and str(value):
        return DeadLetterDir(os.fspath(value))
    msg = (
        f"{where}: dead_letter must be a sink (e.g. DeadLetterDir(path), TestingSink(list)) or a directory "
        f"path; received {value!r} of type {type(value).__name__}"
    )
    raise FlowsparkTypeError(msg)


class DeadLetters:
    """Collects dead-letter rows at the driver and writes them to the sink, batch by batch.

    Used by the in-memory executor and, for sinks that are not Spark-native, by the
    Spark runtimes' drivers. `count` is the number of rows written so far.

    Args:
        sink: A `DynamicSink` (e.g. `DeadLetterDir`, `TestingSink`, `StdOutSink`); a
            `FixedPartitionedSink` is refused: dead-letter rows have no key.
        step_id: The id failures of the sink are reported under (`dead_letter_step`).
    """

    def __init__(self, sink: Any, step_id: str) -> None:
        """Open the sink."""
        if not isinstance(sink, DynamicSink):
            msg = (
                f"step {step_id!r}: the dead letter must be a DynamicSink (e.g. DeadLetterDir(path), "
                f"TestingSink(list), StdOutSink()) here; received {type(sink).__name__}"
            )
            raise FlowsparkTypeError(msg)
        self.step_id = step_id
        self.count = 0
        try:
            self.part = sink.build(step_id, 0, 1)
        except FlowsparkTypeError:
            raise
        except Exception as e:
            raise step_error(step_id, e) from e

    def write(self, rows: list[dict[str, Any]], batch_id: int) -> None:
        """Write rows of one batch (their `batch_id` is set here).

        Args:
            rows: Records (`record`).
            batch_id: The batch id.
        """
        if not rows:
            return
        out = [{**r, "batch_id": batch_id} for r in rows]
        try:
            self.part.write_batch(out)
        except Exception as e:
            raise step_error(self.step_id, e) from e
        self.count += len(out)

    def close(self) -> None:
        """Close the sink."""
        try:
            self.part.close()
        except Exception as e:
            raise step_error(self.step_id, e) from e
