"""Spark column helpers both lowerings use (batch and streaming import them from here, not from each other).

`ID_COLUMN` numbers a Spark-keyed source's rows; `column_key_refusal` says whether Spark can
key a DataFrame's rows on a column as `row[column]` would; `seq_column` is a port's `seq`
with a merge's pad applied.
"""

from __future__ import annotations

from typing import Any, Optional

from flowspark.runtime.driver import HEAD_LEN

__all__ = ["ID_COLUMN", "column_key_refusal", "seq_column"]

#: The row number of a source Spark keys itself (what `monotonically_increasing_id()` gives).
ID_COLUMN = "__flowspark_id"


def column_key_refusal(df: Any, column: str) -> Optional[str]:
    """Why Spark cannot key `df`'s rows on `column` as `row[column]` would, or `None` when it can.

    Only a plain string column qualifies (what `key_on` accepts in Python, compared
    and sorted as Python does); a missing, duplicated, non-string or collated column
    keeps the Python pass, which then fails or succeeds exactly as it always did.

    Args:
        df: The source DataFrame.
        column: The key column.

    Returns:
        The reason, or `None`.
    """
    from pyspark.sql.types import StringType

    names = df.columns
    if names.count(column) != 1:
        return f"the DataFrame has {names.count(column)} columns named {column!r}"
    if ID_COLUMN in names:
        return f"the DataFrame has a column named {ID_COLUMN!r}"
    dtype = df.schema[column].dataType
    if type(dtype) is not StringType or dtype != StringType():
        return f"column {column!r} is {dtype.simpleString()}, not string"
    return None


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
