"""Workers whose Python lacks flowspark: flowspark ships itself (batch and streams), or says what to set."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# The user's own session, built as a user would in a script; its workers run PYSPARK_PYTHON.
DRIVER = textwrap.dedent(
    """
    import sys

    from pyspark.sql import SparkSession

    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.errors import WorkerEnvironmentError
    from flowspark.inputs import FixedPartitionedSource, StatefulSourcePartition
    from flowspark.spark import run
    from flowspark.testing import TestingSink, TestingSource

    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")  # Spark's default 200 tasks a stage: 80 s on local[1]
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    ITEMS = [("a", 1), ("b", 2), ("a", 3)]


    class _Part(StatefulSourcePartition):
        def __init__(self, pos):
            self.pos = pos or 0

        def next_batch(self):
            got, self.pos = ITEMS[self.pos : self.pos + 2], min(self.pos + 2, len(ITEMS))
            return got  # then [] forever: nothing new, an unbounded source

        def snapshot(self):
            return self.pos


    class Endless(FixedPartitionedSource):
        def list_parts(self):
            return ["only"]

        def build_part(self, step_id, for_part, resume_state):
            return _Part(resume_state)


    def flow_of(src, out):
        flow = Dataflow("ship")
        s = op.input("inp", flow, src)
        op.output("out", op.stateful_map("sum", s, lambda st, v: ((st or 0) + v, (st or 0) + v)), TestingSink(out))
        return flow


    try:
        out = []
        run(flow_of(TestingSource(ITEMS), out), spark=spark)
        print("OUT", sorted(out))
        streamed = []
        chk = sys.argv[1]
        run(flow_of(Endless(), streamed), spark=spark, checkpoint=chk, trigger="available_now", progress=False)
        print("STREAMED", sorted(streamed))
    except WorkerEnvironmentError as e:
        print(f"ERROR {e}")
        sys.exit(3)
    """
)


def _run(tmp_path: Path, worker_python: str, pythonpath: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    wrapper = tmp_path / "worker-python"
    # `-S`: no site processing, so the editable install's .pth (which puts flowspark on the
    # path) is not read: the workers see site-packages through PYTHONPATH only.
    wrapper.write_text(f'#!/bin/sh\nexec {worker_python} -S "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_DRIVER_PYTHON")}
    env["PYSPARK_PYTHON"] = str(wrapper)
    env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "chk")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )


def test_flowspark_ships_itself_to_workers_that_lack_it(tmp_path):
    probe = subprocess.run(
        [sys.executable, "-S", "-c", "import flowspark"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(site.getsitepackages())},
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout, whose folder holds the flowspark package
    )
    if probe.returncode == 0:
        pytest.skip("flowspark is installed into site-packages (not editable): the workers can import it anyway")
    res = _run(tmp_path, sys.executable, os.pathsep.join(site.getsitepackages()))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OUT [('a', 1), ('a', 4), ('b', 2)]" in res.stdout
    # A stream too: its tasks and its Python data source's reader run on those workers.
    assert "STREAMED [('a', 1), ('a', 4), ('b', 2)]" in res.stdout


def test_workers_without_pyarrow_get_one_line_saying_what_to_set(tmp_path):
    res = _run(tmp_path, sys.executable, "")  # no site-packages at all: no pyarrow, no cloudpickle
    assert res.returncode == 3, res.stdout + res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("ERROR ")]
    assert "Spark's Python workers" in line
    assert f"PYSPARK_PYTHON={sys.executable}" in line or f"PYSPARK_PYTHON to {sys.executable}" in line
