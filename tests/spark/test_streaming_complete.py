"""`available_now` finishes what was available at its start, also with both cores busy.

Timer flows (event-time windows, `collect` with a timeout, both of which keep notifications)
read a directory of JSON files one file per micro-batch, in two runs on one checkpoint (files
added between the runs, one of them empty), while busy processes load both cores. Each run
must process every file there at its start: the per-key results equal the in-memory
executor's on the same events (with a pause of the same length between the runs, and no end
of input, as a stream has none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow, Stream
from flowspark.spark import SparkSink, SparkSource
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

pytestmark = [pytest.mark.spark, pytest.mark.slow]

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


def _pipeline(events: Stream[dict[str, Any]]) -> Stream[dict[str, Any]]:
    keyed = op.key_on("key", events, _key)
    clock = win.EventClock(_event_time, wait_for_system_duration=timedelta(0))
    windows = win.fold_window("tumble", keyed, clock, win.TumblingWindower(timedelta(minutes=5), T0), int, _add, _merge)
    lists = op.collect("collect", op.map_value("n", keyed, _n), timeout=timedelta(minutes=3), max_size=4)
    return op.merge(
        "rows", op.map("window_rows", windows.down, _window_row), op.map("collect_rows", lists, _collect_row)
    )


def _files() -> list[list[dict[str, Any]]]:
    """Five files: two for the first run; for the second, two more with an empty one between them.

    The second run's events are for windows after those the pause closes (none of them is late).
    """

    def events(minutes: range, n0: int) -> list[dict[str, Any]]:
        return [{"user": u, "minute": m, "n": n0 + m * 3 + i} for m in minutes for i, u in enumerate(["ann", "bob"])]

    first = [events(range(0, 4), 0), events(range(4, 9), 100)]
    return [*first, events(range(20, 27), 200), [], events(range(27, 34), 300)]


@contextmanager
def _busy_cores(n: int = 2) -> Iterator[None]:
    """`n` processes spinning on the CPU for the duration (bounded: each stops by itself after 5 minutes)."""
    spin = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _stage(in_dir: Path, n: int, rows: list[dict[str, Any]]) -> None:
    """File `n` of the input, its modification time `n` seconds after the first (Spark reads files in that order)."""
    in_dir.mkdir(parents=True, exist_ok=True)
    tmp = in_dir / f".{n:04d}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    at = T0.timestamp() + n
    os.utime(tmp, (at, at))
    tmp.rename(in_dir / f"{n:04d}.json")


def _canon(rows: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    return {k: sorted(v) for k, v in per_key((r["user"], (r["kind"], r["value"])) for r in rows).items()}


def test_available_now_processes_every_file_there_at_its_start_under_load(spark, tmp_path):
    import pyarrow.parquet as pq

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "streaming"))
    from common import FileClock

    files = _files()
    runs = [files[:2], files[2:]]
    clock = FileClock(tmp_path / "now")
    flow = Dataflow("complete")
    src = SparkSource(
        "json", str(tmp_path / "in"), schema=IN_SCHEMA, streaming=True, options={"maxFilesPerTrigger": "1"}
    )
    out_dir = tmp_path / "out"
    op.output("out", _pipeline(op.input("events", flow, src)), SparkSink("parquet", str(out_dir), schema=OUT_SCHEMA))
    from flowspark.spark import run

    batches = []
    n = 0
    with _busy_cores():
        for i, files_of_run in enumerate(runs):
            for rows in files_of_run:
                n += 1
                _stage(tmp_path / "in", n, rows)
            clock.set(T0 + i * GAP)
            sr = run(
                flow,
                spark=spark,
                checkpoint=str(tmp_path / "chk"),
                trigger="available_now",
                clock=clock,
                progress=False,
            )
            batches.append(sr.batches)
    streamed = [r for f in sorted(out_dir.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]

    local_flow = Dataflow("complete")
    events: list[Any] = [*files[0], *files[1], TestingSource.PAUSE(GAP), *files[2], *files[4], TestingSource.ABORT()]
    local: list[Any] = []
    op.output("out", _pipeline(op.input("events", local_flow, TestingSource(events))), TestingSink(local))
    run_main(local_flow, clock="logical", start_time=T0)

    assert all(b >= 3 for b in batches), batches  # one file per micro-batch (the empty one too), then the last
    kinds = {k for _u, rows in _canon(local).items() for k, _v in rows}
    assert kinds == {"window", "collect"}, "both timer steps emit in this case"
    assert _canon(streamed) == _canon(local)
