"""Kafka: the compiled plan and the missing-connector error (no broker, no jar on these machines)."""

from __future__ import annotations

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkCompileError, FlowsparkTypeError


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
