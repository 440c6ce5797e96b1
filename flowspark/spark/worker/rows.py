"""A native sink's rows: its schema as Arrow, in the session's time zone, and how item values convert.

The one place a `SparkSink`'s (or `ForeachBatchSink`'s) schema becomes an Arrow
schema, for both lowerings: `row_schema` reads the session's time zone at the
driver and gives a `RowSchema`, which travels to the workers (pickled as its
arguments) and is what `flowspark.spark.worker.stage.dict_rows` builds the rows with.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import re
from typing import Any, Callable, NoReturn, Optional

from flowspark.errors import FlowsparkTypeError

__all__ = ["RowSchema", "row_schema"]


def row_schema(spark: Any, step_id: str, schema: Any) -> RowSchema:
    """The `RowSchema` of a native sink's rows, in the session's time zone (read here, at the driver).

    The one way both lowerings turn a sink's schema into Arrow: every place that builds a
    sink's rows (`flowspark.spark.worker.stage.dict_rows`) gets the `RowSchema` made here.

    Args:
        spark: The SparkSession (its `spark.sql.session.timeZone`).
        step_id: The sink's step id (named in errors).
        schema: A `StructType` or a DDL string.

    Returns:
        The `RowSchema`.

    Raises:
        FlowsparkTypeError: The schema is not a valid DDL string or StructType, or names a type
            flowspark cannot write (named with the step and the column).
    """
    if isinstance(schema, str):
        from pyspark.sql.types import StructType

        if not hasattr(StructType, "fromDDL"):  # Spark 3.5: the session's parser
            try:
                schema = spark.createDataFrame([], schema).schema
            except Exception as e:
                msg = f"step {step_id!r}: the sink's schema {schema!r} is not a valid DDL string ({e})"
                raise FlowsparkTypeError(msg) from e
    return RowSchema(step_id, schema, spark.conf.get("spark.sql.session.timeZone"))


class RowSchema:
    """A native sink's rows: its `StructType`, its Arrow schema, and how item values become Arrow values.

    Values convert as Spark's `createDataFrame` converts them: an aware `datetime` in a
    TIMESTAMP column is its instant, a naive one a wall-clock time in the session's time
    zone (as Spark reads a pandas frame or a SQL literal; `createDataFrame` of a list reads
    it in the Python process's zone, the same one unless the session's was changed); a
    TIMESTAMP_NTZ column keeps a `datetime`'s wall clock (an aware one's offset is dropped);
    a `datetime` in a DATE column is its date; a `Decimal` is rounded half up to its
    column's scale; a STRUCT takes a dict (by name) or a tuple or `Row` (by position); `bytes`,
    `bytearray`, lists and dicts (MAP) go as they are, at any depth. CHAR and VARCHAR
    columns are strings. A value that still does not fit its column is the sink's error
    (`dict_rows`). Pickles as its step id, schema and time zone (rebuilt in a worker).

    Args:
        step_id: The sink's step id.
        schema: A `StructType` or a DDL string.
        time_zone: The session's time zone (`spark.sql.session.timeZone`): a region id
            (`"Europe/Paris"`) or an offset (`"+02:00"`, `"UTC+2"`).

    Raises:
        FlowsparkTypeError: As in `row_schema`.
    """

    def __init__(self, step_id: str, schema: Any, time_zone: str) -> None:
        """Build the Arrow schema and the converters."""
        from pyspark.sql.types import StructType

        from flowspark.spark.compat import arrow_type

        self.step_id = step_id
        self.time_zone = time_zone
        try:
            struct = StructType.fromDDL(schema) if isinstance(schema, str) else schema
        except Exception as e:
            msg = f"step {step_id!r}: the sink's schema {schema!r} is not a valid DDL string ({e})"
            raise FlowsparkTypeError(msg) from e
        if not isinstance(struct, StructType):
            msg = (
                f"step {step_id!r}: the sink's schema must be a StructType or a DDL string "
                f"(e.g. 'user STRING, n LONG'); received {schema!r}"
            )
            raise FlowsparkTypeError(msg)
        #: The rows' `StructType` (CHAR and VARCHAR as STRING).
        self.struct = _no_char(struct)
        tz, arrow_tz = _zone(step_id, time_zone)
        import pyarrow as pa

        fields = []
        for f in self.struct.fields:
            try:
                typ = arrow_type(f.dataType, arrow_tz)
            except Exception as e:
                msg = (
                    f"step {step_id!r}: the sink's column {f.name!r} has type {f.dataType.simpleString()}, "
                    f"which Spark cannot take from Python through Arrow ({e}); give the column another type"
                )
                raise FlowsparkTypeError(msg) from e
            fields.append(pa.field(f.name, typ, nullable=f.nullable))
        #: The Arrow schema of the rows (TIMESTAMP columns in the session's time zone).
        self.arrow = pa.schema(fields)
        self._fixes = [(f.name, c) for f in self.struct.fields if (c := _converter(f.dataType, tz)) is not None]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the constructor's arguments."""
        return (RowSchema, (self.step_id, self.struct, self.time_zone))

    def fit(self, items: list[Any]) -> list[Any]:
        """The items with their values converted for Arrow (see the class); `items` itself when none needs it.

        Args:
            items: The items (dicts; anything else is left as it is, for `dict_rows` to refuse).

        Returns:
            The items to give `pyarrow.RecordBatch.from_pylist`, in order.
        """
        if not self._fixes:
            return items
        return [_fix_dict(x, self._fixes) if isinstance(x, dict) else x for x in items]


def _fix_dict(x: dict[str, Any], fixes: list[tuple[str, Callable[[Any], Any]]]) -> dict[str, Any]:
    out = dict(x)
    for name, conv in fixes:
        v = x.get(name)
        if v is not None:
            out[name] = conv(v)
    return out


def _no_char(dt: Any) -> Any:
    """`dt` with CHAR and VARCHAR (at any depth) as STRING, as Spark's DataFrames read them."""
    from pyspark.sql.types import ArrayType, CharType, MapType, StringType, StructField, StructType, VarcharType

    if isinstance(dt, (CharType, VarcharType)):
        return StringType()
    if isinstance(dt, ArrayType):
        return ArrayType(_no_char(dt.elementType), dt.containsNull)
    if isinstance(dt, MapType):
        return MapType(_no_char(dt.keyType), _no_char(dt.valueType), dt.valueContainsNull)
    if isinstance(dt, StructType):
        return StructType([StructField(f.name, _no_char(f.dataType), f.nullable, f.metadata) for f in dt.fields])
    return dt


_OFFSET = re.compile(r"^(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?$")


def _zone(step_id: str, name: str) -> tuple[_dt.tzinfo, str]:
    """The `tzinfo` of a session time zone and the zone's name for Arrow."""
    from zoneinfo import ZoneInfo

    if name in ("Z", "UTC", "GMT", "UT"):
        return _dt.timezone.utc, "UTC"
    m = _OFFSET.match(name)
    if m is not None:
        sign = -1 if m.group(1) == "-" else 1
        hours, minutes = int(m.group(2)), int(m.group(3) or 0)
        offset = _dt.timedelta(hours=hours, minutes=minutes)
        return _dt.timezone(sign * offset), f"{m.group(1)}{hours:02d}:{minutes:02d}"
    try:
        return ZoneInfo(name), name
    except Exception as e:
        msg = (
            f"step {step_id!r}: the session time zone {name!r} (spark.sql.session.timeZone) is not a region "
            "id or an offset Python knows; set it to one, e.g. 'America/Los_Angeles' or '+02:00'"
        )
        raise FlowsparkTypeError(msg) from e


def _converter(dt: Any, tz: _dt.tzinfo) -> Optional[Callable[[Any], Any]]:
    """How a value of Spark type `dt` becomes what Arrow takes, or `None` when Arrow takes it as it is.

    A value of another kind is left unchanged (Arrow refuses it: the sink's error), but in a
    temporal column it is refused here: Arrow would take a number as a count of microseconds
    or days, where Spark's `createDataFrame` refuses it.
    """
    from pyspark.sql.types import (
        ArrayType,
        DateType,
        DecimalType,
        MapType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    if isinstance(dt, TimestampType):

        def timestamp(v: Any) -> Any:
            if not isinstance(v, _dt.datetime):
                _refuse("TIMESTAMP", "datetime", v)
            return v.replace(tzinfo=tz) if v.tzinfo is None else v

        return timestamp
    if isinstance(dt, TimestampNTZType):

        def timestamp_ntz(v: Any) -> Any:
            if not isinstance(v, _dt.datetime):
                _refuse("TIMESTAMP_NTZ", "datetime", v)
            return v.replace(tzinfo=None) if v.tzinfo is not None else v

        return timestamp_ntz
    if isinstance(dt, DateType):

        def date(v: Any) -> Any:
            if not isinstance(v, _dt.date):
                _refuse("DATE", "date", v)
            return v.date() if isinstance(v, _dt.datetime) else v

        return date
    if isinstance(dt, DecimalType):
        exp = decimal.Decimal(1).scaleb(-dt.scale)
        ctx = decimal.Context(prec=dt.precision, rounding=decimal.ROUND_HALF_UP, traps=[decimal.InvalidOperation])

        def rescale(v: Any) -> Any:
            if isinstance(v, decimal.Decimal) and v.is_finite():
                try:
                    return v.quantize(exp, context=ctx)
                except decimal.InvalidOperation:
                    return v  # more digits than the column's precision: Arrow refuses it
            return v

        return rescale
    if isinstance(dt, ArrayType):
        conv = _converter(dt.elementType, tz)
        if conv is None:
            return None

        def array(v: Any) -> Any:
            if isinstance(v, (list, tuple)):
                return [None if e is None else conv(e) for e in v]
            return v

        return array
    if isinstance(dt, MapType):
        kc = _converter(dt.keyType, tz) or _same
        vc = _converter(dt.valueType, tz)
        if kc is _same and vc is None:
            return None
        vc = vc or _same

        def map_(v: Any) -> Any:
            if isinstance(v, dict):
                return {kc(k): None if e is None else vc(e) for k, e in v.items()}
            return v

        return map_
    if isinstance(dt, StructType):
        names = dt.names
        convs = [_converter(f.dataType, tz) for f in dt.fields]
        fixes = [(name, c) for name, c in zip(names, convs, strict=True) if c is not None]

        def struct(v: Any) -> Any:
            if isinstance(v, dict):
                return _fix_dict(v, fixes) if fixes else v
            if isinstance(v, tuple) and len(v) == len(names):
                # A Row or a tuple, by position: a dict (Arrow takes one kind per column).
                return {n: e if c is None or e is None else c(e) for n, e, c in zip(names, v, convs, strict=True)}
            return v

        return struct
    return None


def _refuse(column: str, kind: str, v: Any) -> NoReturn:
    """Raise the error for a value of the wrong kind in a temporal column (Arrow would take an int as a count)."""
    msg = f"a {column} column takes {kind} values; received {v!r} of type {type(v).__name__}"
    raise TypeError(msg)


def _same(v: Any) -> Any:
    return v
