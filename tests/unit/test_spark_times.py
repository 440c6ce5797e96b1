"""Spark-keyed streams: TIMESTAMP microseconds back to aware datetimes, as Arrow gives them."""

from __future__ import annotations

import pytest

from flowspark.spark.streaming.state import aware_times

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


@pytest.mark.parametrize(
    "zone", ["UTC", "Etc/UTC", "America/New_York", "Europe/London", "Asia/Kolkata", "+01:00", "-05:30"]
)
def test_aware_times_are_the_datetimes_arrow_gives_for_a_timestamp_column(zone):
    col = pa.array(MICROS, pa.int64())
    want = col.cast(pa.timestamp("us", tz=zone)).to_pylist()
    got = aware_times(zone)(col)
    assert got == want
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
            continue
        assert type(g) is type(w)
        assert g.tzinfo == w.tzinfo
        assert (g.replace(tzinfo=None), g.utcoffset(), g.fold) == (w.replace(tzinfo=None), w.utcoffset(), w.fold)
