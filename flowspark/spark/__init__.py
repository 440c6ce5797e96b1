"""Run flowspark dataflows on Apache Spark.

`run(flow)` compiles the dataflow's graph (`compile_flow`, pure, printable) and
runs it on a SparkSession. With bounded sources the job is a Spark batch job and `run`
returns when it is done; when a source is unbounded the flow runs as a
Structured Streaming query with its state and offsets in `checkpoint`
(`flowspark.spark.streaming`). This package is the only place that imports pyspark.

Modules by concern: `plan` (the plan's types), `compiler` (graph -> plan),
`codec` (items, sequences, the task-error marker), `worker` (what runs inside
Python workers), `batch` and `streaming` (the two lowerings of a plan), `api`
(`run`), `pysource` (the Python data source), `inputs`/`outputs`/`kafka` (Spark
sources and sinks), `session` (sessions, shipping user modules), `tools`
(physical plans, progress, checkpoint state for the CLI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowspark._lazy import lazy_names

if TYPE_CHECKING:
    from flowspark.spark.api import run
    from flowspark.spark.compiler import compile_flow
    from flowspark.spark.inputs import SparkSource
    from flowspark.spark.outputs import ForeachBatchSink, SparkSink
    from flowspark.spark.plan import Plan

__all__ = ["ForeachBatchSink", "Plan", "SparkSink", "SparkSource", "compile_flow", "run"]

#: Where each name of `__all__` lives. Imported on first use: a Python worker that unpickles a
#: function of one submodule (e.g. `flowspark.spark.streaming.state`) does not import them all.
_HOMES = {
    "ForeachBatchSink": "flowspark.spark.outputs",
    "Plan": "flowspark.spark.plan",
    "SparkSink": "flowspark.spark.outputs",
    "SparkSource": "flowspark.spark.inputs",
    "compile_flow": "flowspark.spark.compiler",
    "run": "flowspark.spark.api",
}


__getattr__ = lazy_names(__name__, _HOMES, globals())
