"""Run flowspark dataflows on Apache Spark.

`run(flow)` compiles the dataflow's graph (`compile_flow`, pure, printable) and
runs it on a SparkSession. With bounded sources the job is a Spark batch job and `run`
returns when it is done; when a source is unbounded the flow runs as a
Structured Streaming query with its state and offsets in `checkpoint`
(`flowspark.spark.streaming`). This package is the only place that imports pyspark.

Folders by layer, each importing only the ones before it (`tests/unit/test_architecture.py`):
`session`/`compat`/`carrier` (sessions, pyspark's private APIs, shipping flowspark);
`plan.types` (the plan's types, pure data); `worker/` (what runs inside Python workers:
the stage function, ops, codec, rows); `io/` (Spark sources and sinks, Kafka, the Python
data source); `plan.compiler` (graph -> plan) and `rules/` (the optimizer: plan -> physical
plan); `batch/` and `streaming/` (the two lowerings); `api` (`run`) and `tools` (the CLI's
Spark side).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowspark._lazy import lazy_names

if TYPE_CHECKING:
    from flowspark.spark.api import run
    from flowspark.spark.io.inputs import SparkSource
    from flowspark.spark.io.kafka import KafkaSink, KafkaSource
    from flowspark.spark.io.outputs import ForeachBatchSink, SparkSink
    from flowspark.spark.plan.compiler import compile_flow
    from flowspark.spark.plan.types import Plan

__all__ = ["ForeachBatchSink", "KafkaSink", "KafkaSource", "Plan", "SparkSink", "SparkSource", "compile_flow", "run"]

#: Where each name of `__all__` lives. Imported on first use: a Python worker that unpickles a
#: function of one submodule (e.g. `flowspark.spark.streaming.state`) does not import them all.
_HOMES = {
    "ForeachBatchSink": "flowspark.spark.io.outputs",
    "KafkaSink": "flowspark.spark.io.kafka",
    "KafkaSource": "flowspark.spark.io.kafka",
    "Plan": "flowspark.spark.plan.types",
    "SparkSink": "flowspark.spark.io.outputs",
    "SparkSource": "flowspark.spark.io.inputs",
    "compile_flow": "flowspark.spark.plan.compiler",
    "run": "flowspark.spark.api",
}


__getattr__ = lazy_names(__name__, _HOMES, globals())
