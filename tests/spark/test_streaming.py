"""Spark Structured Streaming runtime: bucketed state, timeouts, checkpoints, sinks."""

from __future__ import annotations

import pytest
from streaming_helpers import JsonlDirSource, count_mapper, write_jsonl

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.testing import TestingSink

pytestmark = [pytest.mark.spark]


def _count_flow(root: str, out: list) -> Dataflow:
    flow = Dataflow("stream_count")
    s = op.input("inp", flow, JsonlDirSource(root, ["a", "b"]))
    keyed = op.key_on("key", s, lambda e: e["user"])
    counts = op.stateful_map("count", keyed, count_mapper)
    op.output("out", counts, TestingSink(out))
    return flow


def test_running_count_available_now_then_resume(spark, tmp_path):
    from flowspark.spark import run

    root = str(tmp_path / "in")
    chk = str(tmp_path / "chk")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": f"u{i % 2}"} for i in range(4)])
    out: list = []
    run(_count_flow(root, out), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
    finals = {}
    for k, v in out:
        finals[k] = max(finals.get(k, 0), v)
    assert finals == {"u0": 5, "u1": 4, "u2": 2}
    assert sorted(v for k, v in out if k == "u0") == [1, 2, 3, 4, 5]
    # Second run, same checkpoint: only the new file is read; counts go on.
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u2"}, {"user": "u9"}])
    out2: list = []
    run(_count_flow(root, out2), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
    assert sorted(out2) == [("u2", 3), ("u9", 1)]
