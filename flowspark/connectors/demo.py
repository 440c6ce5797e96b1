"""Connectors for demo dataflows (`bytewax.connectors.demo` equivalents)."""

from __future__ import annotations

import dataclasses
import random
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Optional

from typing_extensions import override

from flowspark._time import utc_now
from flowspark.inputs import FixedPartitionedSource, StatefulSourcePartition

__all__ = ["RandomMetricSource"]


@dataclass(frozen=True)
class _RandomMetricState:
    awake_at: datetime
    count: int


class _RandomMetricPartition(StatefulSourcePartition[tuple[str, float], _RandomMetricState]):
    def __init__(
        self,
        metric_name: str,
        interval: timedelta,
        count: int,
        next_random: Callable[[], float],
        state: _RandomMetricState,
    ) -> None:
        self._metric_name = metric_name
        self._interval = interval
        self._count = count
        self._next_random = next_random
        self._state = state

    @override
    def next_batch(self) -> list[tuple[str, float]]:
        # As Bytewax: the next awake is counted from the previous one, not from now.
        self._state = _RandomMetricState(self._state.awake_at + self._interval, self._state.count + 1)
        if self._state.count > self._count:
            raise StopIteration
        return [(self._metric_name, self._next_random())]

    @override
    def next_awake(self) -> Optional[datetime]:
        return self._state.awake_at

    @override
    def snapshot(self) -> _RandomMetricState:
        return self._state


def _random_digit() -> float:
    return random.randrange(0, 10)  # noqa: S311 - demo data, not security


class RandomMetricSource(FixedPartitionedSource[tuple[str, float], _RandomMetricState]):
    """Demo source: `(metric_name, value)` 2-tuples, one every `interval`.

    One partition, named `metric_name`. The first value comes at once, then one
    every `interval` after the previous wake-up; after `count` values the input
    ends. Values come from `next_random` (default: a random `int` from 0 to 9 from
    the `random` module, so `random.seed(n)` makes a run repeatable, as in
    Bytewax). For several metrics, make several `op.input` steps and `op.merge`
    them. Resumes with the number of values already emitted and the next wake-up.

    Args:
        metric_name: Attached to each value.
        interval: Time between values (default 0.7 s).
        count: Number of values (default: practically endless).
        next_random: Called for each value.

    Example:
        >>> from datetime import timedelta
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSink, run_main
        >>> flow = Dataflow("demo")
        >>> src = RandomMetricSource("volts", timedelta(seconds=1), count=2, next_random=lambda: 42)
        >>> out = []
        >>> op.output("out", op.input("inp", flow, src), TestingSink(out))
        >>> run_main(flow, clock="logical")
        >>> out
        [('volts', 42), ('volts', 42)]
    """

    def __init__(
        self,
        metric_name: str,
        interval: timedelta = timedelta(seconds=0.7),
        count: int = sys.maxsize,
        next_random: Callable[[], float] = _random_digit,
    ) -> None:
        """Emit `count` values of `metric_name`, one every `interval`."""
        self._metric_name = metric_name
        self._interval = interval
        self._count = count
        self._next_random = next_random

    @override
    def list_parts(self) -> list[str]:
        return [self._metric_name]

    @override
    def build_part(
        self, step_id: str, for_part: str, resume_state: Optional[_RandomMetricState]
    ) -> _RandomMetricPartition:
        state = resume_state if resume_state is not None else _RandomMetricState(utc_now(), 0)
        return _RandomMetricPartition(
            for_part, self._interval, self._count, self._next_random, dataclasses.replace(state)
        )
