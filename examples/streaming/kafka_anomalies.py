"""Anomaly detection on Kafka: sensor readings from a metrics topic, alerts to another topic.

Input: records of the topic `metrics` whose value is JSON `{"sensor", "value"}`. Each
sensor keeps its last 20 values (`examples/streaming/anomalies.py`'s detector, state in the
query's checkpoint); a reading whose z-score against them is above 3 becomes an alert record
on the topic `alerts`: key the sensor, value JSON `{"sensor", "value", "z"}`. A value that
is not such JSON goes to the dead letter directory with its topic, partition and offset,
and the stream goes on.

Run it against a broker (the first run reads the topic from its start; each later run on
the same checkpoint goes on from where the last one stopped):

    python scripts/fetch_jars.py connector    # once: Spark's Kafka connector for flowspark's sessions
    python examples/streaming/kafka_anomalies.py localhost:9092 /tmp/kafka-anomalies

On a cluster, `flowspark submit examples/streaming/kafka_anomalies.py ...` adds Spark's
connector with `--packages`. What a consumer of `alerts` sees: Spark's Kafka sink is
at-least-once, so a run restarted after a crash may write the alerts of the micro-batch it
replays a second time; consumers deduplicate on (sensor, value, z) if they must.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream
from flowspark.testing import TestingSink, TestingSource

sys.path.insert(0, str(Path(__file__).parent))
from anomalies import pipeline  # noqa: E402

METRICS = "metrics"
ALERTS = "alerts"


def reading(record: dict[str, Any]) -> dict[str, Any]:
    """A Kafka record of the metrics topic -> the reading `{"sensor", "value"}` of its JSON value."""
    event = json.loads(record["value"])
    return {"sensor": str(event["sensor"]), "value": float(event["value"])}


def alert_record(row: dict[str, Any]) -> dict[str, Any]:
    """An anomaly row -> the alert's Kafka record (key: the sensor)."""
    return {"key": row["sensor"], "value": json.dumps(row, sort_keys=True)}


def alerts(records: Stream[dict[str, Any]]) -> Stream[dict[str, Any]]:
    """Kafka records of readings -> Kafka records of alerts."""
    return op.map("alert_record", pipeline(op.map("reading", records, reading)), alert_record)


def streaming(brokers: str, metrics: str = METRICS, alerts_topic: str = ALERTS) -> Dataflow:
    """The flow on Spark streaming: the metrics topic in, the alerts topic out."""
    from flowspark.spark.io.kafka import KafkaSink, KafkaSource

    flow = Dataflow("kafka_anomalies")
    records = op.input("metrics", flow, KafkaSource(brokers, metrics, starting_offsets="earliest"))
    op.output("alerts", alerts(records), KafkaSink(brokers, alerts_topic))
    return flow


def local(records: list[Any], out: list[Any]) -> Dataflow:
    """The same flow in memory, over record dicts as the Kafka source gives them."""
    flow = Dataflow("kafka_anomalies")
    op.output("alerts", alerts(op.input("metrics", flow, TestingSource(records))), TestingSink(out))
    return flow


def run(flow: Dataflow, work: Path, spark: Any = None, progress: Any = True) -> None:
    """Process what the metrics topic holds now, then stop (`available_now`); bad values to `work/dead`."""
    from flowspark.deadletter import DeadLetterDir
    from flowspark.spark import run as spark_run

    spark_run(
        flow,
        spark=spark,
        checkpoint=str(work / "chk"),
        trigger="available_now",
        dead_letter=DeadLetterDir(str(work / "dead")),
        progress=progress,
    )


def main(argv: list[str]) -> None:
    """`kafka_anomalies.py BROKERS WORK_DIR [METRICS_TOPIC ALERTS_TOPIC]`."""
    if len(argv) not in (2, 4):
        sys.exit("usage: kafka_anomalies.py BROKERS WORK_DIR [METRICS_TOPIC ALERTS_TOPIC]")
    brokers, work = argv[0], Path(argv[1])
    run(streaming(brokers, *argv[2:4]), work)


if __name__ == "__main__":
    main(sys.argv[1:])
