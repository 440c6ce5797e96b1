"""Spark-native sinks: dict items become rows of a Spark DataFrame, written by Spark.

`SparkSink` describes where to write (parquet / json / csv / orc / a table);
`ForeachBatchSink` hands the rows, as a DataFrame, to your function. The Spark
runtime turns the items (each a dict, one row) into a DataFrame of the sink's
schema (given, or inferred from the first rows). The in-memory executor cannot
run them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from flowspark.deadletter import FIELDS, SCHEMA, DeadLetterDir, DeadLetters
from flowspark.errors import FlowsparkError, FlowsparkTypeError, short_repr, step_error
from flowspark.outputs import Sink
from flowspark.spark.compat import inferred_schema
from flowspark.spark.io.delta import missing_delta
from flowspark.spark.worker.codec import decode_task_error
from flowspark.spark.worker.stage import not_dict_error

__all__ = ["ForeachBatchSink", "SparkDeadLetters", "SparkSink", "infer_schema", "write_rows"]

_FORMATS = ("parquet", "json", "csv", "orc", "delta", "table")
#: The formats Spark's file sink writes (its `_spark_metadata` log in the directory).
_FILE_FORMATS = ("parquet", "json", "csv", "orc")
_MODES = ("overwrite", "append", "error", "errorifexists", "ignore")


class SparkSink(Sink[dict[str, Any]]):
    """Write dict items as rows: a parquet / json / csv / orc directory, a Delta table or a table.

    In a stream (docs/streaming.md), a `SparkSink` with a `schema` that is the flow's only
    output is Spark's streaming file sink, Delta Lake's streaming sink for `"delta"`, or
    `toTable` for a table (exactly-once with the checkpoint); without a schema, or next to
    other outputs, each micro-batch is appended with Spark's batch writer (at-least-once). A
    table is written in its existing format.

    Args:
        format: `"parquet"`, `"json"`, `"csv"`, `"orc"`, `"delta"` (a Delta Lake table's
            directory; docs/howto/delta.md) or `"table"` (`path` is the table name).
        path: Output directory, or the table name.
        schema: A `pyspark.sql.types.StructType` or a DDL string for the rows; default:
            inferred from up to 100 items (in a stream: of the first micro-batch with
            items, then kept in the checkpoint).
        mode: Spark save mode of a bounded run (`"overwrite"` default, `"append"`, `"error"`,
            `"ignore"`); a stream always appends.
        options: Writer options (e.g. `{"header": "true"}` for csv).
        partition_by: Columns to partition the output directory by.

    Example:
        >>> sink = SparkSink("parquet", "/tmp/out", schema="user STRING, total LONG")
    """

    def __init__(
        self,
        format: str,  # noqa: A002
        path: str,
        schema: Any = None,
        mode: str = "overwrite",
        options: Optional[dict[str, Any]] = None,
        partition_by: Optional[list[str]] = None,
    ) -> None:
        """Describe where to write."""
        if format not in _FORMATS:
            msg = f"SparkSink: format must be one of {', '.join(_FORMATS)}; received {format!r}"
            raise FlowsparkTypeError(msg)
        if not isinstance(path, str):
            msg = f"SparkSink({format!r}): path must be a str (a directory or table name); received {path!r}"
            raise FlowsparkTypeError(msg)
        if mode not in _MODES:
            msg = f"SparkSink: mode must be one of {', '.join(_MODES)}; received {mode!r}"
            raise FlowsparkTypeError(msg)
        self.format = format
        self.path = path
        self.schema = schema
        self.mode = mode
        self.options = dict(options or {})
        self.partition_by = list(partition_by or [])

    @property
    def file_sink(self) -> bool:
        """Whether a stream writes it with Spark's file sink (a file format; its log in `path/_spark_metadata`)."""
        return self.format in _FILE_FORMATS

    def write(self, df: Any) -> None:
        """Write `df` (a DataFrame of the rows) as described (a bounded run).

        Args:
            df: The DataFrame.
        """
        self._save(df, self.mode)

    def write_batch(self, df: Any, batch_id: int) -> None:  # noqa: ARG002
        """Append the rows of one micro-batch of a stream.

        Args:
            df: The micro-batch's rows.
            batch_id: Spark's micro-batch id.
        """
        self._save(df, "append")

    def _save(self, df: Any, mode: str) -> None:
        w = df.write.mode(mode)
        if self.options:
            w = w.options(**self.options)
        if self.partition_by:
            w = w.partitionBy(*self.partition_by)
        if self.format == "table":
            provider = self.table_provider(df.sparkSession)
            (w if provider is None else w.format(provider)).saveAsTable(self.path)
        else:
            w.format(self.format).save(self.path)

    def table_provider(self, spark: Any) -> Optional[str]:
        """The data source of the existing table `path` (`"parquet"`, `"json"`, ...), for a `"table"` sink.

        Spark's writers refuse to add rows of another format to a table, and default to
        `spark.sql.sources.default`; this is the format to write with.

        Args:
            spark: The SparkSession.

        Returns:
            The table's provider; `None` when the table does not exist yet (Spark's default
            format creates it) or has none (a view).
        """
        if not spark.catalog.tableExists(self.path):
            return None
        for row in spark.sql(f"DESCRIBE TABLE EXTENDED {self.path}").collect():
            if row[0] == "Provider":
                return str(row[1])
        return None

    def __repr__(self) -> str:
        """Show where items go."""
        return f"SparkSink({self.format!r}, {self.path!r})"


class ForeachBatchSink(Sink[dict[str, Any]]):
    """Hand the rows to your function as a Spark DataFrame: `fn(df, batch_id)`.

    In a stream, `fn` is called at the driver once per micro-batch with output rows
    (Spark's `foreachBatch`), with Spark's micro-batch id. It is **at-least-once**: a
    micro-batch that was being written when the query stopped or failed is handed over
    again, with the same `batch_id`, after a restart (make `fn` idempotent, e.g. keyed
    on `batch_id`). In a bounded run `fn` is called once, with every row and `batch_id`
    0. The DataFrame's rows come in no particular order. An exception raised by `fn`
    stops the run with a `FlowsparkRuntimeError` naming the output step.

    Args:
        fn: `fn(df, batch_id)`; its return value is ignored.
        schema: A `pyspark.sql.types.StructType` or a DDL string for the rows; default:
            inferred from up to 100 items (in a stream: of the first micro-batch with
            items, then kept in the checkpoint).

    Raises:
        FlowsparkTypeError: `fn` is not callable.

    Example:
        >>> seen = []
        >>> sink = ForeachBatchSink(lambda df, batch_id: seen.append((batch_id, df.count())))
    """

    def __init__(self, fn: Callable[[Any, int], Any], schema: Any = None) -> None:
        """Describe what receives the rows."""
        if not callable(fn):
            msg = f"ForeachBatchSink: fn must be a function fn(df, batch_id); received {short_repr(fn)}"
            raise FlowsparkTypeError(msg)
        self.fn = fn
        self.schema = schema

    def write(self, df: Any) -> None:
        """Hand every row of a bounded run to `fn` (`batch_id` 0).

        Args:
            df: The DataFrame of the rows.
        """
        self.fn(df, 0)

    def write_batch(self, df: Any, batch_id: int) -> None:
        """Hand the rows of one micro-batch to `fn`.

        Args:
            df: The micro-batch's rows.
            batch_id: Spark's micro-batch id.
        """
        self.fn(df, batch_id)

    def __repr__(self) -> str:
        """Show the function."""
        return f"ForeachBatchSink({getattr(self.fn, '__qualname__', self.fn)!r})"


def write_rows(step_id: str, sink: Any, df: Any, batch_id: Optional[int] = None) -> None:
    """Write a DataFrame of rows with a Spark-native sink; any failure names the output step.

    Args:
        step_id: The output step's id.
        sink: A `SparkSink` or `ForeachBatchSink`.
        df: The rows.
        batch_id: The micro-batch id in a stream (`write_batch`); `None` in a bounded run (`write`).

    Raises:
        FlowsparkRuntimeError: The write (or the user's function) failed; a row that did not
            fit the schema, found inside a Spark task, keeps its own error.
        FlowsparkCompileError: A Delta sink in a session without Delta Lake.
    """
    try:
        if batch_id is None:
            sink.write(df)
        else:
            sink.write_batch(df, batch_id)
    except FlowsparkError:
        raise
    except Exception as e:
        err = decode_task_error(str(e))
        if err is not None:
            raise err from err.__cause__
        lacks = missing_delta(e, step_id) if getattr(sink, "format", None) == "delta" else None
        if lacks is not None:
            raise lacks from e
        raise step_error(step_id, e) from e


def infer_schema(spark: Any, step_id: str, items: list[Any]) -> Any:
    """The schema Spark infers from some dict items (a sink given no schema).

    Args:
        spark: The SparkSession.
        step_id: The output step's id.
        items: Some items (up to 100 are used).

    Returns:
        A `pyspark.sql.types.StructType`.

    Raises:
        FlowsparkRuntimeError: An item is not a dict, or Spark cannot infer a type (e.g. a
            column that is always `None`); names the step and says to pass a schema.
    """
    sample = items[:100]
    bad = next((x for x in sample if not isinstance(x, dict)), None)
    if bad is not None:
        raise step_error(step_id, not_dict_error(step_id, bad))
    try:
        return inferred_schema(spark, sample)
    except Exception as e:
        msg = (
            f"error in step {step_id!r}: cannot infer the rows' schema from the items {short_repr(sample)} "
            f"({type(e).__name__}: {e}); pass the sink a schema, e.g. schema='user STRING, n LONG'"
        )
        raise step_error(step_id, e, message=msg) from e


class SparkDeadLetters:
    """Writes a Spark run's dead-letter rows from the driver (`flowspark.deadletter`).

    A `DeadLetterDir` is written by Spark, one `batch_id=N` directory per batch replaced
    as a whole (dynamic partition overwrite): a micro-batch replayed after a crash
    rewrites its own rows, so each dead item is there once. A `SparkSink` or
    `ForeachBatchSink` gets a DataFrame of the rows (its own guarantees: appended per
    micro-batch, at-least-once); any other sink (`TestingSink`, `StdOutSink`, a
    `DynamicSink`) is written at the driver.

    Args:
        spark: The SparkSession.
        sink: The dead-letter sink.
        step_id: The id failures are reported under (`dead_letter_step`).
        stream: Whether the run is a stream (`write_batch` with the micro-batch id).
    """

    def __init__(self, spark: Any, sink: Any, step_id: str, stream: bool) -> None:
        """Open the sink."""
        self.spark = spark
        self.sink = sink
        self.step_id = step_id
        self.stream = stream
        native = isinstance(sink, (DeadLetterDir, SparkSink, ForeachBatchSink))
        self.driver: Optional[DeadLetters] = None if native else DeadLetters(sink, step_id)
        self.count = 0

    def write(self, rows: list[dict[str, Any]], batch_id: int) -> None:
        """Write one batch's rows.

        Args:
            rows: Records (`flowspark.deadletter.record`), in order.
            batch_id: The micro-batch id (0 in a batch job).
        """
        if not rows:
            return
        if self.driver is not None:
            self.driver.write(rows, batch_id)
            self.count += len(rows)
            return
        try:
            df = self.spark.createDataFrame([(*(r[f] for f in FIELDS[:-1]), batch_id) for r in rows], SCHEMA)
        except Exception as e:
            raise step_error(self.step_id, e) from e
        sink = self.sink
        if isinstance(sink, DeadLetterDir):
            try:
                w = df.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("batch_id")
                w.format(sink.format).save(sink.path)
            except Exception as e:
                raise step_error(self.step_id, e) from e
        else:
            write_rows(self.step_id, sink, df, batch_id if self.stream else None)
        self.count += len(rows)

    def close(self) -> None:
        """Close a sink written at the driver."""
        if self.driver is not None:
            self.driver.close()
