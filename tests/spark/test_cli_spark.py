"""`flowspark plan --spark` and `flowspark run --runtime spark` in process, on the shared local session."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timezone

import pytest

import flowspark.operators as op
from flowspark.cli import main
from flowspark.dataflow import Dataflow
from flowspark.inputs import FileSource
from flowspark.operators import StatefulLogic
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
    # the error names the item the step failed on (the same text as the in-memory executor's)
    assert err == ["flowspark: error: error in step 'bad.boom.flat_map_batch': ValueError: three is bad (item: 3)"]


def stream_flow(root, out, flow_id="cli_stream"):
    from streaming_helpers import JsonlDirSource, count_mapper

    flow = Dataflow(flow_id)
    s = op.input("inp", flow, JsonlDirSource(root, ["a"]))
    keyed = op.key_on("key", s, lambda e: e["user"])
    counts = op.stateful_map("count", keyed, count_mapper)
    op.output("out", op.map("fmt", counts, lambda kv: (kv[0], f"{kv[0]}={kv[1]}")), FileSink(out))
    return flow


FAR = datetime(2100, 1, 1, tzinfo=timezone.utc)


class WaitFar(StatefulLogic):
    """Counts a key's values and waits for a notification far in the future."""

    def __init__(self, resume):
        self.n = resume or 0

    def on_item(self, value):
        self.n += 1
        return [], False

    def on_notify(self):
        return [self.n], True

    def notify_at(self):
        return FAR

    def snapshot(self):
        return self.n


def waiting_flow(root, out):
    from streaming_helpers import JsonlDirSource

    flow = Dataflow("cli_wait")
    s = op.input("inp", flow, JsonlDirSource(root, ["a"]))
    waits = op.stateful("wait", op.key_on("key", s, lambda e: e["user"]), WaitFar)
    op.output("out", op.map("fmt", waits, lambda kv: (kv[0], f"{kv[0]}={kv[1]}")), FileSink(out))
    return flow


def test_state_counts_the_keys_waiting_for_a_notification(spark, tmp_path, capsys, monkeypatch):
    """Chunk layout, one hot key per bucket: most waiting keys sit in chunks (their times there, not in the row)."""
    from streaming_helpers import write_jsonl

    monkeypatch.setattr("flowspark.spark.streaming.chunklayout.HOT_PER_BUCKET", 1)
    monkeypatch.setattr("flowspark.spark.streaming.chunklayout.CHUNK_KEYS", 1)
    root, chk, out = str(tmp_path / "in"), str(tmp_path / "chk"), str(tmp_path / "out.txt")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 5}"} for i in range(12)])
    args = ["run", "--checkpoint", chk, "--trigger", "available_now", "--buckets", "2", "--no-progress"]
    assert main([*args, f"test_cli_spark:waiting_flow({root!r}, {out!r})"]) == 0
    assert main(["state", chk]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "2 buckets (layout 'chunk'), 5 keys with state, 5 waiting for a notification" in lines[0]
    when = f"  (next notification {FAR.isoformat()})"
    assert lines[1:] == [f"cli_wait.wait.stateful_batch 'u{i}': {3 if i < 2 else 2}{when}" for i in range(5)]


def test_streaming_run_then_state_then_foreign_flow_refused(spark, tmp_path, capsys):
    from streaming_helpers import write_jsonl

    root, chk, out = str(tmp_path / "in"), str(tmp_path / "chk"), str(tmp_path / "out.txt")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 3}"} for i in range(7)])
    args = ["run", "--checkpoint", chk, "--trigger", "available_now", "--timeout", "300"]
    assert main([*args, f"test_cli_spark:stream_flow({root!r}, {out!r})"]) == 0
    err = capsys.readouterr().err
    assert "[flowspark] batch " in err  # the per-batch progress line, on stderr
    assert sorted(open(out).read().split()) == sorted(["u0=1", "u1=1", "u2=1", "u0=2", "u1=2", "u2=2", "u0=3"])

    assert main(["state", chk]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"checkpoint {chk}: dataflow 'cli_stream'")
    assert "3 keys with state, 0 waiting for a notification, " in lines[0]
    assert int(re.search(r"([\d,]+) bytes of pickled state rows$", lines[0]).group(1).replace(",", "")) > 0
    assert lines[1:] == [
        "cli_stream.count.stateful_batch 'u0': 3",
        "cli_stream.count.stateful_batch 'u1': 2",
        "cli_stream.count.stateful_batch 'u2': 2",
    ]
    assert main(["state", chk, "--step", "cli_stream.count", "--key", "u1", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["keys"], doc["waiting_for_notification"]) == (3, 0)
    assert doc["state_bytes"] > 0
    assert doc["state"] == [
        {"step_id": "cli_stream.count.stateful_batch", "key": "u1", "snapshot": 2, "notify_at": None}
    ]
    assert main(["state", chk, "--step", "nope"]) == 1
    assert "its stateful steps are cli_stream.count.stateful_batch" in capsys.readouterr().err

    # another flow on the same checkpoint: one line naming both flows
    assert main([*args, f"test_cli_spark:stream_flow({root!r}, {out!r}, 'other_flow')"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("flowspark: error: checkpoint")
    assert "belongs to dataflow 'cli_stream'" in err[0]
    assert "use another checkpoint directory" in err[0]


@pytest.mark.parametrize("layout", ["key", "chunk"])
def test_state_reads_the_key_and_chunk_layouts(spark, tmp_path, capsys, monkeypatch, layout):
    """`flowspark state` on a key- or chunk-layout checkpoint: MapState rows and hot tiers (one key per bucket)."""
    from streaming_helpers import write_jsonl

    monkeypatch.setattr(f"flowspark.spark.streaming.{layout}layout.HOT_PER_BUCKET", 1)
    monkeypatch.setattr("flowspark.spark.streaming.chunklayout.CHUNK_KEYS", 1)
    root, chk, out = str(tmp_path / "in"), str(tmp_path / "chk"), str(tmp_path / "out.txt")
    write_jsonl(f"{root}/a/0001.jsonl", [{"user": f"u{i % 5}"} for i in range(12)])
    args = ["run", "--checkpoint", chk, "--trigger", "available_now", "--state-layout", layout, "--buckets", "2"]
    assert main([*args, "--no-progress", f"test_cli_spark:stream_flow({root!r}, {out!r})"]) == 0
    assert main(["state", chk]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"2 buckets (layout '{layout}'), 5 keys with state, 0 waiting for a notification" in lines[0]
    assert lines[1:] == [f"cli_stream.count.stateful_batch 'u{i}': {3 if i < 2 else 2}" for i in range(5)]


def test_state_of_a_non_checkpoint_is_one_line(tmp_path, capsys):
    assert main(["state", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"flowspark: error: {str(tmp_path)!r} has no flowspark.json, so it is not a flowspark streaming checkpoint; "
        "give the --checkpoint DIR of a `flowspark run` streaming run"
    ]


def test_plan_spark_streaming_physical_plan(spark, tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out.txt")
    flow = f"test_cli_spark:stream_flow({root!r}, {out!r})"
    assert main(["plan", flow, "--spark", "--buckets", "4", "--state-layout", "bucket"]) == 0
    text = capsys.readouterr().out
    assert "runs as a Structured Streaming query" in text
    stage1 = text.split("== stage 1: Spark physical plan ==")[1]
    assert "FlatMapGroupsInPandasWithState" in stage1
    assert "pmod(hash(k" in stage1
    assert ", 4)" in stage1
    # The physical plan is the layout's: a new checkpoint's default runs transformWithStateInPandas.
    assert main(["plan", flow, "--spark", "--buckets", "4"]) == 0
    stage1 = capsys.readouterr().out.split("== stage 1: Spark physical plan ==")[1]
    assert "TransformWithStateInPySpark" in stage1
    assert "FlatMapGroupsInPandasWithState" not in stage1


def test_plan_spark_of_a_spark_keyed_stream_reads_and_writes_no_checkpoint(spark, tmp_path, monkeypatch):
    """The plan records the query's choices in a throwaway checkpoint, never in the temp folder itself."""
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "events"
    data.mkdir()
    pq.write_table(pa.table({"user": ["ann", "bob"]}), data / "0.parquet")
    (tmp_path / "keyed_flows.py").write_text(
        "import flowspark.operators as op\n"
        "from flowspark.dataflow import Dataflow\n"
        "from flowspark.spark import SparkSink, SparkSource\n"
        "flow = Dataflow('keyed')\n"
        f"rows = op.input('inp', flow, SparkSource('parquet', {str(data)!r}, schema='user STRING', streaming=True))\n"
        "counts = op.stateful_map('count', op.key_on('key', rows, lambda r: r['user']), "
        "lambda n, r: ((n or 0) + 1, (n or 0) + 1))\n"
        "op.output('out', op.map('row', counts, lambda kv: {'user': kv[0], 'n': kv[1]}), "
        f"SparkSink('parquet', {str(tmp_path / 'out')!r}, schema='user STRING, n LONG'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert main(["plan", "keyed_flows:flow", "--spark"]) == 0
    assert list(scratch.iterdir()) == []  # nothing left in the temp folder (it once held flowspark.json)
