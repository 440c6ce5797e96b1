"""A driver program for the kill -9 test: runs the count flow into a file sink, from a checkpoint.

Usage: python streaming_driver.py ROOT CHECKPOINT OUT_DIR [continuous]

With `continuous` the query runs until stopped (trigger=None); Ctrl-C (SIGINT) stops it
between micro-batches and the driver prints DRIVER INTERRUPTED and exits with 130. With
`FLOWSPARK_TEST_DEAD_LETTER=DIR` in the environment the run has a dead letter (`DeadLetterDir(DIR)`).
With `FLOWSPARK_TEST_SOURCE=files` the flow reads the same files with Spark's own file stream
(`SparkSource("json", ..., streaming=True)`, one file per micro-batch) instead of a Python source:
the source Spark 3.5 streams (it has no Python data source).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from streaming_helpers import JsonlDirSource, count_mapper  # noqa: E402

import flowspark.operators as op  # noqa: E402
from flowspark.dataflow import Dataflow  # noqa: E402
from flowspark.spark.io.inputs import SparkSource  # noqa: E402
from flowspark.spark.io.outputs import SparkSink  # noqa: E402


def as_row(kv):
    return {"user": kv[0], "n": kv[1]}


def build(root: str, out_dir: str) -> Dataflow:
    flow = Dataflow("kill_test")
    if os.environ.get("FLOWSPARK_TEST_SOURCE") == "files":
        files = SparkSource("json", f"{root}/*/*.jsonl", "user STRING", {"maxFilesPerTrigger": 1}, streaming=True)
        s = op.input("inp", flow, files)
    else:
        s = op.input("inp", flow, JsonlDirSource(root, ["a", "b"], batch=50))
    counts = op.stateful_map("count", op.key_on("key", s, lambda e: e["user"]), count_mapper)
    op.output("out", op.map("row", counts, as_row), SparkSink("json", out_dir, schema="user STRING, n LONG"))
    return flow


def main() -> None:
    root, chk, out_dir = sys.argv[1:4]
    from flowspark.spark import run
    from flowspark.spark.session import get_session

    continuous = sys.argv[4:5] == ["continuous"]
    spark = get_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    try:
        trigger = None if continuous else "available_now"
        dead = os.environ.get("FLOWSPARK_TEST_DEAD_LETTER")
        extra = {"dead_letter": dead} if dead else {}
        layout = os.environ.get("FLOWSPARK_TEST_STATE_LAYOUT")
        if layout:
            extra["state_layout"] = layout
        run(build(root, out_dir), spark=spark, checkpoint=chk, trigger=trigger, max_items=100, **extra)
    except KeyboardInterrupt:
        print("DRIVER INTERRUPTED", flush=True)
        sys.exit(130)
    print("DRIVER DONE", flush=True)


if __name__ == "__main__":
    main()
