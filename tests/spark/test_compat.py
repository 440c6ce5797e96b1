"""flowspark.spark.compat: each use of pyspark's private APIs still works on this pyspark (one smoke test each)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

pytest.importorskip("pyspark")

from flowspark.spark import compat  # noqa: E402


def test_default_session_is_the_active_session(spark):
    assert compat.default_session() is spark


def test_explain_string_is_the_physical_plan_as_text(spark):
    text = compat.explain_string(spark, spark.range(3), "simple")
    assert text.startswith("== Physical Plan ==")
    assert "Range" in text
    assert text == text.rstrip()


def test_stage_list_reads_the_status_store(spark):
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).count()
    stages = compat.stage_list(spark)
    assert stages
    last = max(stages, key=lambda s: s.stageId())
    assert last.status().toString() == "COMPLETE"
    assert last.numTasks() == 2


def test_hadoop_configuration_is_the_sessions(spark):
    conf = compat.hadoop_configuration(spark)
    assert str(conf.get("fs.defaultFS")).startswith("file:")  # local[2]: the local file system


def test_hadoop_path_and_read_utf8_read_a_file_through_hadoop(spark, tmp_path):
    f = tmp_path / "note.txt"
    f.write_text("héllo\nworld", encoding="utf-8")
    p = compat.hadoop_path(spark, f.as_uri())
    assert str(p.getName()) == "note.txt"
    fs = p.getFileSystem(compat.hadoop_configuration(spark))
    stream = fs.open(p)
    try:
        assert compat.read_utf8(spark, stream) == "héllo\nworld"
    finally:
        stream.close()


class _Recorder(compat.JavaQueryListener):
    def __init__(self) -> None:
        self.names: list[Any] = []
        self.ended: list[str] = []
        self.cond = threading.Condition()

    def progress_json(self, text: str) -> None:
        with self.cond:
            self.names.append(json.loads(text).get("name"))

    def terminated(self, run_id: str) -> None:
        with self.cond:
            self.ended.append(run_id)
            self.cond.notify_all()


def test_lean_listener_hands_events_to_its_java_side(spark, tmp_path):
    from pyspark.sql.streaming import StreamingQueryListener  # noqa: TID251

    class Python(StreamingQueryListener):
        def onQueryStarted(self, event):  # noqa: N802
            pass

        def onQueryProgress(self, event):  # noqa: N802
            pytest.fail("a classic session hands events to the Java side")

        def onQueryIdle(self, event):  # noqa: N802
            pass

        def onQueryTerminated(self, event):  # noqa: N802
            pytest.fail("a classic session hands events to the Java side")

    src = tmp_path / "in"
    src.mkdir()
    (src / "a.json").write_text('{"x": 1}\n{"x": 2}\n')
    java = _Recorder()
    ours = compat.lean_listener(spark, Python, java)
    assert isinstance(ours, Python)
    spark.streams.addListener(ours)
    try:
        q = (
            spark.readStream.schema("x long")
            .json(str(src))
            .writeStream.queryName("flowspark_compat_smoke")
            .format("noop")
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        with java.cond:  # events arrive asynchronously
            assert java.cond.wait_for(lambda: str(q.runId) in java.ended, timeout=30)
    finally:
        spark.streams.removeListener(ours)
    assert "flowspark_compat_smoke" in java.names


def test_rebuilt_by_value_reads_cloudpickles_table():
    import cloudpickle
    from pyspark import cloudpickle as spark_cloudpickle  # noqa: TID251

    class Local:
        pass

    spark_cloudpickle.dumps(Local)  # pickled by value: tracked by pyspark's copy only
    assert compat.rebuilt_by_value(spark_cloudpickle, Local)
    assert not compat.rebuilt_by_value(cloudpickle, Local)
    assert not compat.rebuilt_by_value(spark_cloudpickle, int)


def test_inferred_schema_is_what_create_data_frame_infers(spark):
    rows = [{"user": "a", "n": 1, "x": 1.5}, {"user": "b", "n": 2, "x": None}]
    assert compat.inferred_schema(spark, rows) == spark.createDataFrame(rows).schema


def test_from_arrow_makes_a_dataframe_of_a_tables_rows_with_the_schema(spark):
    from datetime import datetime, timezone

    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType  # noqa: TID251

    schema = StructType(
        [StructField("k", StringType()), StructField("n", LongType()), StructField("at", TimestampType())]
    )
    at = datetime(2024, 1, 1, tzinfo=timezone.utc)
    table = pa.table(
        {
            "k": pa.array(["a", None]),
            "n": pa.array([1, None], pa.int64()),
            "at": pa.array([at, None], pa.timestamp("us", tz="UTC")),
        }
    )
    df = compat.from_arrow(spark, table, schema)
    assert df.schema == schema
    rows = sorted(df.collect(), key=lambda r: r.k or "")
    assert [(r.k, r.n) for r in rows] == [(None, None), ("a", 1)]
    assert rows[1].at.replace(tzinfo=None) == at.astimezone().replace(tzinfo=None)  # the session's local time
