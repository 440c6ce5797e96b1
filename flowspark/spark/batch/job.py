"""The batch lowering: run a compiled plan as Spark batch jobs (every source bounded).

Each stage is one `mapInArrow` (`flowspark.spark.worker.stage.stage_function`): a
source stage reads its source (items shipped from the driver in chunks, one
Spark partition per source partition, or a Spark DataFrame); a keyed stage
first `repartition`s its input by key and `sortWithinPartitions(k, seq)`, so the
per-key driver sees each key's values in order with a fixed logical `now`.
`flowspark.spark.batch.describe.describe_stage` says so for each stage (`print(plan)`, `flowspark plan --spark`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark._args import ttl_arg
from flowspark.deadletter import dead_letter_arg
from flowspark.errors import (
    FlowsparkCompileError,
    FlowsparkError,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    step_error,
)
from flowspark.outputs import part_of
from flowspark.spark.batch.describe import describe_stage
from flowspark.spark.batch.driverprefix import driver_prefix
from flowspark.spark.batch.native import Aggregates, pair_rows, python_pass, sample_first_rows
from flowspark.spark.compat import to_arrow
from flowspark.spark.io.columns import (
    ID_COLUMN,
    column_kinds,
    driver_rows,
    head_sample,
    port_code,
    port_rows,
    port_rows_of,
    ports_in_sequence,
    prefix_sample,
    stage_inputs,
    union_all,
)
from flowspark.spark.io.inputs import load_rows
from flowspark.spark.io.outputs import infer_schema, write_rows
from flowspark.spark.plan.types import Plan, SinkPlan, StagePlan
from flowspark.spark.rules.concurrent import stage_reads
from flowspark.spark.rules.lowerings import check_bounded
from flowspark.spark.rules.optimizer import Env, optimize
from flowspark.spark.rules.switches import rules_arg
from flowspark.spark.session import default_parallelism, is_connect, quiet_query_context
from flowspark.spark.worker.codec import (
    chunk_bounds,
    decode_task_error,
    dumps,
    encode_task_error,
    loads,
    loads_arrow,
    source_seq,
)
from flowspark.spark.worker.rows import RowSchema, row_schema
from flowspark.spark.worker.stage import dict_rows, no_gc, stage_function, task_gc

__all__ = ["build_dataframes", "check_bounded", "run_plan"]

_log = logging.getLogger("flowspark.spark")
_ROW_SCHEMA = "p int, k string, seq binary, v binary"
_IN_SCHEMA = "k string, seq binary, v binary"


def _fail(step_id: str, ex: BaseException) -> FlowsparkRuntimeError:
    return step_error(step_id, ex)


def _action(fn: Callable[[], Any]) -> Any:
    """Run a Spark action; turn a user error inside a task into a FlowsparkRuntimeError."""
    try:
        return fn()
    except FlowsparkError:
        raise
    except Exception as e:
        err = decode_task_error(str(e))
        if err is None:
            raise
        cause = err.__cause__
    raise err from cause


class _Job:
    def __init__(self, plan: Plan, spark: Any, now: datetime, partitions: int, chunk_size: int) -> None:
        self.plan = plan
        self.spark = spark
        self.now = now
        self.partitions = partitions
        self.chunk_size = chunk_size
        self.parallelism = default_parallelism(spark)
        self.connect = is_connect(spark)
        self.dfs: dict[int, Any] = {}
        self.persisted: list[Any] = []
        self.loaded: dict[int, Any] = {}
        #: Each stage's input DataFrame and whether Spark keyed it (`ColumnKey`).
        self.inputs: dict[int, tuple[Any, bool]] = {}
        #: With a dead letter: `(seq, v)` DataFrames of the items native sinks refused, and the writer.
        self.misfits: list[Any] = []
        #: With a dead letter: `(seq, v)` DataFrames of the SparkSources' malformed rows (`load_rows`).
        self.malformed: list[Any] = []
        self.dead: Any = None
        #: The keyed stages Spark keys itself (the rule `spark_keys`), each with its source DataFrame.
        self.keyed_by_spark: dict[int, Any] = {}
        #: The aggregates of the stages Spark aggregates (the rule `native_reduction`).
        self.aggregates = Aggregates(plan)
        #: The run allows float reductions as Spark aggregates (`run_plan(float_reductions=...)`).
        self.float_reductions = False

    def optimize(self, rules: tuple[frozenset[str], str]) -> Plan:
        """Decide every rule for this job (`flowspark.spark.rules.optimizer`); the job then runs the physical plan.

        Args:
            rules: The rules switched on and how they were asked for (`rules_arg`).

        Returns:
            The physical plan.
        """
        columns = {
            st.spec.stage_id: column_kinds(self.source_df(st))
            for st in self.plan.stages
            if st.spec.source == "native" and st.bounded
        }
        env = Env(
            "batch",
            *rules,
            connect=self.connect,
            columns=columns,
            float_reductions=self.float_reductions,
            time_zone=self.spark.conf.get("spark.sql.session.timeZone"),
        )
        self.plan = optimize(self.plan, env)
        self.aggregates = Aggregates(self.plan)
        self.keyed_by_spark = {
            st.spec.stage_id: self.loaded[st.spec.column_key.source_stage]
            for st in self.plan.stages
            if st.spec.column_key is not None
        }
        return self.plan

    # -- building DataFrames ------------------------------------------------
    def column_key_input(self, st: StagePlan, df: Any) -> Any:

        key = _key_col(st)
        return _positioned(df).repartition(self.partitions, key).sortWithinPartitions(key, ID_COLUMN)

    def build(self, persist: bool = True) -> None:
        """Build every stage's DataFrame (`persist=False`: build only, run no job, as `flowspark plan` does).

        In a run, a stage whose DataFrame nobody reads gets none (a source stage Spark aggregates,
        a stage writing its sink's rows itself); `persist=False` builds every one, for the plan tools.
        """
        column_keys = self.keyed_by_spark
        uses = stage_reads(self.plan)  # a stage read twice is persisted and materialized
        for st in self.plan.stages:
            sid = st.spec.stage_id
            if "keyed_by_spark" in st.spec.modes:
                continue
            agg = st.spec.native
            native = agg and self.aggregates.input(sid, agg, self.loaded[agg.source_stage], self.persisted, persist)
            if sid in column_keys:
                self.inputs[sid] = (self.column_key_input(st, column_keys[sid]), True)
            elif native is not None:
                self.inputs[sid] = (native, False)
            else:
                self.plan, st = python_pass(self.plan, st)
                for s, _p, _pad in st.inputs:
                    if s not in self.dfs:  # unread until this stage fell back to its Python pass
                        self.stage_df(self.plan.stages[s], 1, persist)
                self.inputs[sid] = (self.stage_input(st), False)
            if persist and not uses.get(sid, 0):
                continue  # nobody reads the stage's DataFrame (its sink's rows come from its input)
            self.stage_df(st, uses.get(sid, 0), persist)

    def stage_df(self, st: StagePlan, uses: int, persist: bool) -> None:
        """Stage `st`'s DataFrame from its input (`self.inputs`): persisted and materialized when read twice."""
        from pyspark import StorageLevel

        inp, column_key = self.inputs[st.spec.stage_id]
        df = inp.mapInArrow(stage_function(st.spec, self.now, column_key=column_key), _ROW_SCHEMA)
        if persist and uses > 1:
            df = df.persist(StorageLevel.MEMORY_AND_DISK)
            self.persisted.append(df)
            _action(df.count)
        self.dfs[st.spec.stage_id] = df

    def port_df(self, stage: int, port: int, pad: bytes = b"") -> Any:
        return port_rows(self.dfs[stage], port, pad)

    def stage_input(self, st: StagePlan) -> Any:
        if st.kind == "source":
            return self.source_df(st)
        df = stage_inputs(self.dfs, st.inputs)
        if st.kind == "keyed":
            df = df.repartition(self.partitions, "k").sortWithinPartitions("k", "seq")
        return df

    def rows_df(self, rows: Sequence[tuple[Optional[str], bytes, bytes]]) -> Any:
        """One row per Spark partition (a source partition each), built without a SparkContext.

        `spark.range(0, n, 1, n)` puts exactly one number in each of `n` partitions; a
        small Arrow pass turns number i into row i (the rows travel in the function).
        """
        if not rows:
            return self.spark.createDataFrame([], _IN_SCHEMA)
        return self.spark.range(0, len(rows), 1, len(rows)).mapInArrow(_pick_rows(list(rows)), _IN_SCHEMA)

    def chunks_df(self, rows: Sequence[tuple[Optional[str], bytes, bytes]]) -> Any:
        """Chunks of items as a DataFrame: through Arrow (no Python worker), `parallelism` partitions."""
        if not rows:
            return self.spark.createDataFrame([], _IN_SCHEMA)
        import pandas as pd

        pdf = pd.DataFrame({"k": [r[0] for r in rows], "seq": [r[1] for r in rows], "v": [r[2] for r in rows]})
        df = self.spark.createDataFrame(pdf, _IN_SCHEMA)
        n = min(len(rows), self.parallelism)
        return df if not self.connect and df.rdd.getNumPartitions() == n else df.repartition(n)

    def source_df(self, st: StagePlan) -> Any:
        spec = st.spec
        sid = spec.source_step
        src = st.source
        si = spec.source_index
        if spec.source == "native":
            if spec.stage_id not in self.loaded:
                try:
                    df, bad = load_rows(src, self.spark, sid, self.plan.dead_letter is not None)
                except FlowsparkCompileError:
                    raise  # names the step and the fix already (a session without Delta)
                except Exception as e:
                    raise _fail(sid, e) from e
                self.loaded[spec.stage_id] = df
                if bad is not None:
                    self.malformed.append(bad.select("seq", "v"))
            return self.loaded[spec.stage_id]
        if spec.source == "chunks":
            items = src.driver_items(sid)
            size = max(1, min(self.chunk_size, math.ceil(len(items) / (2 * self.parallelism)) or 1))
            rows = []
            for start, end, act, off in chunk_bounds(len(items), size, spec.per_batch, src.driver_cuts(sid)):
                try:
                    blob = dumps(items[start:end])
                except Exception as e:
                    raise _fail(sid, e) from e
                rows.append((None, source_seq(si, 0, act, off), blob))
            return self.chunks_df(rows)
        try:
            from flowspark.inputs import FixedPartitionedSource

            if isinstance(src, FixedPartitionedSource):
                keys = list(src.list_parts())
                rows = [(None, source_seq(si, i, 0), dumps((src, key, None))) for i, key in enumerate(keys)]
            else:
                n = self.parallelism
                rows = [(None, source_seq(si, i, 0), dumps((src, None, n))) for i in range(n)]
        except FlowsparkError:
            raise
        except Exception as e:
            raise _fail(sid, e) from e
        return self.rows_df(rows)

    # -- sinks ----------------------------------------------------------------
    def run_sinks(self) -> None:
        together = [sk for sk in self.plan.sinks if "concurrent_sinks" in sk.modes]
        for sk in self.plan.sinks:
            if sk.where == "dynamic":
                self.write_dynamic(sk)
            elif sk.where == "fixed":
                self.write_fixed(sk)
            elif "concurrent_sinks" in sk.modes:
                if sk is together[0]:
                    self.write_together(together)
            elif sk.where == "native":
                self.write_native(sk)
        self.collect_driver()
        if self.plan.dead_letter is not None:
            self.write_dead_letter()

    def write_dead_letter(self) -> None:
        """Collect every stage's dead-letter rows (and the sinks' misfits) and write them, in sequence order."""
        import pyarrow.compute as pc
        from pyspark.sql import functions as F  # noqa: N812

        from flowspark.deadletter import dead_letter_step
        from flowspark.spark.io.outputs import SparkDeadLetters

        parts = [
            self.dfs[s].filter(F.col("p") == p).select("seq", "v") for s, p in self.plan.dead_ports() if s in self.dfs
        ]
        parts.extend(self.misfits)
        parts.extend(self.malformed)
        df = union_all(parts)
        table = _action(lambda: to_arrow(df))
        if table.num_rows:
            table = table.take(pc.sort_indices(table, sort_keys=[("seq", "ascending")]))
        rows = loads_arrow(table.column("v"))
        self.dead = SparkDeadLetters(self.spark, self.plan.dead_letter, dead_letter_step(self.plan.flow_id), False)
        self.dead.write(rows, 0)
        self.dead.close()
        if rows:
            _log.warning("flowspark: %d item(s) went to the dead letter %r", len(rows), self.plan.dead_letter)

    def write_dynamic(self, sk: SinkPlan) -> None:
        df = self.port_df(*sk.port)
        if self.connect:  # no `rdd` to count partitions: give the sink a known number of them
            count = self.parallelism
            df = df.repartition(count)
        else:
            count = df.rdd.getNumPartitions()
        fn = _dynamic_writer(sk.step_id, sk.sink, count)
        _action(lambda: df.sortWithinPartitions("seq").mapInArrow(fn, "n long").collect())

    def write_fixed(self, sk: SinkPlan) -> None:
        from pyspark.sql import functions as F  # noqa: N812

        try:
            keys = list(sk.sink.list_parts())
        except Exception as e:
            raise _fail(sk.step_id, e) from e
        if not keys:
            msg = f"step {sk.step_id!r}: sink {type(sk.sink).__name__}.list_parts() returned no partitions"
            raise FlowsparkCompileError(msg)
        routed = self.port_df(*sk.port).mapInArrow(
            _router(sk.step_id, sk.sink, len(keys)), "pi int, seq binary, v binary"
        )
        n = min(len(keys), max(self.partitions, 1))
        df = routed.repartition(n, F.col("pi")).sortWithinPartitions("pi", "seq")
        fn = _fixed_writer(sk.step_id, sk.sink, keys)
        _action(lambda: df.mapInArrow(fn, "n long").collect())

    def write_together(self, sinks: list[SinkPlan]) -> None:
        """Write SparkSinks as concurrent Spark jobs, one driver thread each (the rule `concurrent_sinks`).

        Their rows are built first, one sink after the other (a sink without a schema infers it
        from a sample: driver-side jobs). Every write is waited for, also when one fails; then the
        first failure in sink order is raised (each names its sink's step, as `write_rows` does).
        """
        from concurrent.futures import ThreadPoolExecutor

        writes = [(sk, rows) for sk in sinks if (rows := self.native_rows(sk)) is not None]
        if len(writes) < 2:
            for sk, rows in writes:
                write_rows(sk.step_id, sk.sink, rows)
            return
        with ThreadPoolExecutor(max_workers=len(writes), thread_name_prefix="flowspark-sink") as pool:
            futures = [pool.submit(write_rows, sk.step_id, sk.sink, rows) for sk, rows in writes]
        # Leaving the `with` waited for every write.
        for f in futures:
            err = f.exception()
            if err is not None:
                raise err

    def write_native(self, sk: SinkPlan) -> None:
        rows = self.native_rows(sk)
        if rows is not None:
            write_rows(sk.step_id, sk.sink, rows)

    def native_rows(self, sk: SinkPlan) -> Any:
        """The DataFrame of a Spark-written sink's rows (`None`: nothing to write), its schema inferred if need be."""
        schema = sk.sink.schema
        dead_letter = self.plan.dead_letter is not None
        fused = "sink_fusion" in sk.modes
        df = None if fused else self.port_df(*sk.port)
        if schema is None and fused:
            sample = self.sample(sk, 100)
            if not sample:
                return None
            schema = infer_schema(self.spark, sk.step_id, sample)
        elif schema is None:
            assert df is not None
            # Inferred from the first 100 items of the stage's output, which is persisted
            # and materialized first (`stage_reads`): stopping a Python stage after 100 items
            # would leave a broken-pipe trace from its worker on the console.
            sample = [loads(r.v) for r in _action(lambda: df.select("v").limit(100).collect())]
            if dead_letter:
                sample = [x for x in sample if isinstance(x, dict)]  # the others go to the dead letter
            if not sample:
                if dead_letter:
                    self.misfits.append(df.mapInArrow(_misfits(sk.step_id, None), "seq binary, v binary"))
                return None
            schema = infer_schema(self.spark, sk.step_id, sample)
        rows_schema = row_schema(self.spark, sk.step_id, schema)
        stage = sk.port[0]
        native = "native_rows" in sk.modes and pair_rows(
            self.plan.stages[stage], self.inputs[stage][0], rows_schema.struct
        )
        if native:
            rows = native  # the aggregate's columns, renamed: no Python pass
        elif fused:
            # One pass: the stage itself emits the sink's rows as typed columns.
            inp, column_key = self.inputs[stage]
            fn = stage_function(
                self.plan.stages[stage].spec, self.now, column_key=column_key, sink=(sk.step_id, rows_schema)
            )
            rows = inp.mapInArrow(fn, rows_schema.struct)
        else:
            assert df is not None
            rows = df.mapInArrow(_to_rows(sk.step_id, rows_schema, dead_letter), rows_schema.struct)
            if dead_letter:
                self.misfits.append(df.mapInArrow(_misfits(sk.step_id, rows_schema), "seq binary, v binary"))
        return rows

    def sample(self, sk: SinkPlan, n: int) -> list[Any]:
        """The first `n` items of a sink's port, in partition order, from a job that stops early.

        Each partition's task stops once the port gave `n` items, and stops cleanly: a job
        cut short by `limit` leaves a broken-pipe trace from its Python worker on the console.
        A Spark-keyed stage first tries its first keys alone (`first_keys_sample`).
        """
        stage, port = sk.port
        inp, column_key = self.inputs[stage]
        fn = stage_function(self.plan.stages[stage].spec, self.now, column_key=column_key, sample=(port, n))
        first = self.aggregates.first_rows(stage) if "aggregate_sample" in sk.modes else None
        if first is not None:
            got = sample_first_rows(fn, first, n, _action)
            if got is not None:
                return got
        if stage in self.keyed_by_spark and "prefix_sample" in sk.modes:
            ck = self.plan.stages[stage].spec.column_key
            assert ck is not None
            df = self.keyed_by_spark[stage]
            read = (lambda t: driver_prefix(df, t, ID_COLUMN)) if "driver_prefix" in sk.modes else None
            got = prefix_sample(_positioned(df), ck.column, fn, n, _action, read)
            if got is not None:
                return got
        if stage in self.keyed_by_spark:
            got = self.first_keys_sample(self.plan.stages[stage], fn, n)
            if got is not None:
                return got
        rows = _action(lambda: inp.mapInArrow(fn, "v binary").collect())
        return [loads(r.v) for r in rows[:n]]

    def first_keys_sample(self, st: StagePlan, fn: Callable[[Iterator[Any]], Iterator[Any]], n: int) -> Any:
        """The first `n` items of a Spark-keyed stage's port from the first rows of its partition 0 (`head_sample`).

        `None` when they give too few items, or a key is null (the full sampling job then runs).
        """
        from pyspark.sql import functions as F  # noqa: N812

        key = _key_col(st)
        part0 = _positioned(self.keyed_by_spark[st.spec.stage_id]).filter(
            F.pmod(F.hash(key), F.lit(self.partitions)) == 0
        )
        return head_sample(part0.orderBy(key, ID_COLUMN), st.spec.column_key.column, fn, n, _action)  # type: ignore[union-attr]

    def collect_driver(self) -> None:
        """Read the ports of the driver's sinks and `inspect` steps (one job), and hand their items over in order."""
        import numpy as np

        inspects: dict[tuple[int, int], list[Any]] = {}
        for ins in self.plan.inspects:
            inspects.setdefault(ins.port, []).append(ins)
        driver_sinks = [sk for sk in self.plan.sinks if sk.where == "driver"]
        ports = {*inspects, *(sk.port for sk in driver_sinks)}
        if not ports:
            return
        codes, items = ports_in_sequence(_action(lambda: to_arrow(driver_rows(self.dfs, sorted(ports)))))
        by_code = {port_code(*port): hs for port, hs in inspects.items()}
        if by_code:  # inspectors see the items of every port they read in sequence order, interleaved
            for i in np.flatnonzero(np.isin(codes, list(by_code))).tolist():
                for h in by_code[int(codes[i])]:
                    try:
                        h.inspector(h.step_id, items[i], 1, 0)
                    except Exception as e:
                        raise _fail(h.step_id, e) from e
        for sk in driver_sinks:
            batch = port_rows_of(codes, items, *sk.port)
            try:
                part = sk.sink.build(sk.step_id, 0, 1)
                if batch:
                    part.write_batch(batch)
                part.close()
            except Exception as e:
                raise _fail(sk.step_id, e) from e

    def close(self) -> None:
        for df in self.persisted:
            try:
                df.unpersist()
            except Exception:  # noqa: BLE001,S110
                pass


def _key_col(st: StagePlan) -> Any:
    """The key column of a Spark-keyed stage (`ColumnKey`) as a Spark column."""
    from pyspark.sql import functions as F  # noqa: N812

    ck = st.spec.column_key
    assert ck is not None
    return F.col("`" + ck.column.replace("`", "``") + "`")


def _positioned(df: Any) -> Any:
    """A source DataFrame with each row's position first (`ID_COLUMN`, the sequence of `position_seqs`)."""
    from pyspark.sql import functions as F  # noqa: N812

    return df.select(F.monotonically_increasing_id().alias(ID_COLUMN), "*")


def _guard(step_id: str, body: Callable[[Iterator[Any]], Iterator[Any]]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        try:
            with task_gc():
                yield from body(batches)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(encode_task_error(_fail(step_id, e))) from None

    return fn


def _dynamic_writer(step_id: str, sink: Any, count: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def body(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = sink.build(step_id, ctx.partitionId() if ctx else 0, count)
        n = 0
        try:
            for b in batches:
                items = [loads(v) for v in b.column(2).to_pylist()]
                if items:
                    part.write_batch(items)
                n += len(items)
        finally:
            part.close()
        yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})

    return _guard(step_id, body)


def _router(step_id: str, sink: Any, n: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def body(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for b in batches:
            pis: list[int] = []
            vs: list[bytes] = []
            for v in b.column(2).to_pylist():
                kv = loads(v)
                pis.append(part_of(step_id, sink, kv, n))
                vs.append(dumps(kv[1]))
            yield pa.RecordBatch.from_arrays(
                [pa.array(pis, pa.int32()), b.column(1), pa.array(vs, pa.binary())], names=["pi", "seq", "v"]
            )

    return _guard(step_id, body)


def _fixed_writer(step_id: str, sink: Any, keys: list[str]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def body(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        parts: dict[int, Any] = {}
        n = 0
        try:
            for b in batches:
                pis = b.column(0).to_pylist()
                vs = b.column(2).to_pylist()
                i = 0
                while i < len(pis):
                    pi = pis[i]
                    j = i
                    while j < len(pis) and pis[j] == pi:
                        j += 1
                    part = parts.get(pi)
                    if part is None:
                        part = parts[pi] = sink.build_part(step_id, keys[pi], None)
                    part.write_batch([loads(v) for v in vs[i:j]])
                    n += j - i
                    i = j
        finally:
            for part in parts.values():
                part.close()
        yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})

    return _guard(step_id, body)


def _pick_rows(rows: list[tuple[Optional[str], bytes, bytes]]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """`id` rows of `spark.range` -> `rows[id]` as `(k, seq, v)` rows (see `_Job.rows_df`)."""

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for b in batches:
            picked = [rows[i] for i in b.column(0).to_pylist()]
            if picked:
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([r[0] for r in picked], pa.string()),
                        pa.array([r[1] for r in picked], pa.binary()),
                        pa.array([r[2] for r in picked], pa.binary()),
                    ],
                    names=["k", "seq", "v"],
                )

    return fn


def _to_rows(step_id: str, rows: RowSchema, skip_misfits: bool = False) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Port rows -> the sink's rows; with `skip_misfits`, items that do not fit are left out (see `_misfits`)."""

    def body(batches: Iterator[Any]) -> Iterator[Any]:
        for b in batches:
            items = loads_arrow(b.column(2))
            if items:
                yield dict_rows(step_id, items, rows, [] if skip_misfits else None)

    return _guard(step_id, body)


def _misfits(step_id: str, rows: Optional[RowSchema]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Port rows -> `(seq, pickled dead-letter record)` of the items a `SparkSink` cannot write.

    `rows` `None`: no item could give a schema (none is a dict): every item is refused.
    """

    def body(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for b in batches:
            items = loads_arrow(b.column(2))
            dead: list[Any] = []
            if rows is None:
                from flowspark.deadletter import record
                from flowspark.spark.worker.stage import not_dict_error

                dead = [(i, record(step_id, not_dict_error(step_id, x), x)) for i, x in enumerate(items)]
            elif items:
                dict_rows(step_id, items, rows, dead)
            if dead:
                seqs = b.column(1).to_pylist()
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array([seqs[i] for i, _r in dead], pa.binary()),
                        pa.array([dumps(r) for _i, r in dead], pa.binary()),
                    ],
                    names=["seq", "v"],
                )

    return _guard(step_id, body)


@quiet_query_context()
def build_dataframes(plan: Plan, spark: Any, rules: tuple[frozenset[str], str]) -> tuple[Plan, dict[int, Any]]:
    """Optimize `plan` and build each stage's DataFrame as a run would, running no job.

    (What a `SparkSource` needs to infer its schema aside.) For `flowspark plan --spark`
    and `flowspark.spark.tools.physical_plans`: what is shown is what runs.

    Args:
        plan: The plain plan (`compile_flow`).
        spark: The SparkSession.
        rules: The rules switched on (`flowspark.spark.rules.switches.rules_arg`).

    Returns:
        `(physical plan, {stage id: DataFrame})`; a stage whose steps run in the keyed stage
        reading it (the rule `spark_keys`) has no DataFrame of its own.
    """
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 2)
    job = _Job(plan, spark, datetime.now(timezone.utc), partitions, 20_000)
    physical = job.optimize(rules)
    job.build(persist=False)
    return physical, dict(job.dfs)


def run_plan(
    plan: Plan,
    *,
    spark: Any = None,
    start_time: Optional[datetime] = None,
    partitions: Optional[int] = None,
    chunk_size: int = 20_000,
    explain: bool = False,
    state_ttl: Optional[timedelta] = None,
    dead_letter: Any = None,
    progress: Any = True,  # noqa: ARG001
    rules: Any = None,
    float_reductions: bool = False,
) -> None:
    """Run a compiled plan on Spark as batch jobs; return when it is done.

    Every source must be bounded. Items for `TestingSink` and `StdOutSink` and
    everything `inspect` sees are collected to the driver and handed over there in
    sequence order (the in-memory executor's order for each source partition, and
    per key exactly).

    Args:
        plan: The plan (`compile_flow`).
        spark: The SparkSession to use; default the active one, or a new local one
            (`flowspark.spark.session.get_session`).
        start_time: The logical "now" of the run (aware datetime): `utc_now()` returns it
            in every step and notifications due at or before it fire (see docs/spark.md);
            default the wall-clock time when the job starts.
        partitions: Spark partitions of keyed stages; default `spark.sql.shuffle.partitions`.
        chunk_size: `TestingSource` items per chunk shipped from the driver.
        explain: Print the physical plan before running: each stage, sink and what every
            rule decided for it (`flowspark.spark.rules.optimizer`).
        state_ttl: Checked and accepted as on the other runtimes, but a batch job
            processes every item at one logical time (`start_time`), so no key is ever
            idle and nothing expires (as with `run_main(clock="fixed")`).
        dead_letter: Where items a step cannot take go instead of failing the job
            (`flowspark.deadletter`): a `DeadLetterDir(path)` or a directory path (parquet,
            `batch_id=0`), a `SparkSink`, `ForeachBatchSink` or a sink written at the driver
            (`TestingSink`). Costs: each stage's output is persisted, and a `SparkSink` is
            written by a pass of its own (see docs/spark.md "Dead letter").
        progress: Accepted as `run_streaming` takes it, so `flowspark.spark.run` takes the same
            arguments for any flow; progress lines are a stream's output (one per micro-batch):
            a batch job prints none, whatever the value.
        rules: Which fast paths may apply (`flowspark.spark.rules.switches.rules_arg`): `"all"`,
            `"none"` or `"-NAME,-NAME"`; default the environment variable `FLOWSPARK_RULES`,
            else all. Every rule gives the same output as `"none"`.
        float_reductions: Let the rule `native_reduction` compute sums, maxima and minima of
            float columns as Spark aggregates: a sum may differ in its last bits (Spark adds in
            another order), and NaN and -0.0 may compare otherwise than in Python (docs/spark.md).

    Raises:
        FlowsparkRuntimeError: A user callable failed (names the step, carries the
            original exception's type and message, chains it when it could be unpickled).
        FlowsparkCompileError: The flow cannot run on Spark.
        FlowsparkTypeError: A bad argument.

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> out = []
        >>> nums = op.input("inp", flow, TestingSource([1, 2]))
        >>> op.output("out", op.map("inc", nums, lambda x: x + 1), TestingSink(out))
        >>> from flowspark.spark.plan.compiler import compile_flow
        >>> run_plan(compile_flow(flow.validate()))  # doctest: +SKIP
        >>> out  # doctest: +SKIP
        [2, 3]
    """
    from flowspark.spark.session import ensure_workers, ship_user_modules

    ttl_arg("flowspark.spark.run", state_ttl)
    chosen = rules_arg(rules)
    plan = plan.with_dead_letter(dead_letter_arg("flowspark.spark.run", dead_letter))
    ship_user_modules()
    if start_time is None:
        start_time = datetime.now(timezone.utc)
    if not isinstance(start_time, datetime) or start_time.tzinfo is None:
        msg = f"flowspark.spark.run: start_time must be an aware datetime; received {start_time!r}"
        raise FlowsparkTypeError(msg)
    if spark is None:
        from flowspark.spark.io.classpath import session_conf
        from flowspark.spark.session import get_session

        spark = get_session(new_conf=lambda: session_conf(plan))  # Kafka's or Delta's jars, Delta's settings
    ensure_workers(spark)
    if partitions is None:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 2)
    job = _Job(plan, spark, start_time, partitions, chunk_size)
    if not isinstance(float_reductions, bool):
        msg = f"flowspark.spark.run: float_reductions must be True or False; received {float_reductions!r}"
        raise FlowsparkTypeError(msg)
    job.float_reductions = float_reductions
    try:
        with no_gc():  # the driver pickles and unpickles items in bulk too
            plan = job.optimize(chosen)
            check_bounded(plan)
            if explain:
                print(plan.render(describe_stage))
            job.build()
            job.run_sinks()
    finally:
        job.close()
