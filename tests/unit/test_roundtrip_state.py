"""`run_main(roundtrip_state=True)`: local tests catch what streaming (resume from snapshots) would break."""

from __future__ import annotations

from typing import Any, Optional

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.testing import TestingSink, TestingSource, run_main

ITEMS = [("a", 1), ("b", 2), ("a", 3), ("b", 4), ("a", 5)]


class Good(op.StatefulLogic):
    def __init__(self, state: Optional[int]) -> None:
        self.total = state or 0

    def on_item(self, value: int) -> tuple[list[int], bool]:
        self.total += value
        return [self.total], self.RETAIN

    def snapshot(self) -> int:
        return self.total


class IgnoresResumeState(Good):
    def __init__(self, state: Optional[int]) -> None:
        super().__init__(None)  # the bug: the resumed logic starts from zero


class SnapshotLeavesStateOut(op.StatefulLogic):
    def __init__(self, state: Optional[int]) -> None:
        self.total = state or 0
        self.seen = 0  # not in the snapshot: lost on resume

    def on_item(self, value: int) -> tuple[list[tuple[int, int]], bool]:
        self.total += value
        self.seen += 1
        return [(self.total, self.seen)], self.RETAIN

    def snapshot(self) -> int:
        return self.total


def _run(builder: Any, *, roundtrip: bool, batch_size: int = 1) -> list[Any]:
    flow = Dataflow("rt")
    out: list[Any] = []
    s = op.input("inp", flow, TestingSource(ITEMS, batch_size=batch_size))
    op.output("out", op.stateful("sum", s, builder), TestingSink(out))
    run_main(flow, roundtrip_state=roundtrip)
    return out


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_correct_logic_gives_the_same_output(batch_size):
    assert _run(Good, roundtrip=True, batch_size=batch_size) == _run(Good, roundtrip=False, batch_size=batch_size)
    assert _run(Good, roundtrip=True) == [("a", 1), ("b", 2), ("a", 4), ("b", 6), ("a", 9)]


@pytest.mark.parametrize("builder", [IgnoresResumeState, SnapshotLeavesStateOut])
def test_state_lost_on_resume_fails_naming_step_and_key(builder):
    assert len(_run(builder, roundtrip=False)) == len(ITEMS)  # the bug is invisible in a normal run
    with pytest.raises(FlowsparkRuntimeError) as info:
        _run(builder, roundtrip=True)
    err = info.value
    assert err.step_id == "rt.sum.stateful_batch"
    assert err.key == "a"
    assert "resumed from its snapshot emitted" in str(err)
    assert "where the live logic emitted" in str(err)


def test_windowing_and_builtin_operators_survive_resume():
    from datetime import datetime, timedelta, timezone

    import flowspark.operators.windowing as win

    t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
    items = [("a", (t0 + timedelta(seconds=s), s)) for s in (0, 10, 70, 130)] + [("b", (t0, 1))]

    def build(flow_out: dict[str, list[Any]]) -> Dataflow:
        flow = Dataflow("w")
        s = op.input("inp", flow, TestingSource(items))
        clock = win.EventClock(lambda v: v[0], wait_for_system_duration=timedelta(0))
        windower = win.TumblingWindower(length=timedelta(seconds=60), align_to=t0)
        w = win.fold_window("f", s, clock, windower, int, lambda acc, v: acc + v[1], int.__add__)
        op.output("out", w.down, TestingSink(flow_out["windows"]))
        counts = op.stateful_map("count", s, lambda st, v: ((st or 0) + 1, (st or 0) + 1))
        op.output("counts", counts, TestingSink(flow_out["counts"]))
        return flow

    plain: dict[str, list[Any]] = {"windows": [], "counts": []}
    resumed: dict[str, list[Any]] = {"windows": [], "counts": []}
    run_main(build(plain))
    run_main(build(resumed), roundtrip_state=True)
    assert resumed == plain
    assert len(plain["windows"]) == 4
    assert len(plain["counts"]) == 5
