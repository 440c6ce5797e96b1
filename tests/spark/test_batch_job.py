"""The batch example job (purchases on Spark batch) equals the in-memory executor."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load_batch_job():
    spec = importlib.util.spec_from_file_location("batch_job", EXAMPLES / "batch_job.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["batch_job"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_batch_job_on_spark_matches_local_and_plain_python(spark):
    from flowspark.spark import run
    from flowspark.testing import run_main

    mod = _load_batch_job()
    running, finals = [], []
    run(mod.build(mod.DATA, running, finals), spark=spark)
    # Spark batch's driver-side sinks get run_main(clock="fixed")'s order.
    fixed_running, fixed_finals = [], []
    run_main(mod.build(mod.DATA, fixed_running, fixed_finals), clock="fixed")
    assert running == fixed_running
    assert finals == fixed_finals
    # Both are Bytewax's order (run_main's): the CSV is one source batch, grouped by user,
    # users sorted.
    local_running, local_finals = [], []
    run_main(mod.build(mod.DATA, local_running, local_finals))
    assert local_running == running
    assert local_running == sorted(running, key=lambda kv: kv[0])
    assert local_finals == finals
    # Independently from the CSV with plain Python.
    import csv
    from decimal import Decimal

    totals: dict[str, int] = {}
    counts: dict[str, int] = {}
    expected_running = []
    with open(mod.DATA, newline="") as f:
        for row in csv.DictReader(f):
            cents = int(Decimal(row["amount"]) * 100)
            totals[row["user"]] = totals.get(row["user"], 0) + cents
            counts[row["user"]] = counts.get(row["user"], 0) + 1
            expected_running.append((row["user"], totals[row["user"]] / 100))
    # One source batch: Bytewax groups it by user, users sorted (a stable sort of the input).
    assert running == sorted(expected_running, key=lambda kv: kv[0])
    assert running != expected_running
    assert finals == sorted((u, (totals[u] / 100, counts[u])) for u in totals)  # end of input in key order
