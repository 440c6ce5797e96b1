"""Run flowspark dataflows on Apache Spark.

`run(flow)` compiles the dataflow (`compile_flow`, pure, printable) and runs it
on a SparkSession. With bounded sources the job is a Spark batch job and `run`
returns when it is done; when a source is unbounded the flow runs as a
Structured Streaming query with its state and offsets in `checkpoint`
(`flowspark.spark.streaming`). This package is the only place that imports pyspark.
"""

from flowspark.spark.compiler import Plan, compile_flow
from flowspark.spark.inputs import SparkSource
from flowspark.spark.outputs import SparkSink
from flowspark.spark.streaming import run

__all__ = ["Plan", "SparkSink", "SparkSource", "compile_flow", "run"]
