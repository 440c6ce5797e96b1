"""SimplePollingSource schedules its polls on the injectable clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from flowspark._time import use_clock
from flowspark.inputs import SimplePollingSource
from flowspark.testing import TimeTestingGetter

T0 = datetime(2024, 1, 1, 12, 0, 7, tzinfo=timezone.utc)


class _Counter(SimplePollingSource):
    def __init__(self, interval, align_to=None, fail_first=False):
        super().__init__(interval, align_to)
        self.n = 0
        self.fail_first = fail_first

    def next_item(self):
        if self.fail_first:
            self.fail_first = False
            raise SimplePollingSource.Retry(timedelta(seconds=1))
        self.n += 1
        return self.n

    def snapshot(self):
        return self.n

    def resume(self, resume_state):
        self.n = resume_state


def test_polls_follow_the_injected_clock():
    clock = TimeTestingGetter(T0)
    with use_clock(clock.get):
        part = _Counter(timedelta(seconds=10)).build_part("flow.inp", "singleton", None)
        assert part.next_awake() == T0
        assert part.next_batch() == [1]
        assert part.next_awake() == T0 + timedelta(seconds=10)
        assert part.snapshot() == 1


def test_align_to_and_retry_and_resume():
    clock = TimeTestingGetter(T0)
    align = datetime(2024, 1, 1, tzinfo=timezone.utc)
    with use_clock(clock.get):
        src = _Counter(timedelta(seconds=10), align_to=align, fail_first=True)
        part = src.build_part("flow.inp", "singleton", 41)
        assert part.next_awake() == datetime(2024, 1, 1, 12, 0, 10, tzinfo=timezone.utc)
        assert part.next_batch() == []
        assert part.next_awake() == datetime(2024, 1, 1, 12, 0, 11, tzinfo=timezone.utc)
        assert part.next_batch() == [42]


def _one_type_argument_output(inputs, dataflow, operators, testing) -> list:
    """A polling source subscripted with its item type only, run to its end with one library's modules."""

    class CounterSource(inputs.SimplePollingSource[int]):
        def __init__(self):
            super().__init__(timedelta(0))
            self.n = 0

        def next_item(self) -> int:
            self.n += 1
            if self.n > 3:
                raise StopIteration
            return self.n

    out: list = []
    flow = dataflow.Dataflow("counter")
    nums = operators.input("inp", flow, CounterSource())
    operators.output("out", operators.map("double", nums, lambda n: n * 2), testing.TestingSink(out))
    testing.run_main(flow)
    return out


def test_a_polling_source_takes_one_type_argument_like_bytewax():
    import pytest

    import flowspark.dataflow
    import flowspark.inputs
    import flowspark.operators
    import flowspark.testing

    ours = _one_type_argument_output(flowspark.inputs, flowspark.dataflow, flowspark.operators, flowspark.testing)
    assert ours == [2, 4, 6]
    bytewax = pytest.importorskip("bytewax")
    del bytewax
    import bytewax.dataflow
    import bytewax.inputs
    import bytewax.operators
    import bytewax.testing

    assert _one_type_argument_output(bytewax.inputs, bytewax.dataflow, bytewax.operators, bytewax.testing) == ours
