"""Spark-native sources: read a Spark DataFrame as a stream of dict items.

`SparkSource` only describes what to read; the Spark runtime builds the
DataFrame on its session when the flow runs (so building a flow needs no
session). The in-memory executor cannot run it.
"""

from __future__ import annotations

from typing import Any, Optional

from typing_extensions import override

from flowspark.errors import FlowsparkTypeError, short_repr
from flowspark.inputs import Source

__all__ = ["SparkSource"]

_FORMATS = ("parquet", "json", "csv", "orc", "text", "table", "dataframe")
#: Formats that only exist as streams (`streaming=True`).
_STREAM_ONLY = ("rate", "socket")


class SparkSource(Source[dict[str, Any]]):
    """Read parquet / json / csv / orc files, a table or an existing DataFrame; one dict item per row.

    Items are the rows as plain dicts (`{"column": value, ...}`), stamped with
    their position (Spark partition, row within it), so the order of each input
    partition is kept through stateless steps and, per key, through stateful ones.

    Args:
        format: `"parquet"`, `"json"`, `"csv"`, `"orc"`, `"text"` (a file format read with
            `spark.read`), `"table"` (`path` is the table name) or `"dataframe"`
            (use `SparkSource.from_dataframe`).
        path: File or directory (or glob) to read, or the table name.
        schema: A `pyspark.sql.types.StructType` or a DDL string (`"a INT, b STRING"`);
            default: Spark's inference.
        options: Reader options (e.g. `{"header": "true"}` for csv).
        streaming: Read with `spark.readStream`: an unbounded source (new files in the
            directory are picked up as they appear; `"table"` reads the table as a stream,
            `spark.readStream.table(path)`; also `"rate"` and `"socket"`); the flow then runs
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
        if self.streaming and format not in (*_STREAM_ONLY, "table", "dataframe") and schema is None:
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

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the DataFrame (it never leaves the driver)."""
        state = dict(self.__dict__)
        state["_df"] = None
        return state

    def __repr__(self) -> str:
        """Show what is read."""
        return f"SparkSource({self.format!r}, {self.path!r})"
