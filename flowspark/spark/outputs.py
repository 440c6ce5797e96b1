"""Spark-native sinks: write dict items with a Spark writer (parquet / json / csv / orc / table).

`SparkSink` describes where to write; the Spark runtime turns the items
(each a dict, one row) into a DataFrame and writes it in one Spark job. The
in-memory executor cannot run it.
"""

from __future__ import annotations

from typing import Any, Optional

from flowspark.errors import FlowsparkTypeError
from flowspark.outputs import Sink

__all__ = ["SparkSink"]

_FORMATS = ("parquet", "json", "csv", "orc", "table")
_MODES = ("overwrite", "append", "error", "errorifexists", "ignore")


class SparkSink(Sink[dict[str, Any]]):
    """Write dict items as rows: a parquet / json / csv / orc directory or a table.

    Args:
        format: `"parquet"`, `"json"`, `"csv"`, `"orc"` or `"table"` (`path` is the table name).
        path: Output directory, or the table name.
        schema: A `pyspark.sql.types.StructType` or a DDL string for the rows; default:
            inferred from up to 100 items.
        mode: Spark save mode (`"overwrite"` default, `"append"`, `"error"`, `"ignore"`).
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

    def write(self, df: Any) -> None:
        """Write `df` (a DataFrame of the rows) as described.

        Args:
            df: The DataFrame.
        """
        w = df.write.mode(self.mode)
        if self.options:
            w = w.options(**self.options)
        if self.partition_by:
            w = w.partitionBy(*self.partition_by)
        if self.format == "table":
            w.saveAsTable(self.path)
        else:
            w.format(self.format).save(self.path)

    def __repr__(self) -> str:
        """Show where items go."""
        return f"SparkSink({self.format!r}, {self.path!r})"
