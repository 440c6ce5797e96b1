"""Every Spark SQL type a `SparkSink` schema names, written by both lowerings, fused or not, and read back.

Timestamps are compared as instants (`unix_micros`). The session's time zone is set to one
that is not the machine's (`America/Los_Angeles`) for these tests, so a naive `datetime`
read in any other zone shows.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Any, NamedTuple

import pytest
from streaming_helpers import ListSource

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark import compile_flow, run
from flowspark.spark.io.outputs import SparkSink
from flowspark.spark.rules.optimizer import Env, optimize
from flowspark.testing import TestingSink, TestingSource

pytestmark = [pytest.mark.spark]

ZONE = "America/Los_Angeles"
UTC = dt.timezone.utc
PLUS2 = dt.timezone(dt.timedelta(hours=2))


def micros(t: dt.datetime) -> int:
    """The instant of an aware datetime in microseconds since the epoch."""
    return (t - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


#: 2024-01-01 12:00 in Los Angeles (PST, UTC-8) is 20:00 UTC.
NAIVE = dt.datetime(2024, 1, 1, 12, 0, 0, 123456)
NAIVE_AT = micros(dt.datetime(2024, 1, 1, 20, 0, 0, 123456, tzinfo=UTC))
AWARE = dt.datetime(2024, 7, 1, 12, 0, tzinfo=PLUS2)  # 10:00 UTC


class Case(NamedTuple):
    type: str
    values: list[Any]
    expected: list[Any]
    expr: str = "v"  # how the column is read back (timestamps as instants)


CASES = {
    "boolean": Case("BOOLEAN", [True, False, None], [True, False, None]),
    "tinyint": Case("TINYINT", [-128, 127], [-128, 127]),
    "smallint": Case("SMALLINT", [-(2**15), 7], [-(2**15), 7]),
    "int": Case("INT", [2**31 - 1], [2**31 - 1]),
    "bigint": Case("BIGINT", [2**62, -1], [2**62, -1]),
    "float": Case("FLOAT", [1.5, 2], [1.5, 2.0]),
    "double": Case("DOUBLE", [0.1, None], [0.1, None]),
    "string": Case("STRING", ["é", ""], ["é", ""]),
    "varchar": Case("VARCHAR(5)", ["abc"], ["abc"]),
    "timestamp": Case(
        "TIMESTAMP",
        [dt.datetime(2024, 1, 1, 12, tzinfo=UTC), AWARE, NAIVE, None],
        [micros(dt.datetime(2024, 1, 1, 12, tzinfo=UTC)), micros(AWARE), NAIVE_AT, None],
        "unix_micros(v)",
    ),
    "timestamp_ntz": Case(
        "TIMESTAMP_NTZ",
        [NAIVE, AWARE],  # an aware datetime keeps its wall clock, as createDataFrame does
        [NAIVE, dt.datetime(2024, 7, 1, 12, 0)],
    ),
    "date": Case(
        "DATE",
        [dt.date(2024, 2, 29), dt.datetime(2024, 3, 1, 23, 30)],
        [dt.date(2024, 2, 29), dt.date(2024, 3, 1)],
    ),
    "decimal": Case(
        "DECIMAL(10,2)",
        [Decimal("1.235"), Decimal("-3.1"), 7, Decimal("12345678.9")],
        [Decimal("1.24"), Decimal("-3.10"), Decimal("7.00"), Decimal("12345678.90")],
    ),
    "binary": Case("BINARY", [b"\x00\xff", bytearray(b"ab")], [bytearray(b"\x00\xff"), bytearray(b"ab")]),
    "array": Case("ARRAY<BIGINT>", [[1, None, 3], []], [[1, None, 3], []]),
    "array_of_timestamps": Case(
        "ARRAY<TIMESTAMP>",
        [[NAIVE, AWARE, None]],
        [[NAIVE_AT, micros(AWARE), None]],
        "transform(v, x -> unix_micros(x))",
    ),
    "map": Case("MAP<STRING, DOUBLE>", [{"a": 1.0, "b": None}], [{"a": 1.0, "b": None}]),
    "map_of_decimals": Case("MAP<STRING, DECIMAL(4,1)>", [{"x": Decimal("2.25")}], [{"x": Decimal("2.3")}]),
    "struct": Case(
        "STRUCT<a: INT, b: STRING>",
        [{"a": 1, "b": "x"}, (2, "y")],  # a dict by name, a tuple (a Row) by position
        [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}],
    ),
    "nested": Case(
        "STRUCT<t: TIMESTAMP, xs: ARRAY<STRUCT<d: DECIMAL(5,1), m: MAP<STRING, BINARY>, day: DATE>>>",
        [{"t": NAIVE, "xs": [{"d": Decimal("0.25"), "m": {"k": b"v"}, "day": dt.date(2000, 1, 1)}, None]}],
        [{"t": NAIVE_AT, "xs": [{"d": Decimal("0.3"), "m": {"k": bytearray(b"v")}, "day": dt.date(2000, 1, 1)}, None]}],
        "if(v IS NULL, NULL, named_struct('t', unix_micros(v.t), 'xs', v.xs))",
    ),
}


@pytest.fixture
def zone(spark):
    """The session's time zone set to `ZONE` for one test (and restored)."""
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    yield ZONE
    spark.conf.set("spark.sql.session.timeZone", before)


def _plain(x: Any) -> Any:
    """A value read back, with Rows as dicts (at any depth)."""
    if hasattr(x, "asDict"):
        return {k: _plain(v) for k, v in x.asDict().items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _read(spark, out: str, expr: str) -> list[Any]:
    rows = spark.read.parquet(out).selectExpr("i", f"{expr} AS v").orderBy("i").collect()
    return [_plain(r.v) for r in rows]


def _batch_flow(case: Case, out: str, fused: bool) -> Dataflow:
    flow = Dataflow("types")
    items = [{"i": i, "v": v} for i, v in enumerate(case.values)]
    s = op.input("inp", flow, TestingSource(items))
    op.output("out", s, SparkSink("parquet", out, schema=f"i INT, v {case.type}"))
    if not fused:
        op.output("also", s, TestingSink([]))  # a second reader: the sink's rows are a pass of their own
    return flow


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "not_fused"])
@pytest.mark.parametrize("name", list(CASES))
def test_batch_sink_writes_each_type(spark, zone, tmp_path, name, fused):  # noqa: ARG001
    case = CASES[name]
    out = str(tmp_path / "out")
    flow = _batch_flow(case, out, fused)
    assert optimize(compile_flow(flow), Env("batch")).decision("sink_fusion", "sink types.out").applied is fused
    run(flow, spark=spark, progress=False)
    assert _read(spark, out, case.expr) == case.expected


def test_batch_sink_without_a_schema_infers_timestamps_and_dates(spark, zone, tmp_path):  # noqa: ARG001
    out = str(tmp_path / "out")
    flow = Dataflow("types")
    items = [{"i": 0, "t": AWARE, "d": dt.date(2024, 2, 29), "x": Decimal("1.5")}, {"i": 1, "t": NAIVE, "d": None}]
    op.output("out", op.input("inp", flow, TestingSource(items)), SparkSink("parquet", out))
    run(flow, spark=spark)
    rows = spark.read.parquet(out).selectExpr("i", "unix_micros(t) AS t", "d", "x").orderBy("i").collect()
    assert [(r.t, r.d) for r in rows] == [(micros(AWARE), dt.date(2024, 2, 29)), (NAIVE_AT, None)]
    assert rows[0].x == Decimal("1.5")


@pytest.mark.parametrize(
    ("type_", "bad", "error"),
    [
        (
            "TIMESTAMP",
            "2024-01-01 12:00",
            "TypeError: a TIMESTAMP column takes datetime values; received '2024-01-01 12:00' of type str",
        ),
        ("DATE", 19000, "TypeError: a DATE column takes date values; received 19000 of type int"),
        ("DECIMAL(4,2)", Decimal("123.4"), "ArrowInvalid: "),  # more digits than the precision
        ("STRUCT<a: INT>", (1, 2), "ArrowInvalid: Tuple size must be equal to number of struct fields"),
    ],
)
def test_a_value_that_does_not_fit_its_column_names_the_step(spark, zone, tmp_path, type_, bad, error):  # noqa: ARG001
    flow = Dataflow("types")
    ok = CASES["timestamp"].values[0] if type_ == "TIMESTAMP" else None
    items = [{"i": 0, "v": ok}, {"i": 1, "v": bad}]
    sink = SparkSink("parquet", str(tmp_path / "out"), schema=f"i INT, v {type_}")
    op.output("out", op.input("inp", flow, TestingSource(items)), sink)
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(flow, spark=spark)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"error in step 'types.out': {error}")
    assert "; the item does not fit the sink's schema <i int32, v " in msg
    assert msg.endswith(f"(item: {{'i': 1, 'v': {bad!r}}})")
    assert info.value.step_id == "types.out"


def test_a_misfit_names_the_session_zone_in_the_schema(spark, zone, tmp_path):  # noqa: ARG001
    flow = Dataflow("types")
    sink = SparkSink("parquet", str(tmp_path / "out"), schema="i INT, v TIMESTAMP")
    op.output("out", op.input("inp", flow, TestingSource([{"i": 0, "v": 1}])), sink)
    with pytest.raises(FlowsparkRuntimeError, match=rf"schema <i int32, v timestamp\[us, tz={ZONE}\]>"):
        run(flow, spark=spark)


def test_a_type_spark_cannot_take_from_python_names_the_step_and_column(spark, tmp_path):
    flow = Dataflow("types")
    sink = SparkSink("parquet", str(tmp_path / "out"), schema="i INT, span INTERVAL YEAR TO MONTH")
    op.output("out", op.input("inp", flow, TestingSource([{"i": 1, "span": None}])), sink)
    with pytest.raises(TypeError, match=r"^step 'types.out': the sink's column 'span' has type interval year to month"):
        run(flow, spark=spark)


def test_a_bounded_run_takes_progress(spark, tmp_path, capsys):
    out: list[Any] = []
    flow = Dataflow("types")
    op.output("out", op.input("inp", flow, TestingSource([1, 2])), TestingSink(out))
    lines: list[str] = []
    for progress in (False, True, lines.append):
        out.clear()
        assert run(flow, spark=spark, progress=progress) is None
        assert out == [1, 2]
    assert lines == []
    assert capsys.readouterr().out == ""


# -- streams: one row of every type, three ways to the sink ------------------------------------------

ROW_TYPES = ["boolean", "tinyint", "bigint", "double", "string", "timestamp", "timestamp_ntz", "date", "decimal",
             "binary"]  # fmt: skip
ALL_TYPES = [*ROW_TYPES, "array_of_timestamps", "map_of_decimals", "struct", "nested"]


def _stream_items(names: list[str]) -> list[dict[str, Any]]:
    """Row `j`: column `c_<name>` holds the case's value `j` (or None past its values)."""
    n = max(len(CASES[k].values) for k in names)
    return [
        {"i": j, **{f"c_{k}": CASES[k].values[j] if j < len(CASES[k].values) else None for k in names}}
        for j in range(n)
    ]


def _stream_expected(names: list[str]) -> dict[str, list[Any]]:
    n = max(len(CASES[k].values) for k in names)
    return {k: [CASES[k].expected[j] if j < len(CASES[k].expected) else None for j in range(n)] for k in names}


def _last(_state: Any, value: Any) -> tuple[Any, Any]:
    return value, value


def _value(kv: Any) -> Any:
    return kv[1]


def _stream_flow(names: list[str], out: str, how: str) -> Dataflow:
    flow = Dataflow("types")
    items = _stream_items(names)
    s = op.input("inp", flow, ListSource({"a": items}, batch=2))
    if how == "fused":  # a keyed stage whose only output is the lone file sink writes its rows
        s = op.map("value", op.stateful_map("last", op.key_on("key", s, lambda x: str(x["i"])), _last), _value)
    schema = ", ".join(["i INT", *(f"c_{k} {CASES[k].type}" for k in names)])
    op.output("out", s, SparkSink("parquet", out, schema=schema))
    if how == "driver":  # next to another output: each micro-batch's rows are written from the driver
        op.output("also", s, TestingSink([]))
    return flow


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "names"),
    [("stage", ALL_TYPES), ("fused", ROW_TYPES), ("driver", ALL_TYPES)],
)
def test_streaming_sink_writes_every_type(spark, zone, tmp_path, how, names):  # noqa: ARG001
    out = str(tmp_path / "out")
    sr = run(
        _stream_flow(names, out, how),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        progress=False,
    )
    assert sr is not None
    assert (sr._sink_fused_stage is not None) is (how == "fused")
    for k in names:
        assert _read_col(spark, out, k) == _stream_expected(names)[k], k


def _read_col(spark, out: str, name: str) -> list[Any]:
    expr = re.sub(r"\bv\b", f"c_{name}", CASES[name].expr)
    rows = spark.read.parquet(out).selectExpr("i", f"{expr} AS v").orderBy("i").collect()
    return [_plain(r.v) for r in rows]


@pytest.mark.slow
def test_streaming_misfit_names_the_step(spark, zone, tmp_path):  # noqa: ARG001
    flow = Dataflow("types")
    items = [{"i": 0, "t": NAIVE}, {"i": 1, "t": 5}]
    s = op.input("inp", flow, ListSource({"a": items}))
    op.output("out", s, SparkSink("parquet", str(tmp_path / "out"), schema="i INT, t TIMESTAMP"))
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(flow, spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("error in step 'types.out': ")
    assert f"the item does not fit the sink's schema <i int32, t timestamp[us, tz={ZONE}]>" in msg
    assert msg.endswith("(item: {'i': 1, 't': 5})")
