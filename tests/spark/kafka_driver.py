"""A driver program for the Kafka kill -9 test: a keyed running count, Kafka -> Kafka, from a checkpoint.

Usage: python kafka_driver.py BOOTSTRAP SOURCE_TOPIC SINK_TOPIC CHECKPOINT

flowspark creates the session (with the cached Kafka connector in `spark.jars`); the query
reads at most 50 records per micro-batch and runs `available_now`.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow


def _count(total, _event):
    total = (total or 0) + 1
    return total, total


def build(
    bootstrap: str, src: str, dst: str, options: Optional[dict[str, str]] = None, flow_id: str = "kafka_kill"
) -> Dataflow:
    """The flow `flow_id`; `options` go to the `KafkaSource` (over `maxOffsetsPerTrigger` 50)."""
    from flowspark.spark.io.kafka import KafkaSink, KafkaSource

    flow = Dataflow(flow_id)
    opts = {"maxOffsetsPerTrigger": "50", **(options or {})}
    records = op.input("inp", flow, KafkaSource(bootstrap, src, options=opts))
    counts = op.stateful_map("count", op.map("key", records, lambda r: (r["key"].decode(), r["offset"])), _count)
    op.output(
        "out",
        op.map("record", counts, lambda kv: {"key": kv[0], "value": json.dumps(kv[1])}),
        KafkaSink(bootstrap, dst),
    )
    return flow


def main() -> None:
    bootstrap, src, dst, chk = sys.argv[1:5]
    from flowspark.spark import run

    run(build(bootstrap, src, dst), checkpoint=chk, trigger="available_now", progress=False)


if __name__ == "__main__":
    main()
