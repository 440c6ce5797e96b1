"""Sources, ported from Bytewax 0.21.1's `pytests/test_inputs.py` (same cases, flowspark's style).

Bytewax's timing tests read the wall clock and wait; these run the same sources on
`run_main(clock="logical")`, whose clock jumps to the next `next_awake`, and read it with
`flowspark.now()`, so they assert exact times and never sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import pytest
from typing_extensions import override

import flowspark
import flowspark.operators as op
from flowspark._time import use_clock
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.inputs import (
    AbortExecution,
    DynamicSource,
    FixedPartitionedSource,
    SimplePollingSource,
    StatefulSourcePartition,
    StatelessSourcePartition,
    _SimplePollingPartition,
    batch,
    batch_async,
    batch_getter,
    batch_getter_ex,
)
from flowspark.testing import TestingSink, TestingSource, TimeTestingGetter, run_main

T0 = datetime(2023, 1, 1, 5, 0, tzinfo=timezone.utc)


def _run(source: Any, **kwargs: Any) -> list[Any]:
    flow = Dataflow("test_df")
    out: list[Any] = []
    op.output("out", op.input("inp", flow, source), TestingSink(out))
    run_main(flow, **kwargs)
    return out


def test_a_flow_without_input_fails_at_run_main_with_a_runtime_error_caused_by_a_value_error() -> None:
    with pytest.raises(FlowsparkRuntimeError) as info:
        run_main(Dataflow("test_df"))
    assert not isinstance(info.value, ValueError)
    cause = info.value.__cause__
    assert isinstance(cause, ValueError)
    assert "at least one input" in str(cause)


# -- next_batch may return any iterable ------------------------------------------------------


class _RepeatPart(StatelessSourcePartition[int]):
    def __init__(self) -> None:
        self._n = 0

    @override
    def next_batch(self) -> Iterable[int]:
        if self._n >= 5:
            raise StopIteration
        self._n += 1
        return itertools.repeat(self._n - 1, 2)


class _RepeatStatefulPart(StatefulSourcePartition[int, None]):
    def __init__(self) -> None:
        self._inner = _RepeatPart()

    @override
    def next_batch(self) -> Iterable[int]:
        return self._inner.next_batch()

    @override
    def snapshot(self) -> None:
        return None


class _RepeatDynamic(DynamicSource[int]):
    @override
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _RepeatPart:
        return _RepeatPart()


class _RepeatFixed(FixedPartitionedSource[int, None]):
    @override
    def list_parts(self) -> list[str]:
        return ["one"]

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: None) -> _RepeatStatefulPart:
        return _RepeatStatefulPart()


@pytest.mark.parametrize("source", [_RepeatDynamic(), _RepeatFixed()], ids=["dynamic", "fixed"])
def test_next_batch_may_return_an_iterator(source: Any) -> None:
    assert _run(source) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


# -- next_awake ------------------------------------------------------------------------------


class _MetronomePart(StatefulSourcePartition[tuple[datetime, int], int]):
    def __init__(self, interval: timedelta, count: int) -> None:
        self._interval = interval
        self._count = count
        self._next_awake = flowspark.now()
        self._n = 0

    @override
    def next_batch(self) -> list[tuple[datetime, int]]:
        now = flowspark.now()
        self._next_awake = now + self._interval
        if self._n >= self._count:
            raise StopIteration
        self._n += 1
        return [(now, self._n - 1)]

    @override
    def next_awake(self) -> Optional[datetime]:
        return self._next_awake

    @override
    def snapshot(self) -> int:
        return self._n


class _DynamicMetronomePart(StatelessSourcePartition[tuple[datetime, int]]):
    def __init__(self, interval: timedelta, count: int) -> None:
        self._inner = _MetronomePart(interval, count)

    @override
    def next_batch(self) -> list[tuple[datetime, int]]:
        return self._inner.next_batch()

    @override
    def next_awake(self) -> Optional[datetime]:
        return self._inner.next_awake()


@dataclass
class _Metronome(FixedPartitionedSource[tuple[datetime, int], int]):
    interval: timedelta
    count: int = 5

    @override
    def list_parts(self) -> list[str]:
        return ["singleton"]

    @override
    def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> _MetronomePart:
        return _MetronomePart(self.interval, self.count)


@dataclass
class _DynamicMetronome(DynamicSource[tuple[datetime, int]]):
    interval: timedelta
    count: int = 5

    @override
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _DynamicMetronomePart:
        return _DynamicMetronomePart(self.interval, self.count)


@pytest.mark.parametrize("make", [_Metronome, _DynamicMetronome], ids=["fixed", "dynamic"])
def test_a_partition_is_polled_no_sooner_than_its_next_awake(make: Any) -> None:
    interval = timedelta(seconds=0.1)
    out = _run(make(interval), clock="logical", start_time=T0)
    assert out == [(T0 + i * interval, i) for i in range(5)]


@pytest.mark.parametrize("make", [_Metronome, _DynamicMetronome], ids=["fixed", "dynamic"])
def test_a_slow_source_does_not_hold_back_a_fast_one(make: Any) -> None:
    fast_interval, slow_interval = timedelta(seconds=0.1), timedelta(seconds=0.5)
    flow = Dataflow("test_df")
    fast: list[Any] = []
    slow: list[Any] = []
    op.output("fast_out", op.input("fast_inp", flow, make(fast_interval)), TestingSink(fast))
    op.output("slow_out", op.input("slow_inp", flow, make(slow_interval)), TestingSink(slow))
    run_main(flow, epoch_interval=timedelta(seconds=0.25), clock="logical", start_time=T0)
    assert fast == [(T0 + i * fast_interval, i) for i in range(5)]
    assert slow == [(T0 + i * slow_interval, i) for i in range(5)]


# -- SimplePollingSource ----------------------------------------------------------------------


class _ListSource(SimplePollingSource[str, int]):
    """Bytewax's `SimpleListSource`: a list, a resume index, and an `Abort` marker that aborts once."""

    @dataclass
    class Abort:
        triggered: bool = False

    def __init__(self, items: list[Any]) -> None:
        super().__init__(interval=timedelta(seconds=0))
        self.items = items
        self._next_idx = 0

    @override
    def next_item(self) -> str:
        try:
            item = self.items[self._next_idx]
        except IndexError as ex:
            raise StopIteration from ex
        self._next_idx += 1
        if isinstance(item, _ListSource.Abort) and not item.triggered:
            item.triggered = True
            raise AbortExecution
        return item

    @override
    def snapshot(self) -> int:
        return self._next_idx

    @override
    def resume(self, resume_state: int) -> None:
        self._next_idx = resume_state


def test_simple_polling_source_takes_item_and_state_type_parameters() -> None:
    alias = SimplePollingSource[int, int]
    assert alias.__origin__ is SimplePollingSource  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        SimplePollingSource[int, int, int]  # type: ignore[misc]


def test_simple_polling_source_continues_after_an_abort() -> None:
    flow = Dataflow("test_df")
    out: list[str] = []
    op.output("out", op.input("inp", flow, _ListSource(["a", "b", _ListSource.Abort(), "c"])), TestingSink(out))
    run_main(flow)
    assert out == ["a", "b"]
    out.clear()
    run_main(flow)
    assert out == ["c"]


def test_simple_polling_source_resume_hook_gets_the_snapshot() -> None:
    src = _ListSource(["a", "b", "c", "d"])
    part = src.build_part("test_df.inp", "singleton", 2)
    assert part.next_batch() == ["c"]
    assert part.snapshot() == 3
    assert part.next_batch() == ["d"]
    with pytest.raises(StopIteration):
        part.next_batch()


def _part(now: datetime, align_to: Optional[datetime], getter: Any = lambda: True) -> _SimplePollingPartition[Any, Any]:
    return _SimplePollingPartition(
        now, interval=timedelta(minutes=30), align_to=align_to, getter=getter, snapshot=lambda: None
    )


def test_simple_polling_source_polls_again_after_the_interval() -> None:
    part = _part(T0, align_to=T0)
    assert part.next_batch() == [True]
    assert part.next_awake() == datetime(2023, 1, 1, 5, 30, tzinfo=timezone.utc)


def test_simple_polling_source_retry_polls_again_after_its_timeout() -> None:
    def getter() -> Any:
        raise SimplePollingSource.Retry(timedelta(seconds=5))

    part = _part(T0, align_to=T0, getter=getter)
    assert part.next_batch() == []
    assert part.next_awake() == datetime(2023, 1, 1, 5, 0, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("now", "first_poll"),
    [
        (datetime(2023, 1, 1, 5, 15, tzinfo=timezone.utc), datetime(2023, 1, 1, 5, 30, tzinfo=timezone.utc)),
        # On a mark exactly: at once, not one interval later.
        (datetime(2023, 1, 1, 5, 0, tzinfo=timezone.utc), datetime(2023, 1, 1, 5, 0, tzinfo=timezone.utc)),
        # Before `align_to`: the marks extend backwards.
        (datetime(2023, 1, 1, 3, 10, tzinfo=timezone.utc), datetime(2023, 1, 1, 3, 30, tzinfo=timezone.utc)),
    ],
)
def test_simple_polling_source_first_poll_is_on_the_next_align_to_mark(now: datetime, first_poll: datetime) -> None:
    assert _part(now, align_to=datetime(2023, 1, 1, 4, 0, tzinfo=timezone.utc)).next_awake() == first_poll


def test_simple_polling_source_start_on_a_mark_polls_at_once_with_the_injected_clock() -> None:
    clock = TimeTestingGetter(T0)

    class Ticks(SimplePollingSource[int, int]):
        def next_item(self) -> int:
            return 1

    with use_clock(clock.get):
        part = Ticks(timedelta(minutes=30), align_to=T0 - timedelta(hours=1)).build_part("f.inp", "singleton", None)
    assert part.next_awake() == T0


# -- batch helpers ---------------------------------------------------------------------------


def test_batch_cuts_an_iterable_and_stays_exhausted() -> None:
    batcher = batch(range(5), 3)
    assert next(batcher) == [0, 1, 2]
    assert next(batcher) == [3, 4]
    with pytest.raises(StopIteration):
        next(batcher)
    with pytest.raises(StopIteration):
        next(batcher)


class _ClosableQueue:
    def __init__(self) -> None:
        self.items: list[int] = []
        self.closed = False

    def get(self) -> int:
        if self.items:
            return self.items.pop(0)
        if self.closed:
            raise StopIteration
        raise queue.Empty


def _drain(batcher: Any, q: _ClosableQueue) -> None:
    q.items += [0, 1, 2, 3, 4]
    assert next(batcher) == [0, 1, 2]
    assert next(batcher) == [3, 4]
    assert next(batcher) == []
    q.items.append(5)
    q.closed = True
    assert next(batcher) == [5]
    with pytest.raises(StopIteration):
        next(batcher)
    with pytest.raises(StopIteration):
        next(batcher)


def test_batch_getter_batches_until_none_then_ends_at_stop_iteration() -> None:
    q = _ClosableQueue()

    def getter() -> Optional[int]:
        try:
            return q.get()
        except queue.Empty:
            return None

    _drain(batch_getter(getter, 3), q)


def test_batch_getter_ex_batches_until_queue_empty_then_ends_at_stop_iteration() -> None:
    q = _ClosableQueue()
    _drain(batch_getter_ex(q.get, 3), q)


def test_batch_async_batches_an_async_generator() -> None:
    async def gen() -> Any:
        for i in range(5):
            await asyncio.sleep(0)
            yield i

    batcher = batch_async(gen(), timeout=timedelta(seconds=1), batch_size=2)
    assert next(batcher) == [0, 1]
    assert next(batcher) == [2, 3]
    assert next(batcher) == [4]
    with pytest.raises(StopIteration):
        next(batcher)
    with pytest.raises(StopIteration):
        next(batcher)


def test_testing_source_still_reads_every_item() -> None:
    assert _run(TestingSource(["a", "b"])) == ["a", "b"]
