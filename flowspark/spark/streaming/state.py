"""Keyed state of a streaming query: one Python call per bucket of keys and micro-batch.

`applyInPandasWithState` (or `transformWithStateInPandas` for chains) groups a
keyed stage's rows by `bucket = pmod(hash(k), B)`. The bucket's state is the
pickled `{key: (snapshots of the chain's logics, notify_at)}`. `BucketDriver`
rebuilds each touched key's logics from their snapshots, hands its values (in
sequence order) to the per-key driver (`flowspark.runtime.driver.drive_chain`),
fires the notifications due at the micro-batch's time, snapshots the logics
back, and returns the bucket's timeout: its earliest `notify_at`.
"""

from __future__ import annotations

import itertools
import operator
import pickle
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark._time import use_clock
from flowspark.errors import FlowsparkRuntimeError
from flowspark.runtime.driver import drive_chain, idx
from flowspark.spark.codec import encode_task_error, loads_all
from flowspark.spark.plan import StageSpec
from flowspark.spark.streaming.routing import Route, forward_frame
from flowspark.spark.worker import dict_rows, no_gc, run_stage_rows, stage_streams

__all__ = ["STATE_SCHEMA", "BucketDriver", "dump_state"]

#: Schema of a bucket's state row.
STATE_SCHEMA = "blob binary"
_key_seq = operator.itemgetter(0, 1)


def dump_state(table: dict[str, Any]) -> bytes:
    """Encode a bucket's state: pickle, or cloudpickle for what plain pickle refuses.

    Snapshots may hold instances of classes from the user's own modules, which flowspark
    ships to the workers by value (`flowspark.spark.session.ship_user_modules`): the workers
    cannot import them by name, cloudpickle carries them. Both decode with `pickle.loads`.

    Args:
        table: `{key: (snapshots, notify_at)}`.

    Returns:
        The bytes.
    """
    try:
        return pickle.dumps(table, protocol=5)
    except Exception:  # noqa: BLE001
        import cloudpickle

        return cloudpickle.dumps(table, protocol=5)


_second = operator.itemgetter(1)


class BucketDriver:
    """Runs a keyed stage for one bucket of keys (called by `applyInPandasWithState`).

    State of a bucket: `{key: (snaps, notify_at)}` pickled, where `snaps[i]` is
    `None` when step `i` has no logic for the key and `(snapshot,)` otherwise, and
    `notify_at` is the earliest `notify_at()` of the key's logics (or `None`).

    Args:
        spec: The keyed stage (its chain, the stateless ops after it, and the
            sequence length of its input, `depth_in`).
        clock: A function returning "now" (aware UTC datetime); default Spark's
            processing time of the micro-batch. With a clock, every bucket with a
            pending notification is visited in every micro-batch (Spark's timers
            cannot follow a foreign clock).
        sink_rows: `(sink step id, Arrow schema)` when the stage's only port feeds the
            query's lone file sink: the output is then the sink's rows (dict items
            converted as `_dict_rows` does), saving a Python pass over every item.
        timers: Whether the query has timers (timeouts); without, no step can ask for
            a notification and no timeout is set.
        route: In the routed lowering (`flowspark.spark.streaming.routing`), the stage's
            route: its output rows carry routes, and the group `forward_group` only
            hands back the rows the stage forwards.
        forward_group: The bucket value of the forward group.
    """

    def __init__(
        self,
        spec: StageSpec,
        clock: Optional[Callable[[], datetime]] = None,
        sink_rows: Optional[tuple[str, Any]] = None,
        timers: bool = True,
        route: Optional[Route] = None,
        forward_group: int = -1,
    ) -> None:
        """Describe the stage."""
        self.route = route
        self.forward_group = forward_group
        self.spec = spec
        self.drivers = tuple(ks.driver() for ks in spec.chain)
        self.depth_in = spec.depth_in
        self.clock = clock
        self.sink_rows = sink_rows
        self.timers = timers

    # -- state codec ----------------------------------------------------------
    def _logics(self, key: str, snaps: Optional[list[Any]]) -> list[Any]:
        if snaps is None:
            return [None] * len(self.drivers)
        return [None if s is None else d.build(key, s[0]) for d, s in zip(self.drivers, snaps, strict=True)]

    def _freeze(self, key: str, logics: list[Any]) -> Optional[tuple[list[Any], Optional[datetime]]]:
        snaps: list[Any] = []
        at: Optional[datetime] = None
        for d, logic in zip(self.drivers, logics, strict=True):
            if logic is None:
                snaps.append(None)
                continue
            snaps.append((d.snapshot(key, logic),))
            a = d.notify_at(key, logic)
            if a is not None and (at is None or a < at):
                at = a
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
            FlowsparkRuntimeError: A user callable failed.
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
            emits, logics = drive_chain(self.drivers, key, items, logics, now=now, eof=False)
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
                emits, tail = drive_chain(rest, key, emits, logics[i + 1 :], now=now, eof=False)
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

    def call(
        self, blob: Optional[bytes], pdfs: Iterator[Any], now: datetime, bucket: Any = None
    ) -> tuple[Any, dict[str, Any]]:
        """Run one bucket's micro-batch: decode state, process rows and due keys, encode output.

        Args:
            blob: The bucket's pickled state, or `None`.
            pdfs: pandas DataFrames of `(k, seq, v)` rows (`(p, k, seq, v)` when routed).
            now: The time of the micro-batch.
            bucket: The group's bucket value.

        Returns:
            `(output DataFrame or None, new state table)`.
        """
        import pandas as pd

        if self.route is not None and bucket == self.forward_group:
            return forward_frame(pdfs, self.route.forward), {}
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
        except FlowsparkRuntimeError as f:
            raise RuntimeError(encode_task_error(f)) from None
        if not cols[0]:
            return None, table
        ps = cols[0] if self.route is None else [self.route.offset + p for p in cols[0]]
        return pd.DataFrame({"p": ps, "k": cols[1], "seq": cols[2], "v": cols[3]}), table

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

        def fn(bucket: Any, pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
            now = driver.now(state.getCurrentProcessingTimeMs)
            out, table = driver.call(state.get[0] if state.exists else None, pdfs, now, bucket[0])
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
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        driver = self

        class BucketProcessor(StatefulProcessor):
            def init(self, handle: Any) -> None:
                self.handle = handle
                self.state = handle.getValueState("blob", STATE_SCHEMA)

            def _run(self, key: Any, pdfs: Iterator[Any], timer_values: Any) -> Iterator[Any]:
                now = driver.now(timer_values.getCurrentProcessingTimeInMs)
                blob = self.state.get()[0] if self.state.exists() else None
                out, table = driver.call(blob, pdfs, now, key[0])
                if driver.timers:
                    for t in list(self.handle.listTimers()):
                        self.handle.deleteTimer(t)
                if table:
                    self.state.update((dump_state(table),))
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
