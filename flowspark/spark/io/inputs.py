"""Spark-native sources: read a Spark DataFrame as a stream of dict items.

`SparkSource` only describes what to read; the Spark runtime builds the
DataFrame on its session when the flow runs (so building a flow needs no
session). The in-memory executor cannot run it.

Both lowerings read a source with `load_rows`: a JSON or CSV file source is read
in PERMISSIVE mode with flowspark's own corrupt-record column (`CORRUPT_COLUMN`),
unless the user's schema names a corrupt-record column or the user chose another
mode. The rows that parsed go on without that column (so the lowerings' checks,
such as whether Spark can key the rows on a column, see the user's columns only);
a row that did not is never an item: it stops the run (Spark's `raise_error`, no
Python pass) or, with a dead letter, becomes a dead-letter row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Optional

from typing_extensions import override

from flowspark.errors import FlowsparkTypeError, short_repr
from flowspark.inputs import Source

__all__ = ["CORRUPT_COLUMN", "SparkSource", "load_rows"]

#: The corrupt-record column flowspark reads a JSON or CSV file source with (`columnNameOfCorruptRecord`).
CORRUPT_COLUMN = "__flowspark_corrupt"
#: The file of a malformed row, next to its raw text (internal to the dead-letter pass).
_FILE_COLUMN = "__flowspark_file"
#: The file split a malformed row was read from (`"<file>@<block start>"`, internal to the dead-letter pass).
_SPLIT_COLUMN = "__flowspark_split"
#: The formats whose malformed rows flowspark catches.
_PERMISSIVE_FORMATS = ("json", "csv")

_FORMATS = ("parquet", "json", "csv", "orc", "text", "delta", "table", "dataframe")
#: Formats whose data carries its own schema (a given one is refused).
_SELF_DESCRIBED = ("delta",)
#: Formats that only exist as streams (`streaming=True`).
_STREAM_ONLY = ("rate", "socket")


class SparkSource(Source[dict[str, Any]]):
    """Read parquet / json / csv / orc files, a Delta table, a table or a DataFrame; one dict item per row.

    Items are the rows as plain dicts (`{"column": value, ...}`), stamped with
    their position (Spark partition, row within it), so the order of each input
    partition is kept through stateless steps and, per key, through stateful ones.

    Args:
        format: `"parquet"`, `"json"`, `"csv"`, `"orc"`, `"text"` (a file format read with
            `spark.read`), `"delta"` (a Delta Lake table's directory, read with Spark's
            `format("delta")`; docs/howto/delta.md), `"table"` (`path` is the table name) or
            `"dataframe"` (use `SparkSource.from_dataframe`).
        path: File or directory (or glob) to read, or the table name.
        schema: A `pyspark.sql.types.StructType` or a DDL string (`"a INT, b STRING"`);
            default: Spark's inference (a Delta table's own schema; none may be given).
        options: Reader options (e.g. `{"header": "true"}` for csv).
        streaming: Read with `spark.readStream`: an unbounded source (new files in the
            directory are picked up as they appear; `"table"` reads the table as a stream,
            `spark.readStream.table(path)`; `"delta"` each commit to the table; also `"rate"` and
            `"socket"`); the flow then runs
            as a Structured Streaming query (see docs/streaming.md). File formats need
            `schema` when streaming. A `from_dataframe` source streams when its DataFrame does.

    Example:
        >>> src = SparkSource("parquet", "/data/events")
        >>> src.is_bounded()
        True
    """

    def __init__(
        self,
        format: str,  # noqa: A002
        path: Optional[str] = None,
        schema: Any = None,
        options: Optional[dict[str, Any]] = None,
        streaming: bool = False,
    ) -> None:
        """Describe what to read."""
        if streaming and format in _STREAM_ONLY:
            path = path if path is not None else ""
        elif format not in _FORMATS:
            msg = f"SparkSource: format must be one of {', '.join(_FORMATS)}; received {format!r}"
            raise FlowsparkTypeError(msg)
        if format != "dataframe" and not isinstance(path, str):
            msg = f"SparkSource({format!r}): path must be a str (a path, glob or table name); received {path!r}"
            raise FlowsparkTypeError(msg)
        self.format = format
        self.path = path
        self.schema = schema
        self.options = dict(options or {})
        self.streaming = bool(streaming)
        self._df: Any = None
        if format in _SELF_DESCRIBED and schema is not None:
            msg = (
                f"SparkSource({format!r}, {path!r}): a Delta table carries its own schema; received "
                f"schema={short_repr(schema)}; leave schema out (select columns in a later step)"
            )
            raise FlowsparkTypeError(msg)
        if self.streaming and format not in (*_STREAM_ONLY, *_SELF_DESCRIBED, "table", "dataframe") and schema is None:
            msg = (
                f"SparkSource({format!r}, {path!r}, streaming=True) needs a schema (Spark does not infer "
                "schemas of streamed files); pass schema='a STRING, b LONG' or a StructType"
            )
            raise FlowsparkTypeError(msg)

    @classmethod
    def from_dataframe(cls, df: Any) -> SparkSource:
        """Read the rows of an existing DataFrame, batch or streaming.

        A streaming DataFrame (`df.isStreaming`, e.g. built with `spark.readStream`) makes
        an unbounded source: the flow then runs as a Structured Streaming query, whose
        checkpoint keeps the DataFrame's source offsets (build the same DataFrame again to
        restart). A batch DataFrame is read once.

        Args:
            df: A `pyspark.sql.DataFrame`.

        Returns:
            The source.

        Raises:
            FlowsparkTypeError: `df` is not a DataFrame.
        """
        streaming = getattr(df, "isStreaming", None)
        if not isinstance(streaming, bool):
            msg = (
                "SparkSource.from_dataframe needs a pyspark.sql.DataFrame (spark.read... or spark.readStream...); "
                f"received {short_repr(df)} of type {type(df).__name__}"
            )
            raise FlowsparkTypeError(msg)
        src = cls("dataframe", streaming=streaming)
        src._df = df
        return src

    @override
    def is_bounded(self) -> bool:
        return not self.streaming

    def load(self, spark: Any) -> Any:
        """Build the DataFrame on `spark`.

        Args:
            spark: The SparkSession.

        Returns:
            The DataFrame.

        Raises:
            FlowsparkTypeError: A `"dataframe"` source not built with `from_dataframe`.
        """
        if self.format == "dataframe":
            if self._df is None:
                msg = (
                    "SparkSource('dataframe') has no DataFrame (it never leaves the driver that built it); "
                    "build the source with SparkSource.from_dataframe(df)"
                )
                raise FlowsparkTypeError(msg)
            return self._df
        if self.format == "table" and not self.streaming:
            return spark.table(self.path)
        if self.format == "table":
            reader = spark.readStream.options(**self.options) if self.options else spark.readStream
            return reader.table(self.path)
        reader = (spark.readStream if self.streaming else spark.read).format(self.format)
        if self.schema is not None:
            reader = reader.schema(self.schema)
        if self.options:
            reader = reader.options(**self.options)
        return reader.load(self.path) if self.path else reader.load()

    def load_checked(self, spark: Any) -> Any:
        """Build the DataFrame on `spark`, a JSON or CSV file source with `CORRUPT_COLUMN` when flowspark owns it.

        That is unless the user's options choose a mode other than PERMISSIVE or the schema
        has the corrupt-record column the options (or `spark.sql.columnNameOfCorruptRecord`)
        name: the user then routes malformed rows (docs/streaming.md "Malformed input"). A
        source without a schema (batch) has it inferred first, the corrupt column left out.

        Args:
            spark: The SparkSession.

        Returns:
            The DataFrame; it has a `CORRUPT_COLUMN` when flowspark catches malformed rows.
        """
        if self.format not in _PERMISSIVE_FORMATS or not self.path:
            return self.load(spark)
        from pyspark.sql.types import StringType, StructField, StructType

        opts = {k: v for k, v in self.options.items() if k.lower() not in ("mode", "columnnameofcorruptrecord")}
        lower = {k.lower(): v for k, v in self.options.items()}
        if str(lower.get("mode", "PERMISSIVE")).upper() != "PERMISSIVE":
            return self.load(spark)  # DROPMALFORMED or FAILFAST: the user's choice
        opts.update(mode="PERMISSIVE", columnNameOfCorruptRecord=CORRUPT_COLUMN)
        reader = (spark.readStream if self.streaming else spark.read).format(self.format).options(**opts)
        if self.schema is None:
            struct = reader.load(self.path).schema  # inferred (batch); a malformed row adds CORRUPT_COLUMN
        else:
            struct = spark.createDataFrame([], self.schema).schema
            named = lower.get("columnnameofcorruptrecord") or spark.conf.get(
                "spark.sql.columnNameOfCorruptRecord", "_corrupt_record"
            )
            if named in struct.names or CORRUPT_COLUMN in struct.names:
                return self.load(spark)  # the user routes malformed rows
        fields = [f for f in struct.fields if f.name != CORRUPT_COLUMN]
        full = StructType([*fields, StructField(CORRUPT_COLUMN, StringType(), True)])
        return reader.schema(full).load(self.path)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the DataFrame (it never leaves the driver)."""
        state = dict(self.__dict__)
        state["_df"] = None
        return state

    def __repr__(self) -> str:
        """Show what is read."""
        return f"SparkSource({self.format!r}, {self.path!r})"


def load_rows(
    source: SparkSource,
    spark: Any,
    step_id: str,
    dead_letter: bool,
    keep: Optional[Callable[[dict[str, list[dict[str, Any]]]], None]] = None,
) -> tuple[Any, Optional[Any]]:
    """Read a `SparkSource` for a lowering: the rows that parsed, and what becomes of the malformed ones.

    The rows that parsed keep the user's columns only. Without a dead letter, a malformed
    row stops the job or micro-batch where Spark reads it (`raise_error` with
    `flowspark.spark.worker.codec.MALFORMED_MARK`, decoded into
    `flowspark.errors.malformed_input_error`): it never reaches a step, and nothing but a
    filter is added to the read. With a dead letter, each malformed row becomes a record
    (`flowspark.deadletter.malformed_record`), either

    - in a second DataFrame (a batch job): one `(p, k, seq, v)` row per malformed row, on
      `flowspark.spark.plan.types.DEAD_PORT`; it reads the full row (Spark refuses a query of raw
      JSON/CSV files that references the corrupt-record column alone); or
    - with `keep` (a stream, where a second read of the source would be a second source of
      the query, which a checkpoint written without a dead letter refuses): an Arrow pass
      right after the read takes the malformed rows out of the first DataFrame and hands
      each task's records to `keep({split: records})`, called in the task, by the file split
      they were read from (`"<file>@<block start>"`): a split read twice in a micro-batch (a
      stage DataFrame read by two parts of the query, a retried task) gives the same records
      under the same name, which `keep` replaces rather than adds.

    Args:
        source: The source.
        spark: The SparkSession.
        step_id: The input step.
        dead_letter: Whether the run has a dead letter.
        keep: With a dead letter, takes the records inside the tasks (one read).

    Returns:
        `(rows, dead rows or None)`; `None` also with `keep`, and when flowspark does not
        catch the source's malformed rows (`SparkSource.load_checked`).
    """
    try:
        df = source.load_checked(spark)
    except Exception as e:
        from flowspark.spark.io.delta import missing_delta

        err = missing_delta(e, step_id) if source.format == "delta" else None
        if err is not None:
            raise err from e
        raise
    if CORRUPT_COLUMN not in df.columns:
        return df, None
    from pyspark.sql import functions as F  # noqa: N812

    from flowspark.spark.worker.codec import MALFORMED_MARK

    bad = F.col(CORRUPT_COLUMN)
    file = F.input_file_name() if "_metadata" in df.columns else F.col("_metadata.file_path")
    if not dead_letter:
        marker = F.concat(
            F.lit(f"{MALFORMED_MARK}<<{step_id.encode().hex()}|"),
            F.hex(F.coalesce(file, F.lit(""))),
            F.lit("|"),
            F.hex(F.substring(bad, 1, 200)),
            F.lit(">>"),
        )
        return df.filter(F.when(bad.isNull(), F.lit(True)).otherwise(F.raise_error(marker))).drop(CORRUPT_COLUMN), None
    if keep is not None:
        from pyspark.sql.types import StructType

        struct = StructType([f for f in df.schema.fields if f.name != CORRUPT_COLUMN])
        start = F.input_file_block_start() if "_metadata" in df.columns else F.col("_metadata.file_block_start")
        split = F.concat(F.coalesce(file, F.lit("")), F.lit("@"), start.cast("string"))
        both = df.select(file.alias(_FILE_COLUMN), split.alias(_SPLIT_COLUMN), "*")
        return both.mapInArrow(_keep_malformed(step_id, keep), struct), None
    rows = df.filter(bad.isNull()).drop(CORRUPT_COLUMN)
    dead = df.filter(bad.isNotNull()).select(file.alias(_FILE_COLUMN), "*")
    return rows, dead.mapInArrow(_dead_rows(step_id), "p int, k string, seq binary, v binary")


def _records(step_id: str, b: Any) -> list[dict[str, Any]]:
    """The dead-letter records of an Arrow batch of malformed rows `(file, ..., CORRUPT_COLUMN, ...)`."""
    from flowspark.deadletter import malformed_record

    files = b.column(0).to_pylist()
    raws = b.column(b.schema.get_field_index(CORRUPT_COLUMN)).to_pylist()
    return [malformed_record(step_id, f or "", r) for f, r in zip(files, raws, strict=True)]


def _keep_malformed(
    step_id: str, keep: Callable[[dict[str, list[dict[str, Any]]]], None]
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Rows `(file, split, user columns..., CORRUPT_COLUMN)` -> the user columns of the rows that parsed.

    One vectorised test per Arrow batch; a batch without malformed rows only loses three
    columns. The malformed rows' records go to `keep` by split (see `load_rows`).
    """

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow.compute as pc

        kept: dict[str, list[dict[str, Any]]] = {}
        for b in batches:
            corrupt = b.column(b.schema.get_field_index(CORRUPT_COLUMN))
            names = [n for n in b.schema.names[2:] if n != CORRUPT_COLUMN]
            if corrupt.null_count < b.num_rows:
                bad = b.filter(pc.is_valid(corrupt))
                for split, rec in zip(bad.column(1).to_pylist(), _records(step_id, bad), strict=True):
                    kept.setdefault(split, []).append(rec)
                b = b.filter(pc.is_null(corrupt))
            yield b.select(names)
        if kept:
            keep(kept)

    return fn


def _dead_rows(step_id: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Malformed rows `(file, ..., CORRUPT_COLUMN, ...)` -> dead-letter rows on `DEAD_PORT` (see `load_rows`)."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from flowspark.spark.plan.types import DEAD_PORT
        from flowspark.spark.worker.codec import dumps

        for b in batches:
            if not b.num_rows:
                continue
            vs = [dumps(r) for r in _records(step_id, b)]
            n = len(vs)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([DEAD_PORT] * n, pa.int32()),
                    pa.nulls(n, pa.string()),
                    pa.array([b""] * n, pa.binary()),
                    pa.array(vs, pa.binary()),
                ],
                names=["p", "k", "seq", "v"],
            )

    return fn
