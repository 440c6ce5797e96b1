"""`flowspark plan --spark` and `flowspark run --runtime spark` in process, on the shared local session."""

from __future__ import annotations

import io
import json

import pytest

import flowspark.operators as op
from flowspark.cli import main
from flowspark.dataflow import Dataflow
from flowspark.inputs import FileSource
from flowspark.outputs import FileSink
from flowspark.testing import TestingSink, TestingSource

pytestmark = pytest.mark.spark

# The flows live in this module: the shared session's Python workers import it by name.


def _fmt(kv):
    return kv[0], f"{kv[0]}={kv[1]}"


def get_flow(inp, out):
    flow = Dataflow("clispark")
    words = op.flat_map("split", op.input("inp", flow, FileSource(inp)), str.split)
    counts = op.count_final("count", words, lambda w: w)
    op.output("out", op.map("fmt", counts, _fmt), FileSink(out))
    return flow


def boom(x):
    if x == 3:
        raise ValueError("three is bad")
    return x


def bad_flow():
    flow = Dataflow("bad")
    op.output("out", op.map("boom", op.input("inp", flow, TestingSource(list(range(5)))), boom), TestingSink([]))
    return flow


@pytest.fixture
def flow_file(tmp_path):
    (tmp_path / "in.txt").write_text("a b a\nc a b\n")
    return f"test_cli_spark:get_flow({str(tmp_path / 'in.txt')!r}, {str(tmp_path / 'out.txt')!r})", tmp_path


def test_plan_spark_shows_physical_plan(spark, flow_file, capsys):
    import_str, _ = flow_file
    assert main(["plan", import_str, "--spark"]) == 0
    out = capsys.readouterr().out
    assert "plan for dataflow 'clispark': 2 stage(s)" in out
    assert "== stage 1: Spark physical plan ==" in out
    stage1 = out.split("== stage 1: Spark physical plan ==")[1]
    assert "Exchange" in stage1
    assert "hashpartitioning(k" in stage1
    assert "MapInArrow" in stage1
    assert main(["plan", import_str, "--spark", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["spark"]["physical"]) == {"0", "1"}
    assert "Physical Plan" in doc["spark"]["physical"]["1"]


def test_run_on_spark_writes_output_and_reports_progress(spark, flow_file, capsys, monkeypatch):
    from flowspark.spark import tools

    seen = []
    real = tools.Progress

    class Eager(real):
        def __init__(self, spark, stream=None, interval=2.0, delay=2.0):
            super().__init__(spark, stream=io.StringIO(), interval=0.05, delay=0.0)
            seen.append(self)

    monkeypatch.setattr(tools, "Progress", Eager)
    import_str, tmp = flow_file
    assert main(["run", "--runtime", "spark", import_str]) == 0
    assert sorted((tmp / "out.txt").read_text().splitlines()) == ["a=3", "b=2", "c=1"]
    (progress,) = seen
    lines = progress.stream.getvalue().splitlines()
    assert lines, "no progress line"
    last = progress.snapshot()
    assert last["stages"] >= 2
    assert last["done"] == last["stages"]
    assert last["rows_written"] > 0
    assert f"stages {last['done']}/{last['stages']} done" in lines[-1]


def test_run_on_spark_user_error_is_one_line(spark, capsys):
    assert main(["run", "--runtime", "spark", "--no-progress", "test_cli_spark:bad_flow"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["flowspark: error: error in step 'bad.boom.flat_map_batch': ValueError: three is bad"]
