"""The key layout of a streaming query's keyed state, and the codec of stored entries.

In the key layout (`transformWithStateInPandas`) a bucket of keys has one bookkeeping
row (the keys waiting for a notification, the registered timer, the key count, and the
entries of the bucket's last `HOT_PER_BUCKET` touched keys: the hot tier) and one
`MapState` row per other key (`KeyTable`), read only when the key gets values or a
notification. A micro-batch's cost follows the keys it touches: keys of the hot tier
cost no per-key state call, others two state-store round trips. `key_processor` is the
layout's `StatefulProcessor`; it runs a bucket with the stage's `BucketDriver`
(`flowspark.spark.streaming.state`, which also holds the bucket layout).
`dump_state` encodes what both layouts store.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, Optional

__all__ = ["ENTRIES", "HOT_PER_BUCKET", "META", "KeyTable", "dump_state", "key_processor", "tiered_processor"]

#: Spark's TTL of the per-key rows when the run has no `state_ttl` (see `key_processor`).
_NO_TTL = timedelta(days=36500)
#: The most keys of a bucket kept in its bookkeeping row (the hot tier, see `KeyTable`).
HOT_PER_BUCKET = 1024
#: Name and schemas of the per-key MapState and of the bucket's bookkeeping ValueState.
ENTRIES = ("entries", "k string", "entry binary")
META = ("meta", "meta binary")


def dump_state(table: Any) -> bytes:
    """Encode a bucket's state or a key's entry: pickle, or cloudpickle for what plain pickle refuses.

    Snapshots may hold instances of classes from the user's own modules, which flowspark
    ships to the workers by value (`flowspark.spark.session.ship_user_modules`): the workers
    cannot import them by name, cloudpickle carries them. Both decode with `pickle.loads`.

    Args:
        table: `{key: (snapshots, notify_at, run)}`, or one such entry (`run`: the writing run's
            token, see `BucketDriver.earlier`; entries of older versions have none).

    Returns:
        The bytes.
    """
    try:
        return pickle.dumps(table, protocol=5)
    except Exception:  # noqa: BLE001
        import cloudpickle

        return cloudpickle.dumps(table, protocol=5)


class KeyTable:
    """A bucket's state in the key layout: a small hot tier in the bucket's row, the rest key by key.

    Behaves like the bucket layout's `{key: entry}` dict for what `BucketDriver.process`
    does with it (`get`, item assignment, `pop`). The bucket's bookkeeping row holds the
    *hot* entries: the last `HOT_PER_BUCKET` keys touched, most recent last. Every other
    key's entry is a `MapState` row, read when the key is touched (then it joins the hot
    tier) and written when it leaves the hot tier. A micro-batch that touches the same keys
    as the last ones reads and writes no per-key row; one touching cold keys pays two
    state-store round trips per key.

    Args:
        entries: The stage's `MapState` (`key -> pickled entry`).
        meta: The bucket's bookkeeping (pickled `{"pending": {key: notify_at}, "timer":
            registered timer in ms or None, "keys": key count, "hot": {key: (entry, in_map)}}`,
            `in_map` telling whether a `MapState` row of the key exists), or `None`.
        hot_cap: The most keys the hot tier keeps (`flush`).
    """

    def __init__(self, entries: Any, meta: Optional[bytes], hot_cap: int = HOT_PER_BUCKET) -> None:
        """Load the bucket's bookkeeping."""
        m = pickle.loads(meta) if meta is not None else {}  # noqa: S301 - our own state
        self.entries = entries
        self.hot_cap = hot_cap
        self.pending: dict[str, datetime] = m.get("pending", {})
        self.timer: Optional[int] = m.get("timer")
        self.keys: int = m.get("keys", 0)
        self.hot: dict[str, tuple[Any, bool]] = m.get("hot", {})
        self.changed = meta is None  # whether the bookkeeping must be written back
        self._seen: dict[str, Any] = {}
        self._in_map: dict[str, bool] = {}

    def get(self, key: str, default: Any = None) -> Any:
        """The key's entry, or `default` when it has none."""
        try:
            ent = self._seen[key]
        except KeyError:
            h = self.hot.get(key)
            if h is not None:
                ent, self._in_map[key] = h
            else:
                row = self.entries.getValue((key,))
                ent = pickle.loads(row[0]) if row is not None else None  # noqa: S301 - our own state
                self._in_map[key] = ent is not None
            self._seen[key] = ent
        return default if ent is None else ent

    def __setitem__(self, key: str, ent: Any) -> None:
        """Set the key's entry (stored at `flush`)."""
        if self.get(key) is None:
            self.keys += 1
        self._seen[key] = ent
        self._track(key, ent[1])

    def pop(self, key: str, default: Any = None) -> Any:
        """Drop the key's entry (at `flush`); return it or `default`."""
        old = self.get(key)
        if old is not None:
            self.keys -= 1
            self._seen[key] = None
        self._track(key, None)
        return default if old is None else old

    def __len__(self) -> int:
        """The number of keys of the bucket."""
        return self.keys

    def pending_count(self) -> int:
        """The number of the bucket's keys waiting for a notification."""
        return len(self.pending)

    def _track(self, key: str, at: Optional[datetime]) -> None:
        if self.pending.get(key) != at:
            if at is None:
                del self.pending[key]
            else:
                self.pending[key] = at

    def hot_entries(self) -> dict[str, Any]:
        """The entries of the hot tier (the state TTL's sweep looks at these only)."""
        return {key: ent for key, (ent, _in_map) in self.hot.items()}

    def flush(self) -> None:
        """Store the keys touched by this call in the hot tier; move the least recent beyond `hot_cap` to MapState."""
        if not self._seen:
            return
        self.changed = True
        hot = self.hot
        for key, ent in self._seen.items():
            hot.pop(key, None)
            if ent is not None:
                hot[key] = (ent, self._in_map[key])
            elif self._in_map[key]:
                self.entries.removeKey((key,))
        self._seen.clear()
        while len(hot) > self.hot_cap:
            key = next(iter(hot))
            ent, _in_map = hot.pop(key)
            self.entries.updateValue((key,), (dump_state(ent),))

    def meta(self) -> bytes:
        """The bucket's bookkeeping, to store."""
        return dump_state({"pending": self.pending, "timer": self.timer, "keys": self.keys, "hot": self.hot})


def key_processor(driver: Any, ttl: Optional[timedelta] = None, timed: bool = True) -> Any:
    """Build the `StatefulProcessor` of the key layout (`transformWithStateInPandas`, see `KeyTable`).

    Args:
        driver: The stage's `flowspark.spark.streaming.state.BucketDriver` (`BucketDriver.key_processor`).
        ttl: The run's `state_ttl`, also given to Spark as the TTL of the per-key rows, so
            the rows of keys that get no value leave the state store without being read
            (Spark counts from a row's last write, never earlier than the key's last value).
        timed: Whether the query runs in processing-time mode with a TTL on the rows (see
            `tiered_processor`).

    Returns:
        The processor.
    """
    hot_cap = HOT_PER_BUCKET  # read now: the workers get the value
    return tiered_processor(driver, ttl, ENTRIES, lambda rows, meta: KeyTable(rows, meta, hot_cap), timed)


def tiered_processor(
    driver: Any,
    ttl: Optional[timedelta],
    map_state: tuple[str, str, str],
    table: Callable[[Any, Optional[bytes]], Any],
    timed: bool = True,
) -> Any:
    """Build the `StatefulProcessor` of a layout with a bookkeeping row per bucket and a `MapState` (key, chunk).

    Args:
        driver: The stage's `BucketDriver`.
        ttl: The run's `state_ttl`, also Spark's TTL of the `MapState` rows (see `key_processor`).
        map_state: Name, key schema and value schema of the layout's `MapState`.
        table: Builds a bucket's table from the `MapState` and the bookkeeping row (or `None`):
            `KeyTable` or `flowspark.spark.streaming.chunklayout.ChunkTable` (`get`, item
            assignment, `pop`, `flush`, `pending`, `timer`, `changed`, `keys`, `meta`).
        timed: Whether the query runs in processing-time mode (`timeMode="ProcessingTime"`),
            with a TTL on the `MapState` rows (`ttl`, or 100 years without one). A query
            without timers and without `state_ttl` runs with `timed=False` (time mode "None",
            rows without a TTL): Spark then plans no processing-time work and runs no no-data
            micro-batches. Spark stores a row's TTL with the row, so a checkpoint keeps its
            choice (`flowspark.spark.streaming.checkpoint.check_untimed`).

    Returns:
        The processor.
    """
    import cloudpickle
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    # The driver and the table travel as bytes, loaded at a processor's first call: Spark first
    # runs the processor's `init` alone in a new Python process on the driver, once per query, to
    # learn the state variables. That process imports neither the stage's modules nor the user's,
    # nor flowspark itself: it runs without the package flowspark shipped to the workers
    # (`session.ensure_workers`: Spark gives it no shipped files), so what `init` unpickles
    # (this class, by value) names nothing of flowspark.
    blob = cloudpickle.dumps((driver, table), protocol=5)
    # Spark stores a TTL with each MapState row when one is configured, so a checkpoint cannot
    # switch between with and without: a timed query without state_ttl gives its rows 100 years.
    ttl_ms = max(1, int((ttl or _NO_TTL) / timedelta(milliseconds=1))) if timed else None

    class TieredProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.entries = handle.getMapState(*map_state, ttlDurationMs=ttl_ms)
            self.meta = handle.getValueState(*META)
            self.driver: Any = None
            self.table: Any = None

        def _run(self, key: Any, pdfs: Iterator[Any], timer_values: Any, fired: Optional[int]) -> Iterator[Any]:
            driver = self.driver
            if driver is None:
                driver, self.table = pickle.loads(blob)  # noqa: S301 - our own driver, pickled above
                self.driver = driver
            now = driver.now(timer_values.getCurrentProcessingTimeInMs)
            if driver.route is not None and key[0] == driver.forward_group:
                out = driver.call({}, pdfs, now, key[0])
                if out is not None:
                    yield out
                return
            # One state call: `get` is `None` for a bucket without its row (`exists` first cost a
            # second round trip to Spark's state server, about 0.6 ms a bucket, measured).
            row = self.meta.get()
            tab = self.table(self.entries, None if row is None else row[0])
            if fired is not None and fired == tab.timer:
                tab.timer, tab.changed = None, True  # Spark dropped the timer that fired
            out = driver.call(tab, pdfs, now, key[0])
            tab.flush()
            driver.report(key[0], tab)
            if driver.timers:
                ms = driver.timeout_ms(tab, now)
                want = None if ms is None else int(now.timestamp() * 1000) + ms
                if want is not None and want == fired:
                    # Spark drops the timer that fired after this call: a new one needs another time.
                    want += 1
                if want != tab.timer:
                    if tab.timer is not None:
                        self.handle.deleteTimer(tab.timer)
                    if want is not None:
                        self.handle.registerTimer(want)
                    tab.timer, tab.changed = want, True
            if tab.changed:
                if tab.keys or tab.timer is not None:
                    self.meta.update((tab.meta(),))
                else:
                    self.meta.clear()
            if out is not None:
                yield out

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802,N803
            yield from self._run(key, rows, timerValues, None)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:  # noqa: N802,N803
            yield from self._run(key, iter(()), timerValues, expiredTimerInfo.getExpiryTimeInMs())

        def close(self) -> None:
            pass

    return TieredProcessor()
