"""flowspark `FixedPartitionedSource`s as Spark streaming sources (PySpark's Python DataSource API).

A source is read at the driver by the stream reader (`DataSourceStreamReader`,
kept alive by Spark between micro-batches): `latestOffset` polls every
partition for what is ready now (at most `max_items` items per partition and
micro-batch) and returns the partitions' new positions; `partitions` hands the
items polled for that offset range to the tasks: each source partition's range
becomes at most `tasks // partitions` Spark tasks (at least one; `tasks` is the
session's default parallelism), each holding chunks of up to 5000 items. A task
runs the source stage itself (the stage is fused into the read, so the items
cross from Python to Spark once): `read` feeds its chunks, as chunk rows of the
batch runtime's row format (`seq` the source sequence of the first item: its
activation, source index, partition index and offset in its source batch; `v`
the encoded list of items, all of one source batch), to the batch runtime's
stage function and yields its Arrow batches `(p, k, seq, v)`. Without a stage
(`stage=None`), `read` yields the chunk rows `(k, seq, v)` themselves.

Activations are Bytewax's: the partitions are polled in turn, so the `j`-th
source batch each partition returns in a micro-batch is one activation of all
of them; each partition's offset records the next activation number.

Offsets are real: for each partition, its `snapshot()` after the last item of
the range (pickled, base64) and the number of items read so far. Spark writes
them in the checkpoint's offset log, so a restarted query rebuilds each partition
with `build_part(step_id, key, snapshot)` and goes on from there; a range that
was planned but not committed before a crash is replayed by rebuilding the
partition at the range's start and reading the same number of items again (the
source contract: resuming from a snapshot yields the same items).

A `DynamicSource` is read as `tasks` partitions (`build(step_id, worker_index, worker_count)`,
worker_count the session's default parallelism, as a batch job builds it): they have no
snapshot, so a range that was planned but not committed before a crash cannot be replayed and
is read as empty, and a restarted query builds new partitions, which go on with what they
return then. That is Bytewax's recovery of a `DynamicSource`: it is not resumed, so what it
returned before a crash and the flow had not finished with is not read again.

`SupportsTriggerAvailableNow`: with `trigger="available_now"` a partition is read
until it returns an empty batch (nothing ready now) or ends, and never after that
in this query, so the query ends.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any, Callable, Optional

import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from flowspark.errors import FlowsparkRuntimeError, step_error
from flowspark.inputs import (
    AbortExecution,
    DynamicSource,
    FixedPartitionedSource,
    StatefulSourcePartition,
    StatelessSourcePartition,
)
from flowspark.spark.plan.types import StageSpec
from flowspark.spark.worker.codec import dumps, source_seq
from flowspark.spark.worker.stage import stage_function

__all__ = ["FORMAT", "TICK_FORMAT", "FlowsparkDataSource", "TickDataSource", "register", "stream_options"]

#: The name the data source is registered under (`spark.readStream.format(FORMAT)`).
FORMAT = "flowspark_source"
#: Largest number of items in one chunk row.
_CHUNK = 5000
_SCHEMA = "k string, seq binary, v binary"
#: Rows of a fused source stage (the batch runtime's stage rows).
STAGE_SCHEMA = "p int, k string, seq binary, v binary"
#: Rows of a fused source stage read in order (`stream_options(order=True)`): `seq` is the
#: item's position in its micro-batch's order of items.
ORDER_SCHEMA = "p int, k string, seq long, v binary"


def _first_activation(start: dict) -> int:
    """The activation a micro-batch's first source batches get: after every one before it.

    Partitions are polled in turn, as in Bytewax: the `j`-th batch each partition
    returns in a micro-batch is activation `round0 + j` of all of them (Spark
    checkpoints each partition's next activation in its offset).
    """
    return max((int(off.get("act", 0)) for off in start.values() if isinstance(off, dict)), default=0)


def _chunk_cuts(sizes: list[int], most: int) -> Iterator[tuple[int, int, int, int]]:
    """Cut a range of source batches into chunks: `(batch index, offset in it, start, length)`.

    A chunk never spans two batches (its items share an activation) nor holds more than `most` items.

        >>> list(_chunk_cuts([3, 5], 4))
        [(0, 0, 0, 3), (1, 0, 3, 4), (1, 4, 7, 1)]
    """
    at = 0
    for act, size in enumerate(sizes):
        for off in range(0, size, most):
            n = min(most, size - off)
            yield act, off, at, n
            at += n


def _order_bases(parts: list[tuple[int, list[int]]]) -> dict[tuple[int, int], int]:
    """The position in a micro-batch of each source batch's first item, in sequence order.

    Items are ordered by (activation, partition, offset in the source batch), as their
    sequences sort; `parts` holds each read partition's index and its source batches' sizes.

        >>> _order_bases([(0, [2, 3]), (1, [4])])
        {(0, 0): 0, (0, 1): 2, (1, 0): 6}
    """
    firsts: dict[tuple[int, int], int] = {}
    at = 0
    for act in range(max((len(sizes) for _, sizes in parts), default=0)):
        for pi, sizes in parts:
            if act < len(sizes):
                firsts[(act, pi)] = at
                at += sizes[act]
    return firsts


def _enc(x: Any) -> str:
    return base64.b64encode(pickle.dumps(x, protocol=5)).decode("ascii")


def _dec(s: str) -> Any:
    return pickle.loads(base64.b64decode(s))  # noqa: S301


def stream_options(
    step_id: str,
    source: FixedPartitionedSource[Any, Any],
    source_index: int,
    max_items: int,
    *,
    stage: Optional[StageSpec] = None,
    clock: Optional[Callable[[], datetime]] = None,
    tasks: int = 1,
) -> dict:
    """Options that make `spark.readStream.format(FORMAT)` read `source`.

    Args:
        step_id: The input step's id.
        source: The source (pickled with cloudpickle into the options).
        source_index: Index of the input step in the flow (first sequence component).
        max_items: Most items read from one partition for one micro-batch.
        stage: The source stage to run inside the read (rows `p, k, seq, v`); `None`
            yields chunk rows `k, seq, v`.
        clock: The stage's clock (default the wall clock when the task starts).
        tasks: Spark tasks to aim for per micro-batch (e.g. the default parallelism): each
            source partition's range is split into at most `tasks // partitions` tasks (at
            least one).

    A `stage` of source `ordered_chunks` (its steps are all one-to-one `map`s, so an item
    keeps its sequence, and its reader needs only the items' order) gets rows whose `seq` is
    a `long`, the item's position in the micro-batch in sequence order (`ORDER_SCHEMA`),
    instead of the 20-byte sequence.

    Returns:
        Reader options.
    """
    order = stage is not None and stage.source == "ordered_chunks"
    payload = (step_id, source, source_index, max_items, stage, clock, tasks, order)
    blob = base64.b64encode(cloudpickle.dumps(payload)).decode("ascii")
    fused = "2" if order else "1" if stage is not None else "0"
    return {"flowspark.source": blob, "flowspark.fused": fused}


def register(spark: Any, carry: Optional[bytes] = None) -> None:
    """Register the data sources on `spark` (once per session is enough; repeating is harmless).

    Args:
        spark: The SparkSession.
        carry: The flowspark zip, when the server's Python lacks flowspark: the sources
            are registered in carriers (`flowspark.spark.carrier`).
    """
    sources: tuple[type, ...] = (FlowsparkDataSource, TickDataSource)
    if carry is not None:
        from flowspark.spark.carrier import carried_data_source

        sources = tuple(carried_data_source(cls, carry) for cls in sources)
    for cls in sources:
        spark.dataSource.register(cls)


class FlowsparkDataSource(DataSource):
    """The Python data source behind streamed `FixedPartitionedSource`s (see the module docs)."""

    @classmethod
    def name(cls) -> str:
        """Return the format name.

        Returns:
            `FORMAT`.
        """
        return FORMAT

    def schema(self) -> str:
        """Return the row schema: stage rows when the source stage is fused, else chunk rows.

        Returns:
            A DDL string.
        """
        return {"1": STAGE_SCHEMA, "2": ORDER_SCHEMA}.get(self.options.get("flowspark.fused", "0"), _SCHEMA)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        """Build the stream reader.

        Args:
            schema: The schema (ignored; always `schema()`).

        Returns:
            The reader.
        """
        return _Reader(*cloudpickle.loads(base64.b64decode(self.options["flowspark.source"])))


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self,
        step_id: str,
        source: FixedPartitionedSource[Any, Any],
        source_index: int,
        max_items: int,
        stage: Optional[StageSpec] = None,
        clock: Optional[Callable[[], datetime]] = None,
        tasks: int = 1,
        order: bool = False,
    ):
        self.step_id = step_id
        self.order = order
        self.source = source
        self.source_index = source_index
        self.max_items = max_items
        self.stage = stage
        self.clock = clock
        #: A DynamicSource's partitions return other items when built again: nothing to replay.
        self.replays = not isinstance(source, DynamicSource)
        if isinstance(source, DynamicSource):
            source = self.source = _Workers(source, max(1, tasks))
        self.keys = self._call(lambda: list(source.list_parts()))
        self.splits = max(1, tasks // max(1, len(self.keys)))
        self.live: dict[str, tuple[int, Any]] = {}  # key -> (items read so far, partition)
        # (key, start n) -> (items of the range, the sizes of the source batches they came in)
        self.buf: dict[tuple[str, int], tuple[list[Any], list[int]]] = {}
        self.available_now = False
        self.drained: set[str] = set()
        # Partitions that ended in an earlier run are read once more when a run starts: a
        # source may resume after an end-of-input marker (`TestingSource.EOF()`: "a resumed
        # run continues after it"). One that ends again stays ended.
        self.retried: set[str] = set()

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except (FlowsparkRuntimeError, StopIteration, AbortExecution):
            raise  # the end of a partition is not an error
        except Exception as e:
            raise step_error(self.step_id, e) from e

    def initialOffset(self) -> dict:  # noqa: N802
        return {k: {"snap": _enc(None), "n": 0, "eof": False, "act": 0} for k in self.keys}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.available_now = True

    def _part(self, key: str, off: dict) -> Any:
        live = self.live.get(key)
        if live is not None and live[0] == off["n"]:
            return live[1]
        if live is not None:
            self._close(live[1])
        part = self._call(lambda: self.source.build_part(self.step_id, key, _dec(off["snap"])))
        self.live[key] = (off["n"], part)
        return part

    def _close(self, part: Any) -> None:
        try:
            part.close()
        except Exception:  # noqa: BLE001,S110
            pass

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
        end: dict = {}
        now: Optional[datetime] = None
        round0 = _first_activation(start)
        for key in self.keys:
            off = start.get(key) or {"snap": _enc(None), "n": 0, "eof": False}
            if off["eof"] and key not in self.retried:
                self.retried.add(key)
                off = {**off, "eof": False}
            if off["eof"] or key in self.drained:
                end[key] = off
                continue
            part = self._part(key, off)
            awake = part.next_awake()
            if awake is not None:
                now = now or datetime.now(timezone.utc)
                if awake > now:
                    end[key] = off
                    continue
            items: list[Any] = []
            sizes: list[int] = []
            eof = False
            try:
                while len(items) < self.max_items:
                    got = self._call(lambda p=part: list(p.next_batch()))
                    items.extend(got)
                    if got:
                        sizes.append(len(got))
                    else:
                        if self.available_now:
                            self.drained.add(key)
                        break
                    awake = part.next_awake()
                    if awake is not None and awake > datetime.now(timezone.utc):
                        break
            except StopIteration:
                eof = True
            except AbortExecution:
                eof = True
            n = off["n"] + len(items)
            snap = self._call(part.snapshot)
            if items:
                self.buf[(key, off["n"])] = (items, sizes)
            self.live[key] = (n, part)
            act = round0 + len(sizes) if sizes else off.get("act", 0)
            end[key] = {"snap": _enc(snap), "n": n, "eof": eof, "act": act}
            if eof:
                self._close(part)
                del self.live[key]
                self.retried.add(key)  # ended in this run: read again only by a later run
        return end

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        round0 = _first_activation(start)
        read: list[tuple[int, list[Any], list[int]]] = []
        for pi, key in enumerate(self.keys):
            s = start.get(key) or {"snap": _enc(None), "n": 0, "eof": False}
            e = end.get(key, s)
            count = e["n"] - s["n"]
            if count <= 0:
                continue
            got = self.buf.pop((key, s["n"]), None)
            if got is None or len(got[0]) != count:
                if not self.replays:
                    continue  # read before a restart by partitions that are gone (see the module doc)
                got = self._replay(key, s, count)
            read.append((pi, *got))
        firsts = _order_bases([(pi, sizes) for pi, _, sizes in read]) if self.order else {}
        for pi, items, sizes in read:
            chunks = [
                (
                    (firsts[(act, pi)] + off).to_bytes(8, "big")
                    if self.order
                    else source_seq(self.source_index, pi, round0 + act, off),
                    dumps(items[at : at + n]),
                )
                for act, off, at, n in _chunk_cuts(sizes, _CHUNK)
            ]
            per_task = -(-len(chunks) // min(self.splits, len(chunks)))
            for i in range(0, len(chunks), per_task):
                out.append(InputPartition((pi, chunks[i : i + per_task])))
        return out

    def _replay(self, key: str, off: dict, count: int) -> tuple[list[Any], list[int]]:
        """Re-read `count` items of partition `key` (and their batch sizes) from the snapshot in `off`."""
        part = self._call(lambda: self.source.build_part(self.step_id, key, _dec(off["snap"])))
        items: list[Any] = []
        sizes: list[int] = []
        try:
            while len(items) < count:
                got = self._call(lambda: list(part.next_batch()))
                items.extend(got)
                if got:
                    sizes.append(min(len(got), count - sum(sizes)))
        except StopIteration:
            pass
        finally:
            self._close(part)
        if len(items) < count:
            msg = (
                f"step {self.step_id!r}: partition {key!r} replayed {len(items)} items from its snapshot, "
                f"but the checkpoint recorded {count}; the source does not resume deterministically"
            )
            raise FlowsparkRuntimeError(self.step_id, msg)
        return items[:count], sizes

    def read(self, partition: InputPartition) -> Iterator[Any]:
        _pi, chunks = partition.value
        rows = [(None, head, blob) for head, blob in chunks]
        if self.stage is None:
            yield from rows
            return
        import numpy as np
        import pyarrow as pa

        batch = pa.RecordBatch.from_arrays(
            [pa.array([r[i] for r in rows], t) for i, t in enumerate((pa.string(), pa.binary(), pa.binary()))],
            names=["k", "seq", "v"],
        )
        now = self.clock() if self.clock is not None else datetime.now(timezone.utc)
        out = stage_function(self.stage, now)(iter([batch]))
        if not self.order:
            yield from out
            return
        for b in out:  # the stage's steps keep each item's 8-byte position: make it a long
            seq = b.column(2)
            at = np.frombuffer(b"".join(seq.to_pylist()), dtype=">i8").astype(np.int64)
            yield b.set_column(2, pa.field("seq", pa.int64()), pa.array(at, pa.int64()))

    def commit(self, end: dict) -> None:
        for key in self.keys:
            e = end.get(key)
            if e is None:
                continue
            for k2 in [k for k in self.buf if k[0] == key and k[1] < e["n"]]:
                del self.buf[k2]

    def stop(self) -> None:
        for _n, part in self.live.values():
            self._close(part)
        self.live.clear()


class _Workers(FixedPartitionedSource[Any, None]):
    """A `DynamicSource` as `count` partitions without resume state (one per worker, as Bytewax builds it)."""

    def __init__(self, source: DynamicSource[Any], count: int) -> None:
        self.source = source
        self.count = count

    def list_parts(self) -> list[str]:
        width = len(str(self.count - 1))
        return [str(i).zfill(width) for i in range(self.count)]  # names that sort as the worker indexes

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _Stateless:
        return _Stateless(self.source.build(step_id, int(for_part), self.count))


class _Stateless(StatefulSourcePartition[Any, None]):
    """A `StatelessSourcePartition` whose snapshot is `None`."""

    def __init__(self, part: StatelessSourcePartition[Any]) -> None:
        self.part = part

    def next_batch(self) -> Any:
        return self.part.next_batch()

    def next_awake(self) -> Optional[datetime]:
        return self.part.next_awake()

    def snapshot(self) -> None:
        return None

    def close(self) -> None:
        self.part.close()


#: The name of the tick source (`spark.readStream.format(TICK_FORMAT)`).
TICK_FORMAT = "flowspark_tick"


class TickDataSource(DataSource):
    """One row `(NULL, b"", b"")` per micro-batch: makes every micro-batch run the keyed stage.

    Spark runs no micro-batch when a restarted query has no new data, so the
    processing-time timeouts of idle buckets would never fire after a restart
    until data arrives; with this source every trigger has one new row (ignored
    by the bucket driver). With `available_now` it yields one tick and stops.
    """

    @classmethod
    def name(cls) -> str:
        """Return the format name.

        Returns:
            `TICK_FORMAT`.
        """
        return TICK_FORMAT

    def schema(self) -> str:
        """Return the row schema (the chunk-row schema).

        Returns:
            A DDL string.
        """
        return _SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        """Build the stream reader.

        Args:
            schema: Ignored.

        Returns:
            The reader.
        """
        return _TickReader()


class _TickReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self) -> None:
        self.left: Optional[int] = None

    def initialOffset(self) -> dict:  # noqa: N802
        return {"t": 0}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.left = 1

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
        if self.left is not None:
            if self.left <= 0:
                return start
            self.left -= 1
        return {"t": start["t"] + 1}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [InputPartition(end["t"])] if end["t"] > start["t"] else []

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        yield (None, b"", b"")
