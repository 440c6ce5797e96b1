"""What the streaming examples share: a directory of JSON files in, parquet out, runs on one checkpoint.

Each example reads a directory of JSON-lines files with `SparkSource("json", dir, schema=...,
streaming=True)` (new files are new input), keeps per-key state in the Spark checkpoint and
writes its rows to a parquet directory with `SparkSink` (exactly once with the checkpoint).
`run` starts an `available_now` query: it processes what is in the directory, then stops; a
second `run` on the same checkpoint continues with the files that arrived since.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream
from flowspark.spark import SparkSink, SparkSource
from flowspark.testing import TestingSink, TestingSource

__all__ = ["FileClock", "demo", "local_flow", "read_rows", "run", "stage_file", "streaming_flow"]

Pipeline = Callable[[Stream[dict[str, Any]]], Stream[dict[str, Any]]]


def stage_file(in_dir: Path, name: str, rows: list[dict[str, Any]]) -> Path:
    """Write `rows` as a JSON-lines file into the input directory (atomically: a query never sees half a file).

    Args:
        in_dir: The input directory.
        name: File name, e.g. `0001.json`.
        rows: The events.

    Returns:
        The file.
    """
    in_dir.mkdir(parents=True, exist_ok=True)
    tmp = in_dir / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = in_dir / name
    os.replace(tmp, path)
    return path


def streaming_flow(
    flow_id: str, in_dir: Path, in_schema: str, pipeline: Pipeline, out_dir: Path, out_schema: str
) -> Dataflow:
    """The example as a stream: JSON files in, the pipeline, parquet rows out.

    Args:
        flow_id: The dataflow's id.
        in_dir: Directory of JSON-lines input files.
        in_schema: Their schema (DDL).
        pipeline: The example's logic, from event dicts to row dicts.
        out_dir: Parquet output directory.
        out_schema: Schema of the rows (DDL).

    Returns:
        The dataflow.
    """
    flow = Dataflow(flow_id)
    events = op.input("events", flow, SparkSource("json", str(in_dir), schema=in_schema, streaming=True))
    op.output("out", pipeline(events), SparkSink("parquet", str(out_dir), schema=out_schema))
    return flow


def local_flow(flow_id: str, events: list[Any], pipeline: Pipeline, out: list[Any]) -> Dataflow:
    """The same pipeline in memory (for tests and comparison).

    Args:
        flow_id: The dataflow's id.
        events: Event dicts (and `TestingSource` markers such as `PAUSE`).
        pipeline: The example's logic.
        out: Receives the row dicts.

    Returns:
        The dataflow.
    """
    flow = Dataflow(flow_id)
    op.output("out", pipeline(op.input("events", flow, TestingSource(events))), TestingSink(out))
    return flow


def run(
    flow: Dataflow, checkpoint: Path, spark: Any = None, clock: Optional[Callable[[], Any]] = None, progress: Any = True
) -> None:
    """Process what the input directory holds now, then stop (`available_now`).

    Args:
        flow: A flow from `streaming_flow`.
        checkpoint: The query's checkpoint (offsets and keyed state); reuse it to continue.
        spark: A SparkSession (default: a local one).
        clock: Processing time for the workers (tests inject one); default Spark's.
        progress: Print one line per micro-batch (`True`), or a callable receiving it.
    """
    from flowspark.spark import run as spark_run

    options: dict[str, Any] = {"progress": progress}
    if clock is not None:
        options["clock"] = clock
    spark_run(flow, spark=spark, checkpoint=str(checkpoint), trigger="available_now", **options)


def read_rows(out_dir: Path) -> list[dict[str, Any]]:
    """Every row written so far to a parquet output directory.

    Args:
        out_dir: The directory.

    Returns:
        The rows as dicts.
    """
    import pyarrow.parquet as pq

    files = sorted(p for p in out_dir.glob("*.parquet") if not p.name.startswith("."))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def demo(
    prefix: str,
    streaming: Callable[[Path, Path], Dataflow],
    batches: list[list[dict[str, Any]]],
    times: Optional[list[Any]] = None,
) -> Path:
    """Run an example as its `__main__` does: each batch arrives as a new file, then one run.

    Args:
        prefix: Name of the temporary work directory.
        streaming: Builds the example's streaming flow from `(input dir, output dir)`.
        batches: The events of each run.
        times: Processing time of each run (an injected clock), or `None` for Spark's.

    Returns:
        The work directory (`in/`, `out/`, `chk/`).
    """
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=f"flowspark-{prefix}-"))
    clock = FileClock(work / "now") if times is not None else None
    for i, batch in enumerate(batches, start=1):
        stage_file(work / "in", f"{i:04d}.json", batch)
        if clock is not None and times is not None:
            clock.set(times[i - 1])
            print(f"-- run {i} at {times[i - 1]:%H:%M} (processing time)")
        run(streaming(work / "in", work / "out"), work / "chk", clock=clock)
    for row in read_rows(work / "out"):
        print(row)
    return work


class FileClock:
    """Processing time for the workers, read from a file this process writes (picklable)."""

    def __init__(self, path: Path) -> None:
        """Keep the time in `path`."""
        self.path = str(path)

    def set(self, t: Any) -> None:
        """Move the clock to `t` (an aware datetime)."""
        Path(self.path).write_text(t.isoformat())

    def __call__(self) -> Any:
        """The time."""
        from datetime import datetime

        return datetime.fromisoformat(Path(self.path).read_text())
