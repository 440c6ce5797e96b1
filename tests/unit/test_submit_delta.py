"""`flowspark submit` ships Delta Lake (`--packages`) and its two settings (`--conf`) for a flow using Delta."""

from __future__ import annotations

import shlex
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pyspark")

_FLOW = """
import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.spark import KafkaSource, SparkSink, SparkSource
from flowspark.testing import TestingSink

copy = Dataflow("copy")
op.output("out", op.input("inp", copy, SparkSource("delta", "/t")), TestingSink([]))

k2d = Dataflow("k2d")
recs = op.input("inp", k2d, KafkaSource("127.0.0.1:9092", "metrics"))
op.output("out", op.map("row", recs, lambda r: {"v": r["value"]}), SparkSink("delta", "/u", schema="v BINARY"))
"""


def _submit(tmp_path, flow, *extra):
    (tmp_path / "dflows.py").write_text(textwrap.dedent(_FLOW))
    return subprocess.run(
        [sys.executable, "-m", "flowspark", "submit", f"dflows.py:{flow}", "--master", "spark://127.0.0.1:7077"]
        + ["--work-dir", str(tmp_path / "work"), "--dry-run", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )


def test_submit_adds_delta_and_its_settings_with_kafkas_connector(tmp_path):
    from flowspark.spark.io.delta import DELTA_CONF, delta_package
    from flowspark.spark.io.kafka import KAFKA_PACKAGE

    if delta_package() is None:
        pytest.skip("no Delta Lake release is built for this pyspark (the next test covers it)")
    done = _submit(tmp_path, "k2d")
    assert done.returncode == 0, done.stderr
    cmd = shlex.split(done.stdout.strip())
    assert cmd[cmd.index("--packages") + 1] == f"{KAFKA_PACKAGE},{delta_package()}"
    for k, v in DELTA_CONF.items():
        assert f"{k}={v}" in cmd


def test_submit_of_a_delta_flow_on_a_pyspark_without_delta_fails_in_one_line(tmp_path):
    from flowspark.spark.io.delta import delta_package

    if delta_package() is not None:
        pytest.skip("a Delta Lake release is built for this pyspark (the message is for lines without one)")
    done = _submit(tmp_path, "k2d")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "step 'k2d.out' uses Delta Lake, and no Delta Lake release is built for the installed" in lines[0]


def test_submit_of_a_delta_flow_with_own_packages_takes_them(tmp_path):
    done = _submit(tmp_path, "copy", "--conf", "spark.jars.packages=io.delta:my-delta:1.0")
    assert done.returncode == 0, done.stderr
    cmd = shlex.split(done.stdout.strip())
    assert "--packages" not in cmd
    assert "spark.jars.packages=io.delta:my-delta:1.0" in cmd
    assert "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension" in cmd


def test_the_version_matrix_pins_the_delta_release_flowspark_picks_for_each_line():
    import importlib.util
    from pathlib import Path

    from flowspark.spark.io.delta import DELTA_RELEASES

    spec = importlib.util.spec_from_file_location("noxfile", Path(__file__).resolve().parents[2] / "noxfile.py")
    if importlib.util.find_spec("nox") is None:
        pytest.fail("nox is not installed: pip install -e '.[test]'", pytrace=False)
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    picked = {f"{major}.{minor}": coordinate.rsplit(":", 1)[1] for (major, minor), coordinate in DELTA_RELEASES.items()}
    assert noxfile.DELTA_FOR == picked
