"""Shared fixtures: one SparkSession for the whole test session, created only when a test asks for it."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession (2 shuffle partitions, UI off, AQE off, Arrow on), shared by every test."""
    pytest.importorskip("pyspark")
    from flowspark.spark.session import worker_python

    # The workers a local session flowspark creates get (this interpreter, through a script).
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Python workers import test modules (functions defined there are pickled by reference):
    # give them the driver's import path. Every test directory is added, since pytest puts
    # a test module's directory on sys.path only when it imports the module.
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [os.path.join(here, d) for d in sorted(os.listdir(here)) if os.path.isdir(os.path.join(here, d))]
    path = [p for p in [here, *dirs, *sys.path] if p and os.path.isdir(p)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    from pyspark.sql import SparkSession  # noqa: TID251

    from flowspark.spark.io.kafka import connector_jars

    # Spark's Kafka connector, when `scripts/fetch_jars.py` cached it for this pyspark (the Kafka
    # tests need it; spark.jars is read once, when the JVM starts).
    jars = connector_jars()
    builder = SparkSession.builder.config("spark.jars", ",".join(jars)) if jars else SparkSession.builder
    session = (
        builder.master("local[2]")
        .appName("flowspark-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def pytest_collection_modifyitems(config, items):
    """A test that takes the `spark` fixture is a Spark test (`-m "not spark"` leaves it out), marked or not."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
