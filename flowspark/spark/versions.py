"""The pyspark versions flowspark supports, and what each line can run.

flowspark runs on pyspark 3.5 to 4.3 (`OLDEST` to `NEWEST`, the `spark` extra's range).
Older lines lack APIs a part of flowspark's streaming runtime is built on (`FEATURES`):

- `transformWithStateInPandas` (Spark 4.0+): the `"chunk"` and `"key"` state layouts and
  a query with several keyed stages. On 3.5 a new checkpoint takes the `"bucket"` layout
  (`applyInPandasWithState`, since 3.4), and `flowspark plan --spark` says why.
- Python streaming data sources with admission control and `Trigger.AvailableNow`
  (`latestOffset(start, limit)`, `SupportsTriggerAvailableNow`: Spark 4.2+): a stream from a
  Python source (`TestingSource`, a user-written source), and the ticks that fire timers in a
  stream. Before 4.2 a stream reads a `SparkSource` (files, Kafka, tables), without timers.

Everything of the batch runtime runs on every supported line. Importing this module
imports nothing of pyspark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from flowspark.errors import FlowsparkCompileError

__all__ = [
    "FEATURES",
    "NEWEST",
    "OLDEST",
    "PYTHON_STREAM_SOURCE",
    "STATE_READER",
    "TRANSFORM_WITH_STATE",
    "Feature",
    "check_supported",
    "installed",
    "lacks",
    "newer",
    "require",
]

#: The oldest and the newest supported minor lines, as `(major, minor)`.
OLDEST = (3, 5)
NEWEST = (4, 3)


@dataclass(frozen=True)
class Feature:
    """A pyspark API some of flowspark needs, the line that brought it, and what needs it."""

    name: str
    since: tuple[int, int]
    used_for: str


TRANSFORM_WITH_STATE = Feature(
    "transformWithStateInPandas",
    (4, 0),
    "the 'chunk' and 'key' state layouts and streaming queries with several keyed stages",
)
PYTHON_STREAM_SOURCE = Feature(
    "a Python streaming data source with admission control and Trigger.AvailableNow",
    (4, 2),
    "streaming queries that read a Python source (TestingSource, a user-written source)",
)
STATE_READER = Feature(
    "Spark's state data source (format 'statestore')",
    (4, 0),
    "flowspark state (reading a streaming checkpoint's keyed state)",
)
FEATURES = (TRANSFORM_WITH_STATE, PYTHON_STREAM_SOURCE, STATE_READER)


def installed(version: Optional[str] = None) -> tuple[int, int]:
    """The installed pyspark's `(major, minor)` (or `version`'s).

    Args:
        version: A version string such as `"3.5.8"`; default the installed pyspark's.

    Returns:
        `(major, minor)`.

    >>> installed("3.5.8")
    (3, 5)
    >>> installed("4.1.0.dev1")
    (4, 1)
    """
    if version is None:
        version = _installed_text()
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _text(line: tuple[int, int]) -> str:
    return f"{line[0]}.{line[1]}"


def _installed_text() -> str:
    """The installed pyspark's version, the module's own.

    A Connect-only client (`pyspark-client`, Databricks Connect) installs the module under
    another distribution name.
    """
    import pyspark

    return str(pyspark.__version__)


def check_supported(caller: str, version: Optional[str] = None) -> None:
    """Refuse a pyspark outside the supported range, in one line.

    Args:
        caller: Who asks (`"flowspark.spark.run"`), named in the message.
        version: The version to check; default the installed pyspark's.

    Raises:
        FlowsparkCompileError: Naming the installed and the supported versions.

    >>> check_supported("run", "4.2.0")
    >>> check_supported("run", "3.4.4")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    flowspark.errors.FlowsparkCompileError: run: pyspark 3.4.4 is installed; flowspark supports pyspark 3.5 to 4.3: ...
    """
    text = _installed_text() if version is None else version
    line = installed(text)
    if OLDEST <= line <= NEWEST:
        return
    msg = (
        f"{caller}: pyspark {text} is installed; flowspark supports pyspark {_text(OLDEST)} to {_text(NEWEST)}: "
        f'install one of those (pip install "pyspark>={_text(OLDEST)},<{NEWEST[0]}.{NEWEST[1] + 1}"), '
        "the version of your cluster's Spark"
    )
    raise FlowsparkCompileError(msg)


def lacks(feature: Feature, version: Optional[str] = None) -> Optional[str]:
    """Why the installed pyspark (or `version`) cannot use `feature`; `None` when it can.

    Args:
        feature: One of `FEATURES`.
        version: A version string; default the installed pyspark's.

    Returns:
        A sentence naming the feature, the line that brought it and the installed version, or `None`.

    >>> lacks(TRANSFORM_WITH_STATE, "4.0.1") is None
    True
    >>> lacks(TRANSFORM_WITH_STATE, "3.5.8")
    'transformWithStateInPandas needs Spark 4.0 or newer; pyspark 3.5.8 is installed'
    """
    text = _installed_text() if version is None else version
    if installed(text) >= feature.since:
        return None
    return f"{feature.name} needs Spark {_text(feature.since)} or newer; pyspark {text} is installed"


def newer(feature: Feature) -> str:
    """`"pyspark X.Y or newer"`: what to install for `feature`.

    >>> newer(TRANSFORM_WITH_STATE)
    'pyspark 4.0 or newer'
    """
    return f"pyspark {_text(feature.since)} or newer"


def require(feature: Feature, what: str, fix: str) -> None:
    """Refuse what needs `feature` when the installed pyspark lacks it.

    Args:
        feature: One of `FEATURES`.
        what: What asked for it, with the step or option (`"step 'inp' reads a TestingSource"`).
        fix: How to run it on this pyspark, or which pyspark to install.

    Raises:
        FlowsparkCompileError: `what`, why it cannot run here, and `fix`.
    """
    why = lacks(feature)
    if why is not None:
        msg = f"{what}: {why}; {fix}"
        raise FlowsparkCompileError(msg)
