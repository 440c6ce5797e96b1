"""The supported pyspark range and what an older line cannot run, checked without a SparkSession.

The installed pyspark's version is patched (`versions._installed_text`), so these run on any
line; `tests/spark/test_versions.py` runs the same refusals against a real Spark 3.5.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkCompileError
from flowspark.spark import versions
from flowspark.testing import TestingSink, TestingSource

pytest.importorskip("pyspark")


@pytest.fixture
def spark35(monkeypatch):
    monkeypatch.setattr(versions, "_installed_text", lambda: "3.5.8")


def _counting_flow(n_keyed: int = 1) -> Dataflow:
    flow = Dataflow("versions_flow")
    s = op.key_on("key", op.input("inp", flow, TestingSource(["a", "b", "a"])), lambda x: x)
    for i in range(n_keyed):
        if i:  # keyed anew: the next stateful step is another keyed stage
            s = op.key_on(f"rekey{i}", op.map(f"value{i}", s, lambda kv: kv[1]), str)
        s = op.stateful_map(f"count{i}", s, lambda n, _x: ((n or 0) + 1, (n or 0) + 1))
    op.output("out", s, TestingSink([]))
    return flow


@pytest.mark.parametrize("version", ["3.4.4", "4.4.0", "2.4.8"])
def test_a_pyspark_outside_the_range_is_refused_in_one_line(version):
    with pytest.raises(FlowsparkCompileError) as e:
        versions.check_supported("flowspark.spark.run", version)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"pyspark {version} is installed" in msg
    assert "flowspark supports pyspark 3.5 to 4.3" in msg
    assert 'pip install "pyspark>=3.5,<4.4"' in msg


@pytest.mark.parametrize("version", ["3.5.0", "3.5.8", "4.0.1", "4.2.0", "4.3.0"])
def test_every_line_of_the_range_is_accepted(version):
    versions.check_supported("flowspark.spark.run", version)


def test_spark_run_refuses_an_unsupported_pyspark_before_compiling(monkeypatch):
    monkeypatch.setattr(versions, "_installed_text", lambda: "3.4.4")
    from flowspark.spark import run

    with pytest.raises(FlowsparkCompileError, match=r"^flowspark.spark.run: pyspark 3.4.4 is installed"):
        run(_counting_flow())


def test_spark_35_lacks_the_spark_4_features():
    assert versions.lacks(versions.TRANSFORM_WITH_STATE, "3.5.8") == (
        "transformWithStateInPandas needs Spark 4.0 or newer; pyspark 3.5.8 is installed"
    )
    assert versions.lacks(versions.PYTHON_STREAM_SOURCE, "3.5.8") is not None
    assert versions.lacks(versions.TRANSFORM_WITH_STATE, "4.0.0") is None
    assert versions.lacks(versions.PYTHON_STREAM_SOURCE, "4.1.1") is not None  # latestOffset() without a limit
    for feature in versions.FEATURES:
        assert versions.lacks(feature, "4.2.0") is None


def test_a_new_checkpoint_takes_the_bucket_layout_on_spark_35(spark35):
    from flowspark.spark.streaming.lowering import layout_note, layouts_here
    from flowspark.spark.streaming.state import LAYOUTS

    assert LAYOUTS[0] == "chunk"
    assert layouts_here(LAYOUTS)[0] == "bucket"
    assert sorted(layouts_here(LAYOUTS)) == sorted(LAYOUTS)
    assert layout_note("bucket", "chunk") == (
        "state layout 'bucket', not the default 'chunk': transformWithStateInPandas needs Spark 4.0 or newer; "
        "pyspark 3.5.8 is installed"
    )


def test_a_new_checkpoint_takes_the_chunk_layout_on_spark_4():
    from flowspark.spark.streaming.lowering import layouts_here
    from flowspark.spark.streaming.state import LAYOUTS

    if versions.installed() < (4, 0):
        pytest.skip("runs on Spark 4")
    assert layouts_here(LAYOUTS) == LAYOUTS


def test_a_python_source_stream_on_spark_35_names_the_step_and_the_fix(spark35, tmp_path):
    from flowspark.spark.streaming import run_streaming

    with pytest.raises(FlowsparkCompileError) as e:
        run_streaming(_counting_flow(), checkpoint=str(tmp_path / "chk"), trigger="available_now")
    msg = str(e.value)
    assert msg.startswith("step 'versions_flow.inp' reads a TestingSource in a streaming query: ")
    assert "a Python streaming data source with admission control and Trigger.AvailableNow needs Spark 4.2" in msg
    assert "read the stream with a SparkSource" in msg
    assert not (tmp_path / "chk").exists()  # refused before anything is written


@pytest.mark.parametrize("layout", ["chunk", "key"])
def test_a_transform_with_state_layout_on_spark_35_is_refused(spark35, tmp_path, layout):
    from flowspark.spark.plan.compiler import compile_flow
    from flowspark.spark.streaming.lowering import check_versions

    plan = compile_flow(_counting_flow())
    plan = type(plan)(**{**plan.__dict__, "stages": [st for st in plan.stages if st.kind != "source"]})
    want = rf"^the '{layout}' state layout of checkpoint 'c': .*state_layout='bucket'"
    with pytest.raises(FlowsparkCompileError, match=want):
        check_versions(plan, layout, "c")
    check_versions(plan, "bucket", "c")
    check_versions(plan, None, "c")


def test_several_keyed_stages_in_one_query_on_spark_35_are_refused(spark35):
    from flowspark.spark.plan.compiler import compile_flow
    from flowspark.spark.streaming.lowering import check_versions

    plan = compile_flow(_counting_flow(2))
    plan = type(plan)(**{**plan.__dict__, "stages": [st for st in plan.stages if st.kind != "source"]})
    with pytest.raises(FlowsparkCompileError, match=r"stateful steps .*count0.*count1.* run in one query"):
        check_versions(plan, "bucket", "c")


def test_plan_spark_says_which_layout_runs_on_spark_35_and_why(spark35, monkeypatch, capsys, tmp_path):
    from flowspark import cli

    mod = tmp_path / "versions_flow_mod.py"
    mod.write_text(
        "import flowspark.operators as op\n"
        "from flowspark.dataflow import Dataflow\n"
        "from flowspark.spark import SparkSource\n"
        "from flowspark.testing import TestingSink\n"
        "flow = Dataflow('vf')\n"
        f"s = op.input('inp', flow, SparkSource('json', {str(tmp_path)!r}, schema='k string', streaming=True))\n"
        "s = op.key_on('key', s, lambda r: r['k'])\n"
        "s = op.stateful_map('count', s, lambda n, _x: ((n or 0) + 1, (n or 0) + 1))\n"
        "op.output('out', s, TestingSink([]))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["plan", "versions_flow_mod:flow", "--spark", "--no-physical"]) == 0
    out = capsys.readouterr().out
    assert "state layout 'bucket', not the default 'chunk': transformWithStateInPandas needs Spark 4.0" in out
    assert "applyInPandasWithState" in out
    assert cli.main(["plan", "versions_flow_mod:flow", "--spark", "--no-physical", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["spark"]["state_layout_note"].startswith("state layout 'bucket'")


def test_flowspark_state_on_spark_35_says_what_to_run(spark35, tmp_path, capsys):
    import json

    from flowspark.cli import main

    chk = tmp_path / "chk"
    (chk / "query" / "commits").mkdir(parents=True)
    (chk / "query" / "commits" / "0").write_text("v1\n{}\n")
    (chk / "query" / "state").mkdir()
    (chk / "flowspark.json").write_text(json.dumps({"flow_id": "f", "stateful_steps": ["f.count"]}))
    assert main(["state", str(chk)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"flowspark: error: flowspark state {chk}: Spark's state data source (format 'statestore') needs Spark 4.0 "
        "or newer; pyspark 3.5.8 is installed; read it with pyspark 4.0 or newer"
    )


def _timer_plan() -> Any:
    from flowspark.spark.plan.compiler import compile_flow

    flow = Dataflow("timed")
    keyed = op.key_on("key", op.input("inp", flow, TestingSource([1])), str)
    op.output("out", op.collect("col", keyed, timeout=timedelta(seconds=1), max_size=5), TestingSink([]))
    plan = compile_flow(flow)
    return type(plan)(**{**plan.__dict__, "stages": [st for st in plan.stages if st.kind != "source"]})


def test_timers_on_spark_35_fire_with_spark_rate_ticks_unless_the_checkpoint_has_python_ticks(spark35, tmp_path):
    """A new checkpoint takes Spark's rate source for its ticks; one started with the Python tick source keeps it."""
    from flowspark.spark.streaming.checkpoint import META_FILE, RATE_TICKS
    from flowspark.spark.streaming.lowering import check_versions

    plan = _timer_plan()
    check_versions(plan, "bucket", str(tmp_path / "new"))  # nothing recorded yet: rate ticks, no refusal
    old = tmp_path / "old"
    (old / "query").mkdir(parents=True)  # a query ran there
    (old / META_FILE).write_text(json.dumps({RATE_TICKS: False}))
    with pytest.raises(FlowsparkCompileError) as e:
        check_versions(plan, "bucket", str(old))
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {str(old)!r} fires the timers of stateful steps 'timed.col")
    assert "with a stream of ticks from a Python data source" in msg
    assert msg.endswith("or start a new checkpoint")
    (old / META_FILE).write_text(json.dumps({}))  # started before the choice was recorded: the tick source
    with pytest.raises(FlowsparkCompileError, match="fires the timers"):
        check_versions(plan, "bucket", str(old))
    (old / META_FILE).write_text(json.dumps({RATE_TICKS: True}))
    check_versions(plan, "bucket", str(old))
