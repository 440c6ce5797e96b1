"""`flowspark submit` ships Spark's Kafka connector with `--packages` for a flow that reads or writes Kafka."""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap

import pytest

_FLOW = """
import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.spark import KafkaSink, KafkaSource
from flowspark.testing import TestingSink, TestingSource


def _row(r):
    return {"key": None, "value": r["value"].decode()}


kafka = Dataflow("kafka")
recs = op.input("inp", kafka, KafkaSource("127.0.0.1:9092", "metrics"))
op.output("out", op.map("row", recs, _row), KafkaSink("127.0.0.1:9092", "alerts"))

to_kafka = Dataflow("to_kafka")
items = op.input("inp", to_kafka, TestingSource([{"key": "a", "value": "1"}]))
op.output("out", items, KafkaSink("127.0.0.1:9092", "alerts"))

plain = Dataflow("plain")
op.output("out", op.input("inp", plain, TestingSource([1])), TestingSink([]))
"""


def _submit(tmp_path, flow, *extra):
    (tmp_path / "kflows.py").write_text(textwrap.dedent(_FLOW))
    res = subprocess.run(
        [sys.executable, "-m", "flowspark", "submit", f"kflows.py:{flow}", "--master", "spark://127.0.0.1:7077"]
        + ["--work-dir", str(tmp_path / "work"), "--dry-run", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return shlex.split(res.stdout.strip())


@pytest.mark.parametrize("flow", ["kafka", "to_kafka"])
def test_submit_adds_the_kafka_connector(tmp_path, flow):
    from flowspark.spark.io.kafka import KAFKA_PACKAGE

    cmd = _submit(tmp_path, flow)
    assert cmd[cmd.index("--packages") + 1] == KAFKA_PACKAGE


def test_submit_without_kafka_or_with_own_packages_adds_none(tmp_path):
    assert "--packages" not in _submit(tmp_path, "plain")
    cmd = _submit(tmp_path, "kafka", "--conf", "spark.jars.packages=my:connector:1.0")
    assert "--packages" not in cmd
    assert "spark.jars.packages=my:connector:1.0" in cmd
