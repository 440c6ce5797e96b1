"""Malformed JSON / CSV rows of a SparkSource: named as bad input, or kept raw in the dead letter (batch and stream)."""

from __future__ import annotations

import os

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.deadletter import DeadLetterDir
from flowspark.errors import FlowsparkRuntimeError
from flowspark.testing import TestingSink

pytestmark = [pytest.mark.spark]

SCHEMA = "user STRING, n INT"
#: A row Spark cannot parse, per format (CSV: `n` is not an int, so Spark fills `user` and keeps the line).
BAD = {"json": '{"user": "eve", "n": ', "csv": "eve,oops"}
BAD2 = {"json": '{"user": "zed" "n": 3}', "csv": "zed,3,extra,"}


def _line(fmt: str, row: tuple[str, int] | str) -> str:
    if isinstance(row, str):
        return row
    return f'{{"user": "{row[0]}", "n": {row[1]}}}' if fmt == "json" else f"{row[0]},{row[1]}"


def _write(folder: str, name: str, fmt: str, rows: list) -> str:
    """Write rows (`(user, n)` pairs or raw lines) as one file, atomically; return Spark's name of it."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.{fmt}")
    head = ["user,n"] if fmt == "csv" else []
    with open(path + ".tmp", "w") as f:
        f.write("\n".join([*head, *(_line(fmt, r) for r in rows)]) + "\n")
    os.replace(path + ".tmp", path)
    return f"file:{path}"


def _source(fmt: str, folder: str, streaming: bool, schema: str = SCHEMA, options: dict | None = None):
    from flowspark.spark.io.inputs import SparkSource

    opts = {"header": "true"} if fmt == "csv" else {}
    return SparkSource(fmt, folder, schema=schema, options={**opts, **(options or {})}, streaming=streaming)


def _flow(src, sink, key=lambda r: r["user"]) -> Dataflow:
    """key_on (Spark keys on column 'user' with the default key), a running count per user, rows for the sink."""
    flow = Dataflow("mal")
    keyed = op.key_on("key", op.input("inp", flow, src), key)
    counts = op.stateful_map("count", keyed, lambda st, _r: ((st or 0) + 1,) * 2)
    op.output("out", op.map("row", counts, lambda kv: {"user": kv[0], "n": kv[1]}), sink)
    return flow


def _parquet_sink(path: str):
    from flowspark.spark.io.outputs import SparkSink

    return SparkSink("parquet", path, schema="user STRING, n LONG")


def _out(spark, path: str) -> list:
    return sorted((r.user, r.n) for r in spark.read.parquet(path).collect())


def _dead(spark, path: str) -> list:
    return sorted((r.step_id, r.error_type, r.error_message, r.item) for r in spark.read.parquet(path).collect())


def _check_error(err: FlowsparkRuntimeError, file: str, raw: str) -> None:
    assert err.step_id == "mal.inp"
    assert err.exc_type == "MalformedInput"
    assert err.exc_message == f"malformed input row in {file}: {raw}"
    text = str(err)
    assert text.startswith(f"error in step 'mal.inp': malformed input row in {file}: {raw}; ")
    assert "dead letter" in text
    assert "key function" not in text


# -------------------------------------------------------------------------------------------- batch
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_batch_malformed_row_stops_the_job_naming_the_input_step(spark, tmp_path, fmt):
    from flowspark.spark import run

    src = str(tmp_path / "in")
    file = _write(src, "p1", fmt, [("amy", 1), BAD[fmt], ("bob", 2)])
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(_flow(_source(fmt, src, False), _parquet_sink(str(tmp_path / "out"))), spark=spark)
    _check_error(info.value, file, BAD[fmt])


def test_batch_error_shows_the_first_200_characters_of_the_raw_text(spark, tmp_path):
    from flowspark.spark import run

    src = str(tmp_path / "in")
    raw = '{"user": "' + "x" * 300
    file = _write(src, "p1", "json", [("amy", 1), raw])
    out: list = []
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(_flow(_source("json", src, False), TestingSink(out)), spark=spark)
    _check_error(info.value, file, raw[:200])
    assert out == []


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_batch_malformed_rows_go_to_the_dead_letter_with_raw_text_and_file(spark, tmp_path, capsys, fmt):
    from flowspark.spark import run

    src, out, dl = (str(tmp_path / d) for d in ("in", "out", "dead"))
    f1 = _write(src, "p1", fmt, [("amy", 1), BAD[fmt], ("bob", 2), ("amy", 3)])
    f2 = _write(src, "p2", fmt, [BAD2[fmt], ("bob", 4)])
    run(_flow(_source(fmt, src, False), _parquet_sink(out)), spark=spark, dead_letter=DeadLetterDir(dl), explain=True)
    assert "    rule spark_keys: applied" in capsys.readouterr().out
    # eve's CSV row has user 'eve': had it reached key_on, eve would be counted.
    assert _out(spark, out) == [("amy", 1), ("amy", 2), ("bob", 1), ("bob", 2)]
    assert _dead(spark, dl) == sorted(
        [
            ("mal.inp", "MalformedInput", f"malformed input row in {f1}: {BAD[fmt]}", BAD[fmt]),
            ("mal.inp", "MalformedInput", f"malformed input row in {f2}: {BAD2[fmt]}", BAD2[fmt]),
        ]
    )
    assert {r.batch_id for r in spark.read.parquet(dl).collect()} == {0}


def test_batch_user_schema_with_a_corrupt_column_keeps_the_rows_as_items(spark, tmp_path):
    """A schema naming the corrupt-record column: the user routes malformed rows, as before."""
    from flowspark.spark import run

    src = str(tmp_path / "in")
    _write(src, "p1", "json", [("amy", 1), BAD["json"]])
    out: list = []
    flow = Dataflow("mal")
    rows = op.input("inp", flow, _source("json", src, False, schema=SCHEMA + ", _corrupt_record STRING"))
    op.output("out", rows, TestingSink(out))
    run(flow, spark=spark)
    assert sorted(out, key=str) == sorted(
        [
            {"user": "amy", "n": 1, "_corrupt_record": None},
            {"user": None, "n": None, "_corrupt_record": BAD["json"]},
        ],
        key=str,
    )


# -------------------------------------------------------------------------------------------- streams
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_stream_malformed_row_stops_the_query_naming_the_input_step(spark, tmp_path, fmt):
    from flowspark.spark import run

    src, out = str(tmp_path / "in"), str(tmp_path / "out")
    file = _write(src, "p1", fmt, [("amy", 1), BAD[fmt], ("bob", 2)])
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(
            _flow(_source(fmt, src, True), _parquet_sink(out)),
            spark=spark,
            checkpoint=str(tmp_path / "chk"),
            trigger="available_now",
            progress=False,
        )
    _check_error(info.value, file, BAD[fmt])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_stream_malformed_rows_go_to_the_dead_letter_exactly_once(spark, tmp_path, fmt):
    from flowspark.spark import run

    src, out, dl, chk = (str(tmp_path / d) for d in ("in", "out", "dead", "chk"))
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False}
    f1 = _write(src, "p1", fmt, [("amy", 1), BAD[fmt], ("bob", 2), ("amy", 3)])
    sr = run(_flow(_source(fmt, src, True), _parquet_sink(out)), dead_letter=DeadLetterDir(dl), **opts)
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    assert os.path.isdir(os.path.join(out, "_spark_metadata"))  # still Spark's exactly-once file sink
    first = [("amy", 1), ("amy", 2), ("bob", 1)]
    dead1 = [("mal.inp", "MalformedInput", f"malformed input row in {f1}: {BAD[fmt]}", BAD[fmt])]
    assert _out(spark, out) == first
    assert _dead(spark, dl) == dead1
    # The same checkpoint again, with one more file: only its rows are added.
    f2 = _write(src, "p2", fmt, [BAD2[fmt], ("bob", 4)])
    sr = run(_flow(_source(fmt, src, True), _parquet_sink(out)), dead_letter=DeadLetterDir(dl), **opts)
    assert _out(spark, out) == sorted([*first, ("bob", 2)])
    assert _dead(spark, dl) == sorted(
        [*dead1, ("mal.inp", "MalformedInput", f"malformed input row in {f2}: {BAD2[fmt]}", BAD2[fmt])]
    )


@pytest.mark.slow
def test_stream_dead_letter_at_the_driver_with_a_python_key_pass(spark, tmp_path):
    """A key Spark cannot take from a column (the source stage runs in Python), dead letter and sink at the driver."""
    from flowspark.spark import run

    src = str(tmp_path / "in")
    f1 = _write(src, "p1", "json", [("amy", 1), BAD["json"], ("bob", 2)])
    out: list = []
    dead: list = []
    sr = run(
        _flow(_source("json", src, True), TestingSink(out), key=lambda r: r["user"].upper()),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        dead_letter=TestingSink(dead),
        progress=False,
    )
    assert sr is not None
    assert str(sr.plan.decision("spark_keys", "stage 1")) == (
        "rule spark_keys: not applied (step 'mal.key.flat_map_batch' is neither proven to keep the items nor a "
        "key_on proven to read a column)"
    )
    assert sorted((r["user"], r["n"]) for r in out) == [("AMY", 1), ("BOB", 1)]
    assert [(d["step_id"], d["error_type"], d["error_message"], d["item"]) for d in dead] == [
        ("mal.inp", "MalformedInput", f"malformed input row in {f1}: {BAD['json']}", BAD["json"])
    ]
