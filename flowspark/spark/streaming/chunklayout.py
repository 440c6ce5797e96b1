"""The chunk layout of a streaming query's keyed state: a hot tier, and cold keys in chunks of many keys.

Like the key layout (`flowspark.spark.streaming.keylayout`), a bucket of keys has one
bookkeeping row (the keys waiting for a notification, the registered timer, and the
entries of the bucket's last `HOT_PER_BUCKET` touched keys: the hot tier). The other
keys sit in `MapState` rows holding many keys each: a key's chunk is
`crc32(key) % chunks`, the bucket's chunk count doubling whenever its cold keys pass
`CHUNK_KEYS` per chunk on average. A micro-batch reads the chunks of the cold keys it
touches and rewrites the chunks of the keys leaving the hot tier, once per chunk and
call: a stream of new keys costs a few state calls per chunk, not two per key, and a
micro-batch over hot keys costs no chunk call at all. A cold key that joins the hot tier
keeps its copy in its chunk (stale from then on, the hot tier's entry wins), and a chunk
written anyway also gets the current entries of its hot keys (clean copies): a hot key
whose copy is clean leaves the hot tier without a write. So the first micro-batch over a
new set of hot keys reads their chunks without rewriting them, and the keys it pushes out
of the hot tier after a fill cost nothing. A cold key's pending `notify_at`
stays in its entry in the chunk; the bookkeeping row keeps per chunk only the earliest
pending time and the count, so a micro-batch reads a chunk for its timers only when one
is due, and the bookkeeping row does not grow with the cold keys waiting for a
notification. `ChunkTable` is the bucket's table, driven by the stage's one
`BucketDriver`; `chunk_processor` its processor.
"""

from __future__ import annotations

import itertools
import pickle
import zlib
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from flowspark.spark.streaming.keylayout import HOT_PER_BUCKET, dump_state, tiered_processor

__all__ = ["CHUNKS", "CHUNK_KEYS", "HOT_PER_BUCKET", "ChunkTable", "chunk_of", "chunk_processor"]

#: Cold keys per chunk, on average, past which a bucket's chunk count doubles.
CHUNK_KEYS = 512
#: Name and schemas of the chunks' MapState (chunk number -> pickled `{key: entry}`).
CHUNKS = ("chunks", "c int", "chunk binary")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def chunk_of(key: str, chunks: int) -> int:
    """The chunk of a key among `chunks` (CRC-32 of its UTF-8 bytes: the same in every process).

    With twice the chunks, a key of chunk `c` goes to `c` or `c + chunks`: a chunk splits in two.
    """
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % chunks


class ChunkTable:
    """A bucket's state in the chunk layout: a hot tier in the bucket's row, the cold keys in chunks.

    Behaves like the bucket layout's `{key: entry}` dict for what `BucketDriver.process`
    does with it (`get`, item assignment, `pop`). A key lives in one place: the hot tier
    (the last `hot_cap` keys touched, most recent last) or its chunk. A touched cold key
    moves to the hot tier; at `flush` the least recent keys beyond `hot_cap` move to their
    chunks. Each chunk is read at most once per call and written once when it changed.
    The hot keys waiting for a notification are kept as integers (µs since the epoch),
    scanned in C (`due`, `earliest`); a cold key's `notify_at` is in its chunk's entry, and
    the bookkeeping row has each chunk's earliest one and count (`cpend`), updated whenever
    the chunk is written: `due` reads the chunks whose earliest time has come, no other.

    Args:
        chunks: The stage's `MapState` (`chunk number -> pickled {key: entry}`).
        meta: The bucket's bookkeeping (pickled `{"pending": {hot key: notify_at in µs since the epoch},
            "cpend": {chunk: (earliest notify_at in µs, keys waiting)}, "timer": registered timer in ms or
            None, "hot": {key: entry}, "n": chunk count, "sizes": {chunk: entries stored in it},
            "copied": {hot key: whether its chunk's copy is current}}`), or `None`. A row
            written before `cpend` existed has every waiting key in `pending`: it is split on
            load; one written before `copied` existed has no copies.
        hot_cap: The most keys of the hot tier.
        chunk_keys: Cold keys per chunk (on average) past which the chunk count doubles.
    """

    def __init__(
        self, chunks: Any, meta: Optional[bytes], hot_cap: int = HOT_PER_BUCKET, chunk_keys: int = CHUNK_KEYS
    ) -> None:
        """Load the bucket's bookkeeping."""
        m = pickle.loads(meta) if meta is not None else {}  # noqa: S301 - our own state
        self.chunks = chunks
        self.hot_cap = hot_cap
        self.chunk_keys = chunk_keys
        self.pending: dict[str, int] = m.get("pending", {})
        self.timer: Optional[int] = m.get("timer")
        self.hot: dict[str, Any] = m.get("hot", {})
        self.n: int = m.get("n", 1)
        self.sizes: dict[int, int] = m.get("sizes", {})
        self.cpend: dict[int, tuple[int, int]] = m.get("cpend", {})
        # The hot keys with an entry in their chunk too: True when that entry is the hot one
        # (clean), False when the key changed since (stale). `sizes` and the chunks count these
        # copies; `cpend`, `due` and `pending_at` leave them out (the hot tier's `pending` has them).
        self.copied: dict[str, bool] = m.get("copied", {})
        self.changed = meta is None  # whether the bookkeeping must be written back
        if meta is not None and "cpend" not in m:
            self._split_pending()
        self._seen: dict[str, Any] = {}  # keys set or dropped by this call (None: dropped)
        self._loaded: dict[int, dict[str, Any]] = {}
        self._dirty: set[int] = set()

    def _split_pending(self) -> None:
        """Move the cold keys of a bookkeeping row written before `cpend` from `pending` to `cpend`."""
        for key in [k for k in self.pending if k not in self.hot]:
            self._count_in(chunk_of(key, self.n), self.pending.pop(key))
            self.changed = True

    @property
    def keys(self) -> int:
        """The number of keys of the bucket (as of the last `flush`)."""
        return len(self.hot) + sum(self.sizes.values()) - len(self.copied)

    def __len__(self) -> int:
        """The number of keys of the bucket (as of the last `flush`)."""
        return self.keys

    def hot_entries(self) -> dict[str, Any]:
        """The entries of the hot tier (the state TTL's sweep looks at these only)."""
        return self.hot

    def _chunk(self, cid: int) -> dict[str, Any]:
        """Chunk `cid`'s `{key: entry}`, read once per call (a chunk Spark's TTL removed is empty)."""
        chunk = self._loaded.get(cid)
        if chunk is None:
            chunk = {}
            if self.sizes.get(cid):
                row = self.chunks.getValue((cid,))
                if row is not None:
                    chunk = pickle.loads(row[0])  # noqa: S301 - our own state
                else:  # every key of it outlived the state TTL: Spark dropped the row unread
                    del self.sizes[cid]
                    self.cpend.pop(cid, None)
                    for key in [k for k in self.copied if chunk_of(k, self.n) == cid]:
                        del self.copied[key]  # its hot entry is its only one now
                    self.changed = True
            self._loaded[cid] = chunk
        return chunk

    def get(self, key: str, default: Any = None) -> Any:
        """The key's entry, or `default` when it has none."""
        if key in self._seen:
            ent = self._seen[key]
        else:
            ent = self.hot.get(key)
            if ent is None:
                ent = self._chunk(chunk_of(key, self.n)).get(key)
        return default if ent is None else ent

    def __setitem__(self, key: str, ent: Any) -> None:
        """Set the key's entry (stored at `flush`)."""
        self._seen[key] = ent
        self._track(key, ent[1])

    def pop(self, key: str, default: Any = None) -> Any:
        """Drop the key's entry (at `flush`); return it or `default`."""
        old = self.get(key)
        self._seen[key] = None
        self._track(key, None)
        return default if old is None else old

    def _track(self, key: str, at: Optional[datetime]) -> None:
        if at is None:
            self.pending.pop(key, None)
        else:
            self.pending[key] = (at - _EPOCH) // _US

    def earliest(self) -> Optional[datetime]:
        """The earliest `notify_at` of the bucket's keys, or `None`."""
        ats = [min(self.pending.values())] if self.pending else []
        if self.cpend:
            ats.append(min(first for first, _n in self.cpend.values()))
        return _EPOCH + min(ats) * _US if ats else None

    def pending_count(self) -> int:
        """The number of the bucket's keys waiting for a notification (as of the last `flush`)."""
        return len(self.pending) + sum(n for _first, n in self.cpend.values())

    def due(self, now: datetime) -> list[tuple[datetime, str]]:
        """`(notify_at, key)` of the keys due at `now`, in time order (then key).

        Reads the chunks whose earliest pending time has come; a key this call set or dropped
        is taken from `pending` (its chunk's entry is the old one until `flush`).
        """
        limit = (now - _EPOCH) // _US
        out = [(_EPOCH + at * _US, key) for key, at in self.pending.items() if at <= limit]
        for cid in [c for c, (first, _n) in self.cpend.items() if first <= limit]:
            for key, ent in self._chunk(cid).items():
                if ent[1] is not None and ent[1] <= now and key not in self._seen and key not in self.copied:
                    out.append((ent[1], key))
        return sorted(out)

    def pending_at(self) -> dict[str, datetime]:
        """`{key: notify_at}` of the keys waiting for a notification (reads every chunk holding one)."""
        out = {}
        for cid in list(self.cpend):
            for key, ent in self._chunk(cid).items():
                if ent[1] is not None and key not in self._seen and key not in self.copied:
                    out[key] = ent[1]
        out.update({key: _EPOCH + at * _US for key, at in self.pending.items()})
        return out

    def flush(self) -> None:
        """Store this call's keys in the hot tier, move the least recent beyond `hot_cap` to chunks, write chunks."""
        if not self._seen:
            return
        self.changed = True
        recount = self._store_seen()
        self._evict()
        dirty = self._dirty
        if dirty:  # chunks written anyway take their hot keys' entries: clean copies
            for key, ent in self.hot.items():
                if not self.copied.get(key):
                    cid = chunk_of(key, self.n)
                    if cid in dirty:
                        self._loaded[cid][key] = ent
                        self.copied[key] = True
        for cid in dirty:
            self.sizes[cid] = len(self._loaded[cid])
        while sum(self.sizes.values()) > self.n * self.chunk_keys:
            self._double()
        for cid in recount - dirty:
            if cid in self._loaded:
                self._count_pending(cid, self._loaded[cid])
        for cid in sorted(dirty):
            chunk = self._loaded[cid]
            self._count_pending(cid, chunk)
            if chunk:
                self.chunks.updateValue((cid,), (dump_state(chunk),))
            else:
                self.chunks.removeKey((cid,))
                self.sizes.pop(cid, None)
        dirty.clear()

    def _store_seen(self) -> set[int]:
        """Put this call's keys in the hot tier (a dropped key leaves its chunk); return the chunks to recount.

        A cold key keeps its copy in its chunk (stale now): the chunks whose `cpend` counted it
        must be counted again without it.
        """
        hot, copied = self.hot, self.copied
        recount: set[int] = set()
        for key, ent in self._seen.items():
            was_hot = hot.pop(key, None) is not None
            if was_hot and key not in copied:
                if ent is not None:
                    hot[key] = ent
                continue
            cid = chunk_of(key, self.n)
            in_chunk = was_hot or (bool(self.sizes.get(cid)) and key in self._chunk(cid))
            if ent is None:  # dropped: its copy goes too
                copied.pop(key, None)
                if in_chunk and self._chunk(cid).pop(key, None) is not None:
                    self._dirty.add(cid)
                continue
            hot[key] = ent
            if in_chunk:
                copied[key] = False  # the chunk keeps the old entry: stale
                if not was_hot and cid in self.cpend:
                    recount.add(cid)
        self._seen.clear()
        return recount

    def _evict(self) -> None:
        """Move the least recent hot keys beyond `hot_cap` to their chunks (a clean copy is there already)."""
        hot = self.hot
        extra = len(hot) - self.hot_cap
        for key in list(itertools.islice(hot, max(extra, 0))):
            ent = hot.pop(key)
            self.pending.pop(key, None)  # its notify_at is in the chunk's entry now
            cid = chunk_of(key, self.n)
            if self.copied.pop(key, False):  # the chunk holds this entry already: count its notify_at
                if ent[1] is not None and cid not in self._dirty:
                    self._count_in(cid, (ent[1] - _EPOCH) // _US)
                continue
            self._chunk(cid)[key] = ent
            self._dirty.add(cid)

    def _count_in(self, cid: int, at: int) -> None:
        """Count one more key of chunk `cid` waiting for a notification at `at` (µs since the epoch) in `cpend`."""
        first, count = self.cpend.get(cid, (at, 0))
        self.cpend[cid] = (min(first, at), count + 1)

    def _count_pending(self, cid: int, chunk: dict[str, Any]) -> None:
        """Record chunk `cid`'s earliest pending `notify_at` and its count (`cpend`), or drop it."""
        copied = self.copied
        ats = [ent[1] for key, ent in chunk.items() if ent[1] is not None and key not in copied]
        if ats:
            self.cpend[cid] = ((min(ats) - _EPOCH) // _US, len(ats))
        else:
            self.cpend.pop(cid, None)

    def _double(self) -> None:
        """Split every chunk in two (the chunk count doubles): chunk `c`'s keys go to `c` or `c + n`."""
        n, n2 = self.n, 2 * self.n
        for cid in range(n):
            chunk = self._chunk(cid)
            if not chunk:
                continue
            moved = {k: e for k, e in chunk.items() if chunk_of(k, n2) != cid}
            if not moved:
                continue
            for k in moved:
                del chunk[k]
            self._loaded[cid + n] = moved
            self._dirty.update((cid, cid + n))
            self.sizes[cid] = len(chunk)
            self.sizes[cid + n] = len(moved)
        self.n = n2

    def meta(self) -> bytes:
        """The bucket's bookkeeping, to store."""
        sizes = {c: s for c, s in self.sizes.items() if s}
        return dump_state(
            {
                "pending": self.pending,
                "cpend": self.cpend,
                "timer": self.timer,
                "hot": self.hot,
                "n": self.n,
                "sizes": sizes,
                "copied": self.copied,
            }
        )


def chunk_processor(driver: Any, ttl: Optional[timedelta] = None, timed: bool = True) -> Any:
    """Build the `StatefulProcessor` of the chunk layout (`transformWithStateInPandas`, see `ChunkTable`).

    Args:
        driver: The stage's `flowspark.spark.streaming.state.BucketDriver`.
        ttl: The run's `state_ttl`, also Spark's TTL of the chunk rows: a chunk is written
            whenever a key enters it, after that key's last value, so a chunk unwritten for the
            TTL holds only expired keys and leaves the state store without being read.
        timed: Whether the query runs in processing-time mode with a TTL on the rows (see
            `flowspark.spark.streaming.keylayout.tiered_processor`).

    Returns:
        The processor.
    """
    hot_cap, chunk_keys = HOT_PER_BUCKET, CHUNK_KEYS  # read now: the workers get the values
    return tiered_processor(driver, ttl, CHUNKS, lambda rows, meta: ChunkTable(rows, meta, hot_cap, chunk_keys), timed)
