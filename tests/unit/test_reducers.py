"""`flowspark.reducers` and the reduction facts operators record in the IR (`StatefulBatch.reduction`)."""

from __future__ import annotations

import operator
from typing import Any

import pytest

import flowspark.operators as op
from flowspark import ir, reducers
from flowspark.dataflow import Dataflow
from flowspark.testing import TestingSink, TestingSource, run_main


def _reductions(build: Any) -> dict[str, Any]:
    flow = Dataflow("r")
    s = op.input("inp", flow, TestingSource([{"u": "a", "v": 1}]))
    keyed = op.map_value("v", op.key_on("k", s, lambda r: r["u"]), lambda r: r["v"])
    op.output("out", build(s, keyed), TestingSink([]))
    return {n.step_id: n.reduction for n in flow.validate().nodes if isinstance(n, ir.StatefulBatch)}


def add(a, b):  # a user's function named like operator.add: not recognised
    return a + b


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda s, k: op.count_final("c", s, lambda r: r["u"]), "count"),
        (lambda s, k: op.reduce_final("t", k, operator.add), "sum"),
        (lambda s, k: op.reduce_final("t", k, max), "max"),
        (lambda s, k: op.reduce_final("t", k, min), "min"),
        (lambda s, k: op.max_final("t", k), "max"),
        (lambda s, k: op.min_final("t", k), "min"),
        (lambda s, k: op.fold_final("t", k, reducers.zero, reducers.sum), "sum"),
        (lambda s, k: op.fold_final("t", k, reducers.zero, reducers.count), "count"),
        (lambda s, k: op.fold_final("t", k, reducers.nothing, reducers.max), "max"),
        (lambda s, k: op.fold_final("t", k, reducers.nothing, reducers.min), "min"),
        (lambda s, k: op.reduce_final("t", k, add), None),
        (lambda s, k: op.reduce_final("t", k, lambda a, b: a + b), None),
        (lambda s, k: op.max_final("t", k, by=abs), None),
        (lambda s, k: op.fold_final("t", k, lambda: 0, reducers.sum), None),
        (lambda s, k: op.fold_final("t", k, reducers.nothing, reducers.sum), None),
    ],
)
def test_reductions_are_recognised_by_identity(build, expected):
    assert list(_reductions(build).values()) == [expected]


def test_count_final_declares_its_ones_constant():
    flow = Dataflow("c")
    s = op.input("inp", flow, TestingSource(["a"]))
    op.output("out", op.count_final("c", s, lambda w: w), TestingSink([]))
    maps = [n for n in flow.validate().nodes if isinstance(n, ir.FlatMapBatch)]
    assert [(n.step_id, n.value_constant) for n in maps] == [
        ("c.c.key.flat_map_batch", False),
        ("c.c.init_count.flat_map_batch", True),
    ]


def test_the_helpers_run_in_memory_as_the_lambdas_do():
    items = [("a", 3), ("b", -2), ("a", 7), ("a", 2**70)]
    for builder, folder, fn in (
        (reducers.zero, reducers.sum, lambda vs: sum(vs)),
        (reducers.zero, reducers.count, len),
        (reducers.nothing, reducers.max, max),
        (reducers.nothing, reducers.min, min),
    ):
        flow = Dataflow("h")
        out: list[Any] = []
        op.output(
            "out", op.fold_final("f", op.input("inp", flow, TestingSource(items)), builder, folder), TestingSink(out)
        )
        run_main(flow)
        assert sorted(out) == [("a", fn([3, 7, 2**70])), ("b", fn([-2]))]
