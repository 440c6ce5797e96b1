"""A driver program for the Delta tests: a keyed running count into a Delta table, from a checkpoint.

Usage: python delta_driver.py ROOT CHECKPOINT TABLE [OUT]

flowspark creates the session (Delta's cached jars and its two settings in it). The stream
reads the JSONL files under ROOT (`JsonlDirSource`, at most 100 items per micro-batch), counts
each user's events and writes `{"user", "n"}` rows with Delta's streaming sink, `available_now`.
With OUT, a batch flow then reads the table back (`SparkSource("delta", TABLE)`, `reader`), a
stream reads its commits (`stream_reader`), `flowspark plan --spark` plans the batch flow in this
session, and OUT gets as JSON the batch flow's two outputs (every row, each user's highest
count), the stream's rows and the plan's text.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from streaming_helpers import JsonlDirSource, count_mapper  # noqa: E402

import flowspark.operators as op  # noqa: E402
from flowspark.dataflow import Dataflow  # noqa: E402
from flowspark.testing import TestingSink  # noqa: E402


def as_row(kv):
    return {"user": kv[0], "n": kv[1]}


def build(root: str, table: str, bounded: bool = False, sink=None) -> Dataflow:
    """The running count of the JSONL files under `root` into `SparkSink("delta", table)` (or `sink`).

    The stream reads them with `JsonlDirSource` (a Python streaming source), or, on a pyspark
    that cannot stream one (before 4.2), with Spark's JSON file stream, one file per micro-batch.
    """
    from flowspark.spark.io.inputs import SparkSource
    from flowspark.spark.io.outputs import SparkSink
    from flowspark.spark.versions import PYTHON_STREAM_SOURCE, lacks

    flow = Dataflow("delta_kill")
    if bounded or lacks(PYTHON_STREAM_SOURCE) is None:
        src = JsonlDirSource(root, ["a", "b"], batch=50, bounded=bounded)
    else:
        options = {"maxFilesPerTrigger": "1", "pathGlobFilter": "*.jsonl", "recursiveFileLookup": "true"}
        src = SparkSource("json", root, schema="user STRING", options=options, streaming=True)
    s = op.input("inp", flow, src)
    counts = op.stateful_map("count", op.key_on("key", s, lambda e: e["user"]), count_mapper)
    out = sink if sink is not None else SparkSink("delta", table, schema="user STRING, n LONG")
    op.output("out", op.map("row", counts, as_row), out)
    return flow


def reader(table: str, rows: list, highest: list) -> Dataflow:
    """A batch flow reading the Delta table: every row into `rows`, each user's highest count into `highest`."""
    from flowspark.spark.io.inputs import SparkSource

    flow = Dataflow("delta_read")
    s = op.input("inp", flow, SparkSource("delta", table))
    op.output("rows", op.map("pair", s, lambda r: (r["user"], r["n"])), TestingSink(rows))
    top = op.reduce_final("top", op.key_on("key", s, lambda r: r["user"]), lambda a, b: a if a["n"] >= b["n"] else b)
    op.output("highest", op.map("user_n", top, lambda kv: (kv[0], kv[1]["n"])), TestingSink(highest))
    return flow


def stream_reader(table: str, rows: list) -> Dataflow:
    """A stream reading the Delta table's commits (`SparkSource("delta", table, streaming=True)`) into `rows`."""
    from flowspark.spark.io.inputs import SparkSource

    flow = Dataflow("delta_stream_read")
    s = op.input("inp", flow, SparkSource("delta", table, streaming=True))
    op.output("rows", op.map("pair", s, lambda r: (r["user"], r["n"])), TestingSink(rows))
    return flow


def plan_flow() -> Dataflow:
    """`reader` of the table in `$FLOWSPARK_TEST_DELTA_TABLE` (for `flowspark plan --spark`)."""
    return reader(os.environ["FLOWSPARK_TEST_DELTA_TABLE"], [], [])


def main() -> None:
    root, chk, table = sys.argv[1:4]
    from flowspark.spark import run

    run(build(root, table), checkpoint=chk, trigger="available_now", max_items=100, progress=False)
    if len(sys.argv) > 4:
        import contextlib
        import io

        from flowspark.cli import main as cli

        rows: list = []
        highest: list = []
        streamed: list = []
        run(reader(table, rows, highest))
        run(stream_reader(table, streamed), checkpoint=f"{chk}-read", trigger="available_now", progress=False)
        os.environ["FLOWSPARK_TEST_DELTA_TABLE"] = table
        plan = io.StringIO()
        with contextlib.redirect_stdout(plan):
            code = cli(["plan", f"{os.path.abspath(__file__)}:plan_flow()", "--spark"])
        with open(sys.argv[4], "w") as f:
            doc = {"rows": rows, "highest": highest, "streamed": streamed}
            json.dump({**doc, "plan": plan.getvalue(), "plan_code": code}, f)


if __name__ == "__main__":
    main()
