"""Command-line argument helpers shared by the `flowspark` commands (a leaf module)."""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import Optional

__all__ = [
    "IMPORT_HELP",
    "RULES_HELP",
    "conf_pair",
    "parse_trigger",
    "positive_int",
    "trigger_arg",
    "ttl_arg",
    "ttl_seconds",
]

#: Help text of the IMPORT_STR argument of every command.
RULES_HELP = (
    "Spark: the fast paths (rules) that may apply: all (default, or the FLOWSPARK_RULES environment variable), "
    "none, or -NAME,-NAME to switch some off; `flowspark plan --spark` shows each rule's decision"
)
IMPORT_HELP = (
    "dataflow import string: <module>[:<variable or factory call>] or <path/file.py>[:...]; "
    "the attribute defaults to `flow`. Examples: src.dataflow, src.dataflow:flow, "
    "flows/wc.py:get_flow('in.txt', n=2)"
)

_TRIGGER_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?)\s*$")


def conf_pair(text: str) -> tuple[str, str]:
    """Parse a `--conf KEY=VALUE` argument.

    Args:
        text: The argument.

    Returns:
        `(key, value)`.

    Raises:
        argparse.ArgumentTypeError: Not `key=value`.
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        msg = f"{text!r} is not key=value (e.g. spark.sql.shuffle.partitions=4)"
        raise argparse.ArgumentTypeError(msg)
    return key.strip(), value


def positive_int(text: str) -> int:
    """Parse a count argument such as `--buckets B` (a positive integer).

    Args:
        text: The argument.

    Returns:
        The count.

    Raises:
        argparse.ArgumentTypeError: Not a positive integer.
    """
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        msg = f"expected a positive integer; received {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return n


def trigger_arg(text: str) -> str:
    """Check a `--trigger` argument (see `parse_trigger`).

    Args:
        text: The argument.

    Returns:
        The text, unchanged.

    Raises:
        argparse.ArgumentTypeError: Not a trigger.
    """
    try:
        parse_trigger(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def parse_trigger(text: str) -> tuple[str, Optional[float]]:
    """Parse a streaming trigger given on the command line.

    Args:
        text: `available_now` (process what is available, then stop) or an
            interval like `10 seconds`, `500 ms`, `2 minutes`.

    Returns:
        `("available_now", None)` or `("processing_time", seconds)`.

    Raises:
        ValueError: Neither form.

    Example:
        >>> parse_trigger("available_now")
        ('available_now', None)
        >>> parse_trigger("10 seconds")
        ('processing_time', 10.0)
        >>> parse_trigger("500 ms")
        ('processing_time', 0.5)
    """
    t = text.strip().lower()
    if t in ("available_now", "availablenow", "available-now"):
        return ("available_now", None)
    m = _TRIGGER_RE.match(t)
    if not m:
        msg = f"trigger {text!r} is neither available_now nor an interval like '10 seconds' or '500 ms'"
        raise ValueError(msg)
    n, unit = float(m.group(1)), m.group(2)
    if unit in ("m", "min", "mins", "minute", "minutes"):
        scale = 60.0
    elif unit.startswith("m"):
        scale = 0.001
    else:
        scale = 1.0
    return ("processing_time", n * scale)


def ttl_arg(where: str, value: object) -> Optional[timedelta]:
    """Check a `state_ttl` run option.

    Args:
        where: The function taking it (for the message).
        value: `None` or a positive `timedelta`.

    Returns:
        The value.

    Raises:
        FlowsparkTypeError: Anything else.
    """
    if value is None or (isinstance(value, timedelta) and value > timedelta(0)):
        return value
    from flowspark.errors import FlowsparkTypeError

    msg = f"{where}: state_ttl must be a positive timedelta (e.g. timedelta(hours=1)) or None; received {value!r}"
    raise FlowsparkTypeError(msg)


def ttl_seconds(text: str) -> timedelta:
    """Parse `--state-ttl SECS` (a positive number of seconds).

    Args:
        text: The argument.

    Returns:
        The TTL.

    Raises:
        argparse.ArgumentTypeError: Not a positive number.
    """
    try:
        secs = float(text)
    except ValueError:
        secs = -1.0
    if not secs > 0:
        msg = f"expected a positive number of seconds (e.g. 3600); received {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return timedelta(seconds=secs)
