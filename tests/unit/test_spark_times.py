"""Spark's TIMESTAMP values to Python: the instants Arrow gives, in `timezone.utc` for a zone always at offset 0."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from flowspark.spark.worker.times import arrow_rows, aware_times

pa = pytest.importorskip("pyarrow")

# Nulls, the epoch, both instants New York and London show twice in the hour their clocks go back,
# and instants across centuries.
MICROS = [
    None,
    0,
    -1,
    1_762_000_200_000_000,
    1_762_003_800_000_000,
    1_761_440_400_000_000,
    1_761_444_000_000_000,
    *range(-(2**55), 2**56, 2**50 + 12_345),
]
UTC_LIKE = ["UTC", "Etc/UTC", "GMT", "+00:00"]
ZONED = ["America/New_York", "Europe/London", "Asia/Kolkata", "+01:00", "-05:30"]


def _same(got: list, want: list, utc: bool) -> None:
    assert got == want  # the same instants
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
            continue
        assert type(g) is datetime
        assert (g.replace(tzinfo=None), g.utcoffset(), g.fold) == (w.replace(tzinfo=None), w.utcoffset(), w.fold)
        if utc:
            assert g.tzinfo is timezone.utc
        else:
            assert g.tzinfo == w.tzinfo


@pytest.mark.parametrize("zone", UTC_LIKE + ZONED)
def test_aware_times_are_the_instants_arrow_gives_for_a_timestamp_column(zone):
    col = pa.array(MICROS, pa.int64())
    _same(aware_times(zone)(col), col.cast(pa.timestamp("us", tz=zone)).to_pylist(), zone in UTC_LIKE)


@pytest.mark.parametrize("zone", UTC_LIKE + ZONED)
def test_arrow_rows_are_arrows_rows_with_faster_timestamps(zone):
    n = len(MICROS)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([f"u{i}" for i in range(n)]),
            pa.array(MICROS, pa.int64()).cast(pa.timestamp("us", tz=zone)),
            pa.array(MICROS, pa.int64()).cast(pa.timestamp("us")),
            pa.array([[m] for m in MICROS], pa.list_(pa.int64())),
        ],
        names=["user", "ts", "ntz", "nested"],
    )
    got, want = arrow_rows(batch), batch.to_pylist()
    assert [list(r) for r in got] == [list(r) for r in want]  # the columns in order
    assert [{k: v for k, v in r.items() if k != "ts"} for r in got] == [
        {k: v for k, v in r.items() if k != "ts"} for r in want
    ]
    _same([r["ts"] for r in got], [r["ts"] for r in want], zone in UTC_LIKE)


def test_arrow_rows_without_timestamps_are_arrows_own():
    batch = pa.RecordBatch.from_arrays([pa.array(["a", None]), pa.array([1, 2])], names=["k", "n"])
    assert arrow_rows(batch) == [{"k": "a", "n": 1}, {"k": None, "n": 2}]
