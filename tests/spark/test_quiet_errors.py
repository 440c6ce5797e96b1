"""A failed streaming query prints flowspark's error, not Spark's logs, Java traces or the task-error marker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = textwrap.dedent(
    """
    import sys

    from streaming_helpers import JsonlDirSource, count_mapper, write_jsonl

    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.errors import FlowsparkRuntimeError
    from flowspark.spark import run
    from flowspark.testing import TestingSink

    root = sys.argv[1]
    write_jsonl(f"{root}/in/a/0001.jsonl", [{"user": "u1"}, {"nouser": 1}, {"user": "u2"}])
    flow = Dataflow("bad")
    s = op.input("inp", flow, JsonlDirSource(f"{root}/in", ["a"]))
    counts = op.stateful_map("count", op.key_on("key", s, lambda e: e["user"]), count_mapper)
    op.output("out", counts, TestingSink([]))
    try:
        run(flow, checkpoint=f"{root}/chk", trigger="available_now", progress=False)
    except FlowsparkRuntimeError as e:
        print(f"failed: {e}", file=sys.stderr)
        sys.exit(1)
    """
)

# The JVM's own start-up lines, printed before any session setting applies.
JVM_START = ("WARNING: Using incubator modules", "Setting default log level", "To adjust logging level")


def test_a_bad_row_fails_the_query_with_one_clear_line(tmp_path: Path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    env.pop("SPARK_CONF_DIR", None)
    env.pop("FLOWSPARK_SPARK_LOG_LEVEL", None)
    res = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 1, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    ours = [ln for ln in lines if not ln.startswith(JVM_START)]
    assert ours == ["failed: error in step 'bad.key.flat_map_batch': KeyError: 'user' (item: {'nouser': 1})"], (
        res.stderr
    )
    assert len(lines) <= 4
    assert "FLOWSPARK_TASK_ERROR" not in res.stderr
