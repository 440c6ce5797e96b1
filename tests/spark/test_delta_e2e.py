"""Delta Lake end to end: a stream into `SparkSink("delta")` killed -9 and restarted, read back.

Each Spark run is a subprocess whose session flowspark creates (Delta's cached jars and its
two settings, `flowspark.spark.io.classpath.session_conf`): `delta_driver.py` runs the stream
(killed -9 once some micro-batches are committed, then restarted from the checkpoint), reads
the table back with a batch flow over `SparkSource("delta")` and with a stream of its commits,
and plans the batch flow with `flowspark plan --spark`. The outputs equal `run_main` over the
same events; `flowspark state` reads the stream's checkpoint here.

No Delta Lake release is built for pyspark 4.3: there these tests skip, with the one command
that runs them (`python -m nox -s kafka`, pyspark 4.2.0 with Delta 4.4.0). Where Delta is
built for the pyspark, jars not cached fail them with the command to run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowspark.testing import TestingSink, run_main

pyspark = pytest.importorskip("pyspark")

from flowspark.spark.io.delta import FETCH_DELTA, delta_jars, delta_package  # noqa: E402

if delta_package() is None:  # one skip for the module, with the command that runs it
    pytest.skip(
        f"no Delta Lake release is built for pyspark {pyspark.__version__}; the Delta end-to-end tests run on "
        "pyspark 4.2.0 with Delta 4.4.0: python -m nox -s kafka",
        allow_module_level=True,
    )

pytestmark = [pytest.mark.slow, pytest.mark.spark]

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "delta_driver.py"


def _commits(chk: Path) -> list[int]:
    d = chk / "query" / "commits"
    return [int(f) for f in os.listdir(d) if f.isdigit()] if d.is_dir() else []


def _txn_versions(table: Path) -> list[int]:
    """The micro-batch ids Delta's transaction log recorded for the query (one `txn` action per streaming commit)."""
    from streaming_helpers import delta_log_actions

    return [txn["version"] for txn in delta_log_actions(table, "txn")]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """Events under `in/`, a stream into a Delta table killed -9 mid-stream, then restarted and read back."""
    import delta_driver
    from streaming_helpers import write_jsonl

    if delta_jars() is None:
        pytest.fail(
            f"Delta Lake's jars for pyspark {pyspark.__version__} are not cached; run: "
            f"{sys.executable} {FETCH_DELTA.split(' ', 1)[1]}",
            pytrace=False,
        )
    tmp = tmp_path_factory.mktemp("delta")
    root, chk, table, out = tmp / "in", tmp / "chk", tmp / "table", tmp / "read.json"
    for part in ("a", "b"):
        for f in range(4):
            write_jsonl(str(root / part / f"{f:04d}.jsonl"), [{"user": f"u{(i * 3 + f) % 7}"} for i in range(75)])
    want: list = []
    run_main(delta_driver.build(str(root), "", bounded=True, sink=TestingSink(want)))
    # The killed run: 600 events, at most 100 per micro-batch; SIGKILL once 2 are committed.
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(root), str(chk), str(table)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and len(_commits(chk)) < 2:
        time.sleep(0.02)
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert killed, "the driver ended before it could be killed; write more events"
    before = len(_commits(chk))
    assert before < 6, "every micro-batch was committed before the kill"
    # The restart: the same driver from the checkpoint, then the batch flow reading the table and its plan.
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(root), str(chk), str(table), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        "want": sorted((r["user"], r["n"]) for r in want),
        "read": json.loads(out.read_text()),
        "chk": chk,
        "table": table,
        "committed_before_kill": before,
    }


def test_kill_9_then_restart_the_delta_table_holds_each_row_exactly_once(crashed):
    """What a reader of the table sees after a crash: every count once, none lost, none twice (Delta's log)."""
    want = crashed["want"]
    assert len(want) == 600
    assert sorted(tuple(r) for r in crashed["read"]["rows"]) == want
    txns = _txn_versions(crashed["table"])
    assert len(txns) == len(set(txns)), f"a micro-batch was committed to the table twice: {txns}"
    assert sorted(txns) == sorted(_commits(crashed["chk"])), "the table's commits are not the query's micro-batches"


def test_a_batch_flow_reads_the_delta_table(crashed):
    """`SparkSource("delta")` in a batch flow: each user's highest count equals `run_main`'s last count per user."""
    last: dict[str, int] = {}
    for user, n in crashed["want"]:
        last[user] = max(last.get(user, 0), n)
    assert sorted(tuple(r) for r in crashed["read"]["highest"]) == sorted(last.items())


def test_a_stream_reads_the_delta_tables_commits(crashed):
    """`SparkSource("delta", streaming=True)`, `available_now`, a new checkpoint: every row of every commit, once."""
    assert sorted(tuple(r) for r in crashed["read"]["streamed"]) == crashed["want"]


def test_flowspark_state_reads_the_checkpoint_of_a_delta_stream(crashed, spark, capsys):
    from flowspark.cli import main
    from flowspark.spark.versions import STATE_READER, lacks

    why = lacks(STATE_READER)
    if why is not None:  # pyspark 3.5: one line saying what to run instead
        assert main(["state", str(crashed["chk"]), "--format", "json"]) == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line == f"flowspark: error: flowspark state {crashed['chk']}: {why}; read it with pyspark 4.0 or newer"
        return
    assert main(["state", str(crashed["chk"]), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    last: dict[str, int] = {}
    for user, n in crashed["want"]:
        last[user] = max(last.get(user, 0), n)
    assert doc["flow_id"] == "delta_kill"
    assert {s["key"]: s["snapshot"] for s in doc["state"]} == last


def test_flowspark_plan_spark_of_a_flow_reading_delta(crashed):
    """`flowspark plan --spark` of the batch flow (in the driver's session): its physical plan reads the Delta log."""
    read = crashed["read"]
    assert read["plan_code"] == 0
    assert "== stage 0: Spark physical plan ==" in read["plan"]
    assert "delta" in read["plan"].split("== stage 0: Spark physical plan ==")[1].lower()
