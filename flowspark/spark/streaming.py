"""Run a compiled plan as a Spark Structured Streaming query (some source is unbounded).

The plan is the batch compiler's (`compile_flow`), lowered to streaming
operations:

- source stages read a stream: `SparkSource(..., streaming=True)` through
  `spark.readStream`, and flowspark `FixedPartitionedSource`s through the Python
  data source of `flowspark.spark.pysource` (real offsets: the partitions'
  snapshots); then the batch runtime's stage function (`mapInArrow`);
- the keyed stage becomes `groupBy(bucket).applyInPandasWithState(...)` with
  `bucket = pmod(hash(key), B)`: one Python call per bucket and micro-batch. The
  bucket's state is the pickled `{key: (snapshots of the chain's logics,
  notify_at)}`. Inside the call the values of each key are sorted by sequence
  and handed to the batch runtime's per-key driver (`drive_key`), with the
  logics rebuilt from their snapshots; keys whose `notify_at` is due fire
  `on_notify` (in time order) after the data. `notify_at` becomes the bucket's
  processing-time timeout (`setTimeoutDuration(min(notify_at) - now)`), so Spark
  calls idle buckets when a key is due;
- sinks: a lone `SparkSink` is Spark's file sink (exactly-once with the
  checkpoint); any other sink, and `inspect`, go through `foreachBatch` at the
  driver (at-least-once: a micro-batch that was running when the driver died is
  written again after the restart).

`B` (`buckets`) is fixed for a checkpoint's lifetime: it is stored in
`<checkpoint>/flowspark.json` with the flow id and the stateful step ids; a
restart with another `B` or another flow is refused with `RecoveryError`.
Windowing keeps its own clock and watermark inside each key's logic, so nothing
here uses Spark's `window()` or watermarks.

Chains: consecutive stateful steps on the same key fuse into one keyed stage.
Spark rejects a second `applyInPandasWithState` in one query, so a flow with
several keyed stages (re-keyed between stateful steps) lowers every keyed stage
to `transformWithStateInPandas` (RocksDB state store) with the same bucket
driver. See docs/streaming.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark import ir
from flowspark._time import use_clock
from flowspark.errors import (
    FlowsparkCompileError,
    FlowsparkError,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    RecoveryError,
)
from flowspark.inputs import DynamicSource, FixedPartitionedSource
from flowspark.operators import never_notifies
from flowspark.spark.compiler import Plan, StagePlan, compile_flow
from flowspark.spark.inputs import SparkSource
from flowspark.spark.outputs import SparkSink
from flowspark.spark.runtime import (
    KeyedStep,
    StageSpec,
    StepFailure,
    _second,
    decode_task_error,
    dict_rows,
    drive_key,
    encode_task_error,
    idx,
    loads,
    loads_all,
    no_gc,
    not_dict_error,
    run_stage_rows,
    stage_function,
    stage_streams,
)
from flowspark.spark.runtime import _wants_notify as _wants_notify  # the batch runtime's check, shared
from flowspark.testing import TestingSource

__all__ = ["META_FILE", "StreamingRun", "compile_streaming", "run_streaming"]

#: File in the checkpoint directory recording what the checkpoint belongs to.
META_FILE = "flowspark.json"
_ROW_SCHEMA = "p int, k string, seq binary, v binary"
_STATE_SCHEMA = "blob binary"
_DEFAULT_BUCKETS = 64
_DEFAULT_INTERVAL = "500 milliseconds"
_key_seq = operator.itemgetter(0, 1)


class _Streamed(TestingSource):
    """Stands for a `FixedPartitionedSource` read through the Python data source.

    The batch compiler plans `TestingSource`s as chunk rows, which is exactly
    what `flowspark.spark.pysource` produces; this wrapper only carries the
    real source to the streaming lowering.
    """

    def __init__(self, inner: FixedPartitionedSource[Any, Any]) -> None:
        super().__init__([])
        self.inner = inner


def _streaming_flow(flow: Any) -> Any:
    """Return a copy of `flow` whose flowspark sources are marked for the Python data source."""
    from flowspark.dataflow import Dataflow

    if not isinstance(flow, Dataflow):
        msg = f"flowspark.spark needs a Dataflow; received {flow!r} of type {type(flow).__name__}"
        raise FlowsparkTypeError(msg)
    graph = flow.validate()
    nodes: list[Any] = []
    for node in graph.nodes:
        if isinstance(node, ir.Input):
            src = node.source
            if isinstance(src, FixedPartitionedSource):
                node = dataclasses.replace(node, source=_Streamed(src))
            elif isinstance(src, DynamicSource):
                msg = (
                    f"step {node.step_id!r}: source {type(src).__name__} is a DynamicSource, which has no "
                    "offsets to resume from; a streaming query needs a FixedPartitionedSource (snapshot/resume) "
                    "or SparkSource(..., streaming=True)"
                )
                raise FlowsparkCompileError(msg)
        nodes.append(node)
    proxy = Dataflow(graph.flow_id)
    proxy._nodes = nodes  # noqa: SLF001
    proxy._composites = list(graph.composites)  # noqa: SLF001
    return proxy


def is_streaming(flow: Any) -> bool:
    """Whether `flow` has an unbounded source (so it runs as a streaming query).

    Args:
        flow: A `Dataflow`.

    Returns:
        True when some input's source is not bounded.
    """
    for node in flow.graph().nodes:
        if isinstance(node, ir.Input):
            src = node.source
            if not (src.is_bounded() if hasattr(src, "is_bounded") else False):
                return True
    return False


def _depths(graph: ir.Graph) -> dict[str, int]:
    """Sequence length of every stream (the compiler's rule: source 16, +4 per map, stateful or merge)."""
    d: dict[str, int] = {}
    for node in graph.nodes:
        match node:
            case ir.Input():
                d[node.down] = 16
            case ir.FlatMapBatch() | ir.StatefulBatch():
                d[node.down] = d[node.up] + 4
            case ir.Merge():
                d[node.down] = max(d[u] for u in node.ups) + 4
            case _:
                for dn in node.downs:
                    d[dn] = d[node.ups[0]]
    return d


def compile_streaming(flow: Any) -> tuple[Plan, dict[str, int]]:
    """Compile a dataflow for a streaming query.

    Args:
        flow: The `Dataflow`.

    Returns:
        `(plan, depths)`: the batch compiler's plan of the flow (flowspark sources
        planned as chunk rows) and the sequence length of every stream.

    Raises:
        FlowsparkCompileError: The flow cannot run as a streaming query (a
            DynamicSource, or what the batch compiler refuses).
    """
    proxy = _streaming_flow(flow)
    plan = compile_flow(proxy)
    return plan, _depths(proxy.graph())


# --------------------------------------------------------------------------- bucket driver
def _notify_at(step_id: str, key: str, logic: Any) -> Optional[datetime]:
    at = logic.notify_at()
    if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
        msg = (
            f"step {step_id!r}: notify_at() must return an aware datetime "
            f"(e.g. datetime.now(timezone.utc)) or None; returned {at!r} for key {key!r}"
        )
        raise FlowsparkTypeError(msg)
    return at


class BucketDriver:
    """Runs a keyed stage for one bucket of keys (called by `applyInPandasWithState`).

    State of a bucket: `{key: (snaps, notify_at)}` pickled, where `snaps[i]` is
    `None` when step `i` has no logic for the key and `(snapshot,)` otherwise, and
    `notify_at` is the earliest `notify_at()` of the key's logics (or `None`).

    Args:
        spec: The keyed stage (its chain and the stateless ops after it).
        depth_in: Sequence length of the stage's input stream.
        clock: A function returning "now" (aware UTC datetime); default Spark's
            processing time of the micro-batch. With a clock, every bucket with a
            pending notification is visited in every micro-batch (Spark's timers
            cannot follow a foreign clock).
        sink_rows: `(sink step id, Arrow schema)` when the stage's only port feeds the
            query's lone file sink: the output is then the sink's rows (dict items
            converted as `_dict_rows` does), saving a Python pass over every item.
        timers: Whether the query has timers (timeouts); without, no step can ask for
            a notification and no timeout is set.
    """

    def __init__(
        self,
        spec: StageSpec,
        depth_in: int,
        clock: Optional[Callable[[], datetime]] = None,
        sink_rows: Optional[tuple[str, Any]] = None,
        timers: bool = True,
    ) -> None:
        """Describe the stage."""
        self.spec = spec
        self.steps: tuple[KeyedStep, ...] = spec.chain
        self.depth_in = depth_in
        self.clock = clock
        self.sink_rows = sink_rows
        self.timers = timers

    # -- state codec ----------------------------------------------------------
    def _logics(self, key: str, snaps: Optional[list[Any]]) -> list[Any]:
        if snaps is None:
            return [None] * len(self.steps)
        out: list[Any] = []
        for step, s in zip(self.steps, snaps, strict=True):
            if s is None:
                out.append(None)
            else:
                try:
                    out.append(step.builder(s[0]))
                except Exception as e:
                    raise StepFailure(step.step_id, e) from e
        return out

    def _freeze(self, key: str, logics: list[Any]) -> Optional[tuple[list[Any], Optional[datetime]]]:
        snaps: list[Any] = []
        at: Optional[datetime] = None
        for step, logic in zip(self.steps, logics, strict=True):
            if logic is None:
                snaps.append(None)
                continue
            try:
                snaps.append((logic.snapshot(),))
                if _wants_notify(logic):
                    a = _notify_at(step.step_id, key, logic)
                    if a is not None and (at is None or a < at):
                        at = a
            except StepFailure:
                raise
            except Exception as e:
                raise StepFailure(step.step_id, e) from e
        if all(s is None for s in snaps):
            return None
        return snaps, at

    # -- one call -------------------------------------------------------------
    def process(
        self, table: dict[str, Any], rows: list[tuple[str, bytes, bytes]], now: datetime
    ) -> list[tuple[bytes, Any]]:
        """Process one bucket's rows of a micro-batch and its due notifications.

        Args:
            table: The bucket's state (`{key: (snaps, notify_at)}`), updated in place.
            rows: `(key, sequence, pickled (key, value))` rows, in any order.
            now: The time of the micro-batch.

        Returns:
            `(sequence, (key, value))` emits of the chain's last step, in order.

        Raises:
            StepFailure: A user callable failed.
        """
        out: list[tuple[bytes, Any]] = []
        rows.sort(key=_key_seq)
        keys = [r[0] for r in rows]
        seqs = [r[1] for r in rows]
        vals = loads_all([r[2] for r in rows])
        if not self.spec.input_value_only:
            vals = list(map(_second, vals))
        i = 0
        for key, run in itertools.groupby(keys):
            j = i + len(list(run))
            items = list(zip(seqs[i:j], vals[i:j], strict=True))
            i = j
            ent = table.get(key)
            logics = self._logics(key, ent[0] if ent else None)
            emits, logics = drive_key(key, items, self.steps, logics, now=now, eof=False)
            out.extend([(s, (key, w)) for s, w in emits])
            self._store(table, key, logics)
        due = sorted((ent[1], key) for key, ent in table.items() if ent[1] is not None and ent[1] <= now)
        for rank, (_at, key) in enumerate(due):
            self._fire(table, key, rank, now, out)
        return out

    def _store(self, table: dict[str, Any], key: str, logics: list[Any]) -> None:
        frozen = self._freeze(key, logics)
        if frozen is None:
            table.pop(key, None)
        else:
            table[key] = frozen

    def _fire(self, table: dict[str, Any], key: str, rank: int, now: datetime, out: list[tuple[bytes, Any]]) -> None:
        logics = self._logics(key, table[key][0])
        for i, step in enumerate(self.steps):
            logic = logics[i]
            if logic is None or not _wants_notify(logic):
                continue
            prefix = b"\xff" * (self.depth_in + 4 * i - 4) + idx(rank)
            emits: list[tuple[bytes, Any]] = []
            last: Optional[datetime] = None
            n = 0
            try:
                while logic is not None:
                    at = _notify_at(step.step_id, key, logic)
                    if at is None or at > now or at == last:
                        break
                    last = at
                    res = logic.on_notify()
                    if type(res) is not tuple or len(res) != 2:
                        msg = (
                            f"step {step.step_id!r}: on_notify() must return a 2-tuple (emits, discard) such as "
                            f"`([x], StatefulLogic.RETAIN)`; returned {res!r} for key {key!r}"
                        )
                        raise FlowsparkTypeError(msg)
                    for w in res[0]:
                        emits.append((prefix + idx(n), w))
                        n += 1
                    if res[1]:
                        logic = None
            except StepFailure:
                raise
            except Exception as e:
                raise StepFailure(step.step_id, e) from e
            logics[i] = logic
            rest = self.steps[i + 1 :]
            if rest and emits:
                emits, tail = drive_key(key, emits, rest, logics[i + 1 :], now=now, eof=False)
                logics[i + 1 :] = tail
            out.extend([(s, (key, w)) for s, w in emits])
        self._store(table, key, logics)

    def now(self, spark_ms: Callable[[], int]) -> datetime:
        """The time of the micro-batch: the injected clock, else Spark's processing time.

        Args:
            spark_ms: Reads Spark's processing time of the batch in ms (a query without
                timers may not have one: the wall clock is used then).

        Returns:
            An aware UTC datetime.
        """
        if self.clock is not None:
            return self.clock()
        try:
            ms = spark_ms()
        except Exception:  # noqa: BLE001
            ms = -1
        if ms is None or ms <= 0:
            return datetime.now(timezone.utc)
        return datetime.fromtimestamp(ms / 1000, timezone.utc)

    def timeout_ms(self, table: dict[str, Any], now: datetime) -> Optional[int]:
        """Return the bucket's timeout duration: until its earliest notification.

        Args:
            table: The bucket's state.
            now: The time of the micro-batch.

        Returns:
            Milliseconds (at least 1), or `None` when no key waits for a notification.
        """
        ats = [ent[1] for ent in table.values() if ent[1] is not None]
        if not ats:
            return None
        if self.clock is not None:
            return 1
        return max(1, int((min(ats) - now) / timedelta(milliseconds=1)))

    def call(self, blob: Optional[bytes], pdfs: Iterator[Any], now: datetime) -> tuple[Any, dict[str, Any]]:
        """Run one bucket's micro-batch: decode state, process rows and due keys, encode output.

        Args:
            blob: The bucket's pickled state, or `None`.
            pdfs: pandas DataFrames of `(k, seq, v)` rows.
            now: The time of the micro-batch.

        Returns:
            `(output DataFrame or None, new state table)`.
        """
        import pandas as pd

        table: dict[str, Any] = pickle.loads(blob) if blob is not None else {}  # noqa: S301
        rows: list[tuple[str, bytes, bytes]] = []
        for pdf in pdfs:
            rows.extend(zip(pdf["k"].tolist(), pdf["seq"].tolist(), pdf["v"].tolist(), strict=True))
        # Tick rows (key NULL, see pysource.TickDataSource) only make the micro-batch run.
        rows = [r for r in rows if r[0] is not None]
        # The emits are not sorted here: whatever reads them sorts by sequence (sinks at the
        # driver, the next keyed stage), and the stateless ops after the chain work item by item.
        try:
            with use_clock(lambda: now), no_gc():
                emits = self.process(table, rows, now)
                if self.sink_rows is not None:
                    return self._sink_frame(emits), table
                cols = run_stage_rows(self.spec, emits)
        except StepFailure as f:
            raise RuntimeError(encode_task_error(f)) from None
        out = pd.DataFrame({"p": cols[0], "k": cols[1], "seq": cols[2], "v": cols[3]}) if cols[0] else None
        return out, table

    def _sink_frame(self, emits: list[tuple[bytes, Any]]) -> Any:
        """The stage's items as rows of the lone file sink's schema (see `sink_rows`)."""
        assert self.sink_rows is not None
        step_id, arrow_schema = self.sink_rows
        items = [x for _s, x in stage_streams(self.spec, emits).get(self.spec.ports[0].stream, ())]
        return dict_rows(step_id, items, arrow_schema).to_pandas() if items else None

    def pandas_function(self) -> Callable[[Any, Iterator[Any], Any], Iterator[Any]]:
        """Build the function `applyInPandasWithState` calls.

        Returns:
            `fn(key, pdfs, state)` yielding pandas DataFrames `(p, k, seq, v)`.
        """
        driver = self

        def fn(_bucket: Any, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
            now = driver.now(state.getCurrentProcessingTimeMs)
            out, table = driver.call(state.get[0] if state.exists else None, pdfs, now)
            if table:
                state.update((pickle.dumps(table, protocol=5),))
                ms = driver.timeout_ms(table, now) if driver.timers else None
                if ms is not None:
                    state.setTimeoutDuration(ms)
            elif state.exists:
                state.remove()
            if out is not None:
                yield out

        return fn

    def processor(self) -> Any:
        """Build the `StatefulProcessor` for `transformWithStateInPandas` (keyed stages after the first).

        Returns:
            The processor.
        """
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        driver = self

        class BucketProcessor(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.handle = handle
                self.state = handle.getValueState("blob", _STATE_SCHEMA)

            def _run(self, pdfs: Iterator[Any], timer_values: Any) -> Iterator[Any]:
                now = driver.now(timer_values.getCurrentProcessingTimeInMs)
                blob = self.state.get()[0] if self.state.exists() else None
                out, table = driver.call(blob, pdfs, now)
                if driver.timers:
                    for t in list(self.handle.listTimers()):
                        self.handle.deleteTimer(t)
                if table:
                    self.state.update((pickle.dumps(table, protocol=5),))
                    ms = driver.timeout_ms(table, now) if driver.timers else None
                    if ms is not None:
                        self.handle.registerTimer(int(now.timestamp() * 1000) + ms)
                else:
                    self.state.clear()
                if out is not None:
                    yield out

            def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
                yield from self._run(rows, timerValues)

            def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:  # noqa: N802,N803
                yield from self._run(iter(()), timerValues)

            def close(self) -> None:
                pass

        return BucketProcessor()


# --------------------------------------------------------------------------- query
def _check_meta(checkpoint: str, flow_id: str, buckets: int, steps: list[str], timers: bool = True) -> bool:
    """Create or check `<checkpoint>/flowspark.json`; return whether the query runs with timers.

    `timers` is what this flow needs (`False` when no stateful step can ask for a
    notification). A checkpoint keeps the choice it was made with (the query's
    sources and timeout mode must not change across restarts); one written before
    the choice was recorded ran with timers.
    """
    path = os.path.join(checkpoint, META_FILE)
    meta = {"flow_id": flow_id, "buckets": buckets, "stateful_steps": steps, "timers": timers, "version": 1}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("flow_id") != flow_id or old.get("stateful_steps") != steps:
            msg = (
                f"checkpoint {checkpoint!r} belongs to dataflow {old.get('flow_id')!r} with stateful steps "
                f"{old.get('stateful_steps')}; this is dataflow {flow_id!r} with {steps}; use another checkpoint "
                "directory (or delete this one to start over)"
            )
            raise RecoveryError(msg)
        if old.get("buckets") != buckets:
            msg = (
                f"checkpoint {checkpoint!r} was written with buckets={old.get('buckets')}; received "
                f"buckets={buckets}; the bucket count is fixed for a checkpoint's lifetime (keys would land "
                "in other buckets and lose their state): pass the old value or start a new checkpoint"
            )
            raise RecoveryError(msg)
        old_timers = old.get("timers", True)
        if timers and not old_timers:
            msg = (
                f"checkpoint {checkpoint!r} was written by a query without timers (no stateful step could ask "
                "for a notification); this flow's stateful steps can; start a new checkpoint"
            )
            raise RecoveryError(msg)
        return bool(old_timers)
    os.makedirs(checkpoint, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(meta, f)
    os.replace(tmp, path)
    return timers


def _per_call_stage(
    spec: StageSpec, clock: Optional[Callable[[], datetime]]
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A stage function whose logical `now` is read when each task starts."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        now = clock() if clock is not None else datetime.now(timezone.utc)
        yield from stage_function(spec, now)(batches)

    return fn


def _progress_line(p: Any) -> str:
    state_rows = sum(int(op.get("numRowsTotal", 0)) for op in (p.get("stateOperators") or []))
    wm = (p.get("eventTime") or {}).get("watermark", "-")
    rate = p.get("processedRowsPerSecond") or 0.0
    return (
        f"[flowspark] batch {p.get('batchId')}: {p.get('numInputRows', 0)} input rows, "
        f"{rate:.0f} rows/s, state rows {state_rows}, watermark {wm}"
    )


class StreamingRun:
    """A running (or finished) streaming query of a dataflow.

    Built by `run_streaming`; `query` is the Spark `StreamingQuery`.
    """

    def __init__(self, plan: Plan, depths: dict[str, int], spark: Any, options: dict[str, Any]) -> None:
        """Prepare the query (nothing starts until `start`)."""
        self.plan = plan
        self.depths = depths
        self.spark = spark
        self.checkpoint: str = options["checkpoint"]
        self.buckets: int = options["buckets"]
        self.clock: Optional[Callable[[], datetime]] = options.get("clock")
        self.max_items: int = options["max_items"]
        self.timers: bool = options.get("timers", True)
        self.progress: Optional[Callable[[str], None]] = options.get("progress")
        self.dfs: dict[int, Any] = {}
        self.query: Any = None
        self.batches = 0
        self._sink_parts: dict[str, Any] = {}
        self._error: Optional[BaseException] = None
        self._nodes: list[Any] = []
        self._sink_struct: Any = None
        self._sink_fused_stage: Optional[int] = None

    # -- building ---------------------------------------------------------------
    def port_df(self, stage: int, port: int, pad: bytes = b"") -> Any:
        """Return the `(k, seq, v)` rows of one port of a stage (with `pad` appended to `seq`)."""
        from pyspark.sql import functions as F  # noqa: N812

        df = self.dfs[stage].filter(F.col("p") == port)
        seq = F.concat(F.col("seq"), F.lit(pad)) if pad else F.col("seq")
        return df.select(F.col("k"), seq.alias("seq"), F.col("v"))

    def source_df(self, st: StagePlan) -> Any:
        """Return the streaming DataFrame a source stage reads."""
        spec = st.spec
        src = st.source
        if isinstance(src, SparkSource):
            try:
                return src.load(self.spark)
            except FlowsparkError:
                raise
            except Exception as e:
                raise FlowsparkRuntimeError(spec.source_step, f"step {spec.source_step!r}: {e}") from e
        from flowspark.spark import pysource

        pysource.register(self.spark)
        inner = src.inner if isinstance(src, _Streamed) else src
        opts = pysource.stream_options(
            spec.source_step,
            inner,
            spec.source_index,
            self.max_items,
            stage=spec,
            clock=self.clock,
            tasks=self.spark.sparkContext.defaultParallelism,
        )
        return self.spark.readStream.format(pysource.FORMAT).options(**opts).load()

    def build(self) -> Any:
        """Build every stage's streaming DataFrame; return the last one."""
        from pyspark.sql import functions as F  # noqa: N812

        n_keyed = sum(1 for st in self.plan.stages if st.kind == "keyed")
        if n_keyed > 1:
            # Spark rejects a second applyInPandasWithState in one query: every keyed stage then
            # uses transformWithStateInPandas, which needs the RocksDB state store.
            self.spark.conf.set(
                "spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
            )
        for st in self.plan.stages:
            spec = st.spec
            if st.kind == "source":
                df = self.source_df(st)
                if isinstance(st.source, SparkSource):
                    df = df.mapInArrow(_per_call_stage(spec, self.clock), _ROW_SCHEMA)
                # else: the Python data source runs the source stage inside its read
            else:
                ins = [self.port_df(s, p, pad) for s, p, pad in st.inputs]
                df = ins[0]
                for other in ins[1:]:
                    df = df.union(other)
                if st.kind == "keyed":
                    from flowspark.spark import pysource

                    if self.timers:
                        # Timers need a micro-batch even when no data arrives (after a restart).
                        pysource.register(self.spark)
                        df = df.union(self.spark.readStream.format(pysource.TICK_FORMAT).load())
                    up = self.plan_entry_depth(st)
                    sink_rows = self._fused_sink(spec)
                    out_schema = _ROW_SCHEMA if sink_rows is None else self._sink_struct
                    driver = BucketDriver(spec, up, self.clock, sink_rows, self.timers)
                    df = df.withColumn("bucket", F.pmod(F.hash("k"), F.lit(self.buckets)))
                    if n_keyed == 1:
                        df = df.groupBy("bucket").applyInPandasWithState(
                            driver.pandas_function(),
                            out_schema,
                            _STATE_SCHEMA,
                            "append",
                            "ProcessingTimeTimeout" if self.timers else "NoTimeout",
                        )
                    else:
                        df = df.groupBy("bucket").transformWithStateInPandas(
                            driver.processor(), out_schema, "Append", "ProcessingTime" if self.timers else "None"
                        )
                else:
                    df = df.mapInArrow(_per_call_stage(spec, self.clock), _ROW_SCHEMA)
            self.dfs[spec.stage_id] = df
        return df

    def _fused_sink(self, spec: StageSpec) -> Optional[tuple[str, Any]]:
        """`(step id, Arrow schema)` when this keyed stage can write the lone file sink's rows itself.

        That is when the stage's only port is the port of the query's lone `SparkSink`,
        which has a schema of atomic columns (pandas carries them unchanged).
        """
        lone = self._lone_file_sink()
        if lone is None or lone.port != (spec.stage_id, 0) or len(spec.ports) != 1:
            return None
        sink: SparkSink = lone.sink
        if sink.schema is None or sink.format == "table":
            return None
        struct, arrow_schema = _sink_schema(sink.schema)
        if not _atomic(struct):
            return None
        self._sink_struct = struct
        self._sink_fused_stage = spec.stage_id
        return lone.step_id, arrow_schema

    def plan_entry_depth(self, st: StagePlan) -> int:
        """Sequence length of a keyed stage's input (the stream its first step reads)."""
        first = st.spec.chain[0].step_id
        for node in self._graph_nodes():
            if isinstance(node, ir.StatefulBatch) and node.step_id == first:
                return self.depths[node.up]
        raise AssertionError(first)

    def _graph_nodes(self) -> list[Any]:
        return self._nodes

    # -- sinks ------------------------------------------------------------------
    def _lone_file_sink(self) -> Optional[Any]:
        sinks = self.plan.sinks
        if len(sinks) == 1 and sinks[0].where == "native" and not self.plan.inspects:
            return sinks[0]
        return None

    def start(self, trigger: Optional[str]) -> Any:
        """Build the query and start it with `trigger`; return the `StreamingQuery`."""
        from pyspark.sql import functions as F  # noqa: N812

        self.build()
        qchk = os.path.join(self.checkpoint, "query")
        lone = self._lone_file_sink()
        if lone is not None:
            sink: SparkSink = lone.sink
            if sink.schema is None:
                msg = (
                    f"step {lone.step_id!r}: a streaming SparkSink needs a schema (a streaming query cannot "
                    "look at the rows first); pass schema='a STRING, b LONG'"
                )
                raise FlowsparkCompileError(msg)
            if sink.format == "table":
                msg = f"step {lone.step_id!r}: a streaming SparkSink writes files; use parquet, json, csv or orc"
                raise FlowsparkCompileError(msg)
            if self._sink_fused_stage == lone.port[0]:
                rows = self.dfs[lone.port[0]]  # the keyed stage already wrote the sink's rows
            else:
                rows = _dict_rows(self.spark, self.port_df(*lone.port), lone.step_id, sink.schema)
            if sink.format == "kafka":
                w = rows.writeStream.format("kafka").outputMode("append")
            else:
                w = rows.writeStream.format(sink.format).option("path", sink.path).outputMode("append")
            if sink.options:
                w = w.options(**sink.options)
            if sink.partition_by:
                w = w.partitionBy(*sink.partition_by)
        else:
            ports = sorted({sk.port for sk in self.plan.sinks} | {ins.port for ins in self.plan.inspects})
            parts = [
                self.dfs[s].filter(F.col("p") == p).select(F.lit(s).alias("st"), "p", "seq", "v") for s, p in ports
            ]
            out = parts[0]
            for other in parts[1:]:
                out = out.union(other)
            self._open_sinks()
            w = out.writeStream.foreachBatch(self._foreach_batch)
        w = w.option("checkpointLocation", qchk).queryName(f"flowspark_{self.plan.flow_id}")
        if trigger == "available_now":
            w = w.trigger(availableNow=True)
        else:
            w = w.trigger(processingTime=trigger or _DEFAULT_INTERVAL)
        try:
            self.query = w.start()
        except Exception as e:
            from flowspark.spark.kafka import _missing_jar

            err = _missing_jar(e)
            if err is not None:
                raise err from e
            raise
        return self.query

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

    def _foreach_batch(self, df: Any, batch_id: int) -> None:
        import pyarrow.compute as pc

        try:
            table = df.toArrow()
        except Exception as e:
            err = decode_task_error(str(e))
            self._error = err if err is not None else e
            raise
        if table.num_rows:
            order = pc.sort_indices(table, sort_keys=[("seq", "ascending"), ("st", "ascending"), ("p", "ascending")])
            table = table.take(order)
        sts = table.column("st").to_pylist()
        ps = table.column("p").to_pylist()
        vs = table.column("v").to_pylist()
        by_port: dict[tuple[int, int], list[Any]] = {}
        for s, p, v in zip(sts, ps, vs, strict=True):
            by_port.setdefault((s, p), []).append(loads(v))
        try:
            for ins in self.plan.inspects:
                for item in by_port.get(ins.port, []):
                    ins.inspector(ins.step_id, item, batch_id + 1, 0)
            for sk in self.plan.sinks:
                items = by_port.get(sk.port)
                if items:
                    self._write(sk, items, batch_id)
        except FlowsparkError as e:
            self._error = e
            raise
        except Exception as e:
            self._error = _fail(getattr(e, "step_id", "sink"), e)
            raise

    def _write(self, sk: Any, items: list[Any], batch_id: int) -> None:
        try:
            if sk.where in ("driver", "dynamic"):
                self._sink_parts[sk.step_id].write_batch(items)
            elif sk.where == "fixed":
                keys, parts = self._sink_parts[sk.step_id]
                routed: dict[int, list[Any]] = {}
                for kv in items:
                    if type(kv) is not tuple or len(kv) != 2 or not isinstance(kv[0], str):
                        msg = (
                            f"step {sk.step_id!r}: {type(sk.sink).__name__} is partitioned and needs "
                            f"`(str key, value)` items; received {kv!r}; add `op.key_on` before the output"
                        )
                        raise FlowsparkTypeError(msg)
                    routed.setdefault(sk.sink.part_fn(kv[0]) % len(keys), []).append(kv[1])
                for i in sorted(routed):
                    parts[i].write_batch(routed[i])
            else:
                bad = next((x for x in items if not isinstance(x, dict)), None)
                if bad is not None:
                    raise not_dict_error(sk.step_id, bad)
                sink = sk.sink
                if sink.format == "kafka":
                    sink.write(self.spark.createDataFrame(items, sink.schema))
                    return
                w = self.spark.createDataFrame(items, sink.schema).write.mode("append")
                if sink.options:
                    w = w.options(**sink.options)
                w.format(sink.format).save(sink.path)
        except FlowsparkError:
            raise
        except Exception as e:
            raise _fail(sk.step_id, e) from e

    def close_sinks(self) -> None:
        """Close the sink partitions opened at the driver."""
        for part in self._sink_parts.values():
            for p in part[1] if isinstance(part, tuple) else [part]:
                try:
                    p.close()
                except Exception:  # noqa: BLE001,S110
                    pass
        self._sink_parts = {}


def _fail(step_id: str, ex: BaseException) -> FlowsparkRuntimeError:
    if isinstance(ex, FlowsparkRuntimeError):
        return ex
    err = FlowsparkRuntimeError(step_id, f"error in step {step_id!r}: {type(ex).__name__}: {ex}")
    err.__cause__ = ex
    return err


def _sink_schema(schema: Any) -> tuple[Any, Any]:
    """`(StructType, Arrow schema)` of a SparkSink's schema (DDL string or StructType)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    st = StructType.fromDDL(schema) if isinstance(schema, str) else schema
    return st, to_arrow_schema(st)  # type: ignore[arg-type]


def _atomic(st: Any) -> bool:
    """Whether every field of a StructType is atomic (pandas round-trips it unchanged)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    return all(not isinstance(f.dataType, (ArrayType, MapType, StructType)) for f in st.fields)


def _dict_rows(spark: Any, df: Any, step_id: str, schema: Any) -> Any:
    """Turn (k, seq, v) rows whose items are dicts into rows of `schema`."""
    st, arrow_schema = _sink_schema(schema)

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        try:
            for b in batches:
                items = loads_all(b.column(2).to_pylist())
                if items:
                    yield dict_rows(step_id, items, arrow_schema)
        except StepFailure as f:
            raise RuntimeError(encode_task_error(f)) from None

    return df.mapInArrow(fn, st)


class _Listener:
    """Prints the progress line and counts finished micro-batches of this run's query."""

    def __init__(self, run: StreamingRun, show: Optional[Callable[[str], None]]) -> None:
        self.run = run
        self.show = show
        self.cond = threading.Condition()
        self.last_batch = -1
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
            self.show(_progress_line(p))
        with self.cond:
            self.run.batches += 1
            self.last_batch = max(self.last_batch, int(p.get("batchId", -1)))
            self.cond.notify_all()

    def drain(self, query: Any, timeout: float = 10.0) -> None:
        """Wait until the progress of the query's last micro-batch was delivered (events are asynchronous)."""
        last = query.lastProgress
        if last is None:
            return
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.last_batch < last["batchId"] and time.monotonic() < deadline:
                self.cond.wait(0.05)


def _make_listener(spark: Any, on_progress: Callable[[dict[str, Any]], None], name: str) -> Any:
    from pyspark.sql.streaming import StreamingQueryListener

    class L(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            p = json.loads(event.progress.json)
            if p.get("name") == name:
                on_progress(p)

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            pass

    lst = L()
    spark.streams.addListener(lst)
    return lst


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


def run_streaming(
    flow: Any,
    *,
    spark: Any = None,
    checkpoint: Optional[str] = None,
    trigger: Optional[str] = None,
    buckets: int = _DEFAULT_BUCKETS,
    max_items: int = 100_000,
    clock: Optional[Callable[[], datetime]] = None,
    progress: Any = True,
    listener: Any = None,
    timeout: Optional[float] = None,
    explain: bool = False,
) -> StreamingRun:
    """Run a dataflow with unbounded sources as a Structured Streaming query.

    Args:
        flow: The `Dataflow`.
        spark: The SparkSession; default the active one or a new local one.
        checkpoint: Directory for the query's offsets and state (required). A second
            run with the same directory continues where the first stopped.
        trigger: `None`: run until stopped (Ctrl-C stops between micro-batches), one
            micro-batch every 500 ms at most; `"available_now"`: process what is
            there, fire due notifications, return; or an interval like `"5 seconds"`.
        buckets: Number of state buckets `B` (fixed for a checkpoint's lifetime).
        max_items: Most items read from one flowspark source partition per micro-batch.
        clock: Function returning "now" (aware UTC) in the workers (must be picklable);
            default Spark's processing time of each micro-batch.
        progress: `True` prints one line per micro-batch, a callable receives the
            line instead, `False` prints nothing.
        listener: A `pyspark.sql.streaming.StreamingQueryListener` to attach too.
        timeout: Stop after this many seconds (between micro-batches); default never
            (or, with `"available_now"`, when everything is processed).
        explain: Print the compiled plan first.

    Returns:
        The finished `StreamingRun` (its `query` holds Spark's progress reports).

    Raises:
        FlowsparkRuntimeError: A user callable failed in the query.
        FlowsparkCompileError: The flow cannot run as a streaming query.
        RecoveryError: The checkpoint belongs to another flow or bucket count.
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
    from flowspark.spark.session import ship_user_modules

    ship_user_modules()
    plan, depths = compile_streaming(flow)
    if explain:
        print(plan)
    steps = [ks.step_id for st in plan.stages for ks in st.spec.chain]
    needs_timers = not all(never_notifies(ks.builder) for st in plan.stages for ks in st.spec.chain)
    timers = _check_meta(checkpoint, plan.flow_id, buckets, steps, needs_timers)
    if spark is None:
        from flowspark.spark.session import get_session

        spark = get_session()
    show: Optional[Callable[[str], None]]
    if progress is True:
        show = print
    elif callable(progress):
        show = progress
    else:
        show = None
    sr = StreamingRun(
        plan,
        depths,
        spark,
        {"checkpoint": checkpoint, "buckets": buckets, "clock": clock, "max_items": max_items, "timers": timers},
    )
    sr._nodes = list(_streaming_flow(flow).graph().nodes)  # noqa: SLF001
    lst = _Listener(sr, show)
    spark_listener = _make_listener(spark, lst.progress, f"flowspark_{plan.flow_id}")
    if listener is not None:
        spark.streams.addListener(listener)
    try:
        query = sr.start(trigger)
        lst.started()
        _wait(sr, query, lst, trigger, timeout)
        lst.drain(query)
    finally:
        spark.streams.removeListener(spark_listener)
        if listener is not None:
            spark.streams.removeListener(listener)
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


def _wait(sr: StreamingRun, query: Any, lst: _Listener, trigger: Optional[str], timeout: Optional[float]) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupted = False
    old = None
    if threading.current_thread() is threading.main_thread():

        def on_int(_sig: int, _frm: Any) -> None:
            nonlocal interrupted
            interrupted = True

        old = signal.signal(signal.SIGINT, on_int)
    try:
        if trigger == "available_now":
            # With processing-time timeouts Spark runs no-data micro-batches forever, so the
            # query is stopped here: after the first micro-batch that read no rows (all data
            # read; that batch also fired the notifications due in idle buckets).
            while query.isActive and not interrupted:
                last = query.lastProgress
                if last is not None and last["numInputRows"] == 0:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    break
                _await(sr, query, 0.05)
        else:
            while query.isActive and not interrupted:
                if deadline is not None and time.monotonic() > deadline:
                    break
                _await(sr, query, 0.2)
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
        **options: Options of `flowspark.spark.batch.run` (bounded flows) or
            `run_streaming` (unbounded flows).

    Returns:
        The `StreamingRun` of an unbounded flow; `None` for a batch run.

    Raises:
        FlowsparkTypeError: `checkpoint`/`trigger` given for a bounded flow, or a bad argument.
    """
    from flowspark.dataflow import Dataflow
    from flowspark.spark import batch

    if isinstance(flow, Dataflow) and is_streaming(flow):
        return run_streaming(flow, spark=spark, checkpoint=checkpoint, trigger=trigger, **options)
    if trigger is not None:
        msg = (
            f"flowspark.spark.run: trigger={trigger!r} applies to flows with an unbounded source; every "
            "source of this flow is bounded, so it runs as a batch job (drop `trigger`)"
        )
        raise FlowsparkTypeError(msg)
    batch.run(flow, spark=spark, **options)
    return None
