"""A batch job: purchases per user on local Spark (bounded input), checked against the in-memory executor.

Reads `examples/data/purchases.csv` (user, amount), computes each user's running
total after every purchase (`stateful_map`) and each user's final total and
purchase count (`fold_final`), runs the flow on Spark (a local SparkSession
in-process, the embedded default) and then on the in-memory executor with time
fixed as in a Spark batch job (`clock="fixed"`; both give Bytewax's order at
driver-side sinks: each source batch grouped by key in sorted key order, end of
input in sorted key order), prints the
Spark results and says whether both runtimes agree.

    python examples/batch_job.py [path/to/purchases.csv]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.inputs import CSVSource
from flowspark.testing import TestingSink, run_main

sys.path.insert(0, str(Path(__file__).parent))
from running_total import DATA, add_to_total, to_cents  # noqa: E402


def build(path: Path, running: list[Any], finals: list[Any]) -> Dataflow:
    """The flow: running totals and final (total, count) per user."""
    flow = Dataflow("batch_job")
    rows = op.input("purchases", flow, CSVSource(path))
    cents = op.map("to_cents", rows, to_cents)
    op.output("running_out", op.stateful_map("running_total", cents, add_to_total), TestingSink(running))
    summary = op.fold_final("summary", cents, lambda: (0, 0), lambda acc, c: (acc[0] + c, acc[1] + 1))
    op.output("summary_out", op.map_value("in_units", summary, lambda acc: (acc[0] / 100, acc[1])), TestingSink(finals))
    return flow


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else DATA
    from flowspark.spark import run

    running: list[Any] = []
    finals: list[Any] = []
    t0 = time.perf_counter()
    run(build(path, running, finals))
    spark_s = time.perf_counter() - t0
    print(f"Spark (local, in-process): {len(running)} purchases in {spark_s:.1f} s (includes session start)")
    print("final totals per user (total, purchases):")
    for user, (total, count) in sorted(finals):
        print(f"  {user:<10} {total:>10.2f} {count:>4}")

    local_running: list[Any] = []
    local_finals: list[Any] = []
    run_main(build(path, local_running, local_finals), clock="fixed")
    same = local_running == running and local_finals == finals
    print(f"in-memory executor gives the same results: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
