"""A successful run prints nothing on stderr the user did not ask for.

The docs' streaming quick-start (also on the chunk layout: transformWithStateInPandas), every
streaming example and the batch example run in a fresh
process on the session flowspark creates (as a user runs them): stderr holds no log line, no
Java frame, no warning and no banner, but the one line the JVM itself prints for the module
Spark's launcher always adds (no setting turns it off; docs/streaming.md "Errors and Spark's log").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Printed by the JVM (not Spark's log) for `--add-modules=jdk.incubator.vector`, which Spark's launcher always passes.
JVM_LINE = "WARNING: Using incubator modules: jdk.incubator.vector"


def test_the_quick_start_and_the_examples_print_nothing_on_stderr(tmp_path):
    # a user's shell has none of them (the suite's conftest sets PYSPARK_PYTHON)
    mine = ("SPARK_CONF_DIR", "FLOWSPARK_SPARK_LOG_LEVEL", "PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    env = {k: v for k, v in os.environ.items() if k not in mine}
    driver = Path(__file__).with_name("quiet_driver.py")
    done = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "work")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[flowspark] batch 0" in done.stdout  # the quick-start's progress lines are what the user asked for
    noise = [line for line in done.stderr.splitlines() if line.strip() and line.strip() != JVM_LINE]
    assert noise == [], "\n".join(noise)[:3000]
