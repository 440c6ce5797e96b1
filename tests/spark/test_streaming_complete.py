"""`available_now` finishes what was available at its start, also with both cores busy (see complete_case.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from complete_case import GAP, T0, canon, expected, read_rows, stage_run, streaming_flow
from test_quiet_success import JVM_LINE

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
#: What pyspark's transformWithStateInPandas driver-side worker prints (with `print`, which Spark
#: copies to the JVM's stderr) when a query with that operator starts; no setting turns it off.
TWS_WORKER = "Streaming TransformWithStateInPandas Python worker"


def _without_source_runner_eof(lines: list[str]) -> list[str]:
    """`lines` without the trace of Spark's Python data source runner meeting the end of its socket.

    When a query stops, Spark may close the socket of its Python data source's planning
    process (`python_streaming_source_runner`) before it ends that process, which then prints
    an `EOFError` trace from its wait for the next call (seen once in two full suite runs, on
    2026-11-27; a known limitation, docs/streaming.md "Errors and Spark's log"). Spark may also
    end the process while it prints: the trace stops before its `EOFError` line (seen once,
    2026-11-30). Only a trace whose frames include the runner's wait (`func_id = read_int(infile)`) and
    whose exception line, if printed, is `EOFError` goes; any other line stays.
    """
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i] != "Traceback (most recent call last):":
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].startswith(" "):
            j += 1
        frames = "\n".join(lines[i + 1 : j])
        last = lines[j] if j < len(lines) else None
        ends_in_wait = "python_streaming_source_runner.py" in frames and "func_id = read_int(infile)" in frames
        if ends_in_wait and (last is None or last.startswith("EOFError")):
            i = j if last is None else j + 1
            continue
        out.append(lines[i])
        i += 1
    return out


def test_only_the_source_runners_own_eof_trace_is_left_out():
    runner = [
        "Traceback (most recent call last):",
        '  File "/x/pyspark/sql/streaming/python_streaming_source_runner.py", line 265, in main',
        "    func_id = read_int(infile)",
        '  File "/x/pyspark/serializers.py", line 596, in read_int',
        "    raise EOFError",
    ]
    assert _without_source_runner_eof(["a", *runner, "EOFError", "b"]) == ["a", "b"]
    assert _without_source_runner_eof(["a", *runner[:3]]) == ["a"]  # the process ended while printing
    other = ["ValueError: boom"]
    assert _without_source_runner_eof([*runner, *other]) == [*runner, *other]
    elsewhere = ["Traceback (most recent call last):", '  File "/x/flow.py", line 3, in f', "EOFError"]
    assert _without_source_runner_eof(elsewhere) == elsewhere


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


def test_available_now_processes_every_file_there_at_its_start_under_load(spark, tmp_path):
    sys.path.insert(0, str(HERE.parents[1] / "examples" / "streaming"))
    from common import FileClock

    from flowspark.spark import run

    clock = FileClock(tmp_path / "now")
    flow = streaming_flow(tmp_path / "in", tmp_path / "out")
    batches = []
    with _busy_cores():
        for i in range(2):
            stage_run(tmp_path / "in", i)
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
    assert all(b >= 3 for b in batches), batches  # one file per micro-batch (the empty one too), then the last
    assert canon(read_rows(tmp_path / "out")) == expected(pause=True)


FLOW_MODULE = """
from pathlib import Path
import os
from complete_case import streaming_flow
flow = streaming_flow(Path(os.environ["COMPLETE_IN"]), Path(os.environ["COMPLETE_OUT"]))
"""


def test_the_command_line_run_processes_every_file_there_at_its_start(tmp_path):
    """`flowspark run --trigger available_now` twice on one checkpoint (Spark's processing time: no pause)."""
    import os

    (tmp_path / "complete_flow.py").write_text(FLOW_MODULE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "COMPLETE_IN": str(tmp_path / "in"),
        "COMPLETE_OUT": str(tmp_path / "out"),
    }
    cmd = [sys.executable, "-m", "flowspark", "run", "complete_flow:flow", "--checkpoint", str(tmp_path / "chk")]
    cmd += ["--trigger", "available_now", "--no-progress"]
    for i in range(2):
        stage_run(tmp_path / "in", i)
        done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        # --no-progress: nothing on stderr but the JVM's own line, and the lines pyspark's own
        # transformWithStateInPandas driver-side worker prints at each query start (this flow chains
        # two keyed stages; a known limitation, docs/streaming.md "Errors and Spark's log").
        noise = _without_source_runner_eof(
            [ln for ln in done.stderr.splitlines() if ln.strip() and ln.strip() != JVM_LINE and TWS_WORKER not in ln]
        )
        assert noise == [], "\n".join(noise)[:3000]
    assert canon(read_rows(tmp_path / "out")) == expected(pause=False)
