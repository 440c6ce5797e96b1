"""The streaming lowering: run a compiled plan as one Structured Streaming query.

See the package docstring for the shape of the query; `Lowering` describes it
stage by stage (what `flowspark plan --spark` prints) and `StreamingRun.build`
follows the same choices.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark._args import ttl_arg
from flowspark.deadletter import DeadLetterDir, dead_letter_arg, record
from flowspark.errors import (
    FlowsparkCompileError,
    FlowsparkError,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    step_error,
)
from flowspark.inputs import DynamicSource
from flowspark.outputs import route_to_parts
from flowspark.spark.batch import seq_column
from flowspark.spark.codec import decode_task_error, encode_task_error, loads, loads_all
from flowspark.spark.compiler import as_graph, compile_flow
from flowspark.spark.inputs import SparkSource, load_rows
from flowspark.spark.outputs import SparkSink, infer_schema, write_rows
from flowspark.spark.plan import DEAD_PORT, Plan, SinkPlan, StagePlan, StageSpec
from flowspark.spark.rows import RowSchema, row_schema
from flowspark.spark.session import default_parallelism, is_connect, quiet_query_context
from flowspark.spark.streaming.checkpoint import (
    check_flag,
    check_layout,
    check_meta,
    check_sink_log,
    load_counts,
    pin_schema,
    pinned_schemas,
    save_counts,
)
from flowspark.spark.streaming.ckfs import check_reachable, is_local
from flowspark.spark.streaming.deadletter import (
    MalformedRows,
    clear_uncommitted,
    file_sink_written,
    keep_in_dir,
    keep_in_driver,
    split_dead,
    task_batch_id,
    write_task_rows,
)
from flowspark.spark.streaming.outbox import Outbox
from flowspark.spark.streaming.routing import (
    ROUTE,
    TICK_ROUTE,
    Route,
    needs_routing,
    routed_stage_function,
    routes,
)
from flowspark.spark.streaming.state import (
    FILE_COLUMN,
    HOT_PER_BUCKET,
    ID_COLUMN,
    LAYOUTS,
    ROW_COLUMN,
    STATE_SCHEMA,
    BucketDriver,
    LatestCounts,
)
from flowspark.spark.worker import dict_rows, not_dict_error, run_stage_rows, stage_function

__all__ = ["Lowering", "StreamingRun", "compile_streaming", "needs_timers", "run_streaming"]

_ROW_SCHEMA = "p int, k string, seq binary, v binary"
DEFAULT_BUCKETS = 64
_DEFAULT_INTERVAL = "500 milliseconds"


def compile_streaming(flow: Any) -> Plan:
    """Compile a dataflow (or its graph) for a streaming query, or check a compiled plan.

    Args:
        flow: The `Dataflow`, its `ir.Graph`, or a compiled `Plan`.

    Returns:
        The plan (the batch job's plan: the streaming query is another lowering of it).

    Raises:
        FlowsparkCompileError: The flow cannot run as a streaming query (a
            DynamicSource, or what the compiler refuses).
    """
    plan = flow if isinstance(flow, Plan) else compile_flow(as_graph(flow))
    for st in plan.stages:
        if st.kind == "source" and isinstance(st.source, DynamicSource):
            msg = (
                f"step {st.spec.source_step!r}: source {type(st.source).__name__} is a DynamicSource, which has "
                "no offsets to resume from; a streaming query needs a FixedPartitionedSource (snapshot/resume) "
                "or SparkSource(..., streaming=True)"
            )
            raise FlowsparkCompileError(msg)
    return plan


def needs_timers(plan: Plan) -> bool:
    """Whether some stateful step can ask for a notification (the IR's `notifies`).

    Args:
        plan: The plan.

    Returns:
        True when the query needs timeouts.
    """
    return any(ks.notifies for ks in plan.keyed_steps())


@dataclass(frozen=True)
class Lowering:
    """The choices of the streaming lowering for a plan, and their description.

    Attributes:
        plan: The plan.
        buckets: State buckets of every keyed stage.
        timers: Whether the query runs with timers (processing-time timeouts).
        layout: The state layout (`flowspark.spark.streaming.state.LAYOUTS`).
    """

    plan: Plan
    buckets: int
    timers: bool
    layout: str = "bucket"

    @property
    def chained(self) -> bool:
        """Whether the plan has several keyed stages.

        Spark allows one applyInPandasWithState per query, so then every keyed stage uses
        transformWithStateInPandas (RocksDB state store).
        """
        return sum(1 for st in self.plan.stages if st.kind == "keyed") > 1

    @property
    def routed(self) -> bool:
        """Whether some stage has several readers.

        The query then threads one chain of rows through every stage
        (`flowspark.spark.streaming.routing`).
        """
        return needs_routing(self.plan)

    @property
    def tws(self) -> bool:
        """Whether keyed stages use transformWithStateInPandas (chains, or the key layout)."""
        return self.chained or self.layout == "key"

    def keyed_op(self) -> str:
        """The Spark operator every keyed stage lowers to, with its timeout mode.

        Returns:
            The text.
        """
        if self.tws:
            mode = "ProcessingTime" if self.timers or self.layout == "key" else "None"
            return f"transformWithStateInPandas(timeMode={mode})"
        return f"applyInPandasWithState({'ProcessingTimeTimeout' if self.timers else 'NoTimeout'})"

    def stage(self, st: StagePlan) -> str:
        """What one stage lowers to.

        Args:
            st: The stage.

        Returns:
            A one-line description.
        """
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
                col = ck.column
                return (
                    f"(stage{ck.source_stage}'s rows, numbered by an Arrow pass{tick}, or for a parquet file "
                    "stream into a sink written by one stateful_map, by the file and row index Spark reads) "
                    f"-> groupBy(pmod(hash({col}), "
                    f"{self.buckets})).{self.keyed_op()}, running stage {ck.source_stage}'s steps on row dicts; "
                    f"when {col!r} is not a plain string column (or the checkpoint started otherwise): "
                    f"({st.union()}{tick}) -> groupBy(pmod(hash(k), {self.buckets}))"
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
        if self.layout == "key":
            return (
                f"layout 'key': entries (snapshots, notify_at), snapshots[i] = None or (snapshot of {which},); "
                f"a bucket's row holds its last {HOT_PER_BUCKET} touched keys' entries and which keys wait for "
                f"a notification, a MapState row per other key is read only when the key is touched{timeout}; "
                "the bucket count is fixed for a checkpoint"
            )
        return (
            f"layout 'bucket': one row per bucket: pickle of {{key: (snapshots, notify_at)}}, snapshots[i] = None or "
            f"(snapshot of {which},){timeout}; the bucket count is fixed for a checkpoint"
        )


def _per_call_stage(
    spec: StageSpec, clock: Optional[Callable[[], datetime]]
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A stage function whose logical `now` is read when each task starts."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        now = clock() if clock is not None else datetime.now(timezone.utc)
        yield from stage_function(spec, now)(batches)

    return fn


def _file_rows(df: Any, source: Any) -> bool:
    """Whether Spark gives `df`'s rows their file and row index (`_metadata`: a parquet file stream).

    A stage writing a sink with one `stateful_map` (`BucketDriver.flat`) needs only each key's
    rows in order, not sequences: those two numbers, computed by Spark, order them without the
    Arrow pass that numbers the rows (`_number_rows`). The order among a micro-batch's files is
    that of their paths' `xxhash64` (the pass's is Spark's packing of files into partitions):
    each file's rows stay in order, as a replayed micro-batch gives them again.

    Decided from the source's format and the `_metadata` struct's fields, never by asking
    Spark for a field that may not exist: pyspark logs every analysis error it raises (an
    ERROR line with a stack trace on stderr), even one flowspark catches.
    """
    if not (isinstance(source, SparkSource) and source.format == "parquet" and source.path):
        return False  # row_index is a parquet reader's field; tables and DataFrames have no file rows
    if "_metadata" in df.columns:
        return False  # a column of the user's own shadows Spark's
    meta = df.select("_metadata").schema.fields[0].dataType
    return {"file_path", "row_index"} <= set(getattr(meta, "names", None) or [])


def _number_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """Prepend `ID_COLUMN`: what `monotonically_increasing_id()` gives (`partition << 33 | position`)."""
    import numpy as np
    import pyarrow as pa
    from pyspark import TaskContext

    ctx = TaskContext.get()
    base = (ctx.partitionId() if ctx is not None else 0) << 33
    pos = 0
    for b in batches:
        ids = pa.array(np.arange(base + pos, base + pos + b.num_rows, dtype=np.int64))
        pos += b.num_rows
        yield pa.RecordBatch.from_arrays([ids, *b.columns], names=[ID_COLUMN, *b.schema.names])


def _progress_line(p: Any, counts: Optional[tuple[int, int]] = None, dead: Optional[int] = None) -> str:
    """The per-micro-batch line: input, rate, state (keys, pending notifications, bytes), watermark.

    Args:
        p: Spark's progress report.
        counts: `(keys, pending notifications)` in state, from the keyed stages' reports.
        dead: With a dead letter, the rows it got in this micro-batch.

    Returns:
        The line.
    """
    ops = p.get("stateOperators") or []
    state_rows = sum(int(op.get("numRowsTotal", 0)) for op in ops)
    memory = sum(int(op.get("memoryUsedBytes", 0)) for op in ops)
    disk = sum(int((op.get("customMetrics") or {}).get("rocksdbSstFileSize", 0)) for op in ops)
    wm = (p.get("eventTime") or {}).get("watermark", "-")
    rate = p.get("processedRowsPerSecond") or 0.0
    state = f"state rows {state_rows}"
    if counts is not None:
        size = f"{_size(memory)} in memory" + (f", {_size(disk)} on disk" if disk else "")
        state = f"state {counts[0]} keys, {counts[1]} timers pending, {size} ({state_rows} state rows)"
    dl = "" if dead is None else f", {dead} to the dead letter"
    return (
        f"[flowspark] batch {p.get('batchId')}: {p.get('numInputRows', 0)} input rows{dl}, "
        f"{rate:.0f} rows/s, {state}, watermark {wm}"
    )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class StreamingRun:
    """A running (or finished) streaming query of a dataflow.

    Built by `run_streaming`; `query` is the Spark `StreamingQuery`.
    """

    def __init__(self, plan: Plan, spark: Any, options: dict[str, Any]) -> None:
        """Prepare the query (nothing starts until `start`)."""
        self.plan = plan
        self.spark = spark
        self.checkpoint: str = options["checkpoint"]
        self.buckets: int = options["buckets"]
        self.clock: Optional[Callable[[], datetime]] = options.get("clock")
        self.max_items: int = options["max_items"]
        self.timers: bool = options.get("timers", True)
        self.layout: str = options.get("layout", "bucket")
        self.state_ttl: Optional[timedelta] = options.get("state_ttl")
        self.progress: Optional[Callable[[str], None]] = options.get("progress")
        #: Empty a file sink's directory that holds another query's log instead of refusing it.
        self.clear_outputs: bool = bool(options.get("clear_outputs", False))
        self.dfs: dict[int, Any] = {}
        self.query: Any = None
        self.batches = 0
        self._sink_parts: dict[str, Any] = {}
        self._error: Optional[BaseException] = None
        self.lowering = Lowering(plan, self.buckets, self.timers, self.layout)
        self.routes = routes(plan) if self.lowering.routed else None
        self._sink_struct: Any = None
        self._sink_fused_stage: Optional[int] = None
        self._schemas: dict[str, Any] = {}  # StructTypes of native sinks given no schema (pinned)
        self._counts: Any = None  # accumulator of the state counts (state.LatestCounts)
        self.lowered: dict[int, str] = {}  # keyed stage -> how its input is keyed (see spark_keyed)
        #: With a dead letter: its writer, and the rows written per micro-batch id (progress line).
        self.dead: Any = None
        self.dead_counts: dict[int, int] = {}
        #: Where the outputs handed to this process go first (`flowspark.spark.streaming.outbox`).
        self.outbox = Outbox(spark, self.checkpoint)
        #: Spark Connect: `foreachBatch` would run on the server, so those outputs go through the outbox.
        self.connect = is_connect(spark)
        #: The flowspark zip the query's Python data sources carry (a Connect server whose
        #: Python lacks flowspark: `flowspark.spark.carrier`), else `None`.
        self.carry: Optional[bytes] = options.get("carry")
        #: A `DeadLetterDir` dead letter is written by the tasks (`flowspark.spark.streaming.deadletter`).
        self.dead_dir: Optional[DeadLetterDir] = (
            plan.dead_letter if isinstance(plan.dead_letter, DeadLetterDir) else None
        )
        #: A dead letter at the driver: the SparkSources' malformed rows by micro-batch (`MalformedRows`).
        self._malformed: Any = None

    # -- building ---------------------------------------------------------------
    def port_df(self, stage: int, port: int, pad: bytes = b"") -> Any:
        """Return the `(k, seq, v)` rows of one port of a stage (with a merge's `pad` applied to `seq`)."""
        from pyspark.sql import functions as F  # noqa: N812

        df = self.dfs[stage].filter(F.col("p") == port)
        return df.select(F.col("k"), seq_column(pad).alias("seq"), F.col("v"))

    def source_df(self, st: StagePlan, order: bool = False) -> Any:
        """Return the streaming DataFrame a source stage reads (`order`: see `_ordered_sources`)."""
        spec = st.spec
        src = st.source
        if isinstance(src, SparkSource):
            try:
                keep = self._keep_malformed(spec.stage_id)
                return load_rows(src, self.spark, spec.source_step, keep is not None, keep)[0]
            except FlowsparkError:
                raise
            except Exception as e:
                raise FlowsparkRuntimeError(spec.source_step, f"step {spec.source_step!r}: {e}") from e
        from flowspark.spark import pysource

        pysource.register(self.spark, self.carry)
        opts = pysource.stream_options(
            spec.source_step,
            src,
            spec.source_index,
            self.max_items,
            # chunk rows, each of one source batch
            stage=dataclasses.replace(spec, source="ordered_chunks" if order else "chunks", per_batch=0),
            clock=self.clock,
            tasks=default_parallelism(self.spark),
        )
        return self.spark.readStream.format(pysource.FORMAT).options(**opts).load()

    def _keep_malformed(self, stage: int) -> Optional[Callable[[dict[str, list[dict[str, Any]]]], None]]:
        """Where a SparkSource's malformed rows go with a dead letter (`load_rows`' `keep`); `None` without one.

        Read in the same pass as the rows that parsed: a second read would be a second source
        of the query. `None` too on Spark Connect with a dead letter at the driver (no
        accumulators): a malformed row then stops the query, as without a dead letter.
        """
        if self.dead_dir is not None:
            return keep_in_dir(self.dead_dir, f"s{stage}-input")
        if self.plan.dead_letter is None:
            return None
        if self._malformed is None:
            try:
                self._malformed = self.spark.sparkContext.accumulator({}, MalformedRows())
            except Exception:  # noqa: BLE001 - a session without a SparkContext (Connect)
                return None
        return keep_in_driver(self._malformed)

    def _driver(self, spec: StageSpec, route: Optional[Route] = None, column_key: bool = False) -> BucketDriver:
        """The bucket driver of a keyed stage."""
        return BucketDriver(
            spec,
            self.clock,
            self._fused_sink(spec) if route is None else None,
            self.timers,
            route,
            self.buckets,
            self.state_ttl,
            self._state_counts(),
            column_key,
        )

    def _keyed(
        self,
        df: Any,
        spec: StageSpec,
        route: Optional[Route] = None,
        column_key: bool = False,
        driver: Optional[BucketDriver] = None,
    ) -> Any:
        """Lower a keyed stage over `df` (with a `bucket` column) to the stateful operator."""
        driver = driver or self._driver(spec, route, column_key)
        out_schema = _ROW_SCHEMA if driver.sink_rows is None else self._sink_struct
        if self.layout == "key":
            # Always processing time: Spark's TTL of the per-key rows (state_ttl) needs it, and
            # a checkpoint's time mode cannot change between runs.
            return df.groupBy("bucket").transformWithStateInPandas(
                driver.key_processor(self.state_ttl), out_schema, "Append", "ProcessingTime"
            )
        if not self.lowering.chained:
            return df.groupBy("bucket").applyInPandasWithState(
                driver.pandas_function(),
                out_schema,
                STATE_SCHEMA,
                "append",
                "ProcessingTimeTimeout" if self.timers else "NoTimeout",
            )
        return df.groupBy("bucket").transformWithStateInPandas(
            driver.processor(), out_schema, "Append", "ProcessingTime" if self.timers else "None"
        )

    def _state_counts(self) -> Any:
        """The accumulator the keyed stages report their state counts to (seeded from the checkpoint)."""
        if self._counts is None:
            try:
                sc = self.spark.sparkContext
            except Exception:  # noqa: BLE001 - a session without a SparkContext: no counts
                return None
            self._counts = sc.accumulator(load_counts(self.checkpoint), LatestCounts())
        return self._counts

    def counts(self) -> Optional[tuple[int, int]]:
        """`(keys, pending notifications)` in state as last reported, saved to the checkpoint; or `None`."""
        if self._counts is None:
            return None
        value = dict(self._counts.value)
        save_counts(self.checkpoint, value)
        return sum(v[0] for v in value.values()), sum(v[1] for v in value.values())

    def dead_count(self, batch_id: int) -> Optional[int]:
        """Rows the dead letter got in a micro-batch; `None` without a dead letter.

        Args:
            batch_id: The micro-batch id.

        Returns:
            The count.
        """
        if self.dead_dir is not None:
            return self.dead_dir.count(batch_id)
        if self.dead is not None:
            return self.dead_counts.get(batch_id, 0)
        return None

    def _ticks(self, columns: list[str]) -> Any:
        """The tick stream (timers need a micro-batch even when no data arrives, e.g. after a restart)."""
        from pyspark.sql import functions as F  # noqa: N812

        from flowspark.spark import pysource

        pysource.register(self.spark, self.carry)
        ticks = self.spark.readStream.format(pysource.TICK_FORMAT).load()
        if "p" in columns:
            ticks = ticks.select(F.lit(TICK_ROUTE).cast("int").alias("p"), "k", "seq", "v")
        return ticks

    def _source_rows(self, st: StagePlan, order: bool = False) -> Any:
        df = self.source_df(st, order)
        if isinstance(st.source, SparkSource):
            df = df.mapInArrow(_per_call_stage(st.spec, self.clock), _ROW_SCHEMA)
        # else: the Python data source runs the source stage inside its read
        return df

    def _use_rocksdb(self) -> None:
        if self.lowering.tws:
            # Spark rejects a second applyInPandasWithState in one query, so chains use
            # transformWithStateInPandas, as does the key layout (MapState): it needs RocksDB.
            self.spark.conf.set(
                "spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
            )

    def build_routed(self) -> Any:
        """Build the routed chain (`flowspark.spark.streaming.routing`); return its last DataFrame."""
        from pyspark.sql import functions as F  # noqa: N812

        assert self.routes is not None
        self._use_rocksdb()
        chain: Any = None
        for st in self.plan.stages:
            spec = st.spec
            route = self.routes[spec.stage_id]
            if st.kind == "source":
                df = self._source_rows(st).withColumn("p", F.col("p") + F.lit(route.offset))
                if self.dead_dir is not None:
                    df = split_dead(df, self.dead_dir, f"s{spec.stage_id}")
                chain = df if chain is None else chain.unionByName(df)
                continue
            assert chain is not None
            if st.kind == "map":
                fn = routed_stage_function(spec, route, functools.partial(run_stage_rows, spec), self.clock)
                chain = chain.mapInArrow(fn, _ROW_SCHEMA)
                if self.dead_dir is not None:
                    chain = split_dead(chain, self.dead_dir, f"s{spec.stage_id}")
                continue
            if self.timers:
                chain = chain.unionByName(self._ticks(["p"]))
            p = F.col("p")
            mine = p.isin(list(route.consumed))
            fwd = p.isin(list(route.forward))
            # A row both read here and needed later goes to its bucket and, as a copy, to the
            # forward group: one read of the chain (explode), not two.
            copies = F.when(mine & fwd, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))
            df = chain.filter(mine | fwd | (p == TICK_ROUTE)).withColumn("copy", F.explode(copies))
            bucket = F.when(mine & (F.col("copy") == 0), F.pmod(F.hash("k"), F.lit(self.buckets)))
            df = df.withColumn("bucket", bucket.otherwise(F.lit(self.buckets))).select("p", "k", "seq", "v", "bucket")
            chain = self._keyed(df, spec, route)
            if self.dead_dir is not None:
                chain = split_dead(chain, self.dead_dir, f"s{spec.stage_id}")
        return chain

    def spark_keyed(self) -> dict[int, Any]:
        """The keyed stages whose source rows Spark keys itself (`ColumnKey`), each with its source DataFrame.

        As in the batch runtime (`flowspark.spark.batch`): the source stage's Python pass is
        skipped, Spark hashes the key column into buckets, and the keyed stage runs the
        source's steps on row dicts. Not in the routed lowering, and a checkpoint keeps the
        choice it started with (`spark_keys` in `flowspark.json`).
        """
        from flowspark.spark.batch import column_key_refusal

        if self.routes is not None:
            return {}
        keyed: dict[int, Any] = {}
        for st in self.plan.stages:
            ck = st.spec.column_key
            if ck is None:
                continue
            src = self.plan.stages[ck.source_stage]
            df = self.source_df(src)
            why = column_key_refusal(df, ck.column)
            self.lowered[st.spec.stage_id] = (
                f"Spark keys on column {ck.column!r}" if why is None else f"Python key pass: {why}"
            )
            if why is None:
                keyed[st.spec.stage_id] = df
        if keyed and not check_flag(self.checkpoint, "spark_keys", True):
            for sid in keyed:
                self.lowered[sid] = "Python key pass: the checkpoint was started with it"
            return {}
        return keyed

    def _ordered_sources(self, spark_keyed: dict[int, Any]) -> dict[int, BucketDriver]:
        """The Python source stages read in order, each with the driver of the stage reading it.

        A keyed stage that needs only its items' order, not their sequences (`BucketDriver.flat`),
        reading the only port of a Python source stage whose steps are all one-to-one `map`s
        (each item keeps its sequence) and which nothing else reads: the source's read numbers
        the items of a micro-batch in sequence order (a `long` where the sequence is 20 bytes).
        """
        readers: dict[tuple[int, int], list[int]] = {}
        for st in self.plan.stages:
            for s, p, _pad in st.inputs:
                readers.setdefault((s, p), []).append(st.spec.stage_id)
        for sk in self.plan.sinks:
            readers.setdefault(sk.port, []).append(-1)
        out: dict[int, BucketDriver] = {}
        for st in self.plan.stages:
            spec = st.spec
            if st.kind != "keyed" or spec.stage_id in spark_keyed or len(st.inputs) != 1 or st.inputs[0][2]:
                continue
            src = self.plan.stages[st.inputs[0][0]]
            if (
                src.kind != "source"
                or isinstance(src.source, SparkSource)
                or len(src.spec.ports) != 1
                or readers.get((src.spec.stage_id, 0)) != [spec.stage_id]
                or not all(o.kind == "map" and o.one_to_one for o in src.spec.ops)
            ):
                continue
            driver = self._driver(spec)
            if driver.flat:
                out[src.spec.stage_id] = driver
                self.lowered[spec.stage_id] = "its source numbers each micro-batch's items in order"
        return out

    def _column_key_input(self, spec: StageSpec, df: Any, file_order: bool = False) -> Any:
        """The source's rows numbered (`ID_COLUMN`) and bucketed on the key column, plus ticks with timers.

        With `file_order`, numbered by Spark instead: `FILE_COLUMN` and `ROW_COLUMN` (see `_file_rows`).
        """
        from pyspark.sql import functions as F  # noqa: N812

        ck = spec.column_key
        assert ck is not None
        from pyspark.sql.types import LongType, StructField, StructType

        key = F.col("`" + ck.column.replace("`", "``") + "`")
        if file_order:
            assert not self.timers, "a file-ordered stage has no ticks"
            df = df.select(
                F.xxhash64(F.col("_metadata.file_path")).alias(FILE_COLUMN),
                F.col("_metadata.row_index").alias(ROW_COLUMN),
                "*",
            )
            return df.withColumn("bucket", F.pmod(F.hash(key), F.lit(self.buckets)))
        # Spark refuses monotonically_increasing_id() on streams: the same number is added by
        # an Arrow pass-through (no row objects), so the keyed stage can order each key's rows.
        numbered = StructType([StructField(ID_COLUMN, LongType(), False), *df.schema.fields])
        df = df.mapInArrow(_number_rows, numbered)
        df = df.withColumn("bucket", F.pmod(F.hash(key), F.lit(self.buckets)))
        if self.timers:
            tick_bucket = F.pmod(F.hash(F.lit(None).cast("string")), F.lit(self.buckets)).alias("bucket")
            df = df.unionByName(self._ticks(["k", "seq", "v"]).select(tick_bucket), allowMissingColumns=True)
        return df

    def build(self) -> Any:
        """Build every stage's streaming DataFrame; return the last one."""
        from pyspark.sql import functions as F  # noqa: N812

        self._use_rocksdb()
        spark_keyed = self.spark_keyed()
        skipped = {self.plan.stages[s].spec.column_key.source_stage for s in spark_keyed}  # type: ignore[union-attr]
        ordered = self._ordered_sources(spark_keyed)
        for st in self.plan.stages:
            spec = st.spec
            if st.kind == "source" and spec.stage_id in skipped:
                continue  # its rows go straight to the keyed stage
            if spec.stage_id in spark_keyed:
                src = spark_keyed[spec.stage_id]
                driver = self._driver(spec, column_key=True)
                source = self.plan.stages[spec.column_key.source_stage].source  # type: ignore[union-attr]
                driver.file_order = driver.flat and _file_rows(src, source)
                if driver.file_order:
                    self.lowered[spec.stage_id] += "; each key's rows ordered by their file and row index"
                df = self._column_key_input(spec, src, driver.file_order)
                df = self._keyed(df, spec, column_key=True, driver=driver)
            elif st.kind == "source":
                df = self._source_rows(st, spec.stage_id in ordered)
            else:
                ins = [self.port_df(s, p, pad) for s, p, pad in st.inputs]
                df = ins[0]
                for other in ins[1:]:
                    df = df.union(other)
                if st.kind == "keyed":
                    if self.timers:
                        df = df.union(self._ticks(["k", "seq", "v"]))
                    df = df.withColumn("bucket", F.pmod(F.hash("k"), F.lit(self.buckets)))
                    df = self._keyed(df, spec, driver=ordered.get(st.inputs[0][0]))
                else:
                    df = df.mapInArrow(_per_call_stage(spec, self.clock), _ROW_SCHEMA)
            if self.dead_dir is not None and not (st.kind == "keyed" and self._sink_fused_stage == spec.stage_id):
                df = split_dead(df, self.dead_dir, f"s{spec.stage_id}")
            self.dfs[spec.stage_id] = df
        return df

    def _fused_sink(self, spec: StageSpec) -> Optional[tuple[str, RowSchema]]:
        """`(step id, RowSchema)` when this keyed stage can write the lone file sink's rows itself.

        That is when the stage's only port is the port of the query's lone `SparkSink`,
        which has a schema of atomic columns (pandas carries them unchanged).
        """
        lone = self._spark_writer_sink()
        if lone is None or lone.port != (spec.stage_id, 0) or len(spec.ports) != 1 or spec.dead_letter:
            return None
        rows = row_schema(self.spark, lone.step_id, lone.sink.schema)
        if not _atomic(rows.struct):
            return None
        self._sink_struct = rows.struct
        self._sink_fused_stage = spec.stage_id
        return lone.step_id, rows

    # -- sinks ------------------------------------------------------------------
    def _lone_native_sink(self) -> Optional[SinkPlan]:
        """The query's only output when it is a Spark-native sink (and nothing is inspected, no dead letter)."""
        sinks = self.plan.sinks
        if self.plan.dead_letter is not None and self.dead_dir is None:
            return None  # the dead letter is an output too: every output goes through foreachBatch
        if self.connect and not self._spark_writes(sinks):
            return None  # its `foreachBatch` would run on the server: the sink gets its rows here (outbox)
        if len(sinks) == 1 and sinks[0].where == "native" and not self.plan.inspects:
            return sinks[0]
        return None

    @staticmethod
    def _spark_writes(sinks: Sequence[SinkPlan]) -> bool:
        """Whether the only output is a `SparkSink` with a schema (Spark's own streaming writer takes it)."""
        return len(sinks) == 1 and isinstance(sinks[0].sink, SparkSink) and sinks[0].sink.schema is not None

    def _spark_writer_sink(self) -> Optional[SinkPlan]:
        """The lone native sink when Spark's own streaming writer takes its rows: a `SparkSink` with a schema.

        Spark's file sink (and `toTable`) needs the rows' schema when the query starts.
        """
        lone = self._lone_native_sink()
        if lone is not None and isinstance(lone.sink, SparkSink) and lone.sink.schema is not None:
            return lone
        return None

    def _port_rows(self, last: Any, port: tuple[int, int]) -> Any:
        """The `(k, seq, v)` rows of one port, from the routed chain or the port's stage."""
        from pyspark.sql import functions as F  # noqa: N812

        if self.routes is None:
            return self.port_df(*port)
        return last.filter(F.col("p") == port[0] * ROUTE + port[1]).select("k", "seq", "v")

    def _pinned(self) -> None:
        """Load the schemas pinned in the checkpoint for native sinks given none."""
        from pyspark.sql.types import StructType

        for step_id, js in pinned_schemas(self.checkpoint).items():
            self._schemas[step_id] = StructType.fromJson(json.loads(js))

    def _schema(self, sk: SinkPlan, sample: Callable[[], list[Any]]) -> Any:
        """The StructType of a native sink's rows: given, pinned in the checkpoint, or inferred now and pinned.

        Returns `None` when the sink has no schema yet and `sample()` found no items.
        """
        if sk.sink.schema is not None:
            return row_schema(self.spark, sk.step_id, sk.sink.schema).struct
        struct = self._schemas.get(sk.step_id)
        if struct is None:
            items = sample()
            if not items:
                return None
            struct = infer_schema(self.spark, sk.step_id, items)
            pin_schema(self.checkpoint, sk.step_id, struct.json())
            self._schemas[sk.step_id] = struct
        return struct

    def start(self, trigger: Optional[str]) -> Any:
        """Build the query and start it with `trigger`; return the `StreamingQuery`."""
        from pyspark.sql import functions as F  # noqa: N812

        self._check_output_log()
        if self.dead_dir is not None:
            files = self._spark_writer_sink()
            skips = None
            if files is not None and files.sink.format not in ("kafka", "table"):
                skips = file_sink_written(files.sink.path)
            # Their micro-batches run again (unless Spark's file sink already wrote them: it skips them).
            clear_uncommitted(self.dead_dir, self.checkpoint, skips)
        last = self.build_routed() if self.routes is not None else self.build()
        qchk = os.path.join(self.checkpoint, "query")
        self._pinned()
        writer = self._spark_writer_sink()
        lone = self._lone_native_sink()
        to_table: Optional[str] = None
        if writer is not None:
            sink: SparkSink = writer.sink
            if self._sink_fused_stage == writer.port[0] and self.routes is None:
                rows = self.dfs[writer.port[0]]  # the keyed stage already wrote the sink's rows
            else:
                rows = _dict_rows(
                    self.spark, self._port_rows(last, writer.port), writer.step_id, sink.schema, self.dead_dir
                )
            if sink.format == "kafka":
                w = rows.writeStream.format("kafka").outputMode("append")
            elif sink.format == "table":
                provider = sink.table_provider(self.spark)
                w = (rows.writeStream if provider is None else rows.writeStream.format(provider)).outputMode("append")
                to_table = sink.path
            else:
                w = rows.writeStream.format(sink.format).option("path", sink.path).outputMode("append")
            if sink.options:
                w = w.options(**sink.options)
            if sink.partition_by:
                w = w.partitionBy(*sink.partition_by)
        elif lone is not None:
            # A ForeachBatchSink, or a SparkSink whose schema comes from the first rows: each
            # micro-batch's rows become a DataFrame inside foreachBatch (at-least-once).
            rows_fn = functools.partial(self._foreach_rows, lone)
            w = self._port_rows(last, lone.port).writeStream.foreachBatch(rows_fn)
        else:
            ports = sorted(
                {sk.port for sk in self.plan.sinks}
                | {ins.port for ins in self.plan.inspects}
                | (set() if self.dead_dir is not None else set(self.plan.dead_ports()))
            )
            # A source stage Spark keyed (`spark_keyed`) has no DataFrame of its own: the keyed stage ran its steps.
            ports = [(s, q) for s, q in ports if s in self.dfs or self.routes is not None]
            if self.routes is not None:
                p = F.col("p")
                out = last.filter(p.isin([s * ROUTE + q for s, q in ports])).select(
                    (p / ROUTE).cast("int").alias("st"), (p % ROUTE).cast("int").alias("p"), "seq", "v"
                )
            else:
                # One read of each stage's DataFrame, whatever number of its ports the writer takes.
                parts = [
                    self.dfs[s]
                    .filter(F.col("p").isin([q for t, q in ports if t == s]))
                    .select(F.lit(s).alias("st"), "p", "seq", "v")
                    for s in sorted({s for s, _q in ports})
                ]
                out = parts[0]
                for other in parts[1:]:
                    out = out.union(other)
            self._open_sinks()
            if self.plan.dead_letter is not None and self.dead_dir is None:
                from flowspark.deadletter import dead_letter_step
                from flowspark.spark.outputs import SparkDeadLetters

                self.dead = SparkDeadLetters(
                    self.spark, self.plan.dead_letter, dead_letter_step(self.plan.flow_id), True
                )
            if self.connect:
                w = self.outbox.writer(out)
            else:
                w = out.writeStream.foreachBatch(self._foreach_batch)
        if self.outbox.exists():
            self.deliver()  # what an earlier run (maybe through Spark Connect) committed but did not hand over
        w = w.option("checkpointLocation", qchk).queryName(f"flowspark_{self.plan.flow_id}")
        if trigger == "available_now":
            w = w.trigger(availableNow=True)
        else:
            w = w.trigger(processingTime=trigger or _DEFAULT_INTERVAL)
        try:
            self.query = w.start() if to_table is None else w.toTable(to_table)
        except Exception as e:
            from flowspark.spark.kafka import _missing_jar

            err = _missing_jar(e)
            if err is not None:
                raise err from e
            raise
        return self.query

    def _check_output_log(self) -> None:
        """Refuse (or, with `clear_outputs`, empty) a file sink directory holding another query's log.

        Only Spark's own file sink keeps that log; on Spark Connect a URI cannot be opened from
        the client, and the server checks nothing: that case is left to the user (docs/streaming.md).
        """
        writer = self._spark_writer_sink()
        if writer is None or writer.sink.format in ("kafka", "table"):
            return
        path = writer.sink.path
        if self.connect and not is_local(path):
            return
        check_sink_log(self.checkpoint, writer.step_id, path, self.clear_outputs, None if self.connect else self.spark)

    def _open_sinks(self) -> None:
        for sk in self.plan.sinks:
            try:
                if sk.where in ("driver", "dynamic"):
                    self._sink_parts[sk.step_id] = sk.sink.build(sk.step_id, 0, 1)
                elif sk.where == "fixed":
                    keys = list(sk.sink.list_parts())
                    self._sink_parts[sk.step_id] = (keys, [sk.sink.build_part(sk.step_id, k, None) for k in keys])
            except Exception as e:
                raise _fail(sk.step_id, e) from e

    def deliver(self) -> None:
        """Hand the outbox's committed, undelivered micro-batches to the sinks, `inspect` and the dead letter."""
        with self.outbox.lock:
            for batch_id, table in self.outbox.pending():
                self._deliver(table, batch_id)
                self.outbox.done(batch_id)

    def _foreach_batch(self, df: Any, batch_id: int) -> None:
        try:
            table = df.toArrow()
        except Exception as e:
            err = decode_task_error(str(e))
            self._error = err if err is not None else e
            raise
        self._deliver(table, batch_id)

    def _deliver(self, table: Any, batch_id: int) -> None:
        """Hand one micro-batch's `(st, p, seq, v)` rows to the sinks, `inspect` and the dead letter, in order."""
        import pyarrow.compute as pc

        if table.num_rows:
            order = pc.sort_indices(table, sort_keys=[("seq", "ascending"), ("st", "ascending"), ("p", "ascending")])
            table = table.take(order)
        sts = table.column("st").to_pylist()
        ps = table.column("p").to_pylist()
        vs = table.column("v").to_pylist()
        by_port: dict[tuple[int, int], list[Any]] = {}
        dead: list[Any] = self._malformed_rows(batch_id)
        for s, p, v in zip(sts, ps, vs, strict=True):
            if p == DEAD_PORT:
                dead.append(loads(v))  # in sequence order, across stages
            else:
                by_port.setdefault((s, p), []).append(loads(v))
        try:
            for ins in self.plan.inspects:
                for item in by_port.get(ins.port, []):
                    ins.inspector(ins.step_id, item, batch_id + 1, 0)
            for sk in self.plan.sinks:
                items = by_port.get(sk.port)
                if items:
                    self._write(sk, items, batch_id, dead if self.plan.dead_letter is not None else None)
            if self.dead is not None:
                self.dead.write(dead, batch_id)
                self.dead_counts[batch_id] = len(dead)
            elif self.dead_dir is not None and dead:  # sinks' misfits, written here as a task would
                write_task_rows(self.dead_dir, "part-driver", dead, batch_id)
        except FlowsparkError as e:
            self._error = e
            raise
        except Exception as e:
            self._error = _fail(getattr(e, "step_id", "sink"), e)
            raise

    def _malformed_rows(self, batch_id: int) -> list[Any]:
        """The SparkSources' malformed rows of a micro-batch for a dead letter at the driver (taken once)."""
        if self._malformed is None:
            return []
        seen = dict(self._malformed.value)
        splits = seen.pop(batch_id, {})
        self._malformed.value = seen
        return [r for _split, rows in sorted(splits.items()) for r in rows]

    def _foreach_rows(self, sk: SinkPlan, df: Any, batch_id: int) -> None:
        """Hand one micro-batch's rows of the lone native sink (`(k, seq, v)` rows) to the sink as a DataFrame."""
        from pyspark import StorageLevel

        df = df.persist(StorageLevel.MEMORY_AND_DISK)  # computed once, whatever reads it below
        try:
            if df.count() == 0:
                return
            sample = [loads(r.v) for r in df.select("v").limit(100).collect()]
            if self.dead_dir is not None:
                sample = [x for x in sample if isinstance(x, dict)]  # the others go to the dead letter
            struct = self._schema(sk, lambda: sample)
            if struct is None:
                if self.dead_dir is not None:  # not one dict: every item goes to the dead letter
                    items = [loads(r.v) for r in df.select("v").collect()]
                    rows = [record(sk.step_id, not_dict_error(sk.step_id, x), x) for x in items]
                    write_task_rows(self.dead_dir, "part-driver", rows, batch_id)
                return
            write_rows(sk.step_id, sk.sink, _dict_rows(self.spark, df, sk.step_id, struct, self.dead_dir), batch_id)
        except FlowsparkError as e:
            self._error = e
            raise
        except Exception as e:
            err = decode_task_error(str(e))
            self._error = err if err is not None else _fail(sk.step_id, e)
            raise
        finally:
            df.unpersist()

    def _write(self, sk: Any, items: list[Any], batch_id: int, dead: Optional[list[Any]] = None) -> None:
        """Write one micro-batch's items of a sink (with a dead letter, `dead` gets a native sink's misfits)."""
        try:
            if sk.where in ("driver", "dynamic"):
                self._sink_parts[sk.step_id].write_batch(items)
            elif sk.where == "fixed":
                keys, parts = self._sink_parts[sk.step_id]
                routed = route_to_parts(sk.step_id, sk.sink, items, len(keys))
                for i in sorted(routed):
                    parts[i].write_batch(routed[i])
            else:
                import pyarrow as pa

                misfits: Optional[list[Any]] = None if dead is None else []
                struct = self._schema(sk, lambda: items if dead is None else [x for x in items if isinstance(x, dict)])
                if struct is None:  # no item is a dict: nothing to infer a schema from
                    assert dead is not None
                    dead.extend(record(sk.step_id, not_dict_error(sk.step_id, x), x) for x in items)
                    return
                rows = row_schema(self.spark, sk.step_id, struct)
                table = pa.Table.from_batches([dict_rows(sk.step_id, items, rows, misfits)])
                if misfits:
                    assert dead is not None
                    dead.extend(r for _i, r in misfits)
                write_rows(sk.step_id, sk.sink, self.spark.createDataFrame(table, rows.struct), batch_id)
        except FlowsparkError:
            raise
        except Exception as e:
            raise _fail(sk.step_id, e) from e

    def close_sinks(self) -> None:
        """Close the sink partitions opened at the driver (and the dead letter's)."""
        if self.dead is not None:
            try:
                self.dead.close()
            except Exception:  # noqa: BLE001,S110
                pass
        for part in self._sink_parts.values():
            for p in part[1] if isinstance(part, tuple) else [part]:
                try:
                    p.close()
                except Exception:  # noqa: BLE001,S110
                    pass
        self._sink_parts = {}


def _fail(step_id: str, ex: BaseException) -> FlowsparkRuntimeError:
    return step_error(step_id, ex)


def _atomic(st: Any) -> bool:
    """Whether every field of a StructType is atomic (pandas round-trips it unchanged)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    return all(not isinstance(f.dataType, (ArrayType, MapType, StructType)) for f in st.fields)


def _dict_rows(spark: Any, df: Any, step_id: str, schema: Any, dead_dir: Optional[DeadLetterDir] = None) -> Any:
    """Turn (k, seq, v) rows whose items are dicts into rows of `schema`.

    With `dead_dir`, items that do not fit go to the dead letter (written by the task).
    """
    rows = row_schema(spark, step_id, schema)

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        misfits: Optional[list[Any]] = None if dead_dir is None else []
        try:
            for b in batches:
                items = loads_all(b.column(2).to_pylist())
                if items:
                    yield dict_rows(step_id, items, rows, misfits)
            if misfits:
                assert dead_dir is not None
                ctx = TaskContext.get()
                part = ctx.partitionId() if ctx is not None else 0
                records = [r for _i, r in misfits]
                write_task_rows(dead_dir, f"part-sink-p{part:05d}", records, task_batch_id())
        except FlowsparkRuntimeError as f:
            raise RuntimeError(encode_task_error(f)) from None

    return df.mapInArrow(fn, rows.struct)


def caught_up(p: dict[str, Any]) -> bool:
    """Whether a micro-batch's progress shows every source at the end of what it can read now.

    Each source's `endOffset` equals its `startOffset`: Spark found no new input for any
    source when it planned the batch, so with `available_now` every source has reached
    the end offset it had when the query started (a batch runs only to fire timeouts).
    A count of rows proves nothing: a batch that reads an empty file reads 0 rows, and a
    restarted query first replays the previous run's unfinished micro-batch with its old
    offsets; the caller therefore never takes a run's first micro-batch as the proof
    (with timers the tick source moves in a new query's first batch, and without timers
    Spark ends the query by itself).
    """
    sources = p.get("sources") or []
    return bool(sources) and all(
        s.get("startOffset") is not None and s.get("startOffset") == s.get("endOffset") for s in sources
    )


class _Listener:
    """Prints the progress line and counts finished micro-batches of this run's query."""

    def __init__(self, run: StreamingRun, show: Optional[Callable[[str], None]]) -> None:
        self.run = run
        self.show = show
        self.cond = threading.Condition()
        self.last_batch = -1
        #: Rows the query's sink reported since the outbox was last read (`_deliver_new`).
        self.sink_rows = 0
        #: A micro-batch of this run found every source at the end of its input (`caught_up`).
        self.done = False
        #: Progress events of this run's query handed over so far.
        self.seen = 0
        #: Run ids whose termination was delivered.
        self.ended_runs: set[str] = set()
        self.early: list[dict[str, Any]] = []  # events seen before the query object was known

    def started(self) -> None:
        """Replay the events that arrived before `run.query` was set."""
        with self.cond:
            early, self.early = self.early, []
        for p in early:
            self.progress(p)

    def progress(self, p: dict[str, Any]) -> None:
        query = self.run.query
        if query is None:
            with self.cond:
                self.early.append(p)
            return
        if p.get("runId") != str(query.runId):
            return  # another query of the same name (e.g. a late event of an earlier run)
        if self.show is not None:
            dead = self.run.dead_count(int(p.get("batchId", -1)))
            self.show(_progress_line(p, self.run.counts(), dead))
        elif self.run._counts is not None:  # noqa: SLF001
            self.run.counts()  # saved for the next run
        with self.cond:
            self.run.batches += 1
            self.last_batch = max(self.last_batch, int(p.get("batchId", -1)))
            written = (p.get("sink") or {}).get("numOutputRows", -1)
            self.sink_rows += 1 if written is None or written < 0 else int(written)  # unknown counts as some
            if self.seen > 0 and caught_up(p):
                self.done = True
            self.seen += 1
            self.cond.notify_all()

    def terminated(self, run_id: str) -> None:
        with self.cond:
            self.ended_runs.add(run_id)
            self.cond.notify_all()

    def ended(self, run_id: str) -> bool:
        """Whether the termination of the query run `run_id` was delivered (call with `cond` held)."""
        return run_id in self.ended_runs

    def drain(self, query: Any, timeout: float = 10.0) -> None:
        """Wait until the progress of the query's last micro-batch was delivered (events are asynchronous)."""
        last = query.lastProgress
        if last is None:
            return
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.last_batch < last["batchId"] and time.monotonic() < deadline:
                self.cond.wait(0.05)


class _JavaListener:
    """The Java side of `_make_listener`'s listener on a classic session, reading each event lean.

    pyspark's own bridge turns every progress event into a Python object field by field (a
    JVM round trip each, some resolving class names through the JVM's class path): measured,
    0.65 s of the listener thread's CPU over a 10-micro-batch run, on two cores. Here an event
    costs two calls: the progress as JSON, or the run id of a termination.
    """

    def __init__(self, lst: _Listener, name: str) -> None:
        self.lst = lst
        self.name = name

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        self.progress_json(jevent.progress().json())

    def progress_json(self, text: str) -> None:
        """Hand a progress event's JSON to the listener when it is of a query named `name`."""
        p = json.loads(text)
        if p.get("name") == self.name:
            self.lst.progress(p)

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        self.lst.terminated(str(jevent.runId().toString()))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]  # noqa: RUF012


def _make_listener(spark: Any, lst: _Listener, name: str) -> Any:
    """A Spark listener handing the progress of the queries named `name` and every termination to `lst`.

    Through Spark Connect the client delivers events as JSON to the Python methods; on a classic
    session pyspark asks the listener for its Java side (`_jlistener`), which is `_JavaListener`.
    """
    from pyspark.sql.streaming import StreamingQueryListener

    java = _JavaListener(lst, name)

    class L(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            java.progress_json(event.progress.json)

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            lst.terminated(str(event.runId))

        @property
        def _jlistener(self) -> Any:
            jl = self.__dict__.get("_lean")
            if jl is None:
                jvm = spark.sparkContext._jvm  # noqa: SLF001
                jl = self.__dict__["_lean"] = jvm.PythonStreamingQueryListenerWrapper(java)
            return jl

    ours = L()
    spark.streams.addListener(ours)
    return ours


def _remove_listeners(spark: Any, query: Any, lst: _Listener, ours: Any, theirs: Any) -> None:
    """Remove this run's listeners; on Spark Connect only once the query's end was delivered.

    pyspark's Connect client can deadlock in `removeListener` (Spark 4.3, seen after a
    query failed): removing the last listener holds the listener bus's lock while it
    joins the event thread, which waits for that lock to post an event still in flight
    (the query's termination). So the removal waits (10 s at most) until that event has
    reached `lst`; after it no event of this query can come.
    """
    if theirs is not None:
        spark.streams.removeListener(theirs)  # not the last listener: no join
    if query is not None and is_connect(spark):
        deadline = time.monotonic() + 10.0
        run_id = str(query.runId)
        with lst.cond:
            while not lst.ended(run_id) and time.monotonic() < deadline:
                lst.cond.wait(0.05)
    spark.streams.removeListener(ours)


def _stop_between_batches(query: Any, timeout: float = 60.0) -> None:
    """Stop `query` between micro-batches (stopping mid-batch can fail in Spark 4.3).

    Waits until no trigger is running, or, when micro-batches run back to back (no-data
    batches for timeouts), until one just finished, and stops then.
    """
    deadline = time.monotonic() + timeout
    last = query.lastProgress
    first = last["batchId"] if last else None
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive", False):
            break
        last = query.lastProgress
        if last is not None and last["batchId"] != first:
            break
        time.sleep(0.002)
    try:
        query.stop()
    except Exception:  # noqa: BLE001,S110
        pass


@quiet_query_context()
def run_streaming(
    flow: Any,
    *,
    spark: Any = None,
    checkpoint: Optional[str] = None,
    trigger: Optional[str] = None,
    buckets: int = DEFAULT_BUCKETS,
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
        buckets: Number of state buckets `B` (fixed for a checkpoint's lifetime).
        state_layout: `"bucket"` (applyInPandasWithState, one state row per bucket: the
            fastest while the state is small) or `"key"` (transformWithStateInPandas with
            one state row per key: a micro-batch's cost follows the keys it touches, for
            large state). Fixed for a checkpoint's lifetime; default the checkpoint's
            layout, `"bucket"` for a new one. See docs/streaming.md "State layouts".
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
        explain: Print the compiled plan first.
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
    if not isinstance(buckets, int) or buckets < 1:
        msg = f"flowspark.spark.run: buckets must be a positive int; received {buckets!r}"
        raise FlowsparkTypeError(msg)
    state_ttl = ttl_arg("flowspark.spark.run", state_ttl)
    if state_layout is not None and state_layout not in LAYOUTS:
        allowed = " or ".join(map(repr, LAYOUTS))
        msg = f"flowspark.spark.run: state_layout must be {allowed}; received {state_layout!r}"
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
    from flowspark.spark.session import get_session

    if spark is None and not is_local(checkpoint):
        spark = get_session()  # its Hadoop file systems open the checkpoint
    if spark is not None:
        check_reachable(spark, checkpoint)
    timers = check_meta(checkpoint, plan.flow_id, buckets, steps, needs_timers(plan))
    layout = check_layout(checkpoint, state_layout, LAYOUTS)
    if explain:
        print(plan.render(Lowering(plan, buckets, timers, layout).stage))
    if spark is None:
        spark = get_session()
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
            "state_ttl": state_ttl,
            "carry": carry,
            "clear_outputs": clear_outputs,
        },
    )
    lst = _Listener(sr, show)
    spark_listener = _make_listener(spark, lst, f"flowspark_{plan.flow_id}")
    if listener is not None:
        spark.streams.addListener(listener)
    query = None
    try:
        query = sr.start(trigger)
        lst.started()
        _wait(sr, query, lst, trigger, timeout)
        lst.drain(query)
        if sr.connect:
            sr.deliver()  # the micro-batches committed since the last progress event
    finally:
        _remove_listeners(spark, query, lst, spark_listener, listener)
        sr.close_sinks()
    return sr


def _raise_query_error(sr: StreamingRun, e: BaseException) -> None:
    if sr._error is not None:  # noqa: SLF001
        err = sr._error  # noqa: SLF001
        raise err from err.__cause__
    dec = decode_task_error(str(e))
    if dec is not None:
        raise dec from dec.__cause__
    raise e


def _await(sr: StreamingRun, query: Any, seconds: float) -> None:
    """`query.awaitTermination(seconds)`; a failed query raises the flowspark error it carries."""
    try:
        query.awaitTermination(seconds)
    except Exception as e:  # noqa: BLE001
        _raise_query_error(sr, e)


def _deliver_new(sr: StreamingRun, query: Any, lst: _Listener, seen: list[int]) -> None:
    """Spark Connect: hand over the outbox's micro-batches once a new one reported progress.

    Runs on the waiting thread, never in the listener's callback: a Connect call made
    from inside the listener's thread can wait forever on the server (seen with Spark
    4.3: `awaitTermination` and the outbox read both hung). A sink failing here stops
    the query and raises.
    """
    if not sr.connect:
        return
    with lst.cond:
        last, rows = lst.last_batch, lst.sink_rows
        lst.sink_rows = 0
    if last <= seen[0]:
        return
    seen[0] = last
    if rows == 0:
        return  # the micro-batches since the last read wrote nothing to the outbox
    try:
        sr.deliver()
    except BaseException:
        _stop_between_batches(query)
        raise


def _slice(now: float, deadline: Optional[float], longest: float) -> float:
    """Seconds to wait: `longest`, or less when `deadline` comes first."""
    return longest if deadline is None else max(0.0, min(longest, deadline - now))


def _wait(sr: StreamingRun, query: Any, lst: _Listener, trigger: Optional[str], timeout: Optional[float]) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupted = False
    seen = [-1]  # the last micro-batch whose outputs were handed over (`_deliver_new`)
    old = None
    if threading.current_thread() is threading.main_thread():

        def on_int(_sig: int, _frm: Any) -> None:
            nonlocal interrupted
            interrupted = True

        old = signal.signal(signal.SIGINT, on_int)
    try:
        if trigger == "available_now":
            # With processing-time timeouts Spark runs no-data micro-batches forever, so the
            # query is stopped here: after the first micro-batch of this run whose sources all
            # stood at their end offsets (`caught_up`: everything available at the start was
            # read and committed; that batch also fired the notifications due in idle
            # buckets). Without timeouts the query ends by itself. The wait is on the listener's events (the
            # query is not polled: each poll is a JVM call and a progress JSON, and on two
            # cores the polling took about 1 s from a 10-micro-batch run); `isActive` is
            # asked once a second in case an event never comes.
            asked = time.monotonic()
            run_id = str(query.runId)
            while not interrupted:
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    break
                with lst.cond:
                    if not (lst.done or lst.ended(run_id)):
                        lst.cond.wait(_slice(now, deadline, 0.5))
                    done = lst.done or lst.ended(run_id)
                _deliver_new(sr, query, lst, seen)
                if done:
                    break
                if time.monotonic() - asked >= 1.0:
                    asked = time.monotonic()
                    if not query.isActive:
                        break
        else:
            while query.isActive and not interrupted:
                if deadline is not None and time.monotonic() > deadline:
                    break
                _await(sr, query, 0.2)
                _deliver_new(sr, query, lst, seen)
        if query.isActive:
            _stop_between_batches(query)
        exc = query.exception()
        if exc is not None:
            _raise_query_error(sr, exc)
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
    if interrupted:
        raise KeyboardInterrupt
