"""The streaming lowering's choices for a plan: what each stage becomes, described stage by stage.

`Lowering` is what `flowspark plan --spark` prints and what `StreamingRun.build` follows;
`compile_streaming` checks that a plan can run as a streaming query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from flowspark.deadletter import DeadLetterDir
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.outputs import SparkSink
from flowspark.spark.plan.compiler import as_graph, compile_flow
from flowspark.spark.plan.types import Plan, SinkPlan, StagePlan
from flowspark.spark.rules.optimizer import Env
from flowspark.spark.streaming.checkpoint import RATE_TICKS, recorded_flag
from flowspark.spark.streaming.chunklayout import CHUNK_KEYS
from flowspark.spark.streaming.ckfs import is_local
from flowspark.spark.streaming.keylayout import HOT_PER_BUCKET
from flowspark.spark.streaming.routing import (
    needs_routing,
)
from flowspark.spark.versions import PYTHON_STREAM_SOURCE, TRANSFORM_WITH_STATE, lacks, newer, require

__all__ = [
    "BUCKETS_PER_PARTITION",
    "BUCKET_LAYOUT_BUCKETS",
    "Lowering",
    "check_ticks",
    "check_versions",
    "compile_streaming",
    "default_buckets",
    "layout_note",
    "layouts_here",
    "lone_native_sink",
    "needs_timers",
    "offline_env",
    "spark_writer_sink",
]

#: A new checkpoint's bucket count in the bucket layout (one state row per bucket).
BUCKET_LAYOUT_BUCKETS = 64
#: A new checkpoint's buckets per shuffle partition in the chunk and key layouts.
BUCKETS_PER_PARTITION = 8


def default_buckets(layout: str, partitions: int) -> int:
    """The bucket count of a new checkpoint that was given none.

    The bucket layout keeps `BUCKET_LAYOUT_BUCKETS` (a touched bucket rewrites all its keys:
    smaller buckets cost less as the state grows). The chunk and key layouts
    (`transformWithStateInPandas`) pay per bucket and micro-batch, whatever its size: a call
    of the processor with its own pandas frame, a read and a write of the bucket's row through
    Spark's state server (about 1 ms each, measured); their state grows in per-key or chunk
    rows, not in the bucket's row. They get `BUCKETS_PER_PARTITION` buckets per Spark
    partition of the stateful operator (`spark.sql.shuffle.partitions` when the checkpoint
    starts, which Spark also fixes for the checkpoint), at least 16: every task still runs
    several buckets, and a cluster with more partitions gets more buckets.

    Args:
        layout: The state layout (`flowspark.spark.streaming.state.LAYOUTS`).
        partitions: The session's `spark.sql.shuffle.partitions`.

    Returns:
        The bucket count.
    """
    if layout == "bucket":
        return BUCKET_LAYOUT_BUCKETS
    return max(16, BUCKETS_PER_PARTITION * partitions)


def compile_streaming(flow: Any) -> Plan:
    """Compile a dataflow (or its graph) for a streaming query, or check a compiled plan.

    Args:
        flow: The `Dataflow`, its `ir.Graph`, or a compiled `Plan`.

    Returns:
        The plan (the batch job's plan: the streaming query is another lowering of it).

    Raises:
        FlowsparkCompileError: The flow cannot run as a streaming query (what the
            compiler refuses).
    """
    return flow if isinstance(flow, Plan) else compile_flow(as_graph(flow))


def needs_timers(plan: Plan) -> bool:
    """Whether some stateful step can ask for a notification (the IR's `notifies`).

    Args:
        plan: The plan.

    Returns:
        True when the query needs timeouts.
    """
    return any(ks.notifies for ks in plan.keyed_steps())


def lone_native_sink(plan: Plan, connect: bool) -> Optional[SinkPlan]:
    """The query's only output when it is a Spark-native sink (and nothing is inspected, no dead letter).

    Args:
        plan: The plan (with its dead letter).
        connect: The session is a Spark Connect session.

    Returns:
        The sink, or `None`.
    """
    sinks = plan.sinks
    if plan.dead_letter is not None and not isinstance(plan.dead_letter, DeadLetterDir):
        return None  # the dead letter is an output too: every output goes through foreachBatch
    if connect and spark_writer_sink(plan, False) is None:
        return None  # its `foreachBatch` would run on the server: the sink gets its rows here (outbox)
    if len(sinks) == 1 and sinks[0].where == "native" and not plan.inspects:
        return sinks[0]
    return None


def spark_writer_sink(plan: Plan, connect: bool) -> Optional[SinkPlan]:
    """The lone native sink when Spark's own streaming writer takes its rows: a `SparkSink` with a schema.

    Spark's file sink (and `toTable`) needs the rows' schema when the query starts.

    Args:
        plan: The plan (with its dead letter).
        connect: The session is a Spark Connect session.

    Returns:
        The sink, or `None`.
    """
    lone = lone_native_sink(plan, connect)
    if lone is not None and isinstance(lone.sink, SparkSink) and lone.sink.schema is not None:
        return lone
    return None


def offline_env(plan: Plan, rules: tuple[frozenset[str], str]) -> Env:
    """What the optimizer knows of a streaming query without a session (`flowspark plan --no-physical`).

    Args:
        plan: The plan.
        rules: The rules switched on (`rules_arg`).

    Returns:
        The environment: no source's columns, no sink's columns.
    """
    writer = spark_writer_sink(plan, False)
    return Env(
        "streaming",
        rules=rules[0],
        rules_text=rules[1],
        session=False,
        timers=needs_timers(plan),
        routed=needs_routing(plan),
        writer_sink=None if writer is None else writer.step_id,
    )


def several_keyed_stages(plan: Plan) -> bool:
    """Whether the plan has more than one keyed stage (a chain: transformWithStateInPandas, Spark 4.0+).

    Args:
        plan: The plan.

    Returns:
        `True` for two keyed stages or more.
    """
    return sum(1 for st in plan.stages if st.kind == "keyed") > 1


def layouts_here(layouts: tuple[str, ...]) -> tuple[str, ...]:
    """The state layouts in the order a new checkpoint picks from, on the installed pyspark.

    `layouts` puts the default first (`"chunk"`); a pyspark without transformWithStateInPandas
    (Spark 3.5) puts `"bucket"` first, the layout it can run (`layout_note` says why).

    Args:
        layouts: The known layouts, the default first.

    Returns:
        The same layouts, the one a new checkpoint takes first.
    """
    if lacks(TRANSFORM_WITH_STATE) is None:
        return layouts
    return ("bucket", *(name for name in layouts if name != "bucket"))


def layout_note(layout: str, default: str) -> Optional[str]:
    """Why a new checkpoint takes `layout` rather than the `default` layout, or `None` when it does not.

    Args:
        layout: The layout a new checkpoint takes on the installed pyspark.
        default: The default layout on a pyspark that has every feature.

    Returns:
        A sentence, or `None`.
    """
    why = lacks(TRANSFORM_WITH_STATE)
    if layout == default or why is None:
        return None
    return f"state layout {layout!r}, not the default {default!r}: {why}"


def check_versions(plan: Plan, layout: Optional[str], checkpoint: str) -> None:
    """Refuse, before any query starts, what the installed pyspark cannot run (`flowspark.spark.versions`).

    Args:
        plan: The streaming plan.
        layout: The state layout asked for or recorded (`None`: not chosen yet).
        checkpoint: The checkpoint directory (named in the message).

    Raises:
        FlowsparkCompileError: Naming the step or the option, the missing API and the fix.
    """
    for st in plan.stages:
        if st.kind == "source" and not isinstance(st.source, SparkSource):
            require(
                PYTHON_STREAM_SOURCE,
                f"step {st.spec.source_step!r} reads a {type(st.source).__name__} in a streaming query",
                f"read the stream with a SparkSource (files, Kafka, a table), or install {newer(PYTHON_STREAM_SOURCE)}",
            )
    if lacks(PYTHON_STREAM_SOURCE) is not None and is_local(checkpoint):
        check_ticks(plan, checkpoint, recorded_flag(checkpoint, RATE_TICKS))
    if layout not in (None, "bucket"):
        require(
            TRANSFORM_WITH_STATE,
            f"the {layout!r} state layout of checkpoint {checkpoint!r}",
            f"start a new checkpoint with state_layout='bucket', or install {newer(TRANSFORM_WITH_STATE)}",
        )
    if several_keyed_stages(plan):
        keyed = ", ".join(repr(ks.step_id) for ks in plan.keyed_steps())
        require(
            TRANSFORM_WITH_STATE,
            f"stateful steps {keyed} run in one query as several keyed stages",
            f"run them as separate flows, or install {newer(TRANSFORM_WITH_STATE)}",
        )


def check_ticks(plan: Plan, checkpoint: str, rate_ticks: Optional[bool]) -> None:
    """Refuse timers a checkpoint fires with the Python tick source where Python streaming sources lack its API.

    A new checkpoint on such a pyspark takes Spark's `rate-micro-batch` source for its ticks
    (`checkpoint.RATE_TICKS`); one started with the tick source keeps it (a query's sources
    are part of its checkpoint).

    Args:
        plan: The streaming plan.
        checkpoint: The checkpoint directory (named in the message).
        rate_ticks: The checkpoint's recorded choice (`None`: not made yet).

    Raises:
        FlowsparkCompileError: Naming the checkpoint, the steps, the missing API and the fix.
    """
    if rate_ticks is False and needs_timers(plan):
        require(
            PYTHON_STREAM_SOURCE,
            f"checkpoint {checkpoint!r} fires the timers of stateful steps "
            f"{', '.join(repr(ks.step_id) for ks in plan.keyed_steps())} with a stream of ticks from a Python data "
            "source (it was started on a newer pyspark)",
            f"install {newer(PYTHON_STREAM_SOURCE)}, or start a new checkpoint",
        )


@dataclass(frozen=True)
class Lowering:
    """The choices of the streaming lowering for a plan, and their description.

    Attributes:
        plan: The plan.
        buckets: State buckets of every keyed stage.
        timers: Whether the query runs with timers (processing-time timeouts).
        layout: The state layout (`flowspark.spark.streaming.state.LAYOUTS`).
        untimed: Whether a key or chunk layout query runs in time mode "None", its rows
            without a TTL (no timers, no `state_ttl`: `checkpoint.check_untimed`).
    """

    plan: Plan
    buckets: int
    timers: bool
    layout: str
    untimed: bool = False

    @property
    def chained(self) -> bool:
        """Whether the plan has several keyed stages.

        Spark allows one applyInPandasWithState per query, so then every keyed stage uses
        transformWithStateInPandas (RocksDB state store).
        """
        return several_keyed_stages(self.plan)

    @property
    def routed(self) -> bool:
        """Whether some stage has several readers.

        The query then threads one chain of rows through every stage
        (`flowspark.spark.streaming.routing`).
        """
        return needs_routing(self.plan)

    @property
    def tws(self) -> bool:
        """Whether keyed stages use transformWithStateInPandas (chains, or the key or chunk layout)."""
        return self.chained or self.layout != "bucket"

    @property
    def time_mode(self) -> str:
        """The time mode of transformWithStateInPandas.

        Processing time with timers, or for a key or chunk layout's rows with a TTL
        (`state_ttl`, or a checkpoint begun so); else "None".
        """
        timed = self.timers or (self.layout != "bucket" and not self.untimed)
        return "ProcessingTime" if timed else "None"

    def keyed_op(self) -> str:
        """The Spark operator every keyed stage lowers to, with its timeout mode.

        Returns:
            The text.
        """
        if self.tws:
            # It needs the RocksDB state store: the run sets it on the session (said here, and in run_streaming).
            return (
                f"transformWithStateInPandas(timeMode={self.time_mode}"
                f"{' (ProcessingTime with a state_ttl)' if self.untimed else ''}; the run sets the session's "
                "spark.sql.streaming.stateStore.providerClass to RocksDBStateStoreProvider)"
            )
        return f"applyInPandasWithState({'ProcessingTimeTimeout' if self.timers else 'NoTimeout'})"

    def stage(self, st: StagePlan) -> str:
        """What one stage lowers to.

        Args:
            st: The stage.

        Returns:
            A one-line description.
        """
        if "keyed_by_spark" in st.spec.modes:
            return "no DataFrame of its own: the keyed stage reading it runs its steps (rule spark_keys)"
        if st.kind == "source":
            if isinstance(st.source, SparkSource):
                head = "spark.readStream of the SparkSource -> mapInArrow"
            else:
                head = (
                    "readStream.format('flowspark_source') (offsets: the partitions' snapshots; stage runs in the read)"
                )
            return f"{head} -> joins the routed chain" if self.routed else head
        tick = " + tick stream" if self.timers else ""
        if self.routed:
            if st.kind == "keyed":
                return (
                    f"(routed chain{tick}) -> groupBy(pmod(hash(k), {self.buckets}) for {st.union()}, "
                    f"else the forward group {self.buckets}).{self.keyed_op()}"
                )
            return f"(routed chain) -> mapInArrow over {st.union()}, forwarding the rest"
        if st.kind == "keyed":
            ck = st.spec.column_key
            if ck is not None:
                numbered = (
                    f"numbered by the file and row index Spark reads{tick}"
                    if "file_order" in st.spec.modes
                    else f"numbered by an Arrow pass{tick}"
                )
                return (
                    f"(stage{ck.source_stage}'s rows, {numbered}) -> groupBy(pmod(hash({ck.column}), "
                    f"{self.buckets})).{self.keyed_op()}, running stage {ck.source_stage}'s steps on row dicts"
                )
            return f"({st.union()}{tick}) -> groupBy(pmod(hash(k), {self.buckets})).{self.keyed_op()}"
        return f"({st.union()}) -> mapInArrow"

    def state(self, st: StagePlan) -> str:
        """How a keyed stage keeps its state.

        Args:
            st: A keyed stage.

        Returns:
            The text.
        """
        steps = [ks.step_id for ks in st.spec.chain]
        which = steps[0] if len(steps) == 1 else "step i of " + ", ".join(steps)
        timeout = "; the bucket's timeout is its earliest notify_at" if self.timers else "; no timers"
        if self.layout == "chunk":
            return (
                f"layout 'chunk': entries (snapshots, notify_at, run), snapshots[i] = None or (snapshot of {which},); "
                f"a bucket's row holds its last {HOT_PER_BUCKET} touched keys' entries and which keys wait for a "
                f"notification, the other keys sit in MapState chunks (crc32(key) % chunks, the count doubling past "
                f"{CHUNK_KEYS} keys per chunk) read when one of their keys is touched and rewritten when one leaves "
                f"the hot tier changed (a touched key's copy stays in its chunk){timeout}; "
                "the bucket count is fixed for a checkpoint"
            )
        if self.layout == "key":
            return (
                f"layout 'key': entries (snapshots, notify_at, run), snapshots[i] = None or (snapshot of {which},); "
                f"a bucket's row holds its last {HOT_PER_BUCKET} touched keys' entries and which keys wait for "
                f"a notification, a MapState row per other key is read only when the key is touched{timeout}; "
                "the bucket count is fixed for a checkpoint"
            )
        return (
            f"layout 'bucket': one row per bucket: pickle of {{key: (snapshots, notify_at, run)}}, "
            f"snapshots[i] = None or (snapshot of {which},){timeout}; the bucket count is fixed for a checkpoint"
        )
