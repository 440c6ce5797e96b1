"""Checks of what user callables return, shared by the operators and the runtimes."""

from __future__ import annotations

from typing import Any

from flowspark.errors import FlowsparkTypeError

__all__ = ["all_pairs", "check_bool"]


def all_pairs(xs: list[Any]) -> bool:
    """Whether every item is a 2-tuple (checked column-wise; False for no items)."""
    return set(map(type, xs)) == {tuple} and set(map(len, xs)) == {2}


def check_bool(step_id: str, what: str, x: Any, result: Any) -> bool:
    """`result` if it is a `bool`; otherwise the error naming the step, the callable and the item.

    Args:
        step_id: The step.
        what: The callable, e.g. "predicate".
        x: The item it was called with.
        result: What it returned.

    Returns:
        `result`.

    Raises:
        FlowsparkTypeError: `result` is not a `bool`.
    """
    if not isinstance(result, bool):
        msg = (
            f"step {step_id!r}: the return value of {what} must be a `bool`; "
            f"returned {result!r} of type {type(result).__name__} for item {x!r}"
        )
        raise FlowsparkTypeError(msg)
    return result
