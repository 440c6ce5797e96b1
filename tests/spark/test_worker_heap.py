"""Spark Python workers freeze what is alive once (`settle_worker_heap`); the driver's collector is left alone.

The user's functions report `gc.get_freeze_count()` where they run: inside a task of a batch
job's source and keyed stages and of a streaming query's keyed stage, the worker's imports are
in the permanent generation; in the driver (the in-memory executor, the process that ran the
Spark job) nothing is frozen by flowspark.
"""

from __future__ import annotations

import gc

import pytest
from streaming_helpers import JsonlDirSource, write_jsonl

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.testing import TestingSink, TestingSource, run_main

pytestmark = [pytest.mark.spark]


def _flow(src, out: list) -> Dataflow:
    flow = Dataflow("heap")
    s = op.input("inp", flow, src)
    seen = op.map("seen", s, lambda x: (x, gc.get_freeze_count()))  # the source stage
    keyed = op.key_on("key", seen, lambda xn: str(xn[0]["n"] % 3))
    frozen = op.stateful_map("count", keyed, lambda st, xn: ((st or 0) + 1, (xn[1], gc.get_freeze_count())))
    op.output("out", frozen, TestingSink(out))
    return flow


ROWS = [{"user": "u", "n": i} for i in range(12)]


def test_a_batch_jobs_stages_run_with_the_workers_imports_frozen(spark):
    from flowspark.spark import run

    before = gc.get_freeze_count()
    out: list = []
    run(_flow(TestingSource(ROWS), out), spark=spark)
    assert len(out) == len(ROWS)
    assert all(source > 0 and keyed > 0 for _k, (source, keyed) in out), out
    assert gc.get_freeze_count() == before  # the driver froze nothing

    mem: list = []
    run_main(_flow(TestingSource(ROWS), mem))
    assert {counts for _k, counts in mem} == {(before, before)}


def test_a_streaming_querys_keyed_stage_runs_with_the_workers_imports_frozen(spark, tmp_path):
    from flowspark.spark import run

    root = str(tmp_path / "in")
    write_jsonl(f"{root}/a/0001.jsonl", ROWS[:6])
    write_jsonl(f"{root}/b/0001.jsonl", ROWS[6:])
    before = gc.get_freeze_count()
    out: list = []
    src = JsonlDirSource(root, ["a", "b"])
    run(_flow(src, out), spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False)
    assert len(out) == len(ROWS)
    assert all(source > 0 and keyed > 0 for _k, (source, keyed) in out), out
    assert gc.get_freeze_count() == before
