"""The README's main job: a streaming query in two runs on one checkpoint, equal to the in-memory executor."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_main_job_streams_in_two_runs_and_matches_in_memory(spark, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("main_job", EXAMPLES / "main_job.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["main_job"] = mod
    spec.loader.exec_module(mod)
    assert mod.main(["main_job", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "== run 1" in out
    assert "== run 2" in out
    assert "[flowspark] batch" in out  # progress lines
    assert "in-memory executor gives the same sessions: True" in out
    rows = mod.read_rows(tmp_path / "out")
    # Run 1's sessions (ann, bob, cid) time out in run 2; bob and dee's new sessions stay open.
    assert sorted((r["user"], r["clicks"]) for r in rows) == [("ann", 2), ("bob", 1), ("cid", 1)]
