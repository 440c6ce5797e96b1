"""Run a dataflow as one Structured Streaming query (some source is unbounded).

The plan is the compiler's (`flowspark.spark.plan.compiler.compile_flow`), lowered to
streaming operations (`query.Lowering` describes them stage by stage):

- source stages read a stream: `SparkSource(..., streaming=True)` through
  `spark.readStream`, and flowspark `FixedPartitionedSource`s through the Python
  data source of `flowspark.spark.io.pysource` (real offsets: the partitions'
  snapshots), which runs the source stage inside its read;
- a keyed stage becomes `groupBy(bucket).applyInPandasWithState(...)` with
  `bucket = pmod(hash(key), B)`: one Python call per bucket and micro-batch
  (`state.BucketDriver`). `notify_at` becomes the bucket's processing-time
  timeout, so Spark calls idle buckets when a key is due. A flow whose stateful
  steps cannot notify (the IR's `StatefulBatch.notifies`) runs without timers;
- sinks: a lone `SparkSink` with a schema is Spark's file sink or `toTable`
  (exactly-once with the checkpoint); a lone `ForeachBatchSink`, or a lone
  `SparkSink` without a schema (inferred from the first rows and pinned in the
  checkpoint), gets each micro-batch's rows as a DataFrame in `foreachBatch`; any
  other sink, and `inspect`, go through `foreachBatch` at the driver. Both
  `foreachBatch` paths are at-least-once: a micro-batch that was running when the
  driver died is written again after the restart.

`B` (`buckets`) is fixed for a checkpoint's lifetime (`checkpoint.check_meta`).
Windowing keeps its own clock and watermark inside each key's logic, so nothing
here uses Spark's `window()` or watermarks. Spark rejects a second
`applyInPandasWithState` in one query, so a flow with several keyed stages lowers
every keyed stage to `transformWithStateInPandas` (RocksDB state store) with the
same bucket driver. See docs/streaming.md.

Modules: `lowering` (the choices for a plan, described stage by stage), `query`
(`StreamingRun`: building the query's DataFrames, its outputs and driver sinks), `frames`
(DataFrame-building helpers), `listen` (the listener, progress line, wait and stop), `run`
(`run_streaming`), `state` (bucket state, inside Python workers), `checkpoint` (the
checkpoint's metadata), `ckfs`, `deadletter`, `outbox`, `routing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowspark._lazy import lazy_names

if TYPE_CHECKING:
    from flowspark.spark.streaming.checkpoint import META_FILE, check_meta
    from flowspark.spark.streaming.lowering import Lowering, compile_streaming, needs_timers
    from flowspark.spark.streaming.query import StreamingRun
    from flowspark.spark.streaming.run import run_streaming
    from flowspark.spark.streaming.state import BucketDriver

__all__ = [
    "META_FILE",
    "BucketDriver",
    "Lowering",
    "StreamingRun",
    "check_meta",
    "compile_streaming",
    "needs_timers",
    "run_streaming",
]

#: Where each name of `__all__` lives, imported on first use (see `flowspark.spark`'s `_HOMES`).
_HOMES = {
    "META_FILE": "flowspark.spark.streaming.checkpoint",
    "BucketDriver": "flowspark.spark.streaming.state",
    "Lowering": "flowspark.spark.streaming.lowering",
    "StreamingRun": "flowspark.spark.streaming.query",
    "check_meta": "flowspark.spark.streaming.checkpoint",
    "compile_streaming": "flowspark.spark.streaming.lowering",
    "needs_timers": "flowspark.spark.streaming.lowering",
    "run_streaming": "flowspark.spark.streaming.run",
}


__getattr__ = lazy_names(__name__, _HOMES, globals())
