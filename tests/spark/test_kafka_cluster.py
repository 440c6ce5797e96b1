"""`flowspark submit` of a Kafka -> Delta Lake stream to a standalone cluster: the jars come from `--packages`.

A cluster resolves what is not in Spark's distribution from Maven: `flowspark submit` adds
`--packages` with Spark's Kafka connector and Delta Lake (and Delta's two settings) for a flow
that uses them, spark-submit resolves them with Ivy into its cache and ships them to the
executors. Here a keyed running count reads a 3-partition topic of the session's broker and
writes a Kafka topic and a Delta table, `available_now`, on the cluster of `test_cluster.py`
(its module fixture: one master, two one-core workers). Runs where Spark's Kafka connector and a
Delta release exist (pyspark 4.2: `python -m nox -s kafka`); elsewhere it skips naming
that command, as the other Kafka tests do.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pyspark = pytest.importorskip("pyspark")

from flowspark.spark.io.delta import delta_package  # noqa: E402
from flowspark.spark.io.kafka import connector_published  # noqa: E402

if not connector_published() or delta_package() is None:
    pytest.skip(
        f"Spark's Kafka connector or Delta Lake is not published for pyspark {pyspark.__version__}: "
        "run `python -m nox -s kafka` (pyspark 4.2)",
        allow_module_level=True,
    )

from test_cluster import _finish, _submit, cluster  # noqa: E402, F401  (`cluster`: the module fixture)
from test_kafka_e2e import _consume, _produce  # noqa: E402

FLOW = textwrap.dedent(
    """
    import json

    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.spark import KafkaSink, KafkaSource, SparkSink


    def count(total, _record):
        total = (total or 0) + 1
        return total, total


    def get_flow(bootstrap, src, dst, table):
        flow = Dataflow("kafka_cluster")
        records = op.input("inp", flow, KafkaSource(bootstrap, src))
        counts = op.stateful_map("count", op.map("key", records, lambda r: (r["key"].decode(), r["offset"])), count)
        op.output("kafka", op.map("record", counts, lambda kv: {"key": kv[0], "value": json.dumps(kv[1])}),
                  KafkaSink(bootstrap, dst))
        op.output("delta", op.map("row", counts, lambda kv: {"user": kv[0], "n": kv[1]}),
                  SparkSink("delta", table, schema="user STRING, n LONG"))
        return flow
    """
)


def _delta_rows(table: Path) -> list[tuple[str, int]]:
    """The rows of an append-only Delta table: the parquet files its log adds."""
    import pyarrow.parquet as pq
    from streaming_helpers import delta_log_actions

    added = [table / add["path"] for add in delta_log_actions(table, "add")]
    return [(r["user"], r["n"]) for f in added for r in pq.read_table(f).to_pylist()]


def test_submit_a_kafka_to_delta_stream_to_a_cluster_with_its_packages(cluster, kafka, tmp_path):  # noqa: F811
    src, dst = kafka.create_topic("cluster_in", partitions=3), kafka.create_topic("cluster_out")
    _produce(kafka, src, [(f"user{i % 5}", json.dumps({"i": i}), []) for i in range(60)])
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "kflows.py").write_text(FLOW)
    table = tmp_path / "table"
    import_str = f"kflows.py:get_flow({kafka.bootstrap!r}, {src!r}, {dst!r}, {str(table)!r})"
    conf = ["--checkpoint", str(tmp_path / "chk"), "--trigger", "available_now", "--work-dir", str(tmp_path / "w")]
    code, stdout, stderr = _finish(
        _submit(cluster, proj, import_str, *conf, "--conf", "spark.sql.shuffle.partitions=2")
    )
    assert code == 0, f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}"
    want = sorted((f"user{k}", n) for k in range(5) for n in range(1, 13))
    assert sorted(_delta_rows(table)) == want
    assert sorted((m.key.decode(), json.loads(m.value)) for m in _consume(kafka, dst)) == want
    # the executors ran it, with the jars spark-submit resolved and shipped
    for _proc, work in cluster.workers:
        assert any(work.glob("app-*/*/stderr")), list(work.iterdir())
