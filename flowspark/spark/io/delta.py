"""Delta Lake through Spark's own `delta` format: `SparkSource("delta", path)`, `SparkSink("delta", path)`.

Delta Lake is not part of pyspark. A session flowspark creates for a flow that reads or
writes Delta puts the jars `python scripts/fetch_jars.py delta` caches (`delta_jars`) in
`spark.jars` and sets Delta's two session settings (`DELTA_CONF`), and builds a table's
snapshot (Delta's replay of its log, at each read and each streaming commit) in as many
partitions as its shuffles (Delta's default is 50 small tasks); your own session or a
cluster takes the coordinate `delta_package()` (`spark.jars.packages`, spark-submit's
`--packages`) and the same two settings:

    SparkSession.builder.config("spark.jars.packages", delta_package()).config(map=DELTA_CONF)

Each Delta release is built for one Spark line (`DELTA_RELEASES`); no release is built for
Spark 4.3 yet, so a Delta flow on pyspark 4.3 fails in one line before a session starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from flowspark.errors import FlowsparkCompileError
from flowspark.spark.io.jars import cached_jars, set_dir

__all__ = [
    "DELTA_CONF",
    "DELTA_RELEASES",
    "FETCH_DELTA",
    "delta_conf",
    "delta_dir",
    "delta_jars",
    "delta_package",
    "missing_delta",
]

#: The command that caches Delta Lake's jars for the installed pyspark (from a flowspark checkout).
FETCH_DELTA = "python scripts/fetch_jars.py delta"

#: The Delta Lake build (Maven coordinate) for each pyspark line; the `delta-spark` wheel of the
#: same version is its Python side. Delta 4.4.0 publishes one artifact per Spark line (its Spark
#: in the name, as `configure_spark_with_delta_pip` picks it); Delta 3.3 is the last for Spark 3.5.
DELTA_RELEASES: dict[tuple[int, int], str] = {
    (3, 5): "io.delta:delta-spark_2.12:3.3.2",
    (4, 0): "io.delta:delta-spark_4.0_2.13:4.4.0",
    (4, 1): "io.delta:delta-spark_4.1_2.13:4.4.0",
    (4, 2): "io.delta:delta-spark_4.2_2.13:4.4.0",
}

#: The session settings Delta Lake needs (static: set before the session starts).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_package(version: Optional[str] = None) -> Optional[str]:
    """The Maven coordinate of the Delta Lake build for the installed pyspark (or `version`).

    Args:
        version: A pyspark version; default the installed one.

    Returns:
        The coordinate, or `None` when no Delta release is built for that Spark line.

    Example:
        >>> delta_package("4.2.0"), delta_package("4.3.0")
        ('io.delta:delta-spark_4.2_2.13:4.4.0', None)
    """
    from flowspark.spark.versions import installed

    return DELTA_RELEASES.get(installed(version))


def delta_dir() -> Path:
    """Where `scripts/fetch_jars.py` caches Delta Lake's jars for the installed pyspark.

    `$FLOWSPARK_JARS_DIR/delta-<pyspark version>` (default root `~/.cache/flowspark/jars`).

    Returns:
        The directory (it may not exist).
    """
    return set_dir("delta")


def delta_jars() -> Optional[list[str]]:
    """The cached Delta Lake jars (Delta and its dependencies), or `None` when not fetched.

    Returns:
        The jar paths, sorted, or `None`.
    """
    return cached_jars(delta_dir())


def delta_conf(step_id: str) -> dict[str, str]:
    """What a session flowspark creates needs for a step reading or writing Delta: its jars and settings.

    Args:
        step_id: The first step that reads or writes Delta (named in the error).

    Returns:
        `DELTA_CONF`, `{"spark.jars": ...}` (the cached jars) and Delta's snapshot partitions (the
        session's shuffle partitions: a local session's cores).

    Raises:
        FlowsparkCompileError: No Delta release is built for the installed pyspark, or its jars
            are not cached: one line naming the step and what to do.
    """
    import pyspark

    package = delta_package()
    if package is None:
        newest = max(DELTA_RELEASES)
        msg = (
            f"step {step_id!r} uses Delta Lake, and no Delta Lake release is built for pyspark "
            f"{pyspark.__version__} (the newest, {DELTA_RELEASES[newest]}, is for Spark {newest[0]}.{newest[1]}); "
            f"run Delta flows with pyspark {newest[0]}.{newest[1]} (then `{FETCH_DELTA}`), or pass a session "
            "whose classpath has a Delta Lake built for its Spark"
        )
        raise FlowsparkCompileError(msg)
    jars = delta_jars()
    if jars is None:
        msg = (
            f"step {step_id!r} uses Delta Lake, and its jars ({package}) are not in {delta_dir()}; run "
            f"`{FETCH_DELTA}` (from a flowspark checkout) once, or pass a session started with "
            f"spark.jars.packages={package} and Delta's two settings (flowspark.spark.io.delta.DELTA_CONF)"
        )
        raise FlowsparkCompileError(msg)
    from flowspark.spark.session import DEFAULT_CONF

    snapshot = {"spark.databricks.delta.snapshotPartitions": DEFAULT_CONF["spark.sql.shuffle.partitions"]}
    return {**DELTA_CONF, **snapshot, "spark.jars": ",".join(jars)}


def missing_delta(e: BaseException, step_id: str) -> Optional[FlowsparkCompileError]:
    """The one-line error for a session without Delta Lake in `e`, or `None` when `e` is another error.

    Args:
        e: What Spark raised reading or writing the `delta` format.
        step_id: The step that read or wrote it.

    Returns:
        The error naming the step and the fix, or `None`.
    """
    text = str(e)
    if "delta" not in text.lower():
        return None
    if not ("Failed to find data source" in text or "DATA_SOURCE_NOT_FOUND" in text or "DeltaSparkSession" in text):
        return None
    package = delta_package() or "a Delta Lake built for this session's Spark"
    msg = (
        f"step {step_id!r} uses Delta Lake, and this session lacks it (Spark could not use the delta format); "
        f"start the session with spark.jars.packages={package} and Delta's two settings "
        "(flowspark.spark.io.delta.DELTA_CONF), or let flowspark create it (it takes the jars "
        f"`{FETCH_DELTA}` caches)"
    )
    return FlowsparkCompileError(msg)
