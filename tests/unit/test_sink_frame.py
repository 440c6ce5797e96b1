"""A streaming stage's sink rows as pandas: the same frame as Arrow's `to_pandas`, strings reused."""

from __future__ import annotations

import enum

import pandas as pd
import pytest

from flowspark.spark.streaming.state import sink_frame
from flowspark.spark.worker.rows import RowSchema
from flowspark.spark.worker.stage import dict_rows


class Color(str, enum.Enum):
    RED = "red"


T = pytest.importorskip("pyspark.sql.types")  # the schema's types (no session)
SCHEMA = RowSchema(
    "s.out",
    T.StructType(
        [
            T.StructField(n, t())
            for n, t in [("user", T.StringType), ("n", T.LongType), ("x", T.DoubleType), ("tag", T.StringType)]
        ]
    ),
    "UTC",
)


@pytest.mark.parametrize(
    "items",
    [
        [{"user": "a", "n": 1, "x": 0.5, "tag": "t"}, {"user": "b", "n": 2, "x": None, "tag": None}],
        [{"user": "a", "n": None, "x": float("nan")}, {"user": None, "n": 2**62, "tag": "é"}],
        [{"user": Color.RED, "n": 1, "x": 1.0, "tag": "t"}],  # a str subclass: Arrow's plain str
    ],
)
def test_same_frame_as_arrow(items):
    batch = dict_rows("s.out", items, SCHEMA)
    got = sink_frame(batch, items)
    pd.testing.assert_frame_equal(got, batch.to_pandas())
    assert [type(v) for v in got["user"]] == [type(v) for v in batch.to_pandas()["user"]]


def test_strings_are_the_items_own_objects():
    items = [{"user": "".join(["a", str(i)]), "n": i, "x": 1.0, "tag": None} for i in range(3)]
    got = sink_frame(dict_rows("s.out", items, SCHEMA), items)
    assert all(a is x["user"] for a, x in zip(got["user"], items, strict=True))
