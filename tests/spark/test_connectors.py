"""Sources and sinks on Spark: file connectors, custom partitioned sources/sinks, Spark-native I/O."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.inputs import (
    CSVSource,
    DirSource,
    DynamicSource,
    FileSource,
    FixedPartitionedSource,
    StatefulSourcePartition,
    StatelessSourcePartition,
)
from flowspark.outputs import DirSink, DynamicSink, FileSink, StatelessSinkPartition
from flowspark.spark import SparkSink, SparkSource, run
from flowspark.testing import TestingSink, TestingSource, run_main

pytestmark = pytest.mark.spark


def test_file_source_to_file_sink(spark, tmp_path: Path):
    src = tmp_path / "in.txt"
    src.write_text("".join(f"line {i}\n" for i in range(100)))
    dst = tmp_path / "out.txt"
    flow = Dataflow("f")
    s = op.map("up", op.input("inp", flow, FileSource(src, batch_size=7)), str.upper)
    op.output("out", op.key_on("k", s, lambda _x: "all"), FileSink(dst))
    run(flow, spark=spark)
    assert dst.read_text() == "".join(f"LINE {i}\n" for i in range(100))


def test_dir_source_csv_source_and_dir_sink(spark, tmp_path: Path):
    indir = tmp_path / "in"
    indir.mkdir()
    for n in range(3):
        (indir / f"part{n}.txt").write_text("".join(f"{n}-{i}\n" for i in range(10)))
    csv = tmp_path / "t.csv"
    csv.write_text("user,n\na,1\nb,2\na,3\n")
    outdir = tmp_path / "out"
    outdir.mkdir()
    flow = Dataflow("f")
    lines = op.input("lines", flow, DirSource(indir))
    rows = op.input("rows", flow, CSVSource(csv))
    k_lines = op.key_on("kl", lines, lambda x: x.split("-")[0])
    k_rows = op.map("kr", rows, lambda r: (r["user"], f"{r['user']}={r['n']}"))
    op.output("out", op.merge("m", k_lines, k_rows), DirSink(outdir, 2))
    run(flow, spark=spark)

    local_dir = tmp_path / "local"
    local_dir.mkdir()
    flow2 = Dataflow("f")
    lines = op.input("lines", flow2, DirSource(indir))
    rows = op.input("rows", flow2, CSVSource(csv))
    k_lines = op.key_on("kl", lines, lambda x: x.split("-")[0])
    k_rows = op.map("kr", rows, lambda r: (r["user"], f"{r['user']}={r['n']}"))
    op.output("out", op.merge("m", k_lines, k_rows), DirSink(local_dir, 2))
    run_main(flow2)
    for f in sorted(local_dir.iterdir()):
        spark_lines = (outdir / f.name).read_text().splitlines()
        local_lines = f.read_text().splitlines()
        assert sorted(spark_lines) == sorted(local_lines)
        # Each source file keeps its order within a sink file.
        for n in range(3):
            assert [x for x in spark_lines if x.startswith(f"{n}-")] == [
                x for x in local_lines if x.startswith(f"{n}-")
            ]
    assert sum(len(f.read_text().splitlines()) for f in outdir.iterdir()) == 33


class _Parts(FixedPartitionedSource):
    """Three partitions of numbers; each item says which partition it came from."""

    def list_parts(self):
        return ["p0", "p1", "p2"]

    def is_bounded(self):
        return True

    def build_part(self, step_id, for_part, resume_state):
        return _Part(for_part)


class _Part(StatefulSourcePartition):
    def __init__(self, name):
        self.name = name
        self.i = 0

    def next_batch(self):
        if self.i >= 4:
            raise StopIteration
        self.i += 2
        return [(self.name, self.i - 2), (self.name, self.i - 1)]

    def snapshot(self):
        return self.i


def test_fixed_partitioned_source_keeps_each_partition_in_order(spark):
    out: list[Any] = []
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, _Parts()), TestingSink(out))
    run(flow, spark=spark)
    assert sorted(out) == [(p, i) for p in ("p0", "p1", "p2") for i in range(4)]
    for p in ("p0", "p1", "p2"):
        assert [i for q, i in out if q == p] == [0, 1, 2, 3]


class _Dyn(DynamicSource):
    def build(self, step_id, worker_index, worker_count):
        return _DynPart(worker_index, worker_count)

    def is_bounded(self):
        return True


class _DynPart(StatelessSourcePartition):
    def __init__(self, idx, count):
        self.items = [f"w{idx}/{count}"]

    def next_batch(self):
        if not self.items:
            raise StopIteration
        items, self.items = self.items, []
        return items


def test_dynamic_source_runs_once_per_worker(spark):
    out: list[Any] = []
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, _Dyn()), TestingSink(out))
    run(flow, spark=spark)
    n = spark.sparkContext.defaultParallelism
    assert sorted(out) == sorted(f"w{i}/{n}" for i in range(n))


class _JsonLinesSink(DynamicSink):
    """Each worker writes its own file."""

    def __init__(self, dir_path):
        self.dir_path = str(dir_path)

    def build(self, step_id, worker_index, worker_count):
        return _JsonLinesPart(Path(self.dir_path) / f"w{worker_index}.jsonl")


class _JsonLinesPart(StatelessSinkPartition):
    def __init__(self, path):
        self.f = open(path, "a")  # noqa: SIM115

    def write_batch(self, items):
        for x in items:
            self.f.write(json.dumps(x) + "\n")

    def close(self):
        self.f.close()


def test_dynamic_sink_writes_on_the_executors(spark, tmp_path: Path):
    flow = Dataflow("f")
    k = op.key_on("k", op.input("inp", flow, TestingSource(list(range(50)))), lambda x: str(x % 5))
    tot = op.reduce_final("sum", k, lambda a, b: a + b)
    op.output("out", tot, _JsonLinesSink(tmp_path))
    run(flow, spark=spark)
    got = [tuple(json.loads(line)) for f in tmp_path.glob("w*.jsonl") for line in f.read_text().splitlines()]
    assert sorted(got) == sorted((str(r), sum(x for x in range(50) if x % 5 == r)) for r in range(5))


class _FailingSink(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _FailingPart()


class _FailingPart(StatelessSinkPartition):
    def write_batch(self, items):
        raise OSError("disk full")


def test_error_in_a_sink_on_the_executors_names_the_step(spark):
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, TestingSource([1, 2])), _FailingSink())
    with pytest.raises(FlowsparkRuntimeError, match="step 'f.out': OSError: disk full") as ei:
        run(flow, spark=spark)
    assert ei.value.step_id == "f.out"
    assert isinstance(ei.value.__cause__, OSError)


def test_spark_source_parquet_to_spark_sink_parquet(spark, tmp_path: Path):
    rows = [{"user": f"u{i % 4}", "amount": i} for i in range(40)]
    spark.createDataFrame(rows).repartition(3).write.parquet(str(tmp_path / "in"))
    flow = Dataflow("f")
    s = op.input("inp", flow, SparkSource("parquet", str(tmp_path / "in")))
    k = op.key_on("k", s, lambda r: r["user"])
    tot = op.fold_final("tot", op.map_value("amt", k, lambda r: r["amount"]), lambda: 0, lambda a, x: a + x)
    op.output(
        "out",
        op.map("row", tot, lambda kv: {"user": kv[0], "total": kv[1]}),
        SparkSink("parquet", str(tmp_path / "out"), schema="user STRING, total LONG"),
    )
    run(flow, spark=spark)
    got = sorted((r.user, r.total) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == [(f"u{u}", sum(i for i in range(40) if i % 4 == u)) for u in range(4)]


def test_spark_source_json_csv_dataframe_and_table_sinks(spark, tmp_path: Path):
    (tmp_path / "a.json").write_text('{"x": 1}\n{"x": 2}\n')
    (tmp_path / "b.csv").write_text("x\n10\n20\n")
    df = spark.createDataFrame([{"x": 100}])
    flow = Dataflow("f")
    a = op.input("a", flow, SparkSource("json", str(tmp_path / "a.json")))
    b = op.input("b", flow, SparkSource("csv", str(tmp_path / "b.csv"), schema="x INT", options={"header": "true"}))
    c = op.input("c", flow, SparkSource.from_dataframe(df))
    m = op.map("norm", op.merge("m", a, b, c), lambda r: {"x": int(r["x"])})
    op.output("json", m, SparkSink("json", str(tmp_path / "out_json")))
    op.output("csv", m, SparkSink("csv", str(tmp_path / "out_csv"), options={"header": "true"}))
    op.output("tbl", m, SparkSink("table", "flowspark_test_table"))
    run(flow, spark=spark)
    want = [1, 2, 10, 20, 100]
    assert sorted(r.x for r in spark.read.json(str(tmp_path / "out_json")).collect()) == want
    assert (
        sorted(int(r.x) for r in spark.read.option("header", "true").csv(str(tmp_path / "out_csv")).collect()) == want
    )
    assert sorted(r.x for r in spark.table("flowspark_test_table").collect()) == want
    spark.sql("DROP TABLE flowspark_test_table")


def test_spark_sink_needs_dicts(spark, tmp_path: Path):
    flow = Dataflow("f")
    op.output(
        "out", op.input("inp", flow, TestingSource([1])), SparkSink("parquet", str(tmp_path / "o"), schema="x INT")
    )
    with pytest.raises(FlowsparkRuntimeError, match="step 'f.out': FlowsparkTypeError: .*SparkSink writes dict items"):
        run(flow, spark=spark)


def _rows_flow(tmp_path: Path, items: list[Any], schema: Any, second_reader: bool) -> Dataflow:
    flow = Dataflow("f")
    k = op.key_on("k", op.input("inp", flow, TestingSource(items)), lambda r: r["user"])
    rows = op.map(
        "row", op.stateful_map("n", k, lambda s, r: ((s or 0) + 1, {**r, "n": (s or 0) + 1})), lambda kv: kv[1]
    )
    op.output("out", rows, SparkSink("parquet", str(tmp_path / "out"), schema=schema))
    if second_reader:
        op.output("copy", rows, TestingSink([]))
    return flow


def test_a_spark_sink_read_alone_gets_its_rows_from_the_stage_itself():
    from flowspark.spark import compile_flow
    from flowspark.spark.rules.optimizer import Env, optimize

    alone = optimize(compile_flow(_rows_flow(Path("/x"), [], "user STRING", second_reader=False)), Env("batch"))
    shared = optimize(compile_flow(_rows_flow(Path("/x"), [], "user STRING", second_reader=True)), Env("batch"))
    assert [str(d) for d in alone.decisions if d.rule == "sink_fusion"] == ["rule sink_fusion: applied"]
    assert [str(d) for d in shared.decisions if d.rule == "sink_fusion"] == [
        "rule sink_fusion: not applied (stage 1 has other outputs)",
        "rule sink_fusion: not applied (not written by Spark: neither a SparkSink nor a ForeachBatchSink)",
    ]


@pytest.mark.parametrize("schema", [None, "user STRING, x LONG, n LONG"])
def test_spark_sink_rows_are_the_same_whether_the_stage_writes_them_or_not(spark, tmp_path: Path, schema):
    items = [{"user": f"u{i % 3}", "x": i} for i in range(30)]
    got = []
    for second in (False, True):
        run(_rows_flow(tmp_path, items, schema, second_reader=second), spark=spark)
        df = spark.read.parquet(str(tmp_path / "out"))
        got.append((df.schema.simpleString(), sorted(tuple(r) for r in df.collect())))
    assert got[0] == got[1]
    assert len(got[0][1]) == 30


@pytest.mark.parametrize("second_reader", [False, True])
def test_a_row_that_does_not_fit_the_schema_names_the_sink(spark, tmp_path: Path, second_reader):
    items = [{"user": "a", "x": 1}, {"user": "b", "x": "not a number"}]
    flow = _rows_flow(tmp_path, items, "user STRING, x LONG, n LONG", second_reader)
    with pytest.raises(FlowsparkRuntimeError, match=r"error in step 'f.out'") as info:
        run(flow, spark=spark)
    assert info.value.step_id == "f.out"
