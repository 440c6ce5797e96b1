"""A stream never silently writes nothing: a new checkpoint on an old file-sink output is refused, or cleared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import RecoveryError
from flowspark.spark import SparkSink, SparkSource

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _user(r: dict[str, Any]) -> str:
    return r["user"]


def _count(n: Any, _r: Any) -> tuple[int, int]:
    n = (n or 0) + 1
    return n, n


def _row(kv: tuple[str, int]) -> dict[str, Any]:
    return {"user": kv[0], "clicks": kv[1]}


def _flow(in_dir: Path, out_dir: Path) -> Dataflow:
    flow = Dataflow("outputs")
    rows = op.input("inp", flow, SparkSource("json", str(in_dir), schema="user STRING", streaming=True))
    counts = op.stateful_map("count", op.key_on("key", rows, _user), _count)
    op.output("out", op.map("row", counts, _row), SparkSink("parquet", str(out_dir), schema="user STRING, clicks LONG"))
    return flow


def _rows(out_dir: Path) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    files = sorted(p for p in out_dir.glob("*.parquet") if not p.name.startswith("."))
    return sorted((r["user"], r["clicks"]) for f in files for r in pq.read_table(f).to_pylist())


def test_a_new_checkpoint_on_an_old_output_is_refused_before_any_micro_batch_then_cleared_on_request(spark, tmp_path):
    from flowspark.spark import run

    in_dir, out_dir = tmp_path / "in", tmp_path / "out"
    in_dir.mkdir()
    (in_dir / "1.json").write_text("".join(json.dumps({"user": u}) + "\n" for u in ["ann", "bob", "ann"]))
    flow = _flow(in_dir, out_dir)
    run(flow, spark=spark, checkpoint=str(tmp_path / "chk1"), trigger="available_now", progress=False)
    assert _rows(out_dir) == [("ann", 1), ("ann", 2), ("bob", 1)]

    (in_dir / "2.json").write_text(json.dumps({"user": "cid"}) + "\n")
    with pytest.raises(RecoveryError, match="output step 'outputs.out'.*new output path.*clear_outputs=True"):
        run(flow, spark=spark, checkpoint=str(tmp_path / "chk2"), trigger="available_now", progress=False)
    assert not (tmp_path / "chk2" / "query" / "offsets").exists()  # refused before any micro-batch was planned
    assert _rows(out_dir) == [("ann", 1), ("ann", 2), ("bob", 1)]

    # The same checkpoint goes on writing the same directory.
    run(flow, spark=spark, checkpoint=str(tmp_path / "chk1"), trigger="available_now", progress=False)
    assert _rows(out_dir) == [("ann", 1), ("ann", 2), ("bob", 1), ("cid", 1)]

    # Starting over: the new checkpoint reads both files from the start and writes the directory anew.
    run(
        flow,
        spark=spark,
        checkpoint=str(tmp_path / "chk2"),
        trigger="available_now",
        progress=False,
        clear_outputs=True,
    )
    assert _rows(out_dir) == [("ann", 1), ("ann", 2), ("bob", 1), ("cid", 1)]
    assert len(list((out_dir / "_spark_metadata").iterdir())) >= 1
