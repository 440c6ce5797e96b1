"""Helpers for building the functions operators take (`bytewax.operators.helpers`)."""

from __future__ import annotations

from typing import Callable, TypeVar

from flowspark.errors import FlowsparkTypeError

K = TypeVar("K")
V = TypeVar("V")

__all__ = ["map_dict_value"]


def map_dict_value(key: K, mapper: Callable[[V], V]) -> Callable[[dict[K, V]], dict[K, V]]:
    """Build a mapper that replaces one value of a dict item and returns the dict.

    For `op.map` over dict items: `map_dict_value("name", str.upper)` turns
    `{"name": "ann", "id": 1}` into `{"name": "ANN", "id": 1}`. As in Bytewax
    the dict is changed in place and returned; an item without `key` raises
    `KeyError` in the step.

    Args:
        key: The dict key whose value to map.
        mapper: Called with the old value; returns the new one.

    Returns:
        A function of one dict.

    Raises:
        FlowsparkTypeError: `mapper` is not callable.

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, run_main
        >>> flow = Dataflow("lens")
        >>> s = op.input("inp", flow, TestingSource([{"name": "ann", "id": 1}]))
        >>> s = op.map("upper", s, map_dict_value("name", str.upper))
        >>> _ = op.inspect("out", s)
        >>> run_main(flow)
        lens.out: {'name': 'ANN', 'id': 1}
    """
    if not callable(mapper):
        msg = f"map_dict_value: mapper must be callable; received {mapper!r} of type {type(mapper).__name__}"
        raise FlowsparkTypeError(msg)

    def map_value_of_key(obj: dict[K, V]) -> dict[K, V]:
        obj[key] = mapper(obj[key])
        return obj

    return map_value_of_key
