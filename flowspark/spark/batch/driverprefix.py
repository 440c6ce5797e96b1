"""The first rows of a parquet `SparkSource`'s partition 0, read at the driver (the rule `driver_prefix`).

`prefix_sample` needs the source's first rows in position order: partition 0's first rows.
Spark takes them with a `limit` job, which here costs about as much as a scan of 1M rows
(0.14-0.25 s, measured). Spark's plan already says which files partition 0 reads
(`FileSourceScanExec.inputRDD`: its `FilePartition`s, planned at the driver, no job): when
the first ones are whole files (a split from byte 0 to the file's size, so every row group is
in it, in file order), pyarrow reads their first rows here.

Only when nothing can differ from Spark's read (else `None`, and the `limit` job runs): a classic
session; a plan that is the scan alone (no filter, no partition or bucket columns); local files;
the file's columns are the DataFrame's, by name and in order, of types whose Python values Arrow
gives the same from the file as from Spark (integers, floats, booleans, strings, binary, dates,
and timestamps stored as instants, read in the session's time zone).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from flowspark.spark.compat import executed_plan

__all__ = ["driver_prefix"]

_log = logging.getLogger("flowspark.spark")

#: Plan nodes that only pass a file scan's rows on.
_PASSING = frozenset({"WholeStageCodegenExec", "ColumnarToRowExec", "InputAdapter", "FileSourceScanExec"})


def _files(df: Any) -> Optional[tuple[list[str], bool]]:
    """Partition 0's first whole local files when the plan is a plain scan: `(paths, whether that is all of it)`."""
    from py4j.protocol import Py4JError

    try:
        node = executed_plan(df)
        if node is None:  # Spark Connect: no plan objects at the driver
            return None
        while node.getClass().getSimpleName() != "FileSourceScanExec":
            if node.getClass().getSimpleName() not in _PASSING or node.children().size() != 1:
                return None
            node = node.children().apply(0)
        scan = node
        if scan.relation().partitionSchema().length() or not scan.dataFilters().isEmpty():
            return None
        if scan.bucketedScan() or not scan.partitionFilters().isEmpty():
            return None
        parts = scan.inputRDD().partitions()
        if not len(parts):
            return None
        files = parts[0].files()
        out = []
        for f in files:
            uri = f.toPath().toUri()
            if uri.getScheme() not in (None, "file") or f.start() != 0 or f.length() != f.fileSize():
                break  # only whole files, from the first on
            out.append(uri.getPath())
        return (out, len(out) == len(files)) if out else None
    except Py4JError as e:
        _log.debug("flowspark: driver_prefix: the plan is not a plain file scan (%s)", e)
        return None


def _arrow_types(df: Any, zone: str) -> Optional[list[Any]]:
    """The Arrow type each column of `df` is read as, or `None` for a type outside the list (module doc)."""
    import pyarrow as pa
    from pyspark.sql import types as T  # noqa: N812

    simple = {
        T.ByteType: pa.int8(),
        T.ShortType: pa.int16(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.BooleanType: pa.bool_(),
        T.BinaryType: pa.binary(),
        T.DateType: pa.date32(),
    }
    out = []
    for f in df.schema.fields:
        t = f.dataType
        if type(t) is T.StringType and t == T.StringType():
            out.append(pa.string())
        elif type(t) is T.TimestampType:
            out.append(pa.timestamp("us", tz=zone))
        elif type(t) in simple:
            out.append(simple[type(t)])
        else:
            return None
    return out


def _fits(file_type: Any, want: Any) -> bool:
    """Whether a file column of Arrow type `file_type` gives the values Spark reads as `want`."""
    import pyarrow as pa

    if pa.types.is_timestamp(want):
        return pa.types.is_timestamp(file_type) and file_type.tz is not None  # an instant (isAdjustedToUTC)
    if pa.types.is_string(want):
        return pa.types.is_string(file_type) or pa.types.is_large_string(file_type)
    if pa.types.is_binary(want):
        return pa.types.is_binary(file_type) or pa.types.is_large_binary(file_type)
    return bool(file_type == want)


def driver_prefix(df: Any, take: int, id_column: str) -> Optional[Any]:
    """Partition 0's first `take` rows of a parquet scan `df` with their positions, read at the driver.

    Args:
        df: The `SparkSource`'s DataFrame (before `ID_COLUMN` is added).
        take: Rows wanted.
        id_column: The name of the position column to put first (`ID_COLUMN`).

    Returns:
        An Arrow table (`id_column` = 0, 1, ... then the DataFrame's columns as Spark gives them),
        fewer than `take` rows only when partition 0 has no more; or `None` when the plan or the
        files are not ones this reads exactly as Spark (module doc): the `limit` job then runs.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    found = _files(df)
    if found is None:
        return None
    files, complete = found
    zone = df.sparkSession.conf.get("spark.sql.session.timeZone")
    want = _arrow_types(df, zone)
    if want is None:
        return None
    names = list(df.columns)
    schema = pa.schema([pa.field(n, t) for n, t in zip(names, want, strict=True)])
    batches: list[Any] = []
    got = 0
    try:
        for path in files:
            pf = pq.ParquetFile(path)
            fields = pf.schema_arrow
            if fields.names != names or not all(
                _fits(fields.field(n).type, t) for n, t in zip(names, want, strict=True)
            ):
                return None
            for b in pf.iter_batches(batch_size=min(take - got, 65536), use_threads=False):
                b = pa.RecordBatch.from_arrays(
                    [b.column(i).cast(schema.field(i).type) for i in range(len(names))], schema=schema
                )
                batches.append(b.slice(0, take - got))
                got += min(b.num_rows, take - got)
                if got >= take:
                    break
            if got >= take:
                break
        if got < take and not complete:
            return None  # partition 0 goes on with a file this does not read
    except (OSError, pa.ArrowException) as e:
        _log.debug("flowspark: driver_prefix: the files could not be read here (%s)", e)
        return None
    table = pa.Table.from_batches(batches, schema=schema)
    return table.add_column(0, id_column, pa.array(range(table.num_rows), pa.int64()))
