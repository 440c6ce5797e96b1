"""Activation bounds: where each activation (source batch) ends among a stream's items in a pass.

The in-memory executor gathers several source batches into one pass; a stateful step
still works per activation, as in Bytewax. A stream's bounds in a pass are `None` (the
pass is one activation), `SINGLES` (each item is its own activation) or a list of end
offsets into the pass's items.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flowspark import ir

__all__ = ["SINGLES", "ends", "leading_to_stateful", "remap_bounds", "segments"]

#: Bounds where each item is its own activation.
SINGLES: Any = ("singles",)


def ends(bounds: Any, n: int) -> list[int]:
    """Bounds as a list of end offsets.

    Args:
        bounds: `None`, `SINGLES` or end offsets.
        n: Number of items.

    Returns:
        The end offset of each activation.
    """
    if bounds is None:
        return [n]
    if bounds is SINGLES:
        return list(range(1, n + 1))
    return list(bounds)


def segments(items: list[Any], bounds: Any) -> Iterable[list[Any]]:
    """The items of each activation.

    Args:
        items: A stream's items in a pass.
        bounds: Their bounds.

    Returns:
        One list per activation.
    """
    if bounds is None:
        return (items,)
    if bounds is SINGLES:
        return ([x] for x in items)
    starts = [0, *bounds[:-1]]
    return (items[a:b] for a, b in zip(starts, bounds, strict=True))


def remap_bounds(bounds: list[int], counts: list[int]) -> Any:
    """Activation bounds of a step's outputs, given each input's number of outputs.

    Args:
        bounds: The inputs' end offsets.
        counts: Number of outputs of each input.

    Returns:
        The outputs' bounds.
    """
    cum = [0]
    for c in counts:
        cum.append(cum[-1] + c)
    out: list[int] = []
    for e in bounds:
        end = cum[e]
        if end and (not out or out[-1] != end):
            out.append(end)
    return None if len(out) <= 1 else out


def leading_to_stateful(graph: ir.Graph) -> set[str]:
    """Streams from which a stateful step can be reached.

    Args:
        graph: The dataflow's graph.

    Returns:
        Their stream ids.
    """
    consumers = graph.consumers()
    memo: dict[str, bool] = {}

    def leads(stream: str) -> bool:
        if stream not in memo:
            memo[stream] = False
            memo[stream] = any(
                isinstance(node, ir.StatefulBatch) or any(leads(d) for d in node.downs)
                for node in consumers.get(stream, [])
            )
        return memo[stream]

    return {s for node in graph.nodes for s in node.downs if leads(s)}
