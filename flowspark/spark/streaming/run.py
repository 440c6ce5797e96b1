"""`run_streaming`: check a run's arguments and checkpoint, start the query, wait for it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Callable, Optional

from flowspark._args import ttl_arg
from flowspark.deadletter import DeadLetterDir, dead_letter_arg
from flowspark.errors import (
    FlowsparkTypeError,
)
from flowspark.spark.rules.switches import rules_arg
from flowspark.spark.session import quiet_query_context
from flowspark.spark.streaming.checkpoint import (
    RATE_TICKS,
    check_flag,
    check_layout,
    check_meta,
    check_untimed,
    recorded_buckets,
)
from flowspark.spark.streaming.ckfs import check_reachable, is_local
from flowspark.spark.streaming.listen import Listener, make_listener, remove_listeners, wait_for_run
from flowspark.spark.streaming.lowering import (
    check_ticks,
    check_versions,
    compile_streaming,
    default_buckets,
    layouts_here,
    needs_timers,
)
from flowspark.spark.streaming.query import StreamingRun
from flowspark.spark.streaming.state import (
    LAYOUTS,
)
from flowspark.spark.versions import PYTHON_STREAM_SOURCE, lacks

__all__ = ["run_streaming"]


@quiet_query_context()
def run_streaming(
    flow: Any,
    *,
    spark: Any = None,
    checkpoint: Optional[str] = None,
    trigger: Optional[str] = None,
    buckets: Optional[int] = None,
    state_layout: Optional[str] = None,
    state_ttl: Optional[timedelta] = None,
    max_items: int = 100_000,
    clock: Optional[Callable[[], datetime]] = None,
    progress: Any = True,
    listener: Any = None,
    timeout: Optional[float] = None,
    explain: bool = False,
    dead_letter: Any = None,
    clear_outputs: bool = False,
    rules: Any = None,
) -> StreamingRun:
    """Run a dataflow with unbounded sources as a Structured Streaming query.

    Args:
        flow: The `Dataflow` (or its graph, or its compiled plan).
        spark: The SparkSession; default the active one or a new local one.
        checkpoint: Directory for the query's offsets and state (required). A second
            run with the same directory continues where the first stopped.
        trigger: `None`: run until stopped (Ctrl-C stops between micro-batches), one
            micro-batch every 500 ms at most; `"available_now"`: process what is
            there, fire due notifications, return; or an interval like `"5 seconds"`.
        buckets: Number of state buckets `B` (fixed for a checkpoint's lifetime); default
            the checkpoint's, and for a new one 64 in the bucket layout, 8 per shuffle
            partition (`spark.sql.shuffle.partitions`, at least 16) in the chunk and key layouts
            (`flowspark.spark.streaming.lowering.default_buckets`).
        state_layout: `"chunk"` (transformWithStateInPandas: a hot tier of recently
            touched keys per bucket, the other keys in `MapState` rows of many keys each: a
            micro-batch's cost follows the keys it touches, state filled at about half the
            bucket layout's rate or better), `"bucket"` (applyInPandasWithState, one state
            row per bucket: a micro-batch touching a bucket rewrites all its keys, fine while
            the state is small) or `"key"` (as `"chunk"`, one `MapState` row per cold key:
            slow to fill). Fixed for a checkpoint's lifetime; default the checkpoint's
            layout, `"chunk"` for a new one. See docs/streaming.md "State layouts".
        state_ttl: Drop a stateful step's state for a key when the key got no value at
            that step for this long (processing time: the micro-batch's, or `clock`),
            checked at each micro-batch before its values: no `on_eof`, its
            notifications go with it. See docs/concepts.md "State TTL".
        max_items: Most items read from one flowspark source partition per micro-batch.
        clock: Function returning "now" (aware UTC) in the workers (must be picklable);
            default Spark's processing time of each micro-batch.
        progress: `True` prints one line per micro-batch, a callable receives the
            line instead, `False` prints nothing.
        listener: A `pyspark.sql.streaming.StreamingQueryListener` to attach too.
        timeout: Stop after this many seconds (between micro-batches); default never
            (or, with `"available_now"`, when everything is processed).
        explain: Print the physical plan first: each stage, sink and what every rule
            decided for it (`flowspark.spark.rules.optimizer`).
        dead_letter: Where items a step cannot take go instead of stopping the query
            (`flowspark.deadletter`), each row with its micro-batch id. A `DeadLetterDir(path)`
            or a directory path (parquet) is written by the micro-batch's tasks, each file
            named by micro-batch, stage and partition, and a replayed micro-batch's files are
            replaced: exactly once with the checkpoint, and the query's outputs are written
            as without a dead letter. Any other sink (`TestingSink`, `SparkSink`,
            `ForeachBatchSink`) gets the rows at the driver in `foreachBatch`
            (at-least-once), and every output of the query then goes through
            `foreachBatch` too. See docs/streaming.md "Dead letter".
        clear_outputs: A file `SparkSink` whose directory holds another query's output
            (a `_spark_metadata` log with micro-batches this checkpoint never planned, e.g.
            a new checkpoint on an old output) is refused before any micro-batch runs, since
            Spark's file sink would skip those micro-batch ids and write nothing; `True`
            deletes that directory instead, and the query writes it anew.
        rules: Which fast paths may apply (`flowspark.spark.rules.switches.rules_arg`): `"all"`,
            `"none"` or `"-NAME,-NAME"`; default the environment variable `FLOWSPARK_RULES`,
            else all. A rule that changes the query's shape (`spark_keys`) stays what the
            checkpoint started with.

    A flow with several keyed stages, or the key layout, runs on transformWithStateInPandas,
    which needs RocksDB: the run then sets `spark.sql.streaming.stateStore.providerClass`
    to `RocksDBStateStoreProvider` on `spark` (your session's setting for later queries
    too); `explain` says so.

    Returns:
        The finished `StreamingRun` (its `query` holds Spark's progress reports).

    Raises:
        FlowsparkRuntimeError: A user callable failed in the query.
        FlowsparkCompileError: The flow cannot run as a streaming query.
        RecoveryError: The checkpoint belongs to another flow or bucket count, or a file
            sink's directory holds another query's output (see `clear_outputs`).
        FlowsparkTypeError: A bad argument.
    """
    if not isinstance(checkpoint, str) or not checkpoint:
        msg = (
            f"flowspark.spark.run: a flow with an unbounded source runs as a streaming query and needs "
            f"checkpoint=DIR (where offsets and state live); received {checkpoint!r}"
        )
        raise FlowsparkTypeError(msg)
    if trigger is not None and not isinstance(trigger, str):
        msg = f"flowspark.spark.run: trigger must be None, 'available_now' or like '5 seconds'; received {trigger!r}"
        raise FlowsparkTypeError(msg)
    state_ttl = ttl_arg("flowspark.spark.run", state_ttl)
    chosen = rules_arg(rules)
    if state_layout is not None and state_layout not in LAYOUTS:
        allowed = ", ".join(map(repr, LAYOUTS))
        msg = f"flowspark.spark.run: state_layout must be one of {allowed}; received {state_layout!r}"
        raise FlowsparkTypeError(msg)
    from flowspark.spark.session import ensure_workers, ship_user_modules, streaming_carry

    dead_sink = dead_letter_arg("flowspark.spark.run", dead_letter)
    if isinstance(dead_sink, DeadLetterDir) and not is_local(dead_sink.path):
        msg = (
            f"flowspark.spark.run: a stream's DeadLetterDir is written by Python in the tasks, which open local "
            f"paths only; received {dead_sink.path!r}; give a directory every node has mounted, or a "
            "SparkSink (Spark writes it, any file system) as dead_letter"
        )
        raise FlowsparkTypeError(msg)
    ship_user_modules()
    plan = compile_streaming(flow).with_dead_letter(dead_sink)
    steps = [ks.step_id for ks in plan.keyed_steps()]
    from flowspark.spark.io.classpath import session_conf
    from flowspark.spark.session import get_session

    def new_conf() -> dict[str, str]:
        return session_conf(plan)  # Kafka's or Delta's jars (and Delta's settings), when flowspark creates the session

    if spark is None and not is_local(checkpoint):
        spark = get_session(new_conf=new_conf)  # its Hadoop file systems open the checkpoint
    if spark is not None:
        check_reachable(spark, checkpoint)
    check_versions(plan, state_layout, checkpoint)  # before anything is written
    spark, buckets = _buckets(spark, checkpoint, buckets, state_layout, new_conf)
    timers = check_meta(checkpoint, plan.flow_id, buckets, steps, needs_timers(plan))
    layout = check_layout(checkpoint, state_layout, layouts_here(LAYOUTS))
    if state_layout is None:  # the recorded layout, not checked above
        check_versions(plan, layout, checkpoint)
    untimed = check_untimed(checkpoint, layout, timers, state_ttl is not None)
    rate_ticks = check_flag(checkpoint, RATE_TICKS, lacks(PYTHON_STREAM_SOURCE) is not None)
    check_ticks(plan, checkpoint, rate_ticks)  # a checkpoint not on this machine: not checked above
    if spark is None:
        spark = get_session(new_conf=new_conf)
    ensure_workers(spark)
    carry = streaming_carry(spark)
    show: Optional[Callable[[str], None]]
    if progress is True:
        show = print
    elif callable(progress):
        show = progress
    else:
        show = None
    sr = StreamingRun(
        plan,
        spark,
        {
            "checkpoint": checkpoint,
            "buckets": buckets,
            "clock": clock,
            "max_items": max_items,
            "timers": timers,
            "layout": layout,
            "untimed": untimed,
            "rate_ticks": rate_ticks,
            "state_ttl": state_ttl,
            "carry": carry,
            "clear_outputs": clear_outputs,
            "rules": chosen,
        },
    )
    physical = sr.optimize()
    if explain:
        print(physical.render(sr.lowering.stage))
    lst = Listener(sr, show)
    lean = physical.decision("lean_listener", "query").applied
    spark_listener = make_listener(spark, lst, f"flowspark_{plan.flow_id}", lean)
    if listener is not None:
        spark.streams.addListener(listener)
    query = None
    try:
        query = sr.start(trigger)
        lst.started()
        wait_for_run(sr, query, lst, trigger, timeout)
        lst.drain(query)
        if sr.connect:
            sr.deliver()  # the micro-batches committed since the last progress event
    finally:
        remove_listeners(spark, query, lst, spark_listener, listener)
        sr.close_sinks()
    return sr


def _buckets(
    spark: Any,
    checkpoint: str,
    buckets: Optional[int],
    layout: Optional[str],
    new_conf: Callable[[], dict[str, str]],
) -> tuple[Any, int]:
    """The run's bucket count: the one asked for, else the checkpoint's, else a new checkpoint's default.

    Returns:
        `(spark, buckets)`: `spark` is a new session when the default needed one (for its shuffle partitions).
    """
    if buckets is not None and (not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1):
        msg = f"flowspark.spark.run: buckets must be a positive int; received {buckets!r}"
        raise FlowsparkTypeError(msg)
    if buckets is None:
        buckets = recorded_buckets(checkpoint)
    if buckets is None:  # a new checkpoint
        if spark is None:
            from flowspark.spark.session import get_session

            spark = get_session(new_conf=new_conf)
        buckets = default_buckets(
            layout or layouts_here(LAYOUTS)[0], int(spark.conf.get("spark.sql.shuffle.partitions"))
        )
    return spark, buckets
