"""The `available_now` completeness case, shared by the classic, CLI and Spark Connect tests.

Timer flows (event-time windows and `collect` with a timeout, both keeping notifications) read
a directory of JSON files one file per micro-batch, in two runs on one checkpoint: two files,
then two more with an empty one between them. Each run must process every file there at its
start, so the per-key results equal the in-memory executor's on the same events (with a pause
of `GAP` between the runs when the stream runs on an injected clock, and no end of input, as a
stream has none). The second run's events are for windows after those the pause closes (none
of them is late).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow, Stream
from flowspark.spark import SparkSink, SparkSource
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

T0 = datetime(2026, 1, 1, 9, tzinfo=timezone.utc)
GAP = timedelta(minutes=10)
IN_SCHEMA = "user STRING, minute LONG, n LONG"
OUT_SCHEMA = "kind STRING, user STRING, value STRING"


def _at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def _event_time(e: dict[str, Any]) -> datetime:
    return _at(e["minute"])


def _window_row(kv: tuple[str, tuple[int, int]]) -> dict[str, Any]:
    user, (window, total) = kv
    return {"kind": "window", "user": user, "value": f"{window}:{total}"}


def _collect_row(kv: tuple[str, list[int]]) -> dict[str, Any]:
    return {"kind": "collect", "user": kv[0], "value": ",".join(map(str, kv[1]))}


def _add(total: int, e: dict[str, Any]) -> int:
    return total + e["n"]


def _merge(a: int, b: int) -> int:
    return a + b


def _key(e: dict[str, Any]) -> str:
    return e["user"]


def _n(e: dict[str, Any]) -> int:
    return e["n"]


def pipeline(events: Stream[dict[str, Any]]) -> Stream[dict[str, Any]]:
    """Events -> one row per closed window and per collected list."""
    keyed = op.key_on("key", events, _key)
    clock = win.EventClock(_event_time, wait_for_system_duration=timedelta(0))
    windows = win.fold_window("tumble", keyed, clock, win.TumblingWindower(timedelta(minutes=5), T0), int, _add, _merge)
    lists = op.collect("collect", op.map_value("n", keyed, _n), timeout=timedelta(minutes=3), max_size=4)
    return op.merge(
        "rows", op.map("window_rows", windows.down, _window_row), op.map("collect_rows", lists, _collect_row)
    )


def files() -> list[list[dict[str, Any]]]:
    """Five files: two for the first run; for the second, two more with an empty one between them."""

    def events(minutes: range, n0: int) -> list[dict[str, Any]]:
        return [{"user": u, "minute": m, "n": n0 + m * 3 + i} for m in minutes for i, u in enumerate(["ann", "bob"])]

    first = [events(range(0, 4), 0), events(range(4, 9), 100)]
    return [*first, events(range(20, 27), 200), [], events(range(27, 34), 300)]


#: Which files each run finds (indexes into `files()`).
RUNS = [[0, 1], [2, 3, 4]]


def stage(in_dir: Path, n: int, rows: list[dict[str, Any]]) -> None:
    """File `n` of the input, its modification time `n` seconds after the first (Spark reads files in that order)."""
    in_dir.mkdir(parents=True, exist_ok=True)
    tmp = in_dir / f".{n:04d}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    at = T0.timestamp() + n
    os.utime(tmp, (at, at))
    tmp.rename(in_dir / f"{n:04d}.json")


def stage_run(in_dir: Path, run: int) -> None:
    """Add the files the `run`-th run (0 or 1) finds."""
    data = files()
    for i in RUNS[run]:
        stage(in_dir, i + 1, data[i])


def streaming_flow(in_dir: Path, out_dir: Path) -> Dataflow:
    """The pipeline reading `in_dir` one file per micro-batch, writing parquet rows to `out_dir`."""
    flow = Dataflow("complete")
    src = SparkSource("json", str(in_dir), schema=IN_SCHEMA, streaming=True, options={"maxFilesPerTrigger": "1"})
    op.output("out", pipeline(op.input("events", flow, src)), SparkSink("parquet", str(out_dir), schema=OUT_SCHEMA))
    return flow


def canon(rows: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """Rows per user, sorted."""
    return {k: sorted(v) for k, v in per_key((r["user"], (r["kind"], r["value"])) for r in rows).items()}


def read_rows(out_dir: Path) -> list[dict[str, Any]]:
    """Every row of the parquet output."""
    import pyarrow.parquet as pq

    return [r for f in sorted(out_dir.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def expected(pause: bool) -> dict[str, list[tuple[str, str]]]:
    """The in-memory executor's rows on the same events (`pause`: `GAP` of logical time between the runs)."""
    data = files()
    events: list[Any] = [row for i in RUNS[0] for row in data[i]]
    if pause:
        events.append(TestingSource.PAUSE(GAP))
    events += [row for i in RUNS[1] for row in data[i]]
    events.append(TestingSource.ABORT())
    flow = Dataflow("complete")
    out: list[Any] = []
    op.output("out", pipeline(op.input("events", flow, TestingSource(events))), TestingSink(out))
    run_main(flow, clock="logical", start_time=T0)
    kinds = {k for rows in canon(out).values() for k, _v in rows}
    assert kinds == {"window", "collect"}, "both timer steps emit in this case"
    return canon(out)
