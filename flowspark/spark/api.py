"""`flowspark.spark.run`: a batch job when every source is bounded, else a streaming query."""

from __future__ import annotations

from typing import Any, Optional

from flowspark.errors import FlowsparkTypeError
from flowspark.spark.batch.job import run_plan
from flowspark.spark.plan.compiler import as_graph, compile_flow
from flowspark.spark.plan.types import Plan
from flowspark.spark.rules.lowerings import runs_as_batch
from flowspark.spark.rules.switches import rules_arg
from flowspark.spark.streaming.checkpoint import check_recorded
from flowspark.spark.streaming.ckfs import is_local
from flowspark.spark.streaming.lowering import check_versions, compile_streaming, layouts_here, needs_timers
from flowspark.spark.streaming.query import StreamingRun
from flowspark.spark.streaming.run import run_streaming
from flowspark.spark.streaming.state import LAYOUTS
from flowspark.spark.versions import check_supported

__all__ = ["check_streaming", "run"]


def run(
    flow: Any,
    *,
    spark: Any = None,
    checkpoint: Optional[str] = None,
    trigger: Optional[str] = None,
    **options: Any,
) -> Optional[StreamingRun]:
    """Run a dataflow on Spark: a batch job when every source ends, else a streaming query.

    A flow whose flowspark sources do not say they end (a user-written
    `FixedPartitionedSource`, `DynamicSource` or `SimplePollingSource` without
    `is_bounded()`) runs without a checkpoint as a batch job that reads every partition
    until it ends, as Bytewax runs it (the rule `drain_sources`); with a checkpoint it runs
    as a streaming query that resumes from the partitions' snapshots.

    Args:
        flow: The `Dataflow`.
        spark: The SparkSession; default the active one or a new local one.
        checkpoint: For unbounded flows: directory of the query's offsets and state
            (required for a Spark stream; with flowspark sources it makes the run a
            streaming query); ignored when every source ends.
        trigger: For unbounded flows: `None` (run until stopped), `"available_now"`
            or an interval like `"5 seconds"` (see `run_streaming`).
        **options: Options of `flowspark.spark.batch.job.run_plan` (bounded flows) or
            `run_streaming` (unbounded flows). Both take `progress`; only a stream prints
            progress lines (a batch job prints none, whatever its value).

    Returns:
        The `StreamingRun` of an unbounded flow; `None` for a batch run.

    Raises:
        FlowsparkTypeError: `checkpoint`/`trigger` given for a bounded flow, or a bad argument.
    """
    check_supported("flowspark.spark.run")
    plan = compile_flow(as_graph(flow))
    batch = runs_as_batch(plan, checkpoint, rules_arg(options.get("rules"))[0])
    _check_options(batch, options)
    if not batch:
        return run_streaming(plan, spark=spark, checkpoint=checkpoint, trigger=trigger, **options)
    if trigger is not None:
        msg = (
            f"flowspark.spark.run: trigger={trigger!r} applies to streaming queries; this flow runs as a batch "
            "job (every source ends, or none is a Spark stream and no checkpoint was given): drop `trigger`, or "
            "give a checkpoint to run it as a streaming query"
        )
        raise FlowsparkTypeError(msg)
    run_plan(plan, spark=spark, **options)
    return None


def check_streaming(
    flow: Any,
    checkpoint: str,
    buckets: Optional[int] = None,
    state_layout: Optional[str] = None,
    state_ttl: bool = False,
) -> Plan:
    """Make the checks of a streaming run that need no SparkSession, before one starts.

    Compiles the flow for a streaming query and compares the run's choices with a local
    checkpoint's `flowspark.json` without writing it (`run_streaming` records them when
    the query starts). A checkpoint on another file system is checked by `run_streaming`,
    through Spark's file systems.

    Args:
        flow: The `Dataflow`.
        checkpoint: The checkpoint directory.
        buckets: The bucket count asked for (`None`: the checkpoint's, or a new one's default).
        state_layout: The state layout asked for (`None`: the checkpoint's).
        state_ttl: Whether the run has a `state_ttl`.

    Returns:
        The compiled plan.

    Raises:
        FlowsparkCompileError: The flow cannot run as a streaming query.
        RecoveryError: The checkpoint belongs to another flow, bucket count or state layout,
            or to a query without timers while this flow needs them.
    """
    plan = compile_streaming(flow)
    check_versions(plan, state_layout, checkpoint)
    if is_local(checkpoint):
        steps = [ks.step_id for ks in plan.keyed_steps()]
        layouts = layouts_here(LAYOUTS)
        check_recorded(checkpoint, plan.flow_id, buckets, steps, needs_timers(plan), state_layout, layouts, state_ttl)
    return plan


def _check_options(batch: bool, options: dict[str, Any]) -> None:
    """Refuse an option the chosen runtime does not take, naming the option and the runtime."""
    import inspect

    fn = run_plan if batch else run_streaming
    known = set(inspect.signature(fn).parameters) - {"plan", "flow", "spark"}
    other = run_streaming if batch else run_plan
    for name in options:
        if name in known:
            continue
        runs = "a batch job" if batch else "a streaming query"
        if name in inspect.signature(other).parameters:
            why = f"it applies only to {'streaming queries' if batch else 'batch jobs'}"
        else:
            why = "flowspark.spark.run has no such option"
        msg = (
            f"flowspark.spark.run: option {name}={options[name]!r} does not apply here: this flow runs as "
            f"{runs}, and {why}; the options it takes: {', '.join(sorted(known))}"
        )
        raise FlowsparkTypeError(msg)
