"""`flowspark.spark` and `flowspark.spark.streaming` import their names on first use (`flowspark._lazy`)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _imported_after(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return set(done.stdout.split())


def test_a_worker_module_does_not_import_the_whole_package():
    pytest.importorskip("pyspark")
    mods = _imported_after("import flowspark.spark.streaming.keylayout")
    assert "flowspark.spark.streaming.keylayout" in mods
    assert not {"flowspark.spark.api", "flowspark.spark.batch.job", "flowspark.spark.streaming.query"} & mods


def test_the_packages_names_resolve_and_an_unknown_one_is_an_attribute_error():
    pytest.importorskip("pyspark")
    import flowspark.spark as fs
    import flowspark.spark.streaming as fss
    from flowspark.spark import (
        ForeachBatchSink,
        KafkaSink,
        KafkaSource,
        Plan,
        SparkSink,
        SparkSource,
        compile_flow,
        run,
    )
    from flowspark.spark.api import run as api_run
    from flowspark.spark.io.kafka import KafkaSource as kafka_source
    from flowspark.spark.streaming.run import run_streaming

    assert run is api_run
    assert fss.run_streaming is run_streaming
    assert KafkaSource is kafka_source
    assert all(callable(x) for x in (ForeachBatchSink, KafkaSink, Plan, SparkSink, SparkSource, compile_flow))
    assert set(fs.__all__) == {
        "ForeachBatchSink",
        "KafkaSink",
        "KafkaSource",
        "Plan",
        "SparkSink",
        "SparkSource",
        "compile_flow",
        "run",
    }
    for name in fss.__all__:
        assert getattr(fss, name) is not None
    with pytest.raises(AttributeError, match="module 'flowspark.spark' has no attribute 'nope'"):
        _ = fs.nope
