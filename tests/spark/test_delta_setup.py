"""Delta Lake without Spark: the formats, the plan, what a session flowspark creates takes, the one-line errors.

The flows themselves run in `tests/spark/test_delta_e2e.py` (pyspark 4.2.0: `python -m nox -s kafka`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkCompileError, FlowsparkTypeError
from flowspark.testing import TestingSink, TestingSource

pyspark = pytest.importorskip("pyspark")

from flowspark.spark.io import delta  # noqa: E402
from flowspark.spark.io.classpath import delta_steps, session_conf  # noqa: E402
from flowspark.spark.io.inputs import SparkSource  # noqa: E402
from flowspark.spark.io.outputs import SparkSink  # noqa: E402
from flowspark.spark.plan.compiler import compile_flow  # noqa: E402
from flowspark.spark.session import DEFAULT_CONF  # noqa: E402


def _copy_flow(stream: bool = False) -> Dataflow:
    flow = Dataflow("dcopy")
    src = SparkSource("delta", "/tables/events", streaming=stream)
    rows = op.map("upper", op.input("inp", flow, src), lambda r: {"user": r["user"].upper()})
    op.output("out", rows, SparkSink("delta", "/tables/users", schema="user STRING"))
    return flow


def _cache(tmp_path, monkeypatch, name: str, jars: list[str]):
    monkeypatch.setenv("FLOWSPARK_JARS_DIR", str(tmp_path / "jars"))
    d = tmp_path / "jars" / name
    d.mkdir(parents=True)
    for j in jars:
        (d / j).write_bytes(b"")
    (d / ".complete").write_text("x\n")
    return d


def test_delta_is_a_format_of_spark_source_and_spark_sink():
    assert SparkSource("delta", "/t").is_bounded()
    assert not SparkSource("delta", "/t", streaming=True).is_bounded()  # a Delta table's own schema: none needed
    sink = SparkSink("delta", "/t", mode="append", partition_by=["day"])
    assert (sink.format, sink.mode, sink.partition_by, sink.file_sink) == ("delta", "append", ["day"], False)
    assert SparkSink("parquet", "/t").file_sink
    with pytest.raises(FlowsparkTypeError) as info:
        SparkSource("delta", "/t", schema="a INT")
    assert str(info.value) == (
        "SparkSource('delta', '/t'): a Delta table carries its own schema; received schema='a INT'; "
        "leave schema out (select columns in a later step)"
    )


def test_delta_package_pairs_each_pyspark_line_with_a_delta_build():
    assert delta.delta_package("4.2.0") == "io.delta:delta-spark_4.2_2.13:4.4.0"
    assert delta.delta_package("4.1.4") == "io.delta:delta-spark_4.1_2.13:4.4.0"
    assert delta.delta_package("3.5.8") == "io.delta:delta-spark_2.12:3.3.2"
    assert delta.delta_package("4.3.0") is None


def test_delta_steps_inputs_sinks_and_a_delta_dead_letter():
    plan = compile_flow(_copy_flow().validate())
    assert delta_steps(plan) == ["dcopy.inp", "dcopy.out"]
    other = Dataflow("plain")
    op.output("out", op.input("inp", other, TestingSource([1])), TestingSink([]))
    assert delta_steps(compile_flow(other.validate())) == []
    dead = compile_flow(other.validate()).with_dead_letter(SparkSink("delta", "/dead"))
    assert delta_steps(dead) == ["plain.dead_letter"]


def test_a_session_for_a_delta_and_kafka_flow_takes_both_jar_sets_and_deltas_settings(tmp_path, monkeypatch):
    from flowspark.spark.io.kafka import KafkaSource

    d = _cache(tmp_path, monkeypatch, f"delta-{pyspark.__version__}", ["delta-spark.jar", "delta-storage.jar"])
    k = _cache(tmp_path, monkeypatch, f"kafka-{pyspark.__version__}", ["spark-sql-kafka.jar"])
    monkeypatch.setattr(delta, "delta_package", lambda: "io.delta:delta-spark_x:1")
    flow = Dataflow("k2d")
    recs = op.input("inp", flow, KafkaSource("b:9092", "t"))
    op.output("out", op.map("row", recs, lambda r: {"v": r["value"]}), SparkSink("delta", "/t", schema="v BINARY"))
    assert session_conf(compile_flow(flow.validate())) == {
        "spark.jars": f"{k / 'spark-sql-kafka.jar'},{d / 'delta-spark.jar'},{d / 'delta-storage.jar'}",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # a local session's cores, as its shuffle partitions (Delta's default: 50 partitions)
        "spark.databricks.delta.snapshotPartitions": DEFAULT_CONF["spark.sql.shuffle.partitions"],
    }
    plain = Dataflow("plain")
    op.output("out", op.input("inp", plain, TestingSource([1])), TestingSink([]))
    assert session_conf(compile_flow(plain.validate())) == {}


def test_a_delta_flow_without_the_cached_jars_names_the_step_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWSPARK_JARS_DIR", str(tmp_path / "none"))
    monkeypatch.setattr(delta, "delta_package", lambda: "io.delta:delta-spark_4.2_2.13:4.4.0")
    with pytest.raises(FlowsparkCompileError) as info:
        session_conf(compile_flow(_copy_flow().validate()))
    assert str(info.value) == (
        f"step 'dcopy.inp' uses Delta Lake, and its jars (io.delta:delta-spark_4.2_2.13:4.4.0) are not in "
        f"{delta.delta_dir()}; run `python scripts/fetch_jars.py delta` (from a flowspark checkout) once, or pass "
        "a session started with spark.jars.packages=io.delta:delta-spark_4.2_2.13:4.4.0 and Delta's two "
        "settings (flowspark.spark.io.delta.DELTA_CONF)"
    )


def test_a_delta_flow_on_a_pyspark_no_delta_is_built_for_names_the_pairing(monkeypatch):
    monkeypatch.setattr(delta, "delta_package", lambda: None)
    with pytest.raises(FlowsparkCompileError) as info:
        session_conf(compile_flow(_copy_flow().validate()))
    assert str(info.value) == (
        f"step 'dcopy.inp' uses Delta Lake, and no Delta Lake release is built for pyspark {pyspark.__version__} "
        "(the newest, io.delta:delta-spark_4.2_2.13:4.4.0, is for Spark 4.2); run Delta flows with pyspark 4.2 "
        "(then `python scripts/fetch_jars.py delta`), or pass a session whose classpath has a Delta Lake built "
        "for its Spark"
    )


def test_sparks_missing_delta_format_becomes_one_line_naming_the_step():
    spark_says = Exception(
        "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: delta. Make sure the provider name is correct "
        "and the package is properly registered and compatible with your Spark version. SQLSTATE: 42K02"
    )
    err = delta.missing_delta(spark_says, "f.out")
    assert err is not None
    assert "\n" not in str(err)
    assert str(err).startswith("step 'f.out' uses Delta Lake, and this session lacks it")
    assert delta.missing_delta(Exception("[PATH_NOT_FOUND] Path does not exist: /t"), "f.out") is None


def test_a_stream_writes_a_lone_delta_sink_with_deltas_own_streaming_writer():
    from flowspark.spark.streaming import compile_streaming
    from flowspark.spark.streaming.lowering import spark_writer_sink

    plan = compile_streaming(_copy_flow(stream=True))
    writer = spark_writer_sink(plan, False)
    assert writer is not None
    assert (writer.step_id, writer.sink.format) == ("dcopy.out", "delta")


def test_plan_spark_no_physical_of_a_delta_flow(tmp_path, capsys, monkeypatch):
    from flowspark.cli import main

    (tmp_path / "dflow.py").write_text(
        "import flowspark.operators as op\n"
        "from flowspark.dataflow import Dataflow\n"
        "from flowspark.spark import SparkSink, SparkSource\n"
        "flow = Dataflow('dflow')\n"
        "op.output('out', op.input('inp', flow, SparkSource('delta', '/t', streaming=True)),\n"
        "          SparkSink('delta', '/u', schema='user STRING'))\n"
    )
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "dflow.py", "--spark", "--no-physical"]) == 0
    out = capsys.readouterr().out
    assert "stage 0 [source]: spark.readStream of the SparkSource" in out
    assert "sink dflow.out: SparkSink (native) <- stage0.port0" in out
    assert "runs as a Structured Streaming query" in out


def test_flowspark_run_of_a_delta_flow_on_a_pyspark_without_delta_fails_in_one_line_before_a_session(tmp_path):
    """`flowspark run` of a Delta flow where no Delta release is built for the pyspark: one line, no JVM."""
    if delta.delta_package() is not None:
        pytest.skip("a Delta Lake release is built for this pyspark (the message is for lines without one)")
    script = tmp_path / "dflow.py"
    script.write_text(
        "import flowspark.operators as op\n"
        "from flowspark.dataflow import Dataflow\n"
        "from flowspark.spark import SparkSink, SparkSource\n"
        "flow = Dataflow('dflow')\n"
        f"op.output('out', op.input('inp', flow, SparkSource('parquet', {str(tmp_path)!r})),\n"
        f"          SparkSink('delta', {str(tmp_path / 't')!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "flowspark", "run", str(script), "--runtime", "spark"],
        capture_output=True,
        text=True,
        env={**os.environ, "FLOWSPARK_JARS_DIR": str(tmp_path / "none")},
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "step 'dflow.out' uses Delta Lake, and no Delta Lake release is built for pyspark" in lines[0]
    assert "run Delta flows with pyspark 4.2 (then `python scripts/fetch_jars.py delta`)" in lines[0]
    assert not (tmp_path / "t").exists()


def test_flowspark_plan_spark_opens_its_session_with_deltas_jars_and_settings(tmp_path, monkeypatch, capsys):
    """`plan --spark` (physical plans) asks the session it creates for what the flow needs, before it starts."""
    import flowspark.spark.session as session
    from flowspark.cli import main

    d = _cache(tmp_path, monkeypatch, delta.delta_dir().name, ["delta-spark.jar"])
    monkeypatch.setattr(delta, "delta_package", lambda: "io.delta:delta-spark_x:1")
    asked: list = []

    def no_session(master, conf=None, app_name="", remote=None, new_conf=None):
        asked.append(new_conf())
        msg = "no session in this test"
        raise RuntimeError(msg)

    monkeypatch.setattr(session, "open_session", no_session)
    (tmp_path / "dplan.py").write_text(
        "import flowspark.operators as op\n"
        "from flowspark.dataflow import Dataflow\n"
        "from flowspark.spark import SparkSink, SparkSource\n"
        "flow = Dataflow('dplan')\n"
        "op.output('out', op.input('inp', flow, SparkSource('delta', '/t')), SparkSink('parquet', '/u'))\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="no session in this test"):
        main(["plan", "dplan.py", "--spark"])
    snapshot = {"spark.databricks.delta.snapshotPartitions": DEFAULT_CONF["spark.sql.shuffle.partitions"]}
    assert asked == [{**delta.DELTA_CONF, **snapshot, "spark.jars": str(d / "delta-spark.jar")}]


def test_a_restart_keeps_the_dead_letters_of_a_micro_batch_deltas_sink_already_committed(tmp_path):
    """Delta's sink skips a replayed micro-batch its log holds (this query's `txn`): its dead rows stay.

    The checkpoint committed micro-batches 0-2; Delta's log holds micro-batch 3 of this query
    (the kill came between Delta's commit and the checkpoint's) and 9 of another query.
    """
    import json

    from flowspark.deadletter import DeadLetterDir
    from flowspark.spark.streaming.deadletter import clear_uncommitted, delta_sink_written

    chk, table, dead = tmp_path / "chk", tmp_path / "table", tmp_path / "dead"
    (chk / "query" / "commits").mkdir(parents=True)
    for n in range(3):
        (chk / "query" / "commits" / str(n)).write_text("v1\n{}\n")
    (chk / "query" / "metadata").write_text(json.dumps({"id": "q-1"}) + "\n")
    (table / "_delta_log").mkdir(parents=True)
    for version, txn in enumerate([{"appId": "q-1", "version": 2}, {"appId": "q-1", "version": 3}, None]):
        lines = [{"commitInfo": {}}, *([{"txn": {**txn, "lastUpdated": 1}}] if txn else [])]
        (table / "_delta_log" / f"{version:020d}.json").write_text("\n".join(map(json.dumps, lines)) + "\n")
    (table / "_delta_log" / f"{3:020d}.json").write_text(json.dumps({"txn": {"appId": "q-2", "version": 9}}) + "\n")
    for n in (2, 3, 4):
        (dead / f"batch_id={n}").mkdir(parents=True)
    written = delta_sink_written(str(table), str(chk))
    assert [n for n in range(11) if written(n)] == [0, 1, 2, 3]
    assert clear_uncommitted(DeadLetterDir(str(dead)), str(chk), written) == [4]
    assert sorted(os.listdir(dead)) == ["batch_id=2", "batch_id=3"]
    assert not delta_sink_written(str(tmp_path / "none"), str(chk))(0)


@pytest.mark.spark
def test_a_session_without_delta_gives_one_line_naming_the_step(spark, tmp_path):
    """The tests' session has no Delta: writing or reading `"delta"` stops in one line, no Java trace."""
    from flowspark.spark import run

    write = Dataflow("dwrite")
    op.output("out", op.input("inp", write, TestingSource([{"a": 1}])), SparkSink("delta", str(tmp_path / "t")))
    with pytest.raises(FlowsparkCompileError) as info:
        run(write, spark=spark)
    assert str(info.value).startswith("step 'dwrite.out' uses Delta Lake, and this session lacks it")
    read = Dataflow("dread")
    op.output("out", op.input("inp", read, SparkSource("delta", str(tmp_path))), TestingSink([]))
    with pytest.raises(FlowsparkCompileError) as info:
        run(read, spark=spark)
    assert str(info.value).startswith("step 'dread.inp' uses Delta Lake, and this session lacks it")
    assert "\n" not in str(info.value)
