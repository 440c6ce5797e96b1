"""The SparkSession the runtime uses when the caller gives none."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

__all__ = ["DEFAULT_CONF", "get_session", "ship_user_modules"]

#: Settings of the session `get_session` creates.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "2g",
}


def _installed_roots() -> list[str]:
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(name)
        if p:
            roots.add(p)
    import site

    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the flowspark package
    roots.add(here)
    return [os.path.realpath(r) + os.sep for r in roots if r]


def ship_user_modules() -> list[str]:
    """Pickle the user's own modules by value, so Spark workers need not import them.

    A flow's callables are pickled by reference to their module when that module
    is importable. Modules the driver imported from a script's folder, a test
    folder or a path added at run time are often not importable by the Python
    workers (the session may have started before, or the workers run elsewhere).
    Every loaded module whose file lies outside the Python installation, the
    site-packages and flowspark itself is therefore registered with cloudpickle
    (ours and pyspark's) to travel by value, like `__main__` does.

    Returns:
        The names of the modules registered.
    """
    import cloudpickle
    from pyspark import cloudpickle as spark_cloudpickle

    roots = _installed_roots()
    done = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name == "__main__" or name in _BY_VALUE:
            continue
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py"):
            continue
        real = os.path.realpath(f)
        if any(real.startswith(r) for r in roots):
            continue
        for cp in (cloudpickle, spark_cloudpickle):
            try:
                cp.register_pickle_by_value(mod)
            except (ValueError, TypeError):
                break
        else:
            _BY_VALUE.add(name)
            done.append(name)
    return done


_BY_VALUE: set[str] = set()


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
