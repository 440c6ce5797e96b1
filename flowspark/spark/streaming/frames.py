"""DataFrame-building helpers of the streaming lowering (stage functions, row numbers, sink rows)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from flowspark.deadletter import DeadLetterDir
from flowspark.errors import (
    FlowsparkRuntimeError,
)
from flowspark.spark.io.columns import ID_COLUMN
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.plan.types import StageSpec
from flowspark.spark.streaming.deadletter import (
    task_batch_id,
    write_task_rows,
)
from flowspark.spark.worker.codec import encode_task_error, loads_arrow
from flowspark.spark.worker.rows import row_schema
from flowspark.spark.worker.stage import dict_rows, stage_function

__all__ = ["atomic_fields", "file_rows", "number_rows", "per_call_stage", "sink_rows"]


def per_call_stage(
    spec: StageSpec, clock: Optional[Callable[[], datetime]]
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A stage function whose logical `now` is read when each task starts."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        now = clock() if clock is not None else datetime.now(timezone.utc)
        yield from stage_function(spec, now)(batches)

    return fn


def file_rows(df: Any, source: Any) -> bool:
    """Whether Spark gives `df`'s rows their file and row index (`_metadata`: a parquet file stream).

    A stage writing a sink's rows (without a dead letter) needs only each key's rows in
    order, not sequences: those two numbers, computed by Spark, order them without the
    Arrow pass that numbers the rows (`number_rows`). The order among a micro-batch's files is
    that of their paths' `xxhash64` (the pass's is Spark's packing of files into partitions):
    each file's rows stay in order, as a replayed micro-batch gives them again.

    Decided from the source's format and the `_metadata` struct's fields, never by asking
    Spark for a field that may not exist: pyspark logs every analysis error it raises (an
    ERROR line with a stack trace on stderr), even one flowspark catches.
    """
    if not (isinstance(source, SparkSource) and source.format == "parquet" and source.path):
        return False  # row_index is a parquet reader's field; tables and DataFrames have no file rows
    if "_metadata" in df.columns:
        return False  # a column of the user's own shadows Spark's
    meta = df.select("_metadata").schema.fields[0].dataType
    return {"file_path", "row_index"} <= set(getattr(meta, "names", None) or [])


def number_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """Prepend `ID_COLUMN`: what `monotonically_increasing_id()` gives (`partition << 33 | position`)."""
    import numpy as np
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    base = (ctx.partitionId() if ctx is not None else 0) << 33
    pos = 0
    for b in batches:
        ids = pa.array(np.arange(base + pos, base + pos + b.num_rows, dtype=np.int64))
        pos += b.num_rows
        yield pa.RecordBatch.from_arrays([ids, *b.columns], names=[ID_COLUMN, *b.schema.names])


def atomic_fields(st: Any) -> bool:
    """Whether every field of a StructType is atomic (pandas round-trips it unchanged)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    return all(not isinstance(f.dataType, (ArrayType, MapType, StructType)) for f in st.fields)


def sink_rows(spark: Any, df: Any, step_id: str, schema: Any, dead_dir: Optional[DeadLetterDir] = None) -> Any:
    """Turn (k, seq, v) rows whose items are dicts into rows of `schema`.

    With `dead_dir`, items that do not fit go to the dead letter (written by the task).
    """
    rows = row_schema(spark, step_id, schema)

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        misfits: Optional[list[Any]] = None if dead_dir is None else []
        try:
            for b in batches:
                items = loads_arrow(b.column(2))
                if items:
                    yield dict_rows(step_id, items, rows, misfits)
            if misfits:
                assert dead_dir is not None
                ctx = TaskContext.get()
                part = ctx.partitionId() if ctx is not None else 0
                records = [r for _i, r in misfits]
                write_task_rows(dead_dir, f"part-sink-p{part:05d}", records, task_batch_id())
        except FlowsparkRuntimeError as f:
            raise RuntimeError(encode_task_error(f)) from None

    return df.mapInArrow(fn, rows.struct)
