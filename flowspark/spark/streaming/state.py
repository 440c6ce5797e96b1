"""Keyed state of a streaming query: one Python call per bucket of keys and micro-batch.

The stateful operator groups a keyed stage's rows by `bucket = pmod(hash(k), B)`.
A key's state is its *entry* `(snapshots of the chain's logics, notify_at)`.
`BucketDriver` rebuilds each touched key's logics from its entry, hands its values
(in sequence order) to the per-key driver (`flowspark.runtime.driver.drive_chain`),
fires the notifications due at the micro-batch's time, snapshots the logics back,
and sets the bucket's timer to its earliest `notify_at`.

Three state layouts (`LAYOUTS`, chosen per checkpoint; a new checkpoint's default is `"chunk"`,
a checkpoint from before layouts were recorded is `"bucket"`):

- `"bucket"`: `applyInPandasWithState` (`transformWithStateInPandas` with one
  `ValueState` for chains); the bucket's state is one row, the pickled
  `{key: entry}`: read and rewritten whole by every micro-batch touching the bucket.
  Cheapest while the state is small; its cost grows with every key in the touched
  buckets.
- `"key"`: `transformWithStateInPandas`; one bookkeeping row per bucket (the keys
  waiting for a notification, the registered timer, the key count, and the entries
  of the bucket's last `HOT_PER_BUCKET` touched keys: the hot tier) and one `MapState`
  row per other key (`KeyTable`), read only when the key gets values or a
  notification. A micro-batch's cost follows the keys it touches: keys of the hot
  tier cost no per-key state call, others two state-store round trips. The layout's
  table and processor are in `flowspark.spark.streaming.keylayout`.
- `"chunk"`: as `"key"`, but the cold keys sit in `MapState` rows of many keys each
  (chunks by a hash of the key, their count doubling as the bucket grows): a micro-batch
  reads only the chunks of the cold keys it touches, once each, and rewrites those of the
  keys leaving the hot tier changed (`flowspark.spark.streaming.chunklayout`).
"""

from __future__ import annotations

import itertools
import operator
import os
import pickle
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark._time import use_clock
from flowspark.errors import FlowsparkRuntimeError
from flowspark.runtime.driver import UNKNOWN, drive_chain, drive_states
from flowspark.runtime.tags import idx
from flowspark.spark.io.columns import ID_COLUMN
from flowspark.spark.plan.types import StageSpec
from flowspark.spark.streaming.chunklayout import ChunkTable, chunk_processor
from flowspark.spark.streaming.keylayout import KeyTable, dump_state, key_processor
from flowspark.spark.streaming.routing import Route, forward_frame
from flowspark.spark.worker.codec import encode_task_error, loads_all
from flowspark.spark.worker.ops import stage_streams, through, unordered_streams
from flowspark.spark.worker.stage import (
    column_key_runs,
    dead_rows,
    dict_rows,
    run_stage_rows,
    stage_drivers,
    task_gc,
)
from flowspark.spark.worker.times import aware_times

# pyspark's applyInPandasWithState frames a call's output with `pd.concat` over frames that
# include all-NA padding rows, and pandas 2 warns about it on the worker's stderr once per
# worker (a FutureWarning about pyspark's code, not the user's): silenced in the workers that
# import this module, for that message only.
warnings.filterwarnings(
    "ignore", message="The behavior of DataFrame concatenation with empty or all-NA entries", category=FutureWarning
)

__all__ = ["LAYOUTS", "STATE_SCHEMA", "BucketDriver", "LatestCounts"]

#: Schema of a bucket's state row (layout "bucket").
STATE_SCHEMA = "blob binary"
#: The row number Spark adds to a source's rows it keys itself (`BucketDriver.column_key`).
#: Instead, for a parquet file stream feeding a `flat` stage: `xxhash64` of the row's file, then
#: its index in the file (`_metadata`), both computed by Spark (`BucketDriver.file_order`).
FILE_COLUMN = "__flowspark_file"
ROW_COLUMN = "__flowspark_row"
#: State layouts, the default first (a new checkpoint's): see the module docstring.
LAYOUTS = ("chunk", "bucket", "key")
#: The tables of the layouts with a hot tier and a bookkeeping row per bucket (`pending` keys).
_TIERED = (KeyTable, ChunkTable)
_key_seq = operator.itemgetter(0, 1)


def sink_frame(batch: Any, items: list[dict[str, Any]]) -> Any:
    """The pandas DataFrame of a sink's rows, `batch` (`dict_rows` of `items`), for pyspark.

    A string column whose values are all `str` (or `None`) takes those very objects from
    the items instead of new ones from Arrow (`to_pandas` builds a `str` per value: a
    quarter of flowspark's time in a streaming stage writing strings, measured); every
    other column is Arrow's `to_pandas`, as before.

    Args:
        batch: The rows as a `pyarrow.RecordBatch` (checked against the sink's schema).
        items: The dict items it was made of, in order.

    Returns:
        A pandas DataFrame with the batch's columns.
    """
    import pandas as pd
    import pyarrow as pa

    cols: dict[str, Any] = {}
    for i, field in enumerate(batch.schema):
        name = field.name
        if pa.types.is_string(field.type):
            col = [x.get(name) for x in items]
            if set(map(type, col)) <= _STR_OR_NONE:
                cols[name] = pd.Series(col, dtype=object)
                continue
        cols[name] = batch.column(i).to_pandas()
    return pd.DataFrame(cols)


_STR_OR_NONE = frozenset({str, type(None)})


_second = operator.itemgetter(1)


class LatestCounts:
    """Accumulator param of the state counts: `{"stage:bucket": (keys, pending notifications)}`, latest wins.

    Each bucket call reports its bucket's counts after the call; the driver's value is then
    the state's counts of every bucket seen (seeded, on a restart, from the checkpoint).
    """

    def zero(self, value: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """An empty report."""
        return {}

    def addInPlace(  # noqa: N802 - Spark's name
        self, a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]]
    ) -> dict[str, tuple[int, int]]:
        """Merge two reports; `b` (the later one) wins."""
        a.update(b)
        return a


def _pending(table: Any) -> Iterator[tuple[str, datetime]]:
    """`(key, notify_at)` of the keys of a bucket waiting for a notification."""
    if isinstance(table, ChunkTable):
        return iter(list(table.pending_at().items()))
    if isinstance(table, KeyTable):
        return iter(list(table.pending.items()))
    return ((k, e[1]) for k, e in table.items() if e[1] is not None)


class BucketDriver:
    """Runs a keyed stage for one bucket of keys (called by `applyInPandasWithState`).

    State of a bucket: `{key: (snaps, notify_at, run)}` pickled, where `snaps[i]` is
    `None` when step `i` has no logic for the key and `(snapshot,)` otherwise
    (`(snapshot, time of the step's last value)` with a state TTL), `notify_at`
    is the earliest `notify_at()` of the key's logics (or `None`), and `run` the
    `run` token of the query run that wrote the entry. An entry of another run (or
    without a token: written before tokens existed) is *resumed*: a failure of the
    first call of the step's code on it says the snapshot may not fit the code
    (`flowspark.errors.resumed_error`).

    Args:
        spec: The keyed stage (its chain, the stateless ops after it, and the
            sequence length of its input, `depth_in`).
        clock: A function returning "now" (aware UTC datetime); default Spark's
            processing time of the micro-batch. With a clock, every bucket with a
            pending notification is visited in every micro-batch (Spark's timers
            cannot follow a foreign clock).
        sink_rows: `(sink step id, RowSchema)` when the stage's only port feeds the
            query's lone file sink: the output is then the sink's rows (dict items
            converted as `frames.sink_rows` does), saving a Python pass over every item.
        timers: Whether the query has timers (timeouts); without, no step can ask for
            a notification and no timeout is set.
        route: In the routed lowering (`flowspark.spark.streaming.routing`), the stage's
            route: its output rows carry routes, and the group `forward_group` only
            hands back the rows the stage forwards.
        forward_group: The bucket value of the forward group.
        ttl: The run's `state_ttl`: a step's logic for a key is dropped (without
            `on_eof`, its notifications with it) when the key got no value at that step
            for this long, checked at the micro-batch's time before anything else.
        counts: A Spark accumulator (`LatestCounts`) each call reports its bucket's key
            and pending-notification counts to (the progress line's), or `None`.
        column_key: The stage's input is its source's own rows, keyed by Spark
            (`spec.column_key`): `ID_COLUMN` (`monotonically_increasing_id`), the source's
            columns and `bucket`; the call runs the source stage's steps on row dicts.
            With the rule `file_order` (a stage writing a sink's rows, without a dead letter: no
            sequences) the number is two columns instead: `FILE_COLUMN` and `ROW_COLUMN`, which
            order each key's rows (tick rows: no row index).
    """

    def __init__(
        self,
        spec: StageSpec,
        clock: Optional[Callable[[], datetime]] = None,
        sink_rows: Optional[tuple[str, Any]] = None,
        timers: bool = True,
        route: Optional[Route] = None,
        forward_group: int = -1,
        ttl: Optional[timedelta] = None,
        counts: Any = None,
        column_key: bool = False,
    ) -> None:
        """Describe the stage."""
        self.ttl = ttl
        self.counts = counts
        self.column_key = column_key
        self.route = route
        self.forward_group = forward_group
        self.spec = spec
        self.drivers = stage_drivers(spec)
        # The rule `bare_state`: every step a function of its state (`stateful_map`), no TTL: the
        # keys' states are driven bare, without building and snapshotting a logic per key and call.
        self.bare = "bare_state" in spec.modes
        # The rule `flat_driver`: one such step writing a sink's rows, no timers, routes or dead
        # letter: each key's values are mapped as a list, and the sink's items built without sequences.
        self.flat = "flat_driver" in spec.modes
        # The rule `one_step`: one step and no TTL: each key's logic is driven without the chain's
        # bookkeeping (`_process_one`).
        self.one = "one_step" in spec.modes
        # The rule `values_driver`: `one_step` writing a sink's rows without a dead letter: nothing
        # reads a sequence, so each key's values are driven without tags (`_process_values`).
        self.sink_values = "values_driver" in spec.modes
        assert not self.one or (len(self.drivers) == 1 and ttl is None), "one_step: one step, no state_ttl"
        assert not self.sink_values or (sink_rows is not None and route is None), "values_driver: a fused sink"
        # The rule `mapper_line`: the steps after the chain are one line of one-to-one mappers.
        self.sink_line = spec.one_to_one_mappers() if sink_rows is not None and "mapper_line" in spec.modes else None
        # The rule `file_order`: the rows come numbered by their file and row index.
        self.file_order = "file_order" in spec.modes
        self.depth_in = spec.depth_in
        self.clock = clock
        self.sink_rows = sink_rows
        self.timers = timers
        #: This query run's token (a driver is built per run and shipped to the workers), stored
        #: in every entry written: entries without it were written by an earlier run.
        self.run = os.urandom(8)
        #: With `column_key`: the source's TIMESTAMP columns, which arrive as microseconds since the
        #: epoch (`query._times_as_micros`), and the session's time zone to make them aware datetimes in.
        self.time_columns: tuple[str, ...] = ()
        self.time_zone = "UTC"
        for d in self.drivers:
            d.store = "checkpoint directory"

    # -- state codec ----------------------------------------------------------
    def earlier(self, ent: Any) -> bool:
        """Whether an entry was written by an earlier run (see the class doc): its state is resumed."""
        return len(ent) < 3 or ent[2] != self.run

    def _logics(self, key: str, ent: Any, now: datetime) -> list[Any]:
        if not ent:
            return [None] * len(self.drivers)
        ttl = self.ttl
        resumed = self.earlier(ent)
        return [
            None if s is None or (ttl is not None and len(s) > 1 and now - s[1] >= ttl) else d.build(key, s[0], resumed)
            for d, s in zip(self.drivers, ent[0], strict=True)
        ]

    def _times(self, snaps: Optional[list[Any]], now: datetime, fed: Optional[list[bool]] = None) -> list[datetime]:
        """Each step's time of its last value, after a call (`fed`: which steps got values)."""
        if snaps is None:
            return [now] * len(self.drivers)
        return [now if (fed is not None and fed[i]) or s is None or len(s) < 2 else s[1] for i, s in enumerate(snaps)]

    def expired(self, ent: Any, now: datetime) -> bool:
        """Whether the state TTL dropped every step's logic of an entry."""
        ttl = self.ttl
        return ttl is not None and all(s is None or (len(s) > 1 and now - s[1] >= ttl) for s in ent[0])

    def _freeze(
        self, key: str, logics: list[Any], times: Optional[list[datetime]]
    ) -> Optional[tuple[list[Any], Optional[datetime], bytes]]:
        """A key's state entry from its logics (`times`: each step's last value, with a TTL)."""
        snaps: list[Any] = []
        at: Optional[datetime] = None
        for i, (d, logic) in enumerate(zip(self.drivers, logics, strict=True)):
            if logic is None:
                snaps.append(None)
                continue
            snaps.append((d.snapshot(key, logic),) if times is None else (d.snapshot(key, logic), times[i]))
            if not self.timers:
                continue  # no step of the query can ask for a notification
            a = d.notify_at(key, logic)
            if a is not None and (at is None or a < at):
                at = a
        if all(s is None for s in snaps):
            return None
        return snaps, at, self.run

    # -- one call -------------------------------------------------------------
    def _row_runs(self, pdfs: Iterator[Any], values_only: bool = False) -> list[tuple[str, list[Any]]]:
        """The per-key runs of a bucket's `(k, seq, v)` rows (see `process`); values alone with `values_only`."""
        rows: list[tuple[str, bytes, bytes]] = []
        for pdf in pdfs:
            rows.extend(zip(pdf["k"].tolist(), pdf["seq"].tolist(), pdf["v"].tolist(), strict=True))
        # Tick rows (key NULL, see pysource.TickDataSource) only make the micro-batch run.
        rows = [r for r in rows if r[0] is not None]
        return self._runs_of(rows, values_only)

    def _runs_of(self, rows: list[tuple[str, bytes, bytes]], values_only: bool = False) -> list[tuple[str, list[Any]]]:
        rows.sort(key=_key_seq)
        keys = [r[0] for r in rows]
        vals = loads_all([r[2] for r in rows])
        if not self.spec.input_value_only:
            vals = list(map(_second, vals))
        seqs = None if values_only else [r[1] for r in rows]
        runs: list[tuple[str, list[Any]]] = []
        i = 0
        for key, run in itertools.groupby(keys):
            j = i + len(list(run))
            runs.append((key, vals[i:j] if seqs is None else list(zip(seqs[i:j], vals[i:j], strict=True))))
            i = j
        return runs

    def process(self, table: Any, rows: list[tuple[str, bytes, bytes]], now: datetime) -> list[tuple[bytes, Any]]:
        """Process one bucket's rows of a micro-batch and its due notifications.

        Args:
            table: The bucket's state (`{key: (snaps, notify_at)}`, a `KeyTable` or a `ChunkTable`), updated in place.
            rows: `(key, sequence, pickled (key, value))` rows, in any order.
            now: The time of the micro-batch.

        Returns:
            `(sequence, (key, value))` emits of the chain's last step, in order.

        Raises:
            FlowsparkRuntimeError: A user callable failed.
        """
        return self.process_runs(table, self._runs_of(rows), now)

    def process_runs(self, table: Any, runs: Any, now: datetime) -> list[tuple[bytes, Any]]:
        """Process one bucket's values of a micro-batch, as `(key, [(sequence, value)])` runs, then its due keys.

        Args:
            table: The bucket's state, updated in place.
            runs: Each key's values in sequence order (any order of keys).
            now: The time of the micro-batch.

        Returns:
            `(sequence, (key, value))` emits of the chain's last step, in order.
        """
        out: list[tuple[bytes, Any]] = []
        if self.ttl is not None:
            self._sweep(table, now)
        tags = self.sink_rows is None  # a sink's rows are written in any order
        ttl = self.ttl is not None
        for d in self.drivers:
            d.resumed.clear()  # keys of an earlier call's logics built but never fed
        if self.bare:
            self._process_bare(table, runs, tags, out)
        elif self.one:
            self._process_one(table, runs, now, tags, out)
        else:
            for key, items in runs:
                ent = table.get(key)
                snaps = ent[0] if ent else None
                fed: Optional[list[bool]] = [] if ttl else None  # the TTL counts from a step's last value
                logics = self._logics(key, ent, now)
                # An entry's `notify_at` is the earliest of its logics' when they were frozen.
                due = ent[1] if ent else UNKNOWN
                emits, logics = drive_chain(
                    self.drivers, key, items, logics, now=now, eof=False, fed=fed, tags=tags, due=due
                )
                out.extend([(s, (key, w)) for s, w in emits])
                self._store(table, key, logics, self._times(snaps, now, fed) if ttl else None)
        for rank, (_at, key) in enumerate(self._due(table, now)):
            self._fire(table, key, rank, now, out)
        return out

    def _due(self, table: Any, now: datetime) -> list[tuple[datetime, str]]:
        """`(notify_at, key)` of the bucket's keys due by `now`, in the order they fire."""
        if isinstance(table, ChunkTable):
            return table.due(now)
        return sorted((at, key) for key, at in _pending(table) if at <= now)

    def _process_values(self, table: Any, runs: Any, now: datetime) -> list[tuple[str, Any]]:
        """`process_runs` for `sink_values`, on runs of values: the `(key, emit)` items, the same entries."""
        d = self.drivers[0]
        d.resumed.clear()
        items: list[tuple[str, Any]] = []
        for key, values in runs:
            ent = table.get(key)
            snap = ent[0][0] if ent else None
            if snap is None:
                ws, logic = d.drive_values(key, values, None, now)
            else:
                ws, logic = d.drive_values(key, values, d.build(key, snap[0], self.earlier(ent)), now, ent[1])
            if ws:
                items.extend([(key, w) for w in ws])
            self._store_one(table, key, logic)
        fired: list[tuple[bytes, Any]] = []
        for rank, (_at, key) in enumerate(self._due(table, now)):
            self._fire(table, key, rank, now, fired)
        items.extend([x for _s, x in fired])
        return items

    def _store_one(self, table: Any, key: str, logic: Any) -> None:
        """Store a one-step key's entry after its call (`one_step`): its logic's snapshot and `notify_at`, or none."""
        if logic is None:
            table.pop(key, None)
        else:
            d = self.drivers[0]
            table[key] = ([(d.snapshot(key, logic),)], d.notify_at(key, logic) if self.timers else None, self.run)

    def _process_one(self, table: Any, runs: Any, now: datetime, tags: bool, out: list[tuple[bytes, Any]]) -> None:
        """`process_runs`' values for a chain of one step without a TTL: the same entries, the same emits.

        The entry's `notify_at` (read after the logic's last hook) is the logic's schedule: a
        rebuilt logic is asked again only when it is due (`StepDriver.drive`'s `due`).
        """
        d = self.drivers[0]
        for key, items in runs:
            ent = table.get(key)
            snap = ent[0][0] if ent else None
            if snap is None:
                emits, logic = d.drive(key, items, None, now, False, tags)
            else:
                logic = d.build(key, snap[0], self.earlier(ent))
                emits, logic = d.drive(key, items, logic, now, False, tags, ent[1])
            out.extend([(s, (key, w)) for s, w in emits])
            self._store_one(table, key, logic)

    def _process_bare(self, table: Any, runs: Any, tags: bool, out: list[tuple[bytes, Any]]) -> None:
        """`process_runs`' values for a chain of steps with a `batch_fn`: the same entries, the same emits."""
        drivers = self.drivers
        fresh: list[Any] = [None] * len(drivers)
        run = self.run
        for key, items in runs:
            ent = table.get(key)
            if ent:
                states = [None if s is None else s[0] for s in ent[0]]
                resumed = self.earlier(ent)
            else:
                states, resumed = fresh, False
            emits, states = drive_states(drivers, key, items, states, tags=tags, resumed=resumed)
            out.extend([(s, (key, w)) for s, w in emits])
            if all(st is None for st in states):
                table.pop(key, None)
            else:
                pairs = zip(drivers, states, strict=True)
                table[key] = ([None if st is None else (d.state_snapshot(key, st),) for d, st in pairs], None, run)

    def _process_flat(self, table: Any, runs: Any) -> list[tuple[str, Any]]:
        """`_process_bare` for one step (`flat`), on runs of values: the `(key, emit)` items, the same entries."""
        d = self.drivers[0]
        run = self.run
        items: list[tuple[str, Any]] = []
        for key, values in runs:
            ent = table.get(key)
            snap = ent[0][0] if ent else None
            if snap is None:
                ws, state = d.map_state(key, values, None)
            else:
                ws, state = d.map_state(key, values, snap[0], self.earlier(ent))
            items.extend([(key, w) for w in ws])
            if state is None:
                table.pop(key, None)
            else:
                table[key] = ([(d.state_snapshot(key, state),)], None, run)
        return items

    def _sweep(self, table: Any, now: datetime) -> None:
        """Drop the keys whose every step's state outlived the TTL (of the bucket's dict, or of its hot tier)."""
        ents = table.hot_entries() if isinstance(table, _TIERED) else table
        dead = [k for k, e in ents.items() if self.expired(e, now)]
        for key in dead:
            table.pop(key, None)

    def _store(self, table: Any, key: str, logics: list[Any], times: Optional[list[datetime]]) -> None:
        frozen = self._freeze(key, logics, times)
        if frozen is None:
            table.pop(key, None)
        else:
            table[key] = frozen

    def _fire(self, table: Any, key: str, rank: int, now: datetime, out: list[tuple[bytes, Any]]) -> None:
        ent = table.get(key)
        if ent is None:
            table.pop(key, None)
            return
        logics = self._logics(key, ent, now)
        times = self._times(ent[0], now)
        for i, d in enumerate(self.drivers):
            logic = logics[i]
            if logic is None:
                continue
            # Emits of a key's notifications sort after every item of the micro-batch,
            # keys in the order their notifications were due.
            prefix = b"\xff" * (self.depth_in + 4 * i - 4) + idx(rank)
            logic, ws = d.fire_due(key, logic, now)
            logics[i] = logic
            emits = [(prefix + idx(n), w) for n, w in enumerate(ws)]
            rest = self.drivers[i + 1 :]
            if rest and emits:
                fed: list[bool] = []
                emits, tail = drive_chain(rest, key, emits, logics[i + 1 :], now=now, eof=False, fed=fed)
                logics[i + 1 :] = tail
                for j, got in enumerate(fed):
                    if got:
                        times[i + 1 + j] = now
            out.extend([(s, (key, w)) for s, w in emits])
        self._store(table, key, logics, times if self.ttl is not None else None)

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

    def report(self, bucket: Any, table: Any) -> None:
        """Report the bucket's counts after a call (see `counts`)."""
        if self.counts is not None and not (self.route is not None and bucket == self.forward_group):
            pending = table.pending_count() if isinstance(table, _TIERED) else sum(1 for _ in _pending(table))
            self.counts.add({f"{self.spec.stage_id}:{bucket}": (len(table), pending)})

    def timeout_ms(self, table: Any, now: datetime) -> Optional[int]:
        """Return the bucket's timeout duration: until its earliest notification.

        Args:
            table: The bucket's state.
            now: The time of the micro-batch.

        Returns:
            Milliseconds (at least 1), or `None` when no key waits for a notification.
        """
        if isinstance(table, ChunkTable):
            first = table.earliest()
            ats = [] if first is None else [first]
        else:
            ats = [at for _key, at in _pending(table)]
        if not ats:
            return None
        if self.clock is not None:
            return 1
        return max(1, int((min(ats) - now) / timedelta(milliseconds=1)))

    def call(self, table: Any, pdfs: Iterator[Any], now: datetime, bucket: Any = None) -> Any:
        """Run one bucket's micro-batch: process rows and due keys, encode output.

        Args:
            table: The bucket's state: its `{key: entry}` dict (layout "bucket") or
                its `KeyTable` (layout "key") or `ChunkTable` (layout "chunk"), updated in place.
            pdfs: pandas DataFrames of `(k, seq, v)` rows (`(p, k, seq, v)` when routed).
            now: The time of the micro-batch.
            bucket: The group's bucket value.

        Returns:
            The output DataFrame, or `None`.
        """
        import pandas as pd

        if self.route is not None and bucket == self.forward_group:
            return forward_frame(pdfs, self.route.forward)
        # The emits are not sorted here: whatever reads them sorts by sequence (sinks at the
        # driver, the next keyed stage), and the stateless ops after the chain work item by item.
        dead: Optional[list[tuple[bytes, Any]]] = [] if self.spec.dead_letter else None
        try:
            with use_clock(lambda: now), task_gc():
                if self.flat or self.sink_values:
                    runs = self._column_runs(pdfs, values_only=True) if self.column_key else self._row_runs(pdfs, True)
                    if self.flat:
                        return self._sink_items_frame(self._process_flat(table, runs))
                    return self._sink_items_frame(self._process_values(table, runs, now))
                if self.column_key:
                    emits = self.process_runs(table, self._column_runs(pdfs, dead), now)
                else:
                    emits = self.process_runs(table, self._row_runs(pdfs), now)
                if self.sink_rows is not None:
                    return self._sink_frame(emits)
                cols = run_stage_rows(self.spec, emits)
                if dead:
                    dead_rows(dead, *cols)
        except FlowsparkRuntimeError as f:
            raise RuntimeError(encode_task_error(f)) from None
        if not cols[0]:
            return None
        ps = cols[0] if self.route is None else [self.route.offset + p for p in cols[0]]
        return pd.DataFrame({"p": ps, "k": cols[1], "seq": cols[2], "v": cols[3]})

    def _column_runs(
        self, pdfs: Iterator[Any], dead: Optional[list[tuple[bytes, Any]]] = None, values_only: bool = False
    ) -> list[tuple[str, list[Any]]]:
        """The per-key runs of a bucket's source rows keyed by Spark (see `column_key`).

        `dead` as in `flowspark.spark.worker.ops.apply_ops`; `values_only` as in `column_key_runs`.
        """
        import pandas as pd
        import pyarrow as pa
        import pyarrow.compute as pc

        ck = self.spec.column_key
        assert ck is not None
        frames = [pdf for pdf in pdfs if len(pdf)]
        if not frames:
            return []
        pdf = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        # One thread: Arrow's pool would start threads in every call (a tenth of the call, measured).
        table = pa.Table.from_pandas(pdf, preserve_index=False, nthreads=1)
        columns_as: Optional[dict[str, Callable[[Any], list[Any]]]] = None
        if self.time_columns or any(pa.types.is_timestamp(f.type) for f in table.schema):
            table, columns_as = self._timestamps(table)
        # A sink's rows are written in any order: their runs need no sequences (the numbers below
        # still order each key's values).
        ordered = self.sink_rows is None or dead is not None
        # The number is the first column (transformWithStateInPandas hands it over as `_0`).
        # Renamed in Arrow: pandas' rename and drop copy the frame (8% of the stage, measured).
        if self.file_order:
            assert not ordered, "file order gives no sequences"
            table = table.rename_columns([FILE_COLUMN, ROW_COLUMN, *table.column_names[2:]]).drop_columns(["bucket"])
            if self.timers:
                table = table.filter(pc.is_valid(table.column(ROW_COLUMN)))  # tick rows have no row index
                if not table.num_rows:
                    return []
            order = [(ck.column, "ascending"), (FILE_COLUMN, "ascending"), (ROW_COLUMN, "ascending")]
            table = table.take(pc.sort_indices(table, sort_keys=order)).drop_columns([ROW_COLUMN])
            table = table.rename_columns([ID_COLUMN, *table.column_names[1:]])  # read by nobody (no sequences)
        else:
            table = table.rename_columns([ID_COLUMN, *table.column_names[1:]]).drop_columns(["bucket"])
            table = table.filter(pc.is_valid(table.column(ID_COLUMN)))  # tick rows have no number
            if not table.num_rows:
                return []
            table = table.set_column(0, ID_COLUMN, table.column(0).cast(pa.int64()))
            # Arrow orders strings by UTF-8 bytes: Python's order of str; null keys last.
            order = [(ck.column, "ascending"), (ID_COLUMN, "ascending")]
            table = table.take(pc.sort_indices(table, sort_keys=order))
        batches = iter(table.combine_chunks().to_batches())
        return list(column_key_runs(self.spec, batches, dead, ordered, values_only, columns_as))

    def _timestamps(self, table: Any) -> tuple[Any, dict[str, Callable[[Any], list[Any]]]]:
        """`table` and how to read its timestamps: aware datetimes for `time_columns`, plain ones for the others.

        The TIMESTAMP columns (microseconds since the epoch, see `time_columns`) become `datetime`s
        in the session's time zone, as a source stage's rows have them everywhere (`arrow_rows`),
        built in Python (`flowspark.spark.worker.times.aware_times`). pandas hands TIMESTAMP_NTZ columns
        over as nanosecond timestamps (`pandas.Timestamp` items): they become microseconds
        (Spark's precision), so the items are `datetime`s.
        """
        import pyarrow as pa

        columns_as: dict[str, Callable[[Any], list[Any]]] = {}
        for i, field in enumerate(table.schema):
            if field.name in self.time_columns:
                table = table.set_column(i, field.name, table.column(i).cast(pa.int64()))
                columns_as[field.name] = aware_times(self.time_zone)
            elif pa.types.is_timestamp(field.type):
                table = table.set_column(i, field.name, table.column(i).cast(pa.timestamp("us", tz=field.type.tz)))
        return table, columns_as

    def _sink_frame(self, emits: list[tuple[bytes, Any]]) -> Any:
        """The stage's items as rows of the lone file sink's schema (see `sink_rows`)."""
        return self._sink_items_frame([x for _s, x in emits])

    def _sink_items_frame(self, chain_items: list[Any]) -> Any:
        """`_sink_frame` of the chain's emitted items."""
        assert self.sink_rows is not None
        step_id, rows = self.sink_rows
        port = self.spec.ports[0].stream
        if self.sink_line is not None:
            items = through(self.sink_line, chain_items)
        else:  # a sink's rows are written in any order: each step over the whole list
            streams = unordered_streams(self.spec, chain_items)
            items = None if streams is None else streams.get(port, [])
        if items is None:  # a step raised: step by step, for its error
            items = [x for _s, x in stage_streams(self.spec, [(b"", x) for x in chain_items]).get(port, ())]
        return sink_frame(dict_rows(step_id, items, rows), items) if items else None

    def pandas_function(self) -> Callable[[Any, Iterator[Any], Any], Iterator[Any]]:
        """Build the function `applyInPandasWithState` calls.

        Returns:
            `fn(key, pdfs, state)` yielding pandas DataFrames `(p, k, seq, v)`.
        """
        driver = self

        def fn(bucket: Any, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
            now = driver.now(state.getCurrentProcessingTimeMs)
            table = _load(state.get[0] if state.exists else None)
            out = driver.call(table, pdfs, now, bucket[0])
            driver.report(bucket[0], table)
            if table:
                state.update((dump_state(table),))
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
        import cloudpickle
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        # As in `keylayout.tiered_processor`: Spark's driver-side process running `init` may
        # lack flowspark, so the class names nothing of it; the rest comes at the first call.
        blob = cloudpickle.dumps((self, _load, dump_state), protocol=5)

        class BucketProcessor(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.handle = handle
                self.state = handle.getValueState("blob", STATE_SCHEMA)
                self.parts: Any = None

            def _run(self, key: Any, pdfs: Iterator[Any], timer_values: Any) -> Iterator[Any]:
                if self.parts is None:
                    self.parts = pickle.loads(blob)  # noqa: S301 - our own driver, pickled above
                driver, load, dump = self.parts
                now = driver.now(timer_values.getCurrentProcessingTimeInMs)
                row = self.state.get()  # `None` without a row: one state call, not two
                table = load(None if row is None else row[0])
                out = driver.call(table, pdfs, now, key[0])
                driver.report(key[0], table)
                if driver.timers:
                    for t in list(self.handle.listTimers()):
                        self.handle.deleteTimer(t)
                if table:
                    self.state.update((dump(table),))
                    ms = driver.timeout_ms(table, now) if driver.timers else None
                    if ms is not None:
                        self.handle.registerTimer(int(now.timestamp() * 1000) + ms)
                else:
                    self.state.clear()
                if out is not None:
                    yield out

            def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
                yield from self._run(key, rows, timerValues)

            def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:  # noqa: N802,N803
                yield from self._run(key, iter(()), timerValues)

            def close(self) -> None:
                pass

        return BucketProcessor()

    def key_processor(self, ttl: Optional[timedelta] = None, timed: bool = True) -> Any:
        """Build the `StatefulProcessor` of the key layout (`flowspark.spark.streaming.keylayout.key_processor`).

        Args:
            ttl: The run's `state_ttl` (also Spark's TTL of the per-key rows).
            timed: Whether the query runs in processing-time mode (see `tiered_processor`).

        Returns:
            The processor.
        """
        return key_processor(self, ttl, timed)

    def chunk_processor(self, ttl: Optional[timedelta] = None, timed: bool = True) -> Any:
        """Build the `StatefulProcessor` of the chunk layout (`flowspark.spark.streaming.chunklayout.chunk_processor`).

        Args:
            ttl: The run's `state_ttl` (also Spark's TTL of the chunk rows).
            timed: Whether the query runs in processing-time mode (see `tiered_processor`).

        Returns:
            The processor.
        """
        return chunk_processor(self, ttl, timed)


def _load(blob: Optional[bytes]) -> dict[str, Any]:
    """A bucket's `{key: entry}` (layout "bucket") from its state row."""
    return pickle.loads(blob) if blob is not None else {}  # noqa: S301 - our own state
