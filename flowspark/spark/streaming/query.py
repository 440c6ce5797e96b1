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
from datetime import datetime, timedelta
from typing import Any, Callable, Optional

from flowspark.deadletter import DeadLetterDir, record
from flowspark.errors import (
    FlowsparkError,
    FlowsparkRuntimeError,
    step_error,
)
from flowspark.outputs import route_to_parts
from flowspark.spark.compat import from_arrow, to_arrow
from flowspark.spark.io.columns import (
    ID_COLUMN,
    column_kinds,
    driver_rows,
    port_rows,
    port_rows_of,
    ports_in_sequence,
    stage_inputs,
)
from flowspark.spark.io.inputs import SparkSource, load_rows
from flowspark.spark.io.outputs import SparkSink, infer_schema, write_rows
from flowspark.spark.plan.types import DEAD_PORT, Plan, SinkPlan, StagePlan, StageSpec
from flowspark.spark.rules.optimizer import Env, optimize, shape_choices
from flowspark.spark.session import default_parallelism, is_connect
from flowspark.spark.streaming.checkpoint import (
    check_flag,
    check_sink_log,
    load_counts,
    pin_schema,
    pinned_schemas,
    recorded_flag,
    save_counts,
)
from flowspark.spark.streaming.ckfs import is_local
from flowspark.spark.streaming.deadletter import (
    MalformedRows,
    clear_uncommitted,
    delta_sink_written,
    file_sink_written,
    keep_in_dir,
    keep_in_driver,
    split_dead,
    write_task_rows,
)
from flowspark.spark.streaming.frames import atomic_fields, file_rows, number_rows, per_call_stage, sink_rows
from flowspark.spark.streaming.lowering import Lowering, lone_native_sink, spark_writer_sink
from flowspark.spark.streaming.outbox import Outbox
from flowspark.spark.streaming.routing import (
    ROUTE,
    TICK_ROUTE,
    Route,
    routed_stage_function,
    routes,
)
from flowspark.spark.streaming.state import (
    FILE_COLUMN,
    ROW_COLUMN,
    STATE_SCHEMA,
    BucketDriver,
    LatestCounts,
)
from flowspark.spark.worker.codec import decode_task_error, loads
from flowspark.spark.worker.rows import RowSchema, row_schema
from flowspark.spark.worker.stage import dict_rows, not_dict_error, run_stage_rows

__all__ = ["ROW_SCHEMA", "StreamingRun"]

ROW_SCHEMA = "p int, k string, seq binary, v binary"
_DEFAULT_INTERVAL = "500 milliseconds"


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
        self.layout: str = options["layout"]
        #: A key or chunk layout query in time mode "None" (`checkpoint.check_untimed`).
        self.untimed: bool = bool(options.get("untimed", False))
        #: Ticks from Spark's `rate-micro-batch` source instead of the Python tick source
        #: (`checkpoint.RATE_TICKS`).
        self.rate_ticks: bool = bool(options.get("rate_ticks", False))
        self.state_ttl: Optional[timedelta] = options.get("state_ttl")
        self.progress: Optional[Callable[[str], None]] = options.get("progress")
        #: Empty a file sink's directory that holds another query's log instead of refusing it.
        self.clear_outputs: bool = bool(options.get("clear_outputs", False))
        self.dfs: dict[int, Any] = {}
        self.query: Any = None
        self.batches = 0
        self._sink_parts: dict[str, Any] = {}
        self._error: Optional[BaseException] = None
        self.lowering = Lowering(plan, self.buckets, self.timers, self.layout, self.untimed)
        self.routes = routes(plan) if self.lowering.routed else None
        self._sink_struct: Any = None
        self._sink_fused_stage: Optional[int] = None
        self._schemas: dict[str, Any] = {}  # StructTypes of native sinks given no schema (pinned)
        self._counts: Any = None  # accumulator of the state counts (state.LatestCounts)
        self._time_columns: dict[int, tuple[str, ...]] = {}  # Spark-keyed stage -> its TIMESTAMP columns
        #: The rules switched on and how they were asked for (`flowspark.spark.rules.switches.rules_arg`).
        self.rules: tuple[frozenset[str], str] = options["rules"]
        #: The SparkSource stages' streaming DataFrames, read once (`source_df`).
        self._sources: dict[int, Any] = {}
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
        return port_rows(self.dfs[stage], port, pad)

    def source_df(self, st: StagePlan, order: bool = False) -> Any:
        """Return the streaming DataFrame a source stage reads (`order`: see `_ordered_sources`)."""
        spec = st.spec
        src = st.source
        if isinstance(src, SparkSource):
            if spec.stage_id in self._sources:
                return self._sources[spec.stage_id]
            try:
                keep = self._keep_malformed(spec.stage_id)
                df = load_rows(src, self.spark, spec.source_step, keep is not None, keep)[0]
            except FlowsparkError:
                raise
            except Exception as e:
                raise FlowsparkRuntimeError(spec.source_step, f"step {spec.source_step!r}: {e}") from e
            self._sources[spec.stage_id] = df
            return df
        from flowspark.spark.io import pysource

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

    def _keyed(self, df: Any, spec: StageSpec, route: Optional[Route] = None, column_key: bool = False) -> Any:
        """Lower a keyed stage over `df` (with a `bucket` column) to the stateful operator."""
        driver = self._driver(spec, route, column_key)
        if column_key:
            driver.time_columns = self._time_columns.get(spec.stage_id, ())
            driver.time_zone = self.spark.conf.get("spark.sql.session.timeZone")
        out_schema = ROW_SCHEMA if driver.sink_rows is None else self._sink_struct
        mode = self.lowering.time_mode
        if self.layout in ("key", "chunk"):
            # Processing time unless untimed: Spark's TTL of the MapState rows (state_ttl) needs
            # it, and a checkpoint's time mode cannot change between runs.
            proc = driver.key_processor if self.layout == "key" else driver.chunk_processor
            return df.groupBy("bucket").transformWithStateInPandas(
                proc(self.state_ttl, mode == "ProcessingTime"), out_schema, "Append", mode
            )
        if not self.lowering.chained:
            return df.groupBy("bucket").applyInPandasWithState(
                driver.pandas_function(),
                out_schema,
                STATE_SCHEMA,
                "append",
                "ProcessingTimeTimeout" if self.timers else "NoTimeout",
            )
        return df.groupBy("bucket").transformWithStateInPandas(driver.processor(), out_schema, "Append", mode)

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

        if self.rate_ticks:
            # One row per micro-batch (one with available_now), as the tick source gives.
            rate = self.spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 1).load()
            ticks = rate.select(
                F.lit(None).cast("string").alias("k"),
                F.lit(b"").cast("binary").alias("seq"),
                F.lit(b"").cast("binary").alias("v"),
            )
        else:
            from flowspark.spark.io import pysource

            pysource.register(self.spark, self.carry)
            ticks = self.spark.readStream.format(pysource.TICK_FORMAT).load()
        if "p" in columns:
            ticks = ticks.select(F.lit(TICK_ROUTE).cast("int").alias("p"), "k", "seq", "v")
        return ticks

    def _source_rows(self, st: StagePlan, order: bool = False) -> Any:
        df = self.source_df(st, order)
        if isinstance(st.source, SparkSource):
            df = df.mapInArrow(per_call_stage(st.spec, self.clock), ROW_SCHEMA)
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
        self.optimize()
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
                chain = chain.mapInArrow(fn, ROW_SCHEMA)
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

    def optimize(self) -> Plan:
        """Decide every rule for this query (`flowspark.spark.rules.optimizer`); the run then follows the physical plan.

        A shape rule (`spark_keys`) keeps what the checkpoint started with: a new checkpoint
        records this run's choice, and a later run may not switch it off.

        Returns:
            The physical plan.

        Raises:
            RecoveryError: A shape rule the checkpoint was started with is switched off.
        """
        from flowspark.errors import RecoveryError
        from flowspark.spark.rules.optimizer import RULES

        if self.plan.decisions:
            return self.plan
        natives = [st for st in self.plan.stages if isinstance(st.source, SparkSource)]
        dfs = {st.spec.stage_id: self.source_df(st) for st in natives}
        writer = self._spark_writer_sink()
        atomic: frozenset[str] = frozenset()
        if writer is not None and atomic_fields(row_schema(self.spark, writer.step_id, writer.sink.schema).struct):
            atomic = frozenset({writer.step_id})
        recorded = {}
        for rule in RULES:
            if rule.shape:
                flag = recorded_flag(self.checkpoint, rule.name)
                if flag is None:
                    continue
                if flag and rule.name not in self.rules[0]:
                    msg = (
                        f"checkpoint {self.checkpoint!r} was started with the rule {rule.name!r}, which changes the "
                        f"query's shape, and rules={self.rules[1]!r} switches it off; switch it on, or use a new "
                        "checkpoint to run without it"
                    )
                    raise RecoveryError(msg)
                recorded[rule.name] = flag
        env = Env(
            "streaming",
            rules=self.rules[0],
            rules_text=self.rules[1],
            connect=self.connect,
            columns={sid: column_kinds(df) for sid, df in dfs.items()},
            file_streams=frozenset(st.spec.stage_id for st in natives if file_rows(dfs[st.spec.stage_id], st.source)),
            timers=self.timers,
            routed=self.routes is not None,
            ttl=self.state_ttl is not None,
            writer_sink=None if writer is None else writer.step_id,
            atomic_sinks=atomic,
            recorded=recorded,
        )
        self.plan = optimize(self.plan, env)
        for name, applied in shape_choices(self.plan).items():
            check_flag(self.checkpoint, name, applied)
        self.lowering = Lowering(self.plan, self.buckets, self.timers, self.layout, self.untimed)
        return self.plan

    def _column_key_input(self, spec: StageSpec, df: Any, file_order: bool = False) -> Any:
        """The source's rows numbered (`ID_COLUMN`) and bucketed on the key column, plus ticks with timers.

        With `file_order`, numbered by Spark instead: `FILE_COLUMN` and `ROW_COLUMN` (see `file_rows`);
        tick rows have no `ROW_COLUMN`.
        """
        from pyspark.sql import functions as F  # noqa: N812

        ck = spec.column_key
        assert ck is not None
        from pyspark.sql.types import LongType, StructField, StructType

        key = F.col("`" + ck.column.replace("`", "``") + "`")
        if file_order:  # `_metadata` is the file source's: read before any other projection
            df = df.select(
                F.xxhash64(F.col("_metadata.file_path")).alias(FILE_COLUMN),
                F.col("_metadata.row_index").alias(ROW_COLUMN),
                "*",
            )
        df = self._times_as_micros(spec, df)
        if not file_order:
            # Spark refuses monotonically_increasing_id() on streams: the same number is added by
            # an Arrow pass-through (no row objects), so the keyed stage can order each key's rows.
            numbered = StructType([StructField(ID_COLUMN, LongType(), False), *df.schema.fields])
            df = df.mapInArrow(number_rows, numbered)
        df = df.withColumn("bucket", F.pmod(F.hash(key), F.lit(self.buckets)))
        if self.timers:
            tick = [F.pmod(F.hash(F.lit(None).cast("string")), F.lit(self.buckets)).alias("bucket")]
            if file_order:  # a file hash for ticks too: pandas would hand a column with nulls over as floats
                tick.append(F.lit(0).cast("long").alias(FILE_COLUMN))
            df = df.unionByName(self._ticks(["k", "seq", "v"]).select(*tick), allowMissingColumns=True)
        return df

    def _times_as_micros(self, spec: StageSpec, df: Any) -> Any:
        """`df` with its TIMESTAMP columns as microseconds since the epoch (LONG), for the keyed stage.

        The stateful operator hands its rows to Python as pandas frames, whose timestamps are
        naive wall-clock times in the session's time zone (ambiguous in the hour a zone sets its
        clocks back); the numbers are exact, and the bucket call turns them back into aware
        datetimes in the session's time zone (`BucketDriver.time_columns`), what a `SparkSource`'s
        timestamp column gives everywhere else.
        """
        from pyspark.sql import functions as F  # noqa: N812
        from pyspark.sql.types import TimestampType

        names = [f.name for f in df.schema.fields if isinstance(f.dataType, TimestampType)]
        self._time_columns[spec.stage_id] = tuple(names)
        if not names:
            return df

        def col(name: str) -> Any:
            c = F.col("`" + name.replace("`", "``") + "`")
            return F.unix_micros(c).alias(name) if name in names else c

        return df.select(*[col(n) for n in df.columns])

    def build(self) -> Any:
        """Build every stage's streaming DataFrame, as the physical plan says; return the last one."""
        from pyspark.sql import functions as F  # noqa: N812

        self.optimize()
        self._use_rocksdb()
        for st in self.plan.stages:
            spec = st.spec
            if "keyed_by_spark" in spec.modes:
                continue  # its rows go straight to the keyed stage (the rule spark_keys)
            if spec.column_key is not None:
                src = self.source_df(self.plan.stages[spec.column_key.source_stage])
                df = self._column_key_input(spec, src, "file_order" in spec.modes)
                df = self._keyed(df, spec, column_key=True)
            elif st.kind == "source":
                df = self._source_rows(st, "ordered_source" in spec.modes)
            else:
                df = stage_inputs(self.dfs, st.inputs)
                if st.kind == "keyed":
                    if self.timers:
                        df = df.union(self._ticks(["k", "seq", "v"]))
                    df = df.withColumn("bucket", F.pmod(F.hash("k"), F.lit(self.buckets)))
                    df = self._keyed(df, spec)
                else:
                    df = df.mapInArrow(per_call_stage(spec, self.clock), ROW_SCHEMA)
            if self.dead_dir is not None and not (st.kind == "keyed" and self._sink_fused_stage == spec.stage_id):
                df = split_dead(df, self.dead_dir, f"s{spec.stage_id}")
            self.dfs[spec.stage_id] = df
        return df

    def _fused_sink(self, spec: StageSpec) -> Optional[tuple[str, RowSchema]]:
        """`(step id, RowSchema)` when this keyed stage writes the lone file sink's rows itself (`sink_fusion`)."""
        lone = self._spark_writer_sink()
        if lone is None or lone.port != (spec.stage_id, 0) or "sink_fusion" not in lone.modes:
            return None
        rows = row_schema(self.spark, lone.step_id, lone.sink.schema)
        self._sink_struct = rows.struct
        self._sink_fused_stage = spec.stage_id
        return lone.step_id, rows

    # -- sinks ------------------------------------------------------------------
    def _lone_native_sink(self) -> Optional[SinkPlan]:
        """The query's only output when it is a Spark-native sink (`lowering.lone_native_sink`)."""
        return lone_native_sink(self.plan, self.connect)

    def _spark_writer_sink(self) -> Optional[SinkPlan]:
        """The lone native sink when Spark's own streaming writer takes its rows (`lowering.spark_writer_sink`)."""
        return spark_writer_sink(self.plan, self.connect)

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
        self._check_output_log()
        if self.dead_dir is not None:
            files = self._spark_writer_sink()
            skips = None
            if files is not None and files.sink.file_sink:
                skips = file_sink_written(files.sink.path)
            elif files is not None and files.sink.format == "delta":
                skips = delta_sink_written(files.sink.path, self.checkpoint)
            # Their micro-batches run again (unless Spark's file sink already wrote them: it skips them).
            clear_uncommitted(self.dead_dir, self.checkpoint, skips)
        last = self.build_routed() if self.routes is not None else self.build()
        qchk = os.path.join(self.checkpoint, "query")
        self._pinned()
        writer = self._spark_writer_sink()
        lone = self._lone_native_sink()
        to_table: Optional[str] = None
        if writer is not None:
            w, to_table = self._native_writer(last, writer)
        elif lone is not None:
            # A ForeachBatchSink, or a SparkSink whose schema comes from the first rows: each
            # micro-batch's rows become a DataFrame inside foreachBatch (at-least-once).
            rows_fn = functools.partial(self._foreach_rows, lone)
            w = self._port_rows(last, lone.port).writeStream.foreachBatch(rows_fn)
        else:
            w = self._driver_writer(last)
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
            from flowspark.spark.io.delta import missing_delta
            from flowspark.spark.io.kafka import missing_jar

            err = missing_jar(e)
            if err is None and writer is not None and writer.sink.format == "delta":
                err = missing_delta(e, writer.step_id)
            if err is not None:
                raise err from e
            raise
        return self.query

    def _native_writer(self, last: Any, writer: SinkPlan) -> tuple[Any, Optional[str]]:
        """Spark's own writer of the lone `SparkSink` with a schema: `(DataStreamWriter, table or None)`."""
        sink: SparkSink = writer.sink
        if self._sink_fused_stage == writer.port[0] and self.routes is None:
            rows = self.dfs[writer.port[0]]  # the keyed stage already wrote the sink's rows
        else:
            rows = sink_rows(self.spark, self._port_rows(last, writer.port), writer.step_id, sink.schema, self.dead_dir)
        to_table: Optional[str] = None
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
        return w, to_table

    def _driver_writer(self, last: Any) -> Any:
        """`foreachBatch` (or, on Spark Connect, the outbox) taking every port read at the driver."""
        from pyspark.sql import functions as F  # noqa: N812

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
            out = driver_rows(self.dfs, ports)
        self._open_sinks()
        if self.plan.dead_letter is not None and self.dead_dir is None:
            from flowspark.deadletter import dead_letter_step
            from flowspark.spark.io.outputs import SparkDeadLetters

            self.dead = SparkDeadLetters(self.spark, self.plan.dead_letter, dead_letter_step(self.plan.flow_id), True)
        if self.connect:
            return self.outbox.writer(out)
        return out.writeStream.foreachBatch(self._foreach_batch)

    def _check_output_log(self) -> None:
        """Refuse (or, with `clear_outputs`, empty) a file sink directory holding another query's log.

        Only Spark's own file sink keeps that log; on Spark Connect a URI cannot be opened from
        the client, and the server checks nothing: that case is left to the user (docs/streaming.md).
        """
        writer = self._spark_writer_sink()
        if writer is None or not writer.sink.file_sink:
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
                raise step_error(sk.step_id, e) from e

    def deliver(self) -> None:
        """Hand the outbox's committed, undelivered micro-batches to the sinks, `inspect` and the dead letter."""
        with self.outbox.lock:
            for batch_id, table in self.outbox.pending():
                self._deliver(table, batch_id)
                self.outbox.done(batch_id)

    def _foreach_batch(self, df: Any, batch_id: int) -> None:
        try:
            table = to_arrow(df)
        except Exception as e:
            err = decode_task_error(str(e))
            self._error = err if err is not None else e
            raise
        self._deliver(table, batch_id)

    def _deliver(self, table: Any, batch_id: int) -> None:
        """Hand one micro-batch's `(st, p, seq, v)` rows to the sinks, `inspect` and the dead letter, in order."""
        codes, rows = ports_in_sequence(table)
        dead: list[Any] = self._malformed_rows(batch_id) + port_rows_of(codes, rows, None, DEAD_PORT)
        try:
            for ins in self.plan.inspects:
                for item in port_rows_of(codes, rows, *ins.port):
                    ins.inspector(ins.step_id, item, batch_id + 1, 0)
            for sk in self.plan.sinks:
                items = port_rows_of(codes, rows, *sk.port)
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
            self._error = step_error(getattr(e, "step_id", "sink"), e)
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
            write_rows(sk.step_id, sk.sink, sink_rows(self.spark, df, sk.step_id, struct, self.dead_dir), batch_id)
        except FlowsparkError as e:
            self._error = e
            raise
        except Exception as e:
            err = decode_task_error(str(e))
            self._error = err if err is not None else step_error(sk.step_id, e)
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
                write_rows(sk.step_id, sk.sink, from_arrow(self.spark, table, rows.struct), batch_id)
        except FlowsparkError:
            raise
        except Exception as e:
            raise step_error(sk.step_id, e) from e

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
