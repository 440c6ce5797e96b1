"""A stream's dead letter in a `DeadLetterDir`, written by the tasks of each micro-batch.

Every stage emits the items it refuses as `DEAD_PORT` rows (`flowspark.spark.worker.stage`).
When the dead letter is a `DeadLetterDir`, a pass-through `mapInArrow` after each
stage takes those rows out of the stream and writes them, from the task, to
`<dir>/batch_id=<micro-batch id>/part-<stage>-<partition>.<format>`: a name fixed
by the micro-batch, the stage and the Spark partition, written aside and renamed,
so a retried task replaces its own file. When a query starts, the directories of
micro-batches the checkpoint has not committed are deleted: a replayed micro-batch
writes its rows again, once. The query's writer is untouched (a lone `SparkSink`
with a schema stays Spark's exactly-once file sink).

The micro-batch id comes from the task's local property `streaming.sql.batchId`,
which Spark's micro-batch execution sets for every job of a micro-batch.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any, Callable, Optional

from flowspark.deadletter import DeadLetterDir
from flowspark.spark.plan.types import DEAD_PORT
from flowspark.spark.streaming.ckfs import files, join
from flowspark.spark.streaming.routing import ROUTE
from flowspark.spark.worker.codec import encode_task_error, loads_arrow

__all__ = [
    "MalformedRows",
    "clear_uncommitted",
    "delta_sink_written",
    "file_sink_written",
    "keep_in_dir",
    "keep_in_driver",
    "split_dead",
    "task_batch_id",
    "write_task_rows",
]

_BATCH_ID = "streaming.sql.batchId"


def task_batch_id() -> int:
    """The micro-batch id of the running task (0 outside a streaming micro-batch).

    Returns:
        The id.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty(_BATCH_ID) if ctx is not None else None
    return int(value) if value is not None else 0


def write_task_rows(sink: DeadLetterDir, name: str, rows: list[dict[str, Any]], batch_id: int) -> None:
    """Write dead-letter records of one task as the file `name` of the micro-batch's directory.

    Args:
        sink: The dead-letter directory.
        name: The file's name, fixed by what wrote the rows (stage, partition).
        rows: The records (`flowspark.deadletter.record`).
        batch_id: The micro-batch id.
    """
    folder = sink.batch_folder(batch_id)
    folder.mkdir(parents=True, exist_ok=True)
    sink.write_file(folder, rows, name)


def keep_in_dir(sink: DeadLetterDir, tag: str) -> Callable[[dict[str, list[dict[str, Any]]]], None]:
    """A source's malformed rows (`flowspark.spark.io.inputs.load_rows`' `keep`) written by the task that read them.

    One file per file split of the micro-batch, `part-<tag>-<hash of the split>`, written aside
    and renamed: a split read again (a retried task, a replayed micro-batch) replaces its file.

    Args:
        sink: The dead-letter directory.
        tag: Names the source stage in the file names (e.g. `s0-input`).

    Returns:
        `keep({split: records})`.
    """

    def keep(splits: dict[str, list[dict[str, Any]]]) -> None:
        import hashlib

        batch_id = task_batch_id()
        for split, rows in splits.items():
            name = hashlib.sha1(split.encode(), usedforsecurity=False).hexdigest()[:20]
            write_task_rows(sink, f"part-{tag}-{name}", rows, batch_id)

    return keep


class MalformedRows:
    """Accumulator param of a stream's malformed source rows for a dead letter at the driver.

    `{batch id: {split: records}}`; a split reported twice (read twice in a micro-batch, a
    retried task) keeps one copy of its records.
    """

    def zero(self, value: dict[int, dict[str, list[Any]]]) -> dict[int, dict[str, list[Any]]]:
        """No rows."""
        return {}

    def addInPlace(  # noqa: N802 - Spark's name
        self, a: dict[int, dict[str, list[Any]]], b: dict[int, dict[str, list[Any]]]
    ) -> dict[int, dict[str, list[Any]]]:
        """Add `b`'s splits to `a`'s."""
        for batch_id, splits in b.items():
            a.setdefault(batch_id, {}).update(splits)
        return a


def keep_in_driver(acc: Any) -> Callable[[dict[str, list[dict[str, Any]]]], None]:
    """A source's malformed rows (`load_rows`' `keep`) added to an accumulator (`MalformedRows`) by micro-batch id.

    The driver takes a micro-batch's rows when it hands the micro-batch's outputs over
    (at-least-once, as every dead row written at the driver).

    Args:
        acc: The accumulator.

    Returns:
        `keep({split: records})`.
    """

    def keep(splits: dict[str, list[dict[str, Any]]]) -> None:
        acc.add({task_batch_id(): splits})

    return keep


def _dead_writer(sink: DeadLetterDir, tag: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        from flowspark.errors import FlowsparkRuntimeError, step_error

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        rows: list[Any] = []
        for b in batches:
            p = b.column(0)
            dead = pc.and_(
                pc.greater_equal(p, 0), pc.equal(pc.bit_wise_and(p, pa.scalar(ROUTE - 1, p.type)), DEAD_PORT)
            )
            if pc.any(dead).as_py():
                rows.extend(loads_arrow(b.filter(dead).column(3)))
                b = b.filter(pc.invert(dead))
            yield b
        if rows:
            try:
                write_task_rows(sink, f"part-{tag}-p{part:05d}", rows, task_batch_id())
            except Exception as e:  # noqa: BLE001
                err = step_error(f"{tag} dead letter", e)
                assert isinstance(err, FlowsparkRuntimeError)
                raise RuntimeError(encode_task_error(err)) from None

    return fn


def split_dead(df: Any, sink: DeadLetterDir, tag: str) -> Any:
    """Take the dead-letter rows out of a stage's `(p, k, seq, v)` rows and write them from the tasks.

    Args:
        df: The stage's streaming DataFrame (`p` first; routed `p` values work too).
        sink: The dead-letter directory.
        tag: Names the stage in the file names (e.g. `s2`).

    Returns:
        The DataFrame without dead-letter rows.
    """
    return df.mapInArrow(_dead_writer(sink, tag), df.schema)


def clear_uncommitted(
    sink: DeadLetterDir, checkpoint: str, written: Optional[Callable[[int], bool]] = None
) -> list[int]:
    """Delete the dead-letter directories of micro-batches the checkpoint has not committed.

    Such a micro-batch (stopped or killed before its commit) is replayed by the next
    run, which writes its rows again. Except when the query's writer had already
    committed it (`written`): Spark's file sink (`file_sink_written`) and Delta's
    streaming sink (`delta_sink_written`) then skip the replayed micro-batch without
    computing it, so its dead rows would not be written again; they are kept.

    Args:
        sink: The dead-letter directory.
        checkpoint: The query's checkpoint (`<checkpoint>/query/commits`).
        written: Whether the writer committed a micro-batch (default: never).

    Returns:
        The batch ids whose directories were deleted.
    """
    commits = join(checkpoint, "query", "commits")
    done = [int(f) for f in files(commits).listdir(commits) if f.isdigit()]
    last = max(done, default=-1)
    gone: list[int] = []
    if not os.path.isdir(sink.path):
        return gone
    for name in os.listdir(sink.path):
        if name.startswith("batch_id=") and name[len("batch_id=") :].isdigit():
            n = int(name[len("batch_id=") :])
            if n > last and not (written is not None and written(n)):
                shutil.rmtree(os.path.join(sink.path, name), ignore_errors=True)
                gone.append(n)
    return sorted(gone)


def file_sink_written(path: str) -> Callable[[int], bool]:
    """Whether Spark's file sink writing to `path` committed a micro-batch (its `_spark_metadata` log).

    Args:
        path: The sink's directory.

    Returns:
        `written(batch_id) -> bool`.
    """
    log = join(path, "_spark_metadata")
    fs = files(log)

    def written(n: int) -> bool:
        return bool(fs.exists(join(log, str(n))) or fs.exists(join(log, f"{n}.compact")))

    return written


def delta_sink_written(path: str, checkpoint: str) -> Callable[[int], bool]:
    """Whether Delta's streaming sink writing the table at `path` committed a micro-batch of this query.

    Delta records each micro-batch it commits as a `txn` action (the query's id from
    `<checkpoint>/query/metadata`, the micro-batch id) in the table's log, and skips a replayed
    micro-batch it already holds without computing it, as Spark's file sink does.

    Args:
        path: The Delta table's directory.
        checkpoint: The query's checkpoint (`DIR`; Spark's logs under `DIR/query`).

    Returns:
        `written(batch_id) -> bool`.
    """
    meta = join(checkpoint, "query", "metadata")
    fs = files(checkpoint)
    query_id = json.loads(fs.read_text(meta).splitlines()[0]).get("id") if fs.exists(meta) else None
    log = join(path, "_delta_log")
    lfs = files(log)
    last = -1
    if query_id is not None and lfs.isdir(log):
        for name in sorted((n for n in lfs.listdir(log) if n.endswith(".json")), reverse=True):
            for line in lfs.read_text(join(log, name)).splitlines():
                txn = json.loads(line).get("txn") if line.strip() else None
                if txn is not None and txn.get("appId") == query_id:
                    last = max(last, int(txn["version"]))
            if last >= 0:
                break  # the newest commit of this query holds its highest micro-batch id

    def written(n: int) -> bool:
        return n <= last

    return written
