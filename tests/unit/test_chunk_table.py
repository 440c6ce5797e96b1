"""The chunk layout's table behaves as the bucket layout's `{key: entry}` dict, over any sequence of calls."""

from __future__ import annotations

import pickle
import random
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest

from flowspark.spark.streaming.chunklayout import ChunkTable, chunk_of


class FakeMapState:
    """Spark's MapState as the table uses it: one value tuple per key, counting state calls."""

    def __init__(self) -> None:
        self.rows: dict[int, bytes] = {}
        self.calls = 0

    def getValue(self, key: tuple[int]) -> Optional[tuple[bytes]]:  # noqa: N802 - Spark's name
        self.calls += 1
        return (self.rows[key[0]],) if key[0] in self.rows else None

    def updateValue(self, key: tuple[int], value: tuple[bytes]) -> None:  # noqa: N802
        self.calls += 1
        self.rows[key[0]] = value[0]

    def removeKey(self, key: tuple[int]) -> None:  # noqa: N802
        self.calls += 1
        self.rows.pop(key[0], None)


T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _entry(n: int, at: Any = None) -> tuple[Any, Any, bytes]:
    return ([(n,)], at, b"run")


def _filled(n: int, hot_cap: int, chunk_keys: int, timed: bool = False) -> tuple[FakeMapState, ChunkTable]:
    """A new table with keys `k0..k<n-1>` set and flushed (`timed`: key i waits for T0 + i seconds)."""
    ms = FakeMapState()
    table = ChunkTable(ms, None, hot_cap=hot_cap, chunk_keys=chunk_keys)
    for i in range(n):
        table[f"k{i}"] = _entry(i, T0 + timedelta(seconds=i) if timed else None)
    table.flush()
    return ms, table


def _check_copies(table: ChunkTable, ms: FakeMapState) -> None:
    """Each chunk row holds what `sizes` says; a copied key is hot and in its chunk, a clean copy equal to it."""
    chunks = {cid: pickle.loads(blob) for cid, blob in ms.rows.items()}
    assert {c: n for c, n in table.sizes.items() if n} == {c: len(ch) for c, ch in chunks.items()}
    for key, clean in table.copied.items():
        assert key in table.hot
        stored = chunks[chunk_of(key, table.n)]
        assert key in stored
        assert (stored[key] == table.hot[key]) or not clean


def _random_ops(rng: random.Random, table: ChunkTable, ref: dict, call: int, ops: int, keys: int, at_of) -> None:
    """`ops` random gets, then pops or sets (`at_of(call)`: the entry's notify_at) of keys `k0..k<keys>`, on both."""
    for _ in range(ops):
        key = f"k{rng.randint(0, keys)}"
        assert table.get(key) == ref.get(key)
        if rng.random() < 0.2:
            assert table.pop(key, None) == ref.pop(key, None)
        else:
            ref[key] = table[key] = _entry(call, at_of(call))


@pytest.mark.parametrize("seed", range(8))
def test_random_calls_match_a_dict_and_chunks_split(seed):
    rng = random.Random(seed)
    ms, meta, ref = FakeMapState(), None, {}
    hot_cap = 4 if seed < 4 else 16
    for call in range(150):
        table = ChunkTable(ms, meta, hot_cap=hot_cap, chunk_keys=3)
        _random_ops(
            rng,
            table,
            ref,
            call,
            rng.randint(0, 25),
            250,
            lambda _call: T0 + timedelta(seconds=rng.randint(0, 300)) if rng.random() < 0.3 else None,
        )
        table.flush()
        meta = table.meta()
        _check_copies(table, ms)
        assert table.keys == len(table) == len(ref)
        assert table.pending_at() == {k: e[1] for k, e in ref.items() if e[1] is not None}
        now = T0 + timedelta(seconds=150)
        assert table.due(now) == sorted((e[1], k) for k, e in ref.items() if e[1] is not None and e[1] <= now)
        ats = [e[1] for e in ref.values() if e[1] is not None]
        assert table.earliest() == (min(ats) if ats else None)
    final = ChunkTable(ms, meta, hot_cap=hot_cap, chunk_keys=3)
    assert {k: final.get(k) for k in ref} == ref
    # The cold keys sit in the chunk their hash names; the chunk count doubled to keep chunks small.
    assert final.n >= len(ref) / 3 / 2
    for cid, blob in ms.rows.items():
        assert all(chunk_of(k, final.n) == cid for k in pickle.loads(blob))
    assert len(final.hot) == hot_cap


def test_a_call_over_hot_keys_makes_no_chunk_call():
    ms, table = _filled(20, hot_cap=3, chunk_keys=2)
    before = ms.calls
    table = ChunkTable(ms, table.meta(), hot_cap=3, chunk_keys=2)
    for key in ("k17", "k18", "k19"):
        table[key] = _entry(table.get(key)[0][0][0] + 1)
    table.flush()
    assert ms.calls == before
    # A cold key costs one read and one write of its chunk (it moves to the hot tier, another leaves).
    table = ChunkTable(ms, table.meta(), hot_cap=3, chunk_keys=2)
    assert table.get("k0") == _entry(0)
    table["k0"] = _entry(5)
    table.flush()
    assert ms.calls - before <= 4


def test_new_hot_keys_after_a_fill_read_their_chunks_and_write_none():
    """A fill leaves clean copies of its last keys; touching other cold keys then rewrites no chunk."""
    ms, table = _filled(2000, hot_cap=50, chunk_keys=20)
    assert len(table.copied) == 50
    assert all(table.copied.values())
    rows = dict(ms.rows)
    # The first call over 50 other keys: the chunks they sit in are read, none is written.
    hot = [f"k{i}" for i in range(0, 1000, 20)]
    table = ChunkTable(ms, table.meta(), hot_cap=50, chunk_keys=20)
    before = ms.calls
    for key in hot:
        table[key] = _entry(table.get(key)[0][0][0] + 1)
    table.flush()
    assert ms.calls - before == len({chunk_of(k, table.n) for k in hot})
    assert ms.rows == rows
    assert set(table.hot) == set(hot)
    assert table.keys == 2000
    # The next calls over the same keys make no chunk call; the stale copies never show.
    table = ChunkTable(ms, table.meta(), hot_cap=50, chunk_keys=20)
    before = ms.calls
    assert [table.get(k)[0][0][0] for k in hot] == [int(k[1:]) + 1 for k in hot]
    table.flush()
    assert ms.calls == before
    # Pushed out by other keys, a changed key is written back to its chunk.
    table = ChunkTable(ms, table.meta(), hot_cap=50, chunk_keys=20)
    for i in range(1, 101, 2):
        table[f"k{i}"] = _entry(0)
    table.flush()
    final = ChunkTable(ms, table.meta(), hot_cap=50, chunk_keys=20)
    assert [final.get(k)[0][0][0] for k in hot] == [int(k[1:]) + 1 for k in hot]
    assert final.keys == 2000
    _check_copies(final, ms)


def test_a_dropped_key_takes_its_chunk_copy_with_it():
    ms, table = _filled(30, hot_cap=2, chunk_keys=10, timed=True)
    table = ChunkTable(ms, table.meta(), hot_cap=2, chunk_keys=10)
    assert table.get("k3") == _entry(3, T0 + timedelta(seconds=3))
    table["k3"] = _entry(4)  # a cold key changes: a stale copy stays in its chunk, waiting no longer
    table.flush()
    assert table.copied.get("k3") is False
    assert table.pending_count() == 29
    assert "k3" not in table.pending_at()
    assert (T0 + timedelta(seconds=3), "k3") not in table.due(T0 + timedelta(seconds=10))
    table = ChunkTable(ms, table.meta(), hot_cap=2, chunk_keys=10)
    assert table.pop("k3") == _entry(4)
    table.flush()
    _check_copies(table, ms)
    assert table.keys == 29
    final = ChunkTable(ms, table.meta(), hot_cap=2, chunk_keys=10)
    assert final.get("k3") is None


def test_a_chunk_spark_dropped_by_ttl_leaves_the_count():
    ms, table = _filled(5, hot_cap=1, chunk_keys=100)
    assert table.keys == 5
    ms.rows.clear()  # what Spark's TTL does to rows unwritten for the TTL
    table = ChunkTable(ms, table.meta(), hot_cap=1, chunk_keys=100)
    assert table.get("k0") is None
    assert table.get("k4") == _entry(4)  # the hot tier is the bookkeeping row's
    table.flush()
    assert table.keys == 1


def test_cold_keys_waiting_for_a_notification_stay_in_their_chunks():
    """The bookkeeping row holds per chunk an earliest time and a count, not every waiting key."""
    ms, table = _filled(200, hot_cap=2, chunk_keys=50, timed=True)
    meta = pickle.loads(table.meta())
    assert set(meta["pending"]) == set(table.hot)
    assert len(meta["pending"]) == 2
    assert sum(n for _first, n in meta["cpend"].values()) == 198
    assert table.pending_count() == 200
    # Nothing due: no chunk is read; one key due: only the chunk holding it.
    table = ChunkTable(ms, table.meta(), hot_cap=2, chunk_keys=50)
    before = ms.calls
    assert table.due(T0 - timedelta(seconds=1)) == []
    assert ms.calls == before
    assert table.due(T0) == [(T0, "k0")]
    assert ms.calls == before + 1
    assert table.earliest() == T0
    # The key fires and waits no longer: it leaves its chunk's count.
    table["k0"] = _entry(0)
    table.flush()
    assert table.pending_count() == 199
    assert table.earliest() == T0 + timedelta(seconds=1)


def test_a_bookkeeping_row_from_before_the_chunk_counts_is_split_on_load():
    ms = FakeMapState()
    table = ChunkTable(ms, None, hot_cap=2, chunk_keys=50)
    ref = {f"k{i}": _entry(i, T0 + timedelta(seconds=i) if i % 3 else None) for i in range(40)}
    for key, ent in ref.items():
        table[key] = ent
    table.flush()
    old = pickle.loads(table.meta())
    # what the earlier code stored: every waiting key's time in "pending", no "cpend"
    old["pending"] = {
        k: (e[1] - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)
        for k, e in ref.items()
        if e[1] is not None
    }
    del old["cpend"]
    table = ChunkTable(ms, pickle.dumps(old), hot_cap=2, chunk_keys=50)
    assert table.changed
    assert table.pending_at() == {k: e[1] for k, e in ref.items() if e[1] is not None}
    now = T0 + timedelta(seconds=20)
    assert table.due(now) == sorted((e[1], k) for k, e in ref.items() if e[1] is not None and e[1] <= now)
    assert set(table.pending) <= set(table.hot)


def test_a_bucket_written_before_copies_goes_on():
    """A bookkeeping row without `copied` (its hot keys in no chunk) loads, and the table goes on matching a dict."""
    rng = random.Random(5)
    ms = FakeMapState()
    table = ChunkTable(ms, None, hot_cap=8, chunk_keys=5)
    ref = {f"k{i}": _entry(i, T0 + timedelta(seconds=i) if i % 4 == 0 else None) for i in range(120)}
    for key, ent in ref.items():
        table[key] = ent
    table.flush()
    # What the earlier code stored: the hot keys only in the bookkeeping row, no "copied".
    old = pickle.loads(table.meta())
    for key in old.pop("copied"):
        cid = chunk_of(key, old["n"])
        chunk = pickle.loads(ms.rows[cid])
        del chunk[key]
        ms.rows[cid] = pickle.dumps(chunk)
        old["sizes"][cid] -= 1
    meta = pickle.dumps(old)

    def at_of(call: int) -> Any:
        return T0 + timedelta(seconds=call) if rng.random() < 0.3 else None

    for call in range(60):
        table = ChunkTable(ms, meta, hot_cap=8, chunk_keys=5)
        assert table.keys == len(ref)
        _random_ops(rng, table, ref, call, rng.randint(0, 12), 160, at_of)
        table.flush()
        meta = table.meta()
        _check_copies(table, ms)
        assert table.pending_at() == {k: e[1] for k, e in ref.items() if e[1] is not None}
    final = ChunkTable(ms, meta, hot_cap=8, chunk_keys=5)
    assert {k: final.get(k) for k in ref} == ref
