"""Scenarios run through a Spark Connect server, each in a process of its own (tests/spark/test_connect.py).

`python connect_driver.py SCENARIO sc://HOST:PORT DIR` prints one line `RESULT <json>`.
A Connect session switches pyspark to Connect mode for its whole process, so these
cannot share the test session's process (which holds a classic session).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from streaming_helpers import JsonlDirSource, count_mapper, write_jsonl  # noqa: E402

import flowspark.operators as op  # noqa: E402
from flowspark.dataflow import Dataflow  # noqa: E402
from flowspark.errors import FlowsparkRuntimeError  # noqa: E402
from flowspark.testing import TestingSink, TestingSource, run_main  # noqa: E402


def _session(url: str) -> Any:
    from pyspark.sql import SparkSession  # noqa: TID251

    return SparkSession.builder.remote(url).getOrCreate()


def _count_flow(root: str, out: list, fail_on: str = "", bounded: bool = False) -> Dataflow:
    flow = Dataflow("connect_count")
    s = op.input("inp", flow, JsonlDirSource(root, ["a", "b"], bounded=bounded))
    keyed = op.key_on("key", s, lambda e: e["user"])
    counts = op.stateful_map("count", keyed, count_mapper)
    op.output("out", counts, _FailingSink(out, fail_on) if fail_on else TestingSink(out))
    return flow


class _FailingSink(TestingSink):
    """A TestingSink whose writes fail while the file `fail_on` exists (the sink runs in this process)."""

    def __init__(self, ls: list, fail_on: str) -> None:
        super().__init__(ls)
        self.fail_on = fail_on

    def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
        part = super().build(step_id, worker_index, worker_count)
        fail_on = self.fail_on
        write = part.write_batch

        def write_batch(items: list) -> None:
            if os.path.exists(fail_on):
                msg = "the sink is down"
                raise ConnectionError(msg)
            write(items)

        part.write_batch = write_batch
        return part


def stream(url: str, d: str) -> dict:
    """A running count over a JSON-lines stream, TestingSink at this process, two runs on one checkpoint."""
    spark = _session(url)
    root = f"{d}/in"
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": f"u{i % 2}"} for i in range(4)])
    first: list = []
    lines: list = []
    run = _run_stream(spark, _count_flow(root, first), d, lines)
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u0"}, {"user": "u5"}])
    second: list = []
    _run_stream(spark, _count_flow(root, second), d, lines)
    expected: list = []
    run_main(_count_flow(root, expected, bounded=True))
    return {
        "first": first,
        "second": second,
        "expected": expected,
        "lines": lines,
        "outbox": os.path.isdir(os.path.join(d, "chk", "outbox")),
        "batches": run.batches,
    }


def _run_stream(spark: Any, flow: Dataflow, d: str, lines: list) -> Any:
    from flowspark.spark import run

    return run(flow, spark=spark, checkpoint=f"{d}/chk", trigger="available_now", progress=lines.append)


def sink_down(url: str, d: str) -> dict:
    """A sink failing at this process stops the stream with its step named; the next run hands the items over."""
    spark = _session(url)
    root = f"{d}/in"
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "u1"}, {"user": "u2"}])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": "u1"}])
    down = f"{d}/down"
    open(down, "w").close()
    got: list = []
    try:
        _run_stream(spark, _count_flow(root, got, down), d, [])
        error = None
    except FlowsparkRuntimeError as e:
        error = {"type": type(e).__name__, "step_id": e.step_id, "message": str(e)}
    os.remove(down)
    again: list = []
    _run_stream(spark, _count_flow(root, again, down), d, [])
    return {"error": error, "during": got, "after": again}


def stream_user_error(url: str, d: str) -> dict:
    """A step failing inside a streaming task arrives as FlowsparkRuntimeError naming it, caused by its error."""
    spark = _session(url)
    root = f"{d}/in"
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": "u1"}, {"n": 1}])
    write_jsonl(f"{root}/b/0001.jsonl", [])
    try:
        _run_stream(spark, _count_flow(root, []), d, [])
    except FlowsparkRuntimeError as e:
        return {"type": type(e).__name__, "step_id": e.step_id, "message": str(e), "cause": repr(e.__cause__)}
    return {"type": None}


def parquet_sink(url: str, d: str) -> dict:
    """A stream writing a SparkSink (Spark's own writer on the server), two runs on one checkpoint."""
    from flowspark.spark import SparkSink, run

    spark = _session(url)
    root = f"{d}/in"

    def flow() -> Dataflow:
        f = Dataflow("connect_parquet")
        s = op.input("inp", f, JsonlDirSource(root, ["a", "b"]))
        counts = op.stateful_map("count", op.key_on("key", s, lambda e: e["user"]), count_mapper)
        rows = op.map("row", counts, lambda kv: {"user": kv[0], "n": kv[1]})
        op.output("out", rows, SparkSink("parquet", f"{d}/out", schema="user string, n long"))
        return f

    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(5)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": "u1"}])
    run(flow(), spark=spark, checkpoint=f"{d}/chk", trigger="available_now", progress=False)
    write_jsonl(f"{root}/b/0002.jsonl", [{"user": "u1"}])
    run(flow(), spark=spark, checkpoint=f"{d}/chk", trigger="available_now", progress=False)
    rows = sorted((r["user"], r["n"]) for r in spark.read.parquet(f"{d}/out").collect())
    return {"rows": rows}


def complete(url: str, d: str) -> dict:
    """`available_now` twice on one checkpoint through Connect: every file there at a run's start (complete_case)."""
    from pathlib import Path

    from complete_case import GAP, T0, canon, expected, read_rows, stage_run, streaming_flow

    from flowspark.spark import run

    sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "streaming"))
    from common import FileClock

    spark = _session(url)
    work = Path(d)
    clock = FileClock(work / "now")
    for i in range(2):
        stage_run(work / "in", i)
        clock.set(T0 + i * GAP)
        flow = streaming_flow(work / "in", work / "out")
        run(flow, spark=spark, checkpoint=str(work / "chk"), trigger="available_now", clock=clock, progress=False)
    return {"streamed": canon(read_rows(work / "out")), "expected": expected(pause=True)}


def no_flowspark(url: str, d: str) -> dict:
    """The server's workers lack flowspark: a batch job ships it; a stream carries it (two runs, one checkpoint)."""
    from flowspark.spark import run

    spark = _session(url)
    flow = Dataflow("ship")
    s = op.input("inp", flow, TestingSource([("a", 1), ("b", 2), ("a", 3)]))
    out: list = []
    op.output("out", op.stateful_map("sum", s, lambda st, v: ((st or 0) + v, (st or 0) + v)), TestingSink(out))
    run(flow, spark=spark)
    root = f"{d}/in"
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": "u1"}, {"user": "u4"}])
    first: list = []
    lines: list = []
    _run_stream(spark, _count_flow(root, first), d, lines)
    write_jsonl(f"{root}/a/0002.jsonl", [{"user": "u0"}, {"user": "u4"}])
    second: list = []
    _run_stream(spark, _count_flow(root, second), d, lines)
    expected: list = []
    run_main(_count_flow(root, expected, bounded=True))
    # The key layout's transformWithStateInPandas processor is carried too.
    keyed: list = []
    run(
        _count_flow(root, keyed),
        spark=spark,
        checkpoint=f"{d}/chk-key",
        trigger="available_now",
        progress=False,
        state_layout="key",
    )
    from flowspark.spark.session import streaming_carry

    return {
        "batch": sorted(out),
        "carried": streaming_carry(spark) is not None,
        "first": first,
        "second": second,
        "expected": expected,
        "key_layout": keyed,
        "lines": lines,
    }


def two_sinks(url: str, d: str) -> dict:
    """A batch job writing two SparkSinks, at once (the rule `concurrent_sinks`) through Connect.

    The counts' sink has no schema: it is inferred through Connect (`compat.inferred_schema`).
    """
    import operator

    from flowspark.spark import SparkSink, SparkSource, compile_flow, run
    from flowspark.spark.tools import physical_plans

    spark = _session(url)
    src = os.path.join(d, "in")
    spark.createDataFrame([(f"u{i % 3}", i) for i in range(30)], "user STRING, v LONG").write.parquet(src)
    flow = Dataflow("connect_two")
    inp = op.input("inp", flow, SparkSource("parquet", src))
    counts = op.count_final("count", inp, lambda r: r["user"])
    totals = op.reduce_final(
        "total", op.map_value("v", op.key_on("key", inp, lambda r: r["user"]), lambda r: r["v"]), operator.add
    )
    for name, stream in (("counts", counts), ("totals", totals)):
        rows = op.map(f"{name}_row", stream, lambda kv: {"user": kv[0], "n": kv[1]})
        schema = None if name == "counts" else "user STRING, n LONG"
        op.output(name, rows, SparkSink("parquet", os.path.join(d, name), schema=schema))
    plan, _ = physical_plans(compile_flow(flow), spark)
    run(flow, spark=spark)
    out = {n: sorted(tuple(r) for r in spark.read.parquet(os.path.join(d, n)).collect()) for n in ("counts", "totals")}
    return {"decision": str(plan.decision("concurrent_sinks", "query")), "rows": out}


def docs_connect(url: str, d: str) -> dict:
    """docs/howto/connect.md's Python block, with this server's address, a batch and a stream flow, paths under d."""
    import re

    text = open(os.path.join(HERE, "..", "..", "docs", "howto", "connect.md")).read()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]
    assert "sc://localhost:15002" in code, code
    code = code.replace("sc://localhost:15002", url).replace('"/data/', f'"{d}/')
    root = f"{d}/in"
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    write_jsonl(f"{root}/b/0001.jsonl", [{"user": f"u{i % 2}"} for i in range(4)])
    batch: list = []
    streamed: list = []
    expected: list = []
    # The batch flow reads a TestingSource: a source class of a module the server's workers cannot import
    # (JsonlDirSource) fails there in a batch job (the source is pickled by reference).
    flows = {"flow": _items_count_flow(batch), "stream_flow": _count_flow(root, streamed)}
    exec(compile(code, "docs/howto/connect.md", "exec"), {"__name__": "docs_connect", **flows})  # noqa: S102
    run_main(_count_flow(root, expected, bounded=True))
    return {"batch": batch, "streamed": streamed, "expected": expected}


def _items_count_flow(out: list) -> Dataflow:
    """_count_flow's running count over the same events as docs_connect's files, from a TestingSource."""
    flow = Dataflow("connect_items")
    events = [{"user": f"u{i % 3}"} for i in range(7)] + [{"user": f"u{i % 2}"} for i in range(4)]
    keyed = op.key_on("key", op.input("inp", flow, TestingSource(events)), lambda e: e["user"])
    op.output("out", op.stateful_map("count", keyed, count_mapper), TestingSink(out))
    return flow


SCENARIOS = {
    f.__name__: f
    for f in (stream, sink_down, stream_user_error, parquet_sink, complete, no_flowspark, two_sinks, docs_connect)
}

if __name__ == "__main__":
    name, url, d = sys.argv[1:4]
    print("RESULT " + json.dumps(SCENARIOS[name](url, d)), flush=True)
