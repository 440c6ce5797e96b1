"""Reductions a flow can declare: folders (and their builders) for `op.fold_final`.

Pass them instead of a lambda: they compute the same as the lambda in memory and on
every runtime, and they tell the Spark batch runtime what the step computes, so it may
run the step as a Spark aggregate (the rule `native_reduction`, docs/spark.md) instead
of calling Python per value. A runtime recognises them by identity, never by name.

| fold_final(step_id, up, builder, folder) | emits per key                  |
| ---------------------------------------- | ------------------------------ |
| `zero, sum`                              | the sum of the values          |
| `zero, count`                            | the number of values           |
| `nothing, max`                           | the largest value              |
| `nothing, min`                           | the smallest value             |

`reduce_final(..., operator.add)`, `reduce_final(..., max)` / `min` (the builtins),
`count_final`, and `max_final` / `min_final` without `by` are recognised as well.

Example:
    >>> import flowspark.operators as op
    >>> from flowspark import reducers
    >>> from flowspark.dataflow import Dataflow
    >>> from flowspark.testing import TestingSink, TestingSource, run_main
    >>> flow = Dataflow("eg")
    >>> s = op.input("inp", flow, TestingSource([("a", 2), ("b", 5), ("a", 3)]))
    >>> out = []
    >>> op.output("out", op.fold_final("total", s, reducers.zero, reducers.sum), TestingSink(out))
    >>> run_main(flow); sorted(out)
    [('a', 5), ('b', 5)]
"""

from __future__ import annotations

import builtins
from typing import Any, Optional

__all__ = ["count", "max", "min", "nothing", "sum", "zero"]


def zero() -> int:
    """The builder of `sum` and `count`: `0`.

    Returns:
        `0`.
    """
    return 0


def nothing() -> None:
    """The builder of `max` and `min`: no value yet.

    Returns:
        `None`.
    """
    return None


def sum(acc: Any, value: Any) -> Any:  # noqa: A001
    """`acc + value` (with `zero`: the sum of a key's values).

    Args:
        acc: The sum so far.
        value: The next value.

    Returns:
        The new sum.

    Example:
        >>> sum(sum(zero(), 2), 3)
        5
    """
    return acc + value


def count(acc: int, value: Any) -> int:  # noqa: ARG001
    """`acc + 1` (with `zero`: the number of a key's values).

    Args:
        acc: The count so far.
        value: The next value (not read).

    Returns:
        The new count.

    Example:
        >>> count(count(zero(), "x"), "y")
        2
    """
    return acc + 1


def max(acc: Optional[Any], value: Any) -> Any:  # noqa: A001
    """The larger of `acc` and `value`, as `builtins.max(acc, value)` (`acc` on a tie); `value` when `acc` is `None`.

    Args:
        acc: The largest value so far (`None`: none yet, see `nothing`).
        value: The next value.

    Returns:
        The new largest value.

    Example:
        >>> max(max(nothing(), 3), 7)
        7
    """
    return value if acc is None else builtins.max(acc, value)


def min(acc: Optional[Any], value: Any) -> Any:  # noqa: A001
    """The smaller of `acc` and `value`, as `builtins.min(acc, value)` (`acc` on a tie); `value` when `acc` is `None`.

    Args:
        acc: The smallest value so far (`None`: none yet, see `nothing`).
        value: The next value.

    Returns:
        The new smallest value.

    Example:
        >>> min(min(nothing(), 3), 7)
        3
    """
    return value if acc is None else builtins.min(acc, value)


#: `(builder, folder)` of `fold_final` -> the reduction it computes (see `flowspark.ir.StatefulBatch.reduction`).
FOLDS: dict[tuple[Any, Any], str] = {
    (zero, sum): "sum",
    (zero, count): "count",
    (nothing, max): "max",
    (nothing, min): "min",
}
