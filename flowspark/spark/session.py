"""The SparkSession the runtime uses when the caller gives none."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

__all__ = ["DEFAULT_CONF", "get_session"]

#: Settings of the session `get_session` creates.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "2g",
}


def get_session(master: str = "local[*]", conf: Optional[dict[str, str]] = None) -> Any:
    """Return the active SparkSession, or create a local one with sensible defaults.

    Args:
        master: Spark master for a new session.
        conf: Extra settings for a new session (over `DEFAULT_CONF`).

    Returns:
        The session.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Workers of a local session import the user's modules like the driver does.
        path = [p for p in sys.path if p and os.path.isdir(p)]
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*(old.split(os.pathsep) if old else []), *path]))
    builder = SparkSession.builder.master(master).appName("flowspark")
    for k, v in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
