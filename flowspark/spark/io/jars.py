"""The jar cache: where `scripts/fetch_jars.py` keeps what Spark's Kafka connector and Delta Lake need.

Each set lives in its own directory under `$FLOWSPARK_JARS_DIR` (default
`~/.cache/flowspark/jars`), and counts once its `.complete` marker is written (a fetch that
did not finish leaves none).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

__all__ = ["cached_jars", "jars_root", "set_dir"]


def jars_root() -> Path:
    """The cache directory: `$FLOWSPARK_JARS_DIR`, or `~/.cache/flowspark/jars`.

    Returns:
        The directory (it may not exist).
    """
    env = os.environ.get("FLOWSPARK_JARS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "flowspark" / "jars"


def set_dir(name: str) -> Path:
    """The directory of set `name` for the installed pyspark: `jars_root()/<name>-<pyspark version>`.

    Args:
        name: The set (`"kafka"`, `"delta"`).

    Returns:
        The directory (it may not exist).
    """
    import pyspark

    return jars_root() / f"{name}-{pyspark.__version__}"


def cached_jars(d: Path) -> Optional[list[str]]:
    """The jars of a finished set in `d`, or `None` when `scripts/fetch_jars.py` did not finish it.

    Args:
        d: A set's directory (under `jars_root()`).

    Returns:
        The jar paths, sorted, or `None`.
    """
    if not (d / ".complete").is_file():
        return None
    jars = sorted(str(j) for j in d.glob("*.jar"))
    return jars or None
