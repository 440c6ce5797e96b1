"""Key functions proven to read one column (`flowspark._keyfn.column_of`) and the IR facts built from them."""

from __future__ import annotations

import functools
import operator

import pytest

import flowspark.operators as op
from flowspark import ir
from flowspark._keyfn import column_of, pair_row_of
from flowspark.dataflow import Dataflow
from flowspark.spark import SparkSource, compile_flow
from flowspark.spark.rules.optimizer import Env, optimize
from flowspark.testing import TestingSink, TestingSource


def by_user(row):
    return row["user"]


def by_user_with_default(row, col="user"):
    return row[col]


USER = "user"


def by_global(row):
    return row[USER]


class Getter:
    def __call__(self, row):
        return row["user"]


@pytest.mark.parametrize(
    "fn",
    [lambda r: r["user"], by_user, operator.itemgetter("user")],
    ids=["lambda", "def", "itemgetter"],
)
def test_recognised(fn):
    assert column_of(fn) == "user"


@pytest.mark.parametrize(
    "fn",
    [
        lambda r: r.get("user"),
        lambda r: r["user"].lower(),
        lambda r: str(r["user"]),
        lambda r: r[0],
        lambda r: r["user"]["id"],
        lambda r, x=1: r["user"],
        lambda *r: r["user"],
        lambda r: (r["user"],)[0],
        by_user_with_default,
        by_global,
        Getter(),
        operator.itemgetter("user", "id"),
        operator.itemgetter(0),
        functools.partial(operator.getitem, b="user"),
        str,
    ],
)
def test_not_recognised(fn):
    assert column_of(fn) is None


def test_closure_is_not_recognised():
    col = "user"
    assert column_of(lambda r: r[col]) is None


def _nodes(flow):
    return {n.step_id: n for n in flow.graph().nodes if isinstance(n, ir.FlatMapBatch)}


def test_operators_record_key_column_and_what_steps_keep():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([{"user": "a"}]))
    s = op.filter("keep", s, lambda r: True)
    k = op.key_on("key", s, lambda r: r["user"])
    k2 = op.key_on("key2", s, lambda r: r["user"].upper())
    m = op.map_value("mv", k, lambda v: v)
    col = op.map_value("col", k, lambda v: v["amount"])
    op.output("o2", col, TestingSink([]))
    fv = op.flat_map_value("fmv", m, lambda v: [v])
    f2 = op.filter_value("fv", fv, lambda v: True)
    mp = op.map("m", f2, lambda kv: kv)
    op.output("o", op.merge("mg", mp, k2), TestingSink([]))
    n = _nodes(flow)
    assert n["f.key.flat_map_batch"].key_column == "user"
    assert n["f.key2.flat_map_batch"].key_column is None
    assert n["f.keep.flat_map_batch"].keeps == "items"
    assert n["f.fv.flat_map_batch"].keeps == "items"
    assert n["f.mv.flat_map_batch"].keeps == "key"
    assert n["f.fmv.flat_map.flat_map_batch"].keeps == "key"
    assert n["f.m.flat_map_batch"].keeps == ""
    assert n["f.col.flat_map_batch"].value_column == "amount"
    assert n["f.mv.flat_map_batch"].value_column is None
    assert n["f.mv.flat_map_batch"].value_mapper is not None
    assert n["f.fmv.flat_map.flat_map_batch"].value_mapper is None  # many values per value: not a value mapper


#: The columns of the SparkSource in these tests, as a lowering reads them from its DataFrame.
COLUMNS = {0: (("user", "string"), ("x", "bigint"), ("a", "string"))}


def _physical(flow):
    """The physical plan of a batch job whose SparkSource has `COLUMNS`."""
    return optimize(compile_flow(flow), Env("batch", columns=COLUMNS))


def _keyed_plan(build_steps):
    flow = Dataflow("f")
    rows = op.input("inp", flow, SparkSource("parquet", "/nowhere"))
    k = build_steps(rows)
    op.output("o", op.stateful_map("count", k, lambda s, v: ((s or 0) + 1, v)), TestingSink([]))
    return _physical(flow)


@pytest.mark.parametrize(
    "steps",
    [
        lambda rows: op.key_on("k", rows, lambda r: r["user"]),
        lambda rows: op.key_on("k", op.filter("f", rows, lambda r: r["x"] > 0), operator.itemgetter("user")),
        lambda rows: op.flat_map_value(
            "fmv", op.map_value("mv", op.key_on("k", rows, lambda r: r["user"]), lambda r: r["x"]), lambda v: [v]
        ),
        lambda rows: op.filter_value("fv", op.key_on("k", op.redistribute("r", rows), lambda r: r["user"]), bool),
    ],
    ids=["key_on", "filter-then-key", "key-keeping-steps", "redistribute-filter_value"],
)
def test_spark_keys_these_stages(steps):
    plan = _keyed_plan(steps)
    assert str(plan.decision("spark_keys", "stage 1")) == "rule spark_keys: applied"
    assert "keyed_by_spark" in plan.stages[0].spec.modes
    ck = plan.stages[1].spec.column_key
    assert ck is not None
    assert ck.column == "user"
    assert ck.source_stage == 0
    assert ck.ops == plan.stages[0].spec.ops


@pytest.mark.parametrize(
    "steps",
    [
        lambda rows: op.key_on("k", rows, lambda r: r["user"].lower()),
        lambda rows: op.key_on("k", op.map("m", rows, lambda r: {**r, "user": "x"}), lambda r: r["user"]),
        lambda rows: op.map("m", op.key_on("k", rows, lambda r: r["user"]), lambda kv: ("same", kv[1])),
        lambda rows: op.key_on("k", op.inspect("i", rows), lambda r: r["user"]),
        lambda rows: op.key_on("k2", op.map_value("mv", op.key_on("k", rows, lambda r: r["a"]), dict), by_user),
    ],
    ids=["unrecognised-key", "map-before-key", "key-changing-map", "inspect", "two-key_ons"],
)
def test_spark_does_not_key_these_stages(steps):
    plan = _keyed_plan(steps)
    assert plan.stages[1].spec.column_key is None
    assert not plan.decision("spark_keys", "stage 1").applied


def test_a_source_read_twice_is_not_keyed_by_spark():
    flow = Dataflow("f")
    rows = op.input("inp", flow, SparkSource("parquet", "/nowhere"))
    k = op.key_on("k", rows, lambda r: r["user"])
    op.output("o", op.stateful_map("count", k, lambda s, v: (s, v)), TestingSink([]))
    op.output("raw", rows, TestingSink([]))
    plan = _physical(flow)
    assert plan.stages[1].spec.column_key is None
    assert not plan.decision("spark_keys", "stage 1").applied


def test_a_testing_source_is_not_keyed_by_spark():
    flow = Dataflow("f")
    k = op.key_on("k", op.input("inp", flow, TestingSource([{"user": "a"}])), lambda r: r["user"])
    op.output("o", op.stateful_map("count", k, lambda s, v: (s, v)), TestingSink([]))
    plan = _physical(flow)
    assert plan.stages[1].spec.column_key is None
    assert not plan.decision("spark_keys", "stage 1").applied


def _pair_row(kv):
    return {"user": kv[0], "n": kv[1]}


def _swapped(kv):
    return {"n": kv[1], "user": kv[0]}


@pytest.mark.parametrize(("fn", "fields"), [(_pair_row, ("user", "n")), (_swapped, ("user", "n"))])
def test_a_pair_as_a_dict_of_two_names_is_recognised(fn, fields):
    assert pair_row_of(fn) == fields
    flow = Dataflow("rows")
    op.output("out", op.map("row", op.input("inp", flow, TestingSource([("a", 1)])), fn), TestingSink([]))
    assert _nodes(flow)["rows.row.flat_map_batch"].pair_row == fields


@pytest.mark.parametrize(
    "fn",
    [
        lambda kv: {"user": kv[0], "n": kv[1] + 1},
        lambda kv: {"user": kv[0], "n": kv[0]},
        lambda kv: {"user": kv[1], "n": kv[2]},
        lambda kv: {"user": kv["k"], "n": kv[1]},
        lambda kv: {"user": kv[0], "n": kv[1], "x": 1},
        lambda kv: {1: kv[0], "n": kv[1]},
        lambda kv: {"user": kv[True], "n": kv[1]},
        lambda kv: dict(user=kv[0], n=kv[1]),
        lambda kv, extra=1: {"user": kv[0], "n": kv[1]},
    ],
)
def test_other_mappers_are_not_a_pair_row(fn):
    assert pair_row_of(fn) is None
