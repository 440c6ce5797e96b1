"""A query stopped by a Kafka broker that does not answer: one line naming the step and the broker (no Spark)."""

from __future__ import annotations

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError

pytest.importorskip("pyspark")

from flowspark.spark.io.kafka import KafkaSink, KafkaSource, broker_unreachable  # noqa: E402
from flowspark.spark.plan.compiler import as_graph, compile_flow  # noqa: E402

# What Spark's query exception carries: its own first line, Kafka's exception, Java frames.
ADMIN = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node assignment. Call: listNodes"
    " SQLSTATE: XXKST\n"
    "\tat org.apache.spark.sql.kafka010.KafkaOffsetReaderAdmin.withRetries(KafkaOffsetReaderAdmin.scala)\n"
)
PRODUCER = (
    "Job aborted due to stage failure: org.apache.kafka.common.errors.TimeoutException: Topic out not present in "
    "metadata after 60000 ms.\n\tat org.apache.spark.sql.kafka010.KafkaDataWriter.write(KafkaDataWriter.scala)\n"
)
CONSUMER = (
    "Job aborted: java.util.concurrent.TimeoutException: Cannot fetch record for offset 7 in 120000 milliseconds\n"
    "\tat org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer.fetch(KafkaDataConsumer.scala)\n"
)


def _plan():
    flow = Dataflow("clicks")
    records = op.input("inp", flow, KafkaSource("10.0.0.1:9092", "in"))
    rows = op.map("row", records, lambda r: {"key": None, "value": r["value"].decode()})
    op.output("out", rows, KafkaSink("10.0.0.2:9092", "out"))
    return compile_flow(as_graph(flow))


@pytest.mark.parametrize(
    ("text", "step", "end"),
    [
        (ADMIN, "clicks.inp", "KafkaSource('10.0.0.1:9092', 'in')"),
        (CONSUMER, "clicks.inp", "KafkaSource('10.0.0.1:9092', 'in')"),
        (PRODUCER, "clicks.out", "KafkaSink('10.0.0.2:9092', 'out')"),
    ],
)
def test_a_kafka_timeout_names_the_step_and_the_broker_in_one_line(text, step, end):
    err = broker_unreachable(_plan(), RuntimeError(text))
    assert isinstance(err, FlowsparkRuntimeError)
    assert err.step_id == step
    line = str(err)
    assert "\n" not in line
    servers = end.split("'")[1]
    assert line.startswith(f"step {step!r} ({end}): the Kafka broker at {servers} is unreachable (TimeoutException: ")
    assert "at org.apache" not in line
    assert "SQLSTATE" not in line
    assert line.endswith("run the flow again: it resumes from the checkpoint's last committed micro-batch")


def test_other_errors_and_flows_without_kafka_are_left_alone():
    assert broker_unreachable(_plan(), RuntimeError("java.io.FileNotFoundException: /x")) is None
    plain = Dataflow("plain")
    from flowspark.spark import SparkSink, SparkSource

    src = SparkSource("parquet", "/in", schema="v STRING", streaming=True)
    op.output("out", op.input("inp", plain, src), SparkSink("parquet", "/out"))
    assert broker_unreachable(compile_flow(as_graph(plain)), RuntimeError(ADMIN)) is None
