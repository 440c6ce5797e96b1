"""Spark column helpers both lowerings use (batch and streaming import them from here, not from each other).

`ID_COLUMN` numbers a Spark-keyed source's rows; `column_kinds` gives a DataFrame's columns as
the optimizer reads them (the rule `spark_keys` decides whether Spark can key the rows on a
column as `row[column]` would); `seq_column` is a port's `seq` with a merge's pad applied.
"""

from __future__ import annotations

from typing import Any

from flowspark.runtime.driver import HEAD_LEN

__all__ = ["ID_COLUMN", "column_kinds", "seq_column"]

#: The row number of a source Spark keys itself (what `monotonically_increasing_id()` gives).
ID_COLUMN = "__flowspark_id"


def column_kinds(df: Any) -> tuple[tuple[str, str], ...]:
    """A DataFrame's columns as `(name, kind)`: kind `string` for a plain string column, else Spark's type.

    Only a plain string column can be a key Spark computes (what `key_on` accepts in Python,
    compared and sorted as Python does); a collated string column is not one.

    Args:
        df: A DataFrame.

    Returns:
        The columns, in order (duplicated names included).
    """
    from pyspark.sql.types import StringType

    out = []
    for f in df.schema.fields:
        t = f.dataType
        out.append((f.name, "string" if type(t) is StringType and t == StringType() else t.simpleString()))
    return tuple(out)


def seq_column(pad: bytes) -> Any:
    """The `seq` column of a port read by a stage, with a merge's `pad` applied.

    Args:
        pad: Empty, or (for an upstream of a merge) its 4-byte index, inserted after
            the source header, then zero padding, appended (see `StagePlan.inputs`).

    Returns:
        A Spark Column.
    """
    from pyspark.sql import functions as F  # noqa: N812

    if not pad:
        return F.col("seq")
    head = F.expr(f"substring(seq, 1, {HEAD_LEN})")
    rest = F.expr(f"substring(seq, {HEAD_LEN + 1}, 1073741824)")
    return F.concat(head, F.lit(pad[:4]), rest, F.lit(pad[4:]))
