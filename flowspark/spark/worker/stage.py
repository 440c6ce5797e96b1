"""What runs inside Spark's Python workers: the stage function every lowering calls.

A stage (`flowspark.spark.plan.types.StageSpec`) is one Python pass: items enter
(driver chunks, source partitions, Spark rows, or rows of earlier stages),
stateless ops run over `(sequence, item)` lists (`flowspark.spark.worker.ops`), a keyed stage drives its chain
key by key through the per-key driver (`flowspark.runtime.driver`), and the
stage's ports leave as Arrow rows `(p, k, seq, v)`. Plain Python over lists and
bytes (pyarrow only at the edges), so the batch job and the streaming query run
the same code. A user error leaves a task as the marker of
`flowspark.spark.worker.codec.encode_task_error`.
"""

from __future__ import annotations

import gc
import itertools
import operator
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Optional

from flowspark._time import use_clock
from flowspark.deadletter import record as dead_record
from flowspark.errors import FlowsparkRuntimeError, FlowsparkTypeError, step_error
from flowspark.runtime.driver import StepDriver, drive_chain
from flowspark.runtime.tags import eof_emits
from flowspark.spark.plan.types import DEAD_PORT, Op, StageSpec
from flowspark.spark.worker.aggregates import aggregated_items
from flowspark.spark.worker.codec import (
    dumps,
    dumps_all,
    encode_task_error,
    loads,
    loads_arrow,
    position_seqs,
    read_head,
    source_items,
)
from flowspark.spark.worker.ops import Dead, apply_ops, checked_keys, screen_keyed, stage_streams, through
from flowspark.spark.worker.times import arrow_rows

if TYPE_CHECKING:
    from flowspark.spark.worker.rows import RowSchema

__all__ = [
    "stage_drivers",
    "column_key_runs",
    "dead_rows",
    "dict_rows",
    "no_gc",
    "settle_worker_heap",
    "task_gc",
    "not_dict_error",
    "run_stage_rows",
    "stage_function",
]


def stage_drivers(spec: StageSpec) -> tuple[StepDriver, ...]:
    """The per-key driver of each stateful step of a keyed stage, as the physical plan says.

    Args:
        spec: A keyed stage of a physical plan (`flowspark.spark.rules.optimizer`: `regroup`,
            `eof_only` and `batch_fn` are what the rules chose).

    Returns:
        The drivers, in chain order.
    """
    return tuple(
        StepDriver(ks.step_id, ks.builder, ks.level, ks.regroup, ks.eof_only, ks.batch_fn) for ks in spec.chain
    )


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


def _fail(step_id: str, error: BaseException) -> FlowsparkRuntimeError:
    return step_error(step_id, error)


def _key_runs(batches: Iterator[Any], value_only: bool, values_only: bool = False) -> Iterator[tuple[str, list[Any]]]:
    """Group Arrow batches of `(k, seq, v)` rows sorted by (k, seq) into `(key, [(seq, value)])` runs.

    A key's rows may span batches; each key is yielded once, with all its rows. `value_only`:
    column `v` holds the values alone (`Port.value_only`); `values_only`: a run holds the
    key's values alone, without their sequences.
    """

    def columns() -> Iterator[tuple[Any, Optional[list[bytes]], list[Any]]]:
        for b in batches:
            if not b.num_rows:
                continue
            vs = loads_arrow(b.column(2))
            ss = None if values_only else b.column(1).to_pylist()
            yield b.column(0), ss, vs if value_only else list(map(_second, vs))

    return _runs(columns())


def _runs(columns: Iterator[tuple[Any, Optional[list[bytes]], list[Any]]]) -> Iterator[tuple[str, list[Any]]]:
    """Cut `(keys as an Arrow array, seqs, values)` columns, sorted by key throughout, into per-key runs.

    A run holds `(seq, value)` pairs, or the values alone when the seqs are `None`.
    """
    import pyarrow.compute as pc

    cur_key: Optional[str] = None
    buf: list[Any] = []
    for keys, ss, vs in columns:
        runs = pc.run_end_encode(keys)
        start = 0
        for key, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
            part = vs[start:end] if ss is None else list(zip(ss[start:end], vs[start:end], strict=True))
            if key != cur_key:
                if cur_key is not None:
                    if key < cur_key:  # Spark sorted the rows by key
                        msg = f"keys arrived out of order ({cur_key!r} then {key!r})"
                        raise AssertionError(msg)
                    yield cur_key, buf
                cur_key = key
                buf = part
            else:
                buf.extend(part)
            start = end
    if cur_key is not None:
        yield cur_key, buf


def column_key_runs(
    spec: StageSpec,
    batches: Iterator[Any],
    dead: Dead = None,
    sequences: bool = True,
    values_only: bool = False,
    columns_as: Optional[dict[str, Callable[[Any], list[Any]]]] = None,
) -> Iterator[tuple[str, list[Any]]]:
    """Group rows Spark keyed and sorted (`ColumnKey`) into `(key, [(seq, value)])` runs.

    Input batches: `id` (`monotonically_increasing_id`), then the source's columns,
    sorted by `(key column, id)`. Each batch's rows become dicts, run through
    the source stage's steps (their filters, the `key_on`, key-keeping steps), and the
    resulting items, still grouped by key, are cut into runs; a key's rows may span
    batches. With `dead` (a list), items those steps refuse go there (see `flowspark.spark.worker.ops.apply_ops`).
    With `sequences=False` (the caller reads no sequences: a stage writing a sink's rows,
    without a dead letter) every sequence is empty bytes; with `values_only` (which implies
    it) a run holds the key's values alone. `columns_as` gives the Python values of some columns
    (name -> function of the Arrow column) instead of Arrow's `to_pylist`.
    """
    import pyarrow as pa

    sequences = sequences and not values_only
    assert sequences or dead is None, "dead-letter entries need sequences"
    ck = spec.column_key
    assert ck is not None
    key_for = spec.chain[0].step_id
    # The `key_on` first (no filter before it): its keys are the column itself.
    key_first = ck.ops[0].key_column == ck.column and ck.ops[0].kind == "map"
    # The rule `value_mappers`: every step after it maps values alone (`map_value`): the items
    # are `(row[column], mapped row)`, computed as columns (keys as Arrow gives them, values
    # mapped in one list); the rule `value_column`: the first of them is `row[ck.value_from]`,
    # and no row dict is built at all.
    value_fns = _value_fns(ck.ops[1:]) if "value_mappers" in spec.modes else None
    value_column = ck.value_from if value_fns is not None else None

    def rows_of(b: Any) -> list[Any]:
        try:
            if not columns_as:
                return arrow_rows(pa.RecordBatch.from_arrays(b.columns[1:], names=b.schema.names[1:]))
            names = b.schema.names[1:]
            cols = [values_of(b, n) for n in names]
            return [dict(zip(names, vs)) for vs in zip(*cols)]  # noqa: B905 - columns of one batch
        except Exception as e:
            raise _fail(ck.source_step, e) from e

    def values_of(b: Any, name: str) -> list[Any]:
        col = b.column(name)
        return columns_as[name](col) if columns_as and name in columns_as else col.to_pylist()

    def columns() -> Iterator[tuple[Any, Optional[list[bytes]], list[Any]]]:
        for b in batches:
            if not b.num_rows:
                continue
            seqs = position_seqs(ck.source_index, b.column(0)) if sequences else [b""] * b.num_rows
            keys = _key_column(b, ck.column) if key_first else None
            rows: Optional[list[Any]] = None
            if keys is not None and value_fns is not None:
                if value_column is not None:
                    vs = _mapped_values(value_fns[1:], values_of(b, value_column))
                else:
                    rows = rows_of(b)
                    vs = _mapped_values(value_fns, rows)
                if vs is not None:  # else a mapper raised: the step-by-step path below raises its error
                    yield keys, None if values_only else seqs, vs
                    continue
            if rows is None:
                rows = rows_of(b)
            if keys is not None:
                # The recognised key function is `row[column]`: its pairs, without calling it per row.
                pairs = zip(keys.to_pylist(), rows, strict=True)
                streams = {ck.ops[0].downs[0]: list(zip(seqs, pairs, strict=True))}
                apply_ops(ck.ops[1:], streams, dead)
            else:
                streams = {ck.entry: list(zip(seqs, rows, strict=True))}
                apply_ops(ck.ops, streams, dead)
            items = streams.get(ck.port)
            if items and dead is not None:
                items = screen_keyed(key_for, items, dead)
            if items:
                xs = list(map(_second, items))
                ks = checked_keys(key_for, xs)
                yield (
                    pa.array(ks, pa.string()),
                    None if values_only else list(map(_first, items)),
                    list(map(_second, xs)),
                )

    return _runs(columns())


def _value_fns(ops: tuple[Op, ...]) -> tuple[Callable[[Any], Any], ...]:
    """The per-value mappers of `ops`, each a `map_value` or a `redistribute` (the rule `value_mappers`)."""
    return tuple(o.value_fn for o in ops if o.kind == "map" and o.value_fn is not None)


def _mapped_values(fns: tuple[Callable[[Any], Any], ...], values: list[Any]) -> Optional[list[Any]]:
    """`values` through each mapper in turn, or `None` when one raises."""
    try:
        for fn in fns:
            values = list(map(fn, values))
    except Exception:  # noqa: BLE001  # the caller reruns the steps one by one, for the step's error
        return None
    return values


def _key_column(b: Any, column: str) -> Any:
    """Column `column` of a batch when it is a string column without nulls (the keys as they are), else `None`."""
    import pyarrow as pa

    names = b.schema.names
    if names.count(column) != 1:
        return None
    keys = b.column(names.index(column))
    if keys.null_count or not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        return None  # the key function's own call raises the error for a null key
    return keys


def _port_rows(
    spec: StageSpec,
    streams: dict[str, list[tuple[bytes, Any]]],
    out_p: list[int],
    out_k: list[Optional[str]],
    out_s: list[bytes],
    out_v: list[bytes],
    dead: Dead = None,
) -> None:
    for p, port in enumerate(spec.ports):
        items = streams.get(port.stream)
        if items and dead is not None and port.key_for is not None:
            items = screen_keyed(port.key_for, items, dead)
        if not items:
            continue
        n = len(items)
        xs = list(map(_second, items))
        out_p.extend([p] * n)
        out_s.extend(map(_first, items))
        if port.key_for is not None:
            ks = checked_keys(port.key_for, xs)
            out_k.extend(ks)
            out_v.extend(dumps_all(list(map(_second, xs)) if port.value_only else xs))
        else:
            out_k.extend([None] * n)
            out_v.extend(dumps_all(xs))


def not_dict_error(step_id: str, x: Any) -> FlowsparkTypeError:
    """The error for an item a `SparkSink` cannot write (not a dict).

    Args:
        step_id: The sink's step id.
        x: The item.

    Returns:
        The error.
    """
    msg = (
        f"step {step_id!r}: SparkSink writes dict items (one row each); received {x!r} of type "
        f"{type(x).__name__}; map items to dicts before the output"
    )
    return FlowsparkTypeError(msg)


def dict_rows(step_id: str, items: list[Any], rows: RowSchema, dead: Optional[list[Any]] = None) -> Any:
    """The rows a `SparkSink` writes: dict items as one Arrow record batch of `rows.arrow`.

    Args:
        step_id: The sink's step id.
        items: The items (dicts).
        rows: The sink's schema (`flowspark.spark.worker.rows.row_schema`): its Arrow schema and
            how values convert.
        dead: With a dead letter: receives `(index in items, record)` for each item that
            is not a dict or does not fit the schema; the batch holds the others.

    Returns:
        A `pyarrow.RecordBatch`.

    Raises:
        FlowsparkRuntimeError: An item is not a dict or does not fit the schema (names the sink).
    """
    import pyarrow as pa

    arrow_schema = rows.arrow
    if dead is not None:
        try:
            if set(map(type, items)) == {dict}:
                return pa.RecordBatch.from_pylist(rows.fit(items), schema=arrow_schema)
        except Exception:  # noqa: BLE001,S110
            pass  # found item by item below
        good = []
        for i, x in enumerate(items):
            try:
                if not isinstance(x, dict):
                    raise not_dict_error(step_id, x)
                fitted = rows.fit([x])
                pa.RecordBatch.from_pylist(fitted, schema=arrow_schema)
            except Exception as e:  # noqa: BLE001
                err = e if isinstance(e, FlowsparkTypeError) else _misfit_error(step_id, [x], rows, e)
                dead.append((i, dead_record(step_id, err, x)))
                continue
            good.extend(fitted)
        return pa.RecordBatch.from_pylist(good, schema=arrow_schema)
    if set(map(type, items)) != {dict}:
        bad = next((x for x in items if not isinstance(x, dict)), None)
        if bad is not None:
            raise _fail(step_id, not_dict_error(step_id, bad))
    try:
        return pa.RecordBatch.from_pylist(rows.fit(items), schema=arrow_schema)
    except Exception as e:
        raise _misfit_error(step_id, items, rows, e) from e


def _misfit_error(step_id: str, items: list[Any], rows: RowSchema, e: Exception) -> FlowsparkRuntimeError:
    """The error for dict items that do not fit a sink's schema: names the first such item."""
    import pyarrow as pa

    bad = items[0]
    for x in items:
        try:
            pa.RecordBatch.from_pylist(rows.fit([x]), schema=rows.arrow)
        except Exception:  # noqa: BLE001
            bad = x
            break
    cols = ", ".join(f"{f.name} {f.type}" for f in rows.arrow)
    # The explanation is part of the exception's message, so it survives a Spark task (codec).
    err = step_error(step_id, e, item=bad)
    detail = (
        f"{e}; the item does not fit the sink's schema <{cols}>: make the items fit (an op.map before "
        "the output) or give the sink another schema"
    )
    out = type(err).describe(step_id, err.exc_type or type(e).__name__, detail, item=err.item)
    out.__cause__ = e
    return out


def run_stage_rows(
    spec: StageSpec,
    items: list[tuple[bytes, Any]],
) -> tuple[list[int], list[Optional[str]], list[bytes], list[bytes]]:
    """Push items of the stage's entry stream through its stateless ops.

    Args:
        spec: The stage.
        items: `(sequence, item)` pairs of the entry stream.

    Returns:
        Column lists `(port, key, sequence, pickled item)` of the rows leaving the stage.

    Raises:
        FlowsparkRuntimeError: A user callable failed.
    """
    cols: tuple[list[int], list[Optional[str]], list[bytes], list[bytes]] = ([], [], [], [])
    dead: Dead = [] if spec.dead_letter else None
    _port_rows(spec, stage_streams(spec, items, dead), *cols, dead)
    if dead:
        dead_rows(dead, *cols)
    return cols


def dead_rows(
    dead: list[tuple[bytes, Any]],
    out_p: list[int],
    out_k: list[Optional[str]],
    out_s: list[bytes],
    out_v: list[bytes],
) -> None:
    """Append `(seq, record)` dead-letter entries as `DEAD_PORT` rows to output columns.

    Args:
        dead: The entries.
        out_p: Port column.
        out_k: Key column.
        out_s: Sequence column.
        out_v: Value column (the pickled record).
    """
    out_p.extend([DEAD_PORT] * len(dead))
    out_k.extend([None] * len(dead))
    out_s.extend(map(_first, dead))
    out_v.extend(dumps(r) for _s, r in dead)


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration of a task.

    A stage allocates millions of small tuples; inside a Spark Python worker (many
    live objects) the collector's full scans made a source stage ~5x slower (9 s
    instead of 1.6 s for 1M rows, measured). Reference counting still frees every
    acyclic object; cycles wait for the collector to resume after the task.

    Yields:
        Nothing.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: The process whose live objects `settle_worker_heap` froze (a forked child is another process).
_SETTLED_PID: Optional[int] = None


def settle_worker_heap() -> None:
    """In a Spark Python worker, the first time in its process: collect, then freeze what is alive.

    pyspark's daemon reuses a Python worker for task after task and runs a full collection
    (`gc.collect()`) after each one. A full collection traverses every live object, most of them
    the worker's imports (pyspark, pandas, pyarrow, flowspark), which live as long as the
    process: 60 ms a task on average in a streaming windows run, 6.5 s of the run's 108 tasks
    (measured). `gc.freeze()` moves the objects alive now to the permanent generation, which
    collections skip: the same run's collections took 0.55 s. What tasks allocate afterwards is
    collected as before. A cycle already alive here that becomes garbage later (the first
    task's own deserialized objects) stays in memory: once per worker process.

    Does nothing outside a Spark task (the driver, the in-memory executor, the tests calling a
    stage function directly): a user's process keeps its collector as it is.
    """
    global _SETTLED_PID
    pid = os.getpid()
    if _SETTLED_PID == pid:
        return
    try:
        from pyspark import TaskContext
    except ImportError:  # no pyspark: no Spark task either
        return
    if TaskContext.get() is None:
        return
    _SETTLED_PID = pid
    gc.collect()
    gc.freeze()


@contextmanager
def task_gc() -> Iterator[None]:
    """The collector for a task's work in a Spark Python worker: `settle_worker_heap`, then `no_gc`.

    Yields:
        Nothing.
    """
    settle_worker_heap()
    with no_gc():
        yield


# --------------------------------------------------------------------------- sources inside tasks
def _read_partition(step_id: str, part: Any) -> Iterator[list[Any]]:
    """Read a built source partition to its end, batch by batch.

    `next_awake` is compared with the system clock, as Bytewax does (a source computes it from
    `datetime.now`), not with the job's logical "now", which stays fixed.
    """
    import time

    from flowspark.inputs import AbortExecution

    try:
        while True:
            awake = part.next_awake() if hasattr(part, "next_awake") else None
            if awake is not None:
                wait = (awake - datetime.now(timezone.utc)).total_seconds()
                if wait > 0:
                    time.sleep(min(wait, 1.0))
                    continue
            try:
                batch = part.next_batch()
            except StopIteration:
                return
            except AbortExecution:
                msg = "the source aborted the execution (AbortExecution); a Spark batch job cannot stop half-way"
                raise RuntimeError(msg) from None
            yield list(batch)
    except FlowsparkRuntimeError:
        raise
    except Exception as e:
        raise _fail(step_id, e) from e
    finally:
        try:
            part.close()
        except Exception:  # noqa: BLE001,S110
            pass


def _entry_items_from_source(spec: StageSpec, batch: Any, partition_id: int) -> Iterator[list[tuple[bytes, Any]]]:
    """Turn one Arrow batch of the stage's input into lists of (seq, item) of the entry stream."""
    src = spec.source
    if src == "chunks":
        # A chunk's header stamps its first item; the others follow `spec.per_batch`.
        seqs = batch.column(1).to_pylist()
        blobs = batch.column(2).to_pylist()
        for head, blob in zip(seqs, blobs, strict=True):
            si, pi, act, off = read_head(head)
            yield source_items(si, pi, act, loads(blob), off, spec.per_batch)
    elif src == "ordered_chunks":
        # A chunk's header is its first item's position in the micro-batch (8 bytes, big
        # endian); the others follow (see `pysource.stream_options(order=True)`).
        import numpy as np

        for head, blob in zip(batch.column(1).to_pylist(), batch.column(2).to_pylist(), strict=True):
            xs = loads(blob)
            first = int.from_bytes(head, "big")
            buf = np.arange(first, first + len(xs), dtype=">u8").tobytes()
            yield list(zip([buf[i : i + 8] for i in range(0, len(buf), 8)], xs, strict=True))
    elif src == "parts":
        seqs = batch.column(1).to_pylist()
        blobs = batch.column(2).to_pylist()
        for head, blob in zip(seqs, blobs, strict=True):
            si, pi, _, _ = read_head(head)
            source, part_key, worker_count = loads(blob)
            try:
                if part_key is None:
                    part = source.build(spec.source_step, pi, worker_count)
                else:
                    part = source.build_part(spec.source_step, part_key, None)
            except Exception as e:
                raise _fail(spec.source_step, e) from e
            for act, xs in enumerate(_read_partition(spec.source_step, part)):
                yield source_items(si, pi, act, xs)  # one source batch: one activation
    else:
        raise AssertionError(src)


def stage_function(
    spec: StageSpec,
    now: datetime,
    out_batch_rows: int = 8192,
    column_key: bool = False,
    sink: Optional[tuple[str, RowSchema]] = None,
    sample: Optional[tuple[int, int]] = None,
    sequences: bool = True,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Build the function `mapInArrow` calls for one stage.

    Args:
        spec: The stage.
        now: The logical time of the run (installed as the clock of `flowspark._time`).
        out_batch_rows: Rows per output Arrow batch.
        column_key: For a keyed stage with `spec.column_key`: its input rows are the
            source's rows keyed and sorted by Spark (see `column_key_runs`), not the
            rows of the source stage's port.
        sink: `(step id, RowSchema)` of the `SparkSink` that is the only reader of the
            stage's only port (`SinkPlan.only_reader`): the stage then emits the sink's
            rows (dict items as typed columns) instead of `(p, k, seq, v)` rows.
        sample: `(port, n)`: emit only the pickled items (column `v`) of that port, and
            stop once `n` were emitted (the task ends without reading the rest of its input).
        sequences: `False`: nobody reads the port rows' sequences (the sampling job reads the
            items); a stage driven on values (`values_driver`) then gives them empty ones.

    Returns:
        A function from an iterator of `pyarrow.RecordBatch` to one of output batches
        with columns `p` (int32), `k` (string), `seq` (binary), `v` (binary), or the
        sink's columns, or `v` alone with `sample`.
    """
    if sample is not None:
        return _sampler(stage_function(spec, now, out_batch_rows, column_key, sequences=False), *sample)

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        try:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            partition_id = ctx.partitionId() if ctx is not None else 0
        except Exception:  # noqa: BLE001
            partition_id = 0
        schema = pa.schema([("p", pa.int32()), ("k", pa.string()), ("seq", pa.binary()), ("v", pa.binary())])

        def port_batch(items: list[tuple[bytes, Any]]) -> Any:
            return cols_batch(run_stage_rows(spec, items))

        def cols_batch(cols: tuple[list[int], list[Optional[str]], list[bytes], list[bytes]]) -> Any:
            if not cols[0]:
                return None
            return pa.RecordBatch.from_arrays(
                [
                    pa.array(cols[0], pa.int32()),
                    pa.array(cols[1], pa.string()),
                    pa.array(cols[2], pa.binary()),
                    pa.array(cols[3], pa.binary()),
                ],
                schema=schema,
            )

        # The rule `mapper_line`: the stage's steps are one line of one-to-one mappers.
        line = spec.one_to_one_mappers() if sink is not None and "mapper_line" in spec.modes else None

        # The rule `values_driver`: the keyed stage's values go to its steps as plain lists (`_value_items`).
        values = "values_driver" in spec.modes

        def sink_batch(items: list[Any]) -> Any:
            assert sink is not None
            chain_items = items if values else list(map(_second, items))
            xs = through(line, chain_items) if line is not None else None
            if xs is None:  # not a line of one-to-one steps, or a step raised: step by step, for its error
                tagged = list(zip(itertools.repeat(b""), items)) if values else items
                ps = stage_streams(spec, tagged).get(spec.ports[0].stream)
                xs = list(map(_second, ps)) if ps else None
            return dict_rows(sink[0], xs, sink[1]) if xs else None

        out = port_batch if sink is None else sink_batch
        assert sink is None or not spec.dead_letter, "a stage with a dead letter emits port rows"
        dead: Dead = [] if spec.dead_letter else None
        try:
            with use_clock(lambda: now), task_gc():
                stage_items: Iterator[list[Any]] = (
                    _value_items(spec, batches, now, out_batch_rows, column_key, None if sink else sequences)
                    if values
                    else _stage_items(
                        spec, batches, now, partition_id, out_batch_rows, column_key, dead, ordered=sink is None
                    )
                )
                for items in stage_items:
                    b = out(items)
                    if b is not None:
                        yield b
                    if dead:
                        cols: tuple[list[int], list[Optional[str]], list[bytes], list[bytes]] = ([], [], [], [])
                        dead_rows(dead, *cols)
                        dead.clear()
                        yield cols_batch(cols)
        except FlowsparkRuntimeError as f:
            raise RuntimeError(encode_task_error(f)) from None

    return fn


def _sampler(
    fn: Callable[[Iterator[Any]], Iterator[Any]], port: int, n: int
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """Wrap a stage function: the first `n` pickled items of `port`, then stop (see `stage_function`)."""

    def sampled(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        got = 0
        out = fn(batches)
        try:
            for b in out:
                vs = b.filter(pc.equal(b.column(0), port)).column(3).slice(0, n - got)
                if len(vs):
                    got += len(vs)
                    yield pa.RecordBatch.from_arrays([vs], names=["v"])
                if got >= n:
                    break
        finally:
            out.close()  # type: ignore[attr-defined]  # a generator (stage_function's `fn`)
        for _b in batches:
            pass  # read to the end: the Python worker then serves the next task (a worker left
            # mid-input is not reused: the write after the sample started new ones, +0.4 s measured)

    return sampled


def _stage_items(
    spec: StageSpec,
    batches: Iterator[Any],
    now: datetime,
    partition_id: int,
    out_rows: int,
    column_key: bool,
    dead: Dead = None,
    ordered: bool = True,
) -> Iterator[list[tuple[bytes, Any]]]:
    """The items of the stage's entry stream (or its chain's emits), in lists of about `out_rows`.

    `dead`: receives the dead-letter entries of a Spark-keyed stage's source steps.
    `ordered=False`: the caller reads no sequences (the stage writes a sink's rows): a keyed
    stage then computes none (empty bytes), which saved a fifth of such a stage (measured).
    """
    src = spec.source
    if "native_reduction" in spec.modes:
        yield from aggregated_items(spec, batches, out_rows, ordered)
        return
    if spec.chain:
        # Keyed stage: rows arrive sorted by (k, seq).
        drivers = stage_drivers(spec)
        pending: list[tuple[bytes, Any]] = []
        runs = (
            column_key_runs(spec, batches, dead, sequences=ordered or dead is not None)
            if column_key
            else _key_runs(batches, spec.input_value_only)
        )
        for key, items in runs:
            emits = drive_chain(drivers, key, items, now=now, tags=ordered)[0]
            if emits:
                pending.extend([(s, (key, w)) for s, w in emits])
            if len(pending) >= out_rows:
                yield pending
                pending = []
        if pending:
            yield pending
        return
    if src == "rows":
        for b in batches:
            ss = b.column(1).to_pylist()
            yield list(zip(ss, loads_arrow(b.column(2)), strict=True))
        return
    if src == "native":
        si = spec.source_index
        pos = 0
        for b in batches:
            try:
                xs = arrow_rows(b)
            except Exception as e:
                raise _fail(spec.source_step, e) from e
            items = source_items(si, partition_id, 0, xs, offset=pos)  # one activation, as `position_seqs`
            pos += len(xs)
            yield items
        return
    for b in batches:
        for items in _entry_items_from_source(spec, b, partition_id):
            for start in range(0, len(items), out_rows):
                yield items[start : start + out_rows]


def _value_items(
    spec: StageSpec,
    batches: Iterator[Any],
    now: datetime,
    out_rows: int,
    column_key: bool,
    tags: Optional[bool],
) -> Iterator[list[Any]]:
    """The chain's emits of a keyed stage driven on values alone (the rule `values_driver`).

    Each key's values go through each step in turn as a plain list (`StepDriver.drive_values`
    with the key's end of input): the same emits in the same order as `drive_chain` when no
    step reads its values' sequences (none notifies, or one step gets a `SparkSource`'s rows,
    one activation). `tags=None` (a stage writing a sink's rows): the items are `(key, emit)`;
    `False` (a sampling job, which reads the items alone): `(b"", (key, emit))`; `True` (a
    stage whose last step emits only at end of input): `(sequence, (key, emit))` with the
    end-of-input sequences `drive_chain` gives them.
    """
    drivers = stage_drivers(spec)
    runs = (
        column_key_runs(spec, batches, values_only=True)
        if column_key
        else _key_runs(batches, spec.input_value_only, values_only=True)
    )
    level = drivers[-1].level
    pending: list[Any] = []
    for key, values in runs:
        for d in drivers:
            values, _logic = d.drive_values(key, values, None, now, eof=True)
        if values:
            items = zip(itertools.repeat(key), values)
            if tags is None:
                pending.extend(items)
            elif tags:
                pending.extend(eof_emits(level, key, items))
            else:
                pending.extend(zip(itertools.repeat(b""), items))
            if len(pending) >= out_rows:
                yield pending
                pending = []
    if pending:
        yield pending
