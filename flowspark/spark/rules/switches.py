"""Which optimizer rules a run switches on, and the rules table.

`rules_arg` reads what a user asks for: `flowspark.spark.run(..., rules=...)`,
`flowspark run --rules`, or the environment variable `FLOWSPARK_RULES`: `all` (the
default), `none`, `-NAME,-NAME` (all but those) or `NAME,NAME` (only those), with the
names of `flowspark.spark.rules.optimizer.RULES`. `describe_rules` prints those rules as the
table docs/architecture.md holds.
"""

from __future__ import annotations

import os
from typing import Any

from flowspark.errors import FlowsparkTypeError
from flowspark.spark.rules.optimizer import RULES

__all__ = ["ENV_VAR", "describe_rules", "rule_names", "rules_arg"]

#: The environment variable that switches rules off when `rules` is not given.
ENV_VAR = "FLOWSPARK_RULES"


def rule_names() -> list[str]:
    """The names of every rule, in the order they are decided.

    Returns:
        The names.
    """
    return [r.name for r in RULES]


def rules_arg(value: Any, where: str = "flowspark.spark.run") -> tuple[frozenset[str], str]:
    """The rules switched on by `value` (`None`: the environment variable `FLOWSPARK_RULES`, else all).

    Args:
        value: `None`, `"all"`, `"none"`, `"-NAME,-NAME"` (all but those), `"NAME,NAME"`
            (only those), or an iterable of rule names (only those).
        where: Who asks (named in the error).

    Returns:
        `(names switched on, the text asked for)`.

    Raises:
        FlowsparkTypeError: An unknown rule name or a malformed value.
    """
    names = rule_names()
    if value is None:
        value = os.environ.get(ENV_VAR) or "all"
        where = f"{where} ({ENV_VAR})" if os.environ.get(ENV_VAR) else where
    if isinstance(value, str):
        text = value.strip()
        parts = [p.strip() for p in text.split(",") if p.strip()]
    elif isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(p, str) for p in value):
        parts = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
        text = ",".join(parts)
    else:
        msg = f"{where}: rules must be 'all', 'none', '-NAME,-NAME' or a list of rule names; received {value!r}"
        raise FlowsparkTypeError(msg)
    if parts in (["all"], []):
        return frozenset(names), "all"
    if parts == ["none"]:
        return frozenset(), "none"
    minus = [p[1:] for p in parts if p.startswith("-")]
    plus = [p for p in parts if not p.startswith("-")]
    unknown = [p for p in minus + plus if p not in names]
    if unknown or (minus and plus):
        why = f"unknown rule {unknown[0]!r}" if unknown else "mix of rules switched off (-NAME) and rules named alone"
        msg = (
            f"{where}: {why} in rules={text!r}; use 'all', 'none', '-NAME,-NAME' (all but those) or "
            f"'NAME,NAME' (only those), with names from: {', '.join(names)}"
        )
        raise FlowsparkTypeError(msg)
    if minus:
        return frozenset(names) - frozenset(minus), text
    return frozenset(plus), text


def describe_rules() -> str:
    """Every rule as a markdown table (docs/architecture.md holds it; a test checks it is current).

    Returns:
        The table.
    """
    lines = [
        "| rule | applies to | decided for | changes the query's shape | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in RULES:
        targets = ", ".join(sorted(r.targets))
        lines.append(f"| `{r.name}` | {targets} | {r.scope} | {'yes' if r.shape else 'no'} | {r.summary} |")
    return "\n".join(lines)
