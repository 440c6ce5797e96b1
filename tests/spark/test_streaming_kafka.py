"""Kafka: the compiled plan and the missing-connector error (no broker, no jar on these machines)."""

from __future__ import annotations

import os

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkCompileError, FlowsparkTypeError
from flowspark.spark.plan.compiler import compile_flow
from flowspark.testing import TestingSink, TestingSource


def _value_row(r):
    return {"key": None if r["key"] is None else r["key"].decode(), "value": r["value"].decode().upper()}


def _kafka_flow():
    from flowspark.spark.io.kafka import KafkaSink, KafkaSource

    flow = Dataflow("kafka_flow")
    recs = op.input("inp", flow, KafkaSource(["b1:9092", "b2:9092"], ["clicks", "views"], starting_offsets="latest"))
    op.output("out", op.map("upper", recs, _value_row), KafkaSink("b1:9092", "upper"))
    return flow


def test_kafka_compiles_to_spark_kafka_source_and_sink():
    from flowspark.spark.io.kafka import KAFKA_PACKAGE
    from flowspark.spark.streaming import compile_streaming

    flow = _kafka_flow()
    plan = compile_streaming(flow)
    assert not plan.bounded
    (stage,) = plan.stages
    assert stage.source.format == "kafka"
    assert stage.source.options == {
        "kafka.bootstrap.servers": "b1:9092,b2:9092",
        "subscribe": "clicks,views",
        "startingOffsets": "latest",
    }
    (sink,) = plan.sinks
    assert sink.where == "native"
    assert sink.sink.format == "kafka"
    assert sink.sink.options == {"kafka.bootstrap.servers": "b1:9092", "topic": "upper"}
    assert "KafkaSink (native)" in str(plan)
    assert KAFKA_PACKAGE == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0"


def test_kafka_bad_arguments():
    from flowspark.spark.io.kafka import KafkaSink, KafkaSource

    with pytest.raises(FlowsparkTypeError, match="KafkaSource topics must be a non-empty str"):
        KafkaSource("b:9092", [])
    with pytest.raises(FlowsparkTypeError, match="KafkaSink brokers"):
        KafkaSink(None, "t")


@pytest.mark.spark
def test_kafka_without_the_connector_names_the_package(spark, tmp_path):
    from flowspark.spark import run

    with pytest.raises(FlowsparkCompileError, match="spark-sql-kafka-0-10_2.13:4.3.0"):
        run(_kafka_flow(), spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)


def _jars_cache(tmp_path, monkeypatch, complete: bool):
    from flowspark.spark.io.kafka import connector_dir

    monkeypatch.setenv("FLOWSPARK_JARS_DIR", str(tmp_path / "jars"))
    d = connector_dir()
    assert d.parent == tmp_path / "jars"
    d.mkdir(parents=True)
    (d / "spark-sql-kafka.jar").write_bytes(b"")
    (d / "kafka-clients.jar").write_bytes(b"")
    if complete:
        (d / ".complete").write_text("x\n")
    return d


def test_a_session_flowspark_creates_for_a_kafka_flow_takes_the_cached_jars(tmp_path, monkeypatch):
    from flowspark.spark.io import kafka
    from flowspark.spark.streaming import compile_streaming

    d = _jars_cache(tmp_path, monkeypatch, complete=True)
    plan = compile_streaming(_kafka_flow())
    assert kafka.kafka_steps(plan) == ["kafka_flow.inp", "kafka_flow.out"]
    assert kafka.session_conf(plan) == {"spark.jars": f"{d / 'kafka-clients.jar'},{d / 'spark-sql-kafka.jar'}"}
    other = Dataflow("no_kafka")
    op.output("out", op.input("inp", other, TestingSource([1])), TestingSink([]))
    assert kafka.session_conf(compile_flow(other)) == {}


def test_a_kafka_flow_without_the_cached_connector_names_the_command(tmp_path, monkeypatch):
    from flowspark.spark.io import kafka
    from flowspark.spark.streaming import compile_streaming

    d = _jars_cache(tmp_path, monkeypatch, complete=False)  # a fetch that did not finish
    monkeypatch.setattr(kafka, "connector_published", lambda: True)
    with pytest.raises(FlowsparkCompileError) as info:
        kafka.session_conf(compile_streaming(_kafka_flow()))
    assert str(info.value) == (
        f"step 'kafka_flow.inp' uses Kafka, and Spark's Kafka connector ({kafka.KAFKA_PACKAGE}) is not in {d}; "
        f"run `python scripts/fetch_jars.py connector` (from a flowspark checkout) once, or pass a session "
        f"started with spark.jars.packages={kafka.KAFKA_PACKAGE}"
    )


def test_kafka_on_a_pyspark_without_a_published_connector_fails_in_one_line_before_a_session(tmp_path):
    """`flowspark run` of a Kafka flow on pyspark 4.3 (no connector on Maven): one line, no JVM started."""
    import subprocess
    import sys

    from flowspark.spark.io.kafka import connector_published

    if connector_published():
        pytest.skip("this pyspark has a published Kafka connector (the message is for lines without one)")
    script = tmp_path / "kflow.py"
    script.write_text(
        "import flowspark.operators as op\n"
        "from flowspark.dataflow import Dataflow\n"
        "from flowspark.spark.io.kafka import KafkaSink, KafkaSource\n"
        "flow = Dataflow('kflow')\n"
        "op.output('out', op.input('inp', flow, KafkaSource('127.0.0.1:9', 't')), KafkaSink('127.0.0.1:9', 'u'))\n"
    )
    env = {**os.environ, "FLOWSPARK_JARS_DIR": str(tmp_path / "none")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowspark",
            "run",
            str(script),
            "--runtime",
            "spark",
            "--checkpoint",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "step 'kflow.inp' uses Kafka, and Maven serves no Spark Kafka connector for pyspark" in lines[0]
    assert "run Kafka flows with pyspark 4.2 (then `python scripts/fetch_jars.py connector`)" in lines[0]
    assert not (tmp_path / "c").exists()
