"""`flowspark.spark.run`: a batch job when every source is bounded, else a streaming query."""

from __future__ import annotations

from typing import Any, Optional

from flowspark.errors import FlowsparkTypeError
from flowspark.spark.batch import run_plan
from flowspark.spark.compiler import as_graph, compile_flow
from flowspark.spark.streaming.query import StreamingRun, run_streaming

__all__ = ["run"]


def run(
    flow: Any,
    *,
    spark: Any = None,
    checkpoint: Optional[str] = None,
    trigger: Optional[str] = None,
    **options: Any,
) -> Optional[StreamingRun]:
    """Run a dataflow on Spark: a batch job when every source is bounded, else a streaming query.

    Args:
        flow: The `Dataflow`.
        spark: The SparkSession; default the active one or a new local one.
        checkpoint: For unbounded flows: directory of the query's offsets and state
            (required); ignored by batch runs.
        trigger: For unbounded flows: `None` (run until stopped), `"available_now"`
            or an interval like `"5 seconds"` (see `run_streaming`).
        **options: Options of `flowspark.spark.batch.run_plan` (bounded flows) or
            `run_streaming` (unbounded flows). Both take `progress`; only a stream prints
            progress lines (a batch job prints none, whatever its value).

    Returns:
        The `StreamingRun` of an unbounded flow; `None` for a batch run.

    Raises:
        FlowsparkTypeError: `checkpoint`/`trigger` given for a bounded flow, or a bad argument.
    """
    plan = compile_flow(as_graph(flow))
    if not plan.bounded:
        return run_streaming(flow, spark=spark, checkpoint=checkpoint, trigger=trigger, **options)
    if trigger is not None:
        msg = (
            f"flowspark.spark.run: trigger={trigger!r} applies to flows with an unbounded source; every "
            "source of this flow is bounded, so it runs as a batch job (drop `trigger`)"
        )
        raise FlowsparkTypeError(msg)
    run_plan(plan, spark=spark, **options)
    return None
