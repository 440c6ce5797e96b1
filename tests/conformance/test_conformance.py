"""One operator suite every runtime must pass: the in-memory executor ("local") and Spark ("spark").

Expected outputs are written out by hand from the Bytewax 0.21 semantics. Where a
runtime gives no global order (items of different keys after a stateful step), the
test compares per key (in order) or as a multiset; everywhere else it compares the
exact list.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Optional

import numpy as np
import pytest
from error_helpers import Boom, boom_on_2

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkCompileError, FlowsparkRuntimeError, FlowsparkTypeError
from flowspark.operators import StatefulBatchLogic, StatefulLogic
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSink, TestingSource, per_key

UTC = timezone.utc
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def at_eof_only(what: str, instead: str):
    """Mark a case whose output comes (partly) from end of input, which a stream never reaches."""
    return pytest.mark.notimpl(
        ["spark-streaming"],
        raises=AssertionError,
        reason=f"{what} at end of input, and a stream has none; on Spark streaming {instead}",
        end_of_input=True,
    )


def pipe(items: list[Any], build, flow_id: str = "t") -> tuple[Dataflow, list[Any]]:
    flow = Dataflow(flow_id)
    out: list[Any] = []
    s = op.input("inp", flow, TestingSource(items))
    op.output("out", build(s), TestingSink(out))
    return flow, out


def add_one(x: int) -> int:
    return x + 1


# --------------------------------------------------------------------------- stateless
def test_map(runtime):
    flow, out = pipe(list(range(10)), lambda s: op.map("m", s, add_one))
    runtime.run(flow)
    assert out == list(range(1, 11))


def test_many_items_keep_order(runtime):
    flow, out = pipe(list(range(5000)), lambda s: op.map("m", s, lambda x: x * 2))
    runtime.run(flow)
    assert out == [2 * x for x in range(5000)]


def test_flat_map_keeps_order_of_sub_items(runtime):
    flow, out = pipe([1, 2, 3], lambda s: op.flat_map("fm", s, lambda x: [x] * x))
    runtime.run(flow)
    assert out == [1, 2, 2, 3, 3, 3]


def test_flat_map_batch(runtime):
    flow, out = pipe([1, 2, 3], lambda s: op.flat_map_batch("fmb", s, lambda xs: [x * 10 for x in xs]))
    runtime.run(flow)
    assert out == [10, 20, 30]


def test_flatten_filter_filter_map(runtime):
    def build(s):
        s = op.flatten("fl", s)
        s = op.filter("f", s, lambda x: x % 2 == 0)
        return op.filter_map("fm", s, lambda x: None if x == 4 else x * 100)

    flow, out = pipe([[1, 2], [], [3, 4, 5, 6]], build)
    runtime.run(flow)
    assert out == [200, 600]


def test_keyed_stateless_operators(runtime):
    def build(s):
        k = op.key_on("k", s, lambda x: x["u"])
        k = op.map_value("mv", k, lambda x: x["n"])
        k = op.filter_value("fv", k, lambda n: n > 0)
        k = op.flat_map_value("fmv", k, lambda n: range(n))
        k = op.filter_map_value("fmv2", k, lambda n: n * 2 if n else None)
        return op.key_rm("rm", k)

    items = [{"u": "a", "n": 2}, {"u": "b", "n": 0}, {"u": "a", "n": 3}]
    flow, out = pipe(items, build)
    runtime.run(flow)
    assert out == [2, 2, 4]


def test_branch_and_merge(runtime):
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource(list(range(8))))
    b = op.branch("b", s, lambda x: x % 2 == 0)
    evens = op.map("e", b.trues, lambda x: ("even", x))
    odds = op.map("o", b.falses, lambda x: ("odd", x))
    merged = op.merge("m", evens, odds)
    out_e: list[Any] = []
    out_m: list[Any] = []
    op.output("oe", evens, TestingSink(out_e))
    op.output("om", merged, TestingSink(out_m))
    runtime.run(flow)
    assert out_e == [("even", x) for x in (0, 2, 4, 6)]
    assert sorted(out_m) == sorted([("even", x) for x in (0, 2, 4, 6)] + [("odd", x) for x in (1, 3, 5, 7)])
    # Each upstream keeps its order through the merge.
    assert [x for x in out_m if x[0] == "odd"] == [("odd", x) for x in (1, 3, 5, 7)]


def test_merge_of_two_inputs(runtime):
    flow = Dataflow("t")
    a = op.input("a", flow, TestingSource([1, 2, 3]))
    b = op.input("b", flow, TestingSource([10, 20]))
    out: list[Any] = []
    op.output("out", op.merge("m", a, b), TestingSink(out))
    runtime.run(flow)
    assert sorted(out) == [1, 2, 3, 10, 20]
    assert [x for x in out if x < 10] == [1, 2, 3]
    assert [x for x in out if x >= 10] == [10, 20]


def test_one_stream_two_consumers(runtime):
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource([1, 2, 3]))
    a: list[Any] = []
    b: list[Any] = []
    op.output("a", op.map("double", s, lambda x: 2 * x), TestingSink(a))
    op.output("b", op.map("neg", s, lambda x: -x), TestingSink(b))
    runtime.run(flow)
    assert a == [2, 4, 6]
    assert b == [-1, -2, -3]


def test_redistribute(runtime):
    flow, out = pipe(list(range(20)), lambda s: op.redistribute("r", op.map("m", s, add_one)))
    runtime.run(flow)
    assert out == list(range(1, 21))


@pytest.mark.notimpl(
    ["spark-streaming"],
    raises=AssertionError,
    reason="the streaming case runs twice on one checkpoint, and the restart continues after the EOF marker "
    "(as run_main resumed from recovery does)",
    end_of_input=True,
)
def test_testing_source_eof_marker_ends_input(runtime):
    flow, out = pipe([1, 2, TestingSource.EOF(), 3], lambda s: s)
    runtime.run(flow)
    assert out == [1, 2]


def test_empty_input(runtime):
    flow, out = pipe([], lambda s: op.count_final("c", s, lambda x: "k"))
    runtime.run(flow)
    assert out == []


def test_inspect_prints_at_the_caller(runtime, capsys):
    flow, out = pipe(["a", "b"], lambda s: op.inspect("show", s))
    runtime.run(flow)
    assert capsys.readouterr().out == "t.show: 'a'\nt.show: 'b'\n"
    assert out == ["a", "b"]


def test_inspect_custom_inspector_runs_in_caller_process(runtime):
    seen: list[Any] = []
    flow, out = pipe([3, 1, 2], lambda s: op.inspect("spy", s, lambda sid, x: seen.append((sid, x))))
    runtime.run(flow)
    assert seen == [("t.spy", 3), ("t.spy", 1), ("t.spy", 2)]


def test_inspect_debug(runtime):
    seen: list[Any] = []
    flow, _ = pipe([5, 6], lambda s: op.inspect_debug("dbg", s, lambda sid, x, ep, w: seen.append((sid, x))))
    runtime.run(flow)
    assert seen == [("t.dbg", 5), ("t.dbg", 6)]


def test_stdout_sink(runtime, capsys):
    flow = Dataflow("t")
    op.output("out", op.input("inp", flow, TestingSource(["x", 1, (2, 3)])), StdOutSink())
    runtime.run(flow)
    assert capsys.readouterr().out == "x\n1\n(2, 3)\n"


def test_raises_fails_on_an_item(runtime):
    flow = Dataflow("t")
    op.raises("boom", op.input("inp", flow, TestingSource([1])))
    with pytest.raises(FlowsparkRuntimeError) as ei:
        runtime.run(flow)
    assert "t.boom" in str(ei.value)


# --------------------------------------------------------------------------- stateful
EVENTS = [("a", 1), ("b", 10), ("a", 2), ("c", 100), ("b", 20), ("a", 3)]


def keyed(s):
    return op.key_on("k", s, lambda kv: kv[0])


def test_stateful_map_running_sum(runtime):
    def build(s):
        k = op.map_value("v", keyed(s), lambda kv: kv[1])
        return op.stateful_map("sum", k, lambda st, v: ((st or 0) + v, (st or 0) + v))

    flow, out = pipe(EVENTS, build)
    runtime.run(flow)
    assert per_key(out) == {"a": [1, 3, 6], "b": [10, 30], "c": [100]}
    assert sorted(out) == sorted([("a", 1), ("b", 10), ("a", 3), ("c", 100), ("b", 30), ("a", 6)])


def test_stateful_map_discard(runtime):
    def mapper(st, v):
        n = (st or 0) + 1
        return (None if n == 2 else n), n

    flow, out = pipe(["x"] * 5, lambda s: op.stateful_map("m", op.key_on("k", s, lambda x: x), mapper))
    runtime.run(flow)
    assert out == [("x", 1), ("x", 2), ("x", 1), ("x", 2), ("x", 1)]


def test_stateful_flat_map(runtime):
    def mapper(st, v):
        st = (st or 0) + v
        return st, [st] * v

    flow, out = pipe(
        [("a", 1), ("a", 2)],
        lambda s: op.stateful_flat_map("sfm", op.map_value("v", keyed(s), lambda kv: kv[1]), mapper),
    )
    runtime.run(flow)
    assert out == [("a", 1), ("a", 3), ("a", 3)]


@at_eof_only("fold_final, reduce_final and count_final emit", "the accumulators stay in state")
def test_fold_final_reduce_final_count_final(runtime):
    flow = Dataflow("t")
    s = op.input("inp", flow, TestingSource(EVENTS))
    k = op.map_value("v", keyed(s), lambda kv: kv[1])
    folded: list[Any] = []
    reduced: list[Any] = []
    counted: list[Any] = []
    op.output("f", op.fold_final("fold", k, list, lambda acc, v: [*acc, v]), TestingSink(folded))
    op.output("r", op.reduce_final("red", k, lambda a, b: a + b), TestingSink(reduced))
    op.output("c", op.count_final("cnt", s, lambda kv: kv[0]), TestingSink(counted))
    runtime.run(flow)
    assert sorted(folded) == [("a", [1, 2, 3]), ("b", [10, 20]), ("c", [100])]
    assert sorted(reduced) == [("a", 6), ("b", 30), ("c", 100)]
    assert sorted(counted) == [("a", 3), ("b", 2), ("c", 1)]


@at_eof_only("max_final and min_final emit", "the running max/min stays in state")
def test_max_min_final(runtime):
    flow = Dataflow("t")
    s = op.map_value("v", keyed(op.input("inp", flow, TestingSource(EVENTS))), lambda kv: kv[1])
    mx: list[Any] = []
    mn: list[Any] = []
    op.output("mx", op.max_final("max", s), TestingSink(mx))
    op.output("mn", op.min_final("min", s, by=lambda v: -v), TestingSink(mn))
    runtime.run(flow)
    assert sorted(mx) == [("a", 3), ("b", 20), ("c", 100)]
    assert sorted(mn) == [("a", 3), ("b", 20), ("c", 100)]


@at_eof_only("fold_final emits", "the accumulator stays in state")
def test_consecutive_stateful_steps_on_the_same_key(runtime):
    def build(s):
        k = op.map_value("v", keyed(s), lambda kv: kv[1])
        running = op.stateful_map("run", k, lambda st, v: ((st or 0) + v, (st or 0) + v))
        return op.fold_final("last", running, lambda: None, lambda acc, v: v)

    flow, out = pipe(EVENTS, build)
    runtime.run(flow)
    assert sorted(out) == [("a", 6), ("b", 30), ("c", 100)]


@at_eof_only("reduce_final and fold_final emit", "the accumulators stay in state")
def test_stateful_then_rekey_then_stateful(runtime):
    def build(s):
        k = op.map_value("v", keyed(s), lambda kv: kv[1])
        totals = op.reduce_final("tot", k, lambda a, b: a + b)
        everything = op.key_on("all", op.key_rm("rm", totals), lambda v: "all")
        return op.fold_final("list", everything, list, lambda acc, v: sorted([*acc, v]))

    flow, out = pipe(EVENTS, build)
    runtime.run(flow)
    assert out == [("all", [6, 30, 100])]


@at_eof_only("fold_final emits", "the accumulators stay in state")
@pytest.mark.parametrize("start_time", [None, T0], ids=["clock", "fixed"])
def test_end_of_input_in_sorted_key_order(runtime, start_time):
    # As bytewax 0.21.1: on_eof runs in sorted key order, not in the order keys arrived;
    # the next stateful step gets the results in that order too.
    def build(s):
        totals = op.fold_final("tot", s, lambda: 0, lambda acc, v: acc + v)
        everything = op.key_on("all", op.key_rm("rm", totals), lambda v: "all")
        op.output("each", totals, TestingSink(each))
        return op.fold_final("list", everything, list, lambda acc, v: [*acc, v])

    each: list[Any] = []
    flow, out = pipe([("c", 1), ("a", 2), ("b", 3), ("a", 4)], build)
    runtime.run(flow, start_time=start_time)
    assert each == [("a", 6), ("b", 3), ("c", 1)]
    assert out == [("all", [6, 3, 1])]


class Counter(StatefulLogic):
    def __init__(self, state: Optional[int]):
        self.n = state or 0

    def on_item(self, value):
        self.n += 1
        return [("item", value, self.n)], self.RETAIN

    def on_eof(self):
        return [("eof", self.n)], self.DISCARD

    def snapshot(self):
        return self.n


@at_eof_only("on_eof is called", "on_eof is never called (the items are emitted, the eof rows not)")
def test_stateful_logic_on_eof(runtime):
    flow, out = pipe(EVENTS, lambda s: op.stateful("st", keyed(s), Counter))
    runtime.run(flow)
    assert per_key(out) == {
        "a": [("item", ("a", 1), 1), ("item", ("a", 2), 2), ("item", ("a", 3), 3), ("eof", 3)],
        "b": [("item", ("b", 10), 1), ("item", ("b", 20), 2), ("eof", 2)],
        "c": [("item", ("c", 100), 1), ("eof", 1)],
    }


class BatchSum(StatefulBatchLogic):
    def __init__(self, state):
        self.total = state or 0

    def on_batch(self, values):
        self.total += sum(values)
        return [], self.RETAIN

    def on_eof(self):
        return [self.total], self.DISCARD

    def snapshot(self):
        return self.total


@at_eof_only("this logic emits only from on_eof", "on_eof is never called")
def test_stateful_batch(runtime):
    flow, out = pipe(EVENTS, lambda s: op.stateful_batch("sb", op.map_value("v", keyed(s), lambda kv: kv[1]), BatchSum))
    runtime.run(flow)
    assert sorted(out) == [("a", 6), ("b", 30), ("c", 100)]


def _join_sides(flow: Dataflow) -> tuple[Any, Any]:
    left = op.key_on("kl", op.input("l", flow, TestingSource([("a", 1), ("b", 2)])), lambda kv: kv[0])
    right = op.key_on("kr", op.input("r", flow, TestingSource([("a", "x"), ("c", "y")])), lambda kv: kv[0])
    return op.map_value("lv", left, lambda kv: kv[1]), op.map_value("rv", right, lambda kv: kv[1])


def test_join_complete_and_running(runtime):
    flow = Dataflow("t")
    left, right = _join_sides(flow)
    complete: list[Any] = []
    op.output("c", op.join("j", left, right), TestingSink(complete))
    runtime.run(flow)
    assert complete == [("a", (1, "x"))]


@at_eof_only("join(emit_mode='final') emits", "use emit_mode='complete' or 'running'")
def test_join_final(runtime):
    flow = Dataflow("t")
    left, right = _join_sides(flow)
    final: list[Any] = []
    op.output("f", op.join("jf", left, right, emit_mode="final"), TestingSink(final))
    runtime.run(flow)
    assert sorted(final, key=repr) == sorted([("a", (1, "x")), ("b", (2, None)), ("c", (None, "y"))], key=repr)


@at_eof_only("collect emits its last partial list", "it is emitted by max_size or the timeout only")
def test_collect_max_size_and_eof(runtime):
    flow, out = pipe(
        [("a", i) for i in range(5)],
        lambda s: op.collect("c", op.map_value("v", keyed(s), lambda kv: kv[1]), timedelta(hours=1), 2),
    )
    runtime.run(flow, start_time=T0)
    assert out == [("a", [0, 1]), ("a", [2, 3]), ("a", [4])]


def test_enrich_cached(runtime):
    calls: list[Any] = []

    def getter(k):
        calls.append(k)
        return k.upper()

    flow, out = pipe(["a", "b", "a"], lambda s: op.enrich_cached("e", s, getter, lambda cache, x: cache.get(x)))
    runtime.run(flow, start_time=T0)
    assert out == ["A", "B", "A"]


# --------------------------------------------------------------------------- timers
class Alarm(StatefulLogic):
    """Counts values; asks for a notification at a fixed time carried by the first value."""

    def __init__(self, state):
        self.at, self.n = state or (None, 0)

    def on_item(self, value):
        if self.at is None:
            self.at = value
        self.n += 1
        return [("item", self.n)], self.RETAIN

    def on_notify(self):
        self.at = None
        return [("notify", self.n)], self.RETAIN

    def on_eof(self):
        return [("eof", self.n)], self.DISCARD

    def notify_at(self):
        return self.at

    def snapshot(self):
        return (self.at, self.n)


@at_eof_only(
    "on_eof is called and due notifications fire before each value",
    "due notifications fire after each micro-batch's values, and on_eof is never called",
)
def test_notify_at_fires_against_the_logical_now(runtime):
    past = T0 - timedelta(minutes=1)
    future = T0 + timedelta(minutes=1)
    items = [("due", past), ("later", future), ("due", past), ("later", future)]
    flow, out = pipe(items, lambda s: op.stateful("al", op.map_value("v", keyed(s), lambda kv: kv[1]), Alarm))
    runtime.run(flow, start_time=T0)
    # "due": its time is before now: it fires before the next value and before EOF.
    # "later": never due during the run: only on_eof.
    assert per_key(out) == {
        "due": [("item", 1), ("notify", 1), ("item", 2), ("notify", 2), ("eof", 2)],
        "later": [("item", 1), ("item", 2), ("eof", 2)],
    }


class BadNotify(StatefulLogic):
    def __init__(self, state):
        pass

    def on_item(self, value):
        return [], self.RETAIN

    def notify_at(self):
        return datetime(2024, 1, 1)  # naive: not allowed

    def snapshot(self):
        return None


def test_notify_at_naive_datetime_is_an_error(runtime):
    flow, _ = pipe([("a", 1)], lambda s: op.stateful("bad", keyed(s), BadNotify))
    with pytest.raises(FlowsparkRuntimeError, match="t.bad.stateful_batch.*aware datetime"):
        runtime.run(flow, start_time=T0)


# --------------------------------------------------------------------------- windowing
def ev(minute: float, key: str = "k") -> tuple[str, tuple[datetime, int]]:
    return (key, (T0 + timedelta(minutes=minute), 1))


@at_eof_only("windows still open close", "a window closes when the watermark passes its end")
def test_tumbling_count_window(runtime):
    clock = win.EventClock(lambda v: v[0], timedelta(0))
    windower = win.TumblingWindower(timedelta(minutes=10), T0)
    items = [ev(1), ev(2, "j"), ev(11), ev(12), ev(25, "j"), ev(3)]

    flow = Dataflow("t")
    s = op.map_value("v", keyed(op.input("inp", flow, TestingSource(items))), lambda kv: kv[1])
    w = win.fold_window("fw", s, clock, windower, lambda: 0, lambda n, v: n + v[1], lambda a, b: a + b)
    down: list[Any] = []
    late: list[Any] = []
    op.output("down", w.down, TestingSink(down))
    op.output("late", w.late, TestingSink(late))
    runtime.run(flow, start_time=T0 + timedelta(days=1))
    assert per_key(down) == {"k": [(0, 1), (1, 2)], "j": [(0, 1), (2, 1)]}
    assert [(k, v[1][0]) for k, v in late] == [("k", T0 + timedelta(minutes=3))]


@at_eof_only("the last sessions close", "a session closes when the watermark passes its gap")
def test_session_window_collect(runtime):
    clock = win.EventClock(lambda v: v[0], timedelta(minutes=5))
    windower = win.SessionWindower(timedelta(minutes=2))
    items = [ev(0), ev(1), ev(10), ev(0.5), ev(11)]
    flow = Dataflow("t")
    s = op.map_value("v", keyed(op.input("inp", flow, TestingSource(items))), lambda kv: kv[1][0].minute)
    s = op.key_on("rk", op.key_rm("rm", s), lambda m: "k")
    # key_rm/key_on round trip keeps values: event times are minutes again.
    s2 = op.map_value("ts", s, lambda m: (T0 + timedelta(minutes=m), m))
    w = win.collect_window("cw", s2, clock, windower)
    down: list[Any] = []
    op.output("down", w.down, TestingSink(down))
    runtime.run(flow, start_time=T0)
    # The value at minute 0 arriving after minute 10 is behind the watermark (10 - 5): late.
    assert sorted((wid, [m for _, m in vals]) for _k, (wid, vals) in down) == [(0, [0, 1]), (1, [10, 11])]


# --------------------------------------------------------------------------- errors
def test_user_exception_names_the_step(runtime):
    flow, _ = pipe([1, 0], lambda s: op.map("div", s, lambda x: 1 / x))
    with pytest.raises(FlowsparkRuntimeError) as ei:
        runtime.run(flow)
    err = ei.value
    assert err.step_id == "t.div.flat_map_batch"
    assert "ZeroDivisionError" in str(err)
    assert "division by zero" in str(err)
    assert "py4j" not in str(err).lower()
    assert isinstance(err.__cause__, ZeroDivisionError)


def test_exception_in_stateful_logic_names_the_step(runtime):
    def mapper(st, v):
        if v == 3:
            raise KeyError("no three")
        return st, v

    flow, _ = pipe(EVENTS, lambda s: op.stateful_map("sm", op.map_value("v", keyed(s), lambda kv: kv[1]), mapper))
    with pytest.raises(FlowsparkRuntimeError, match="t.sm.stateful_batch.*KeyError.*no three") as ei:
        runtime.run(flow)
    assert ei.value.step_id == "t.sm.stateful_batch"


def test_non_str_key_is_a_clear_error(runtime):
    flow, _ = pipe([(1, "x")], lambda s: op.reduce_final("r", s, lambda a, b: a))
    with pytest.raises(FlowsparkRuntimeError, match="keys must be str") as ei:
        runtime.run(flow)
    assert ei.value.step_id == "t.r.stateful_batch"
    assert isinstance(ei.value.__cause__, FlowsparkTypeError)


def test_not_a_pair_is_a_clear_error(runtime):
    flow, _ = pipe(["just a string"], lambda s: op.reduce_final("r", s, lambda a, b: a))
    with pytest.raises(FlowsparkRuntimeError, match="requires `\\(key, value\\)` 2-tuple items"):
        runtime.run(flow)


@pytest.mark.notimpl(
    ["spark"],
    raises=FlowsparkCompileError,
    match="TestingSource.ABORT cannot run on the Spark batch runtime",
    reason="a batch job has no epoch boundary to abort at",
)
def test_abort_marker(runtime):
    flow, out = pipe([1, TestingSource.ABORT(), 2], lambda s: s)
    runtime.run(flow)
    assert out == [1]


def test_a_keyed_stream_read_by_a_sink_and_a_stateful_step(runtime):
    """The sink still gets whole `(key, value)` items while the stateful step reads the same port."""
    flow = Dataflow("shared")
    raw: list[Any] = []
    totals: list[Any] = []
    items = [("a", 1), ("b", 2), ("a", np.int64(3)), ("b", (4, "x"))]
    k = op.input("inp", flow, TestingSource(items))
    op.output("raw", k, TestingSink(raw))
    op.output("out", op.stateful_map("n", k, lambda st, v: ((st or 0) + 1, ((st or 0) + 1, v))), TestingSink(totals))
    runtime.run(flow)
    assert raw == items
    assert [type(v) for _, v in raw] == [int, int, np.int64, tuple]
    assert per_key(totals) == {"a": [(1, 1), (2, np.int64(3))], "b": [(1, 2), (2, (4, "x"))]}


def _div_by_zero_on_b(state, value):
    if value == "b":
        return state, 1 / 0
    return state, value


def test_a_user_error_in_a_stateful_step_reads_the_same_on_every_runtime(runtime):
    flow, _ = pipe([("a", "a"), ("b", "b")], lambda s: op.stateful_map("s", s, _div_by_zero_on_b))
    with pytest.raises(FlowsparkRuntimeError) as info:
        runtime.run(flow)
    err = info.value
    assert str(err) == "error in step 't.s.stateful_batch' for key 'b': ZeroDivisionError: division by zero"
    assert (err.step_id, err.key, err.exc_type, err.exc_message) == (
        "t.s.stateful_batch",
        "b",
        "ZeroDivisionError",
        "division by zero",
    )
    assert isinstance(err.__cause__, ZeroDivisionError)


def test_a_user_error_is_the_cause_of_the_runtime_error(runtime):
    """The step's own exception is the `__cause__` on every runtime (on Spark: pickled in the worker)."""
    flow, _ = pipe([1, 2, 3], lambda s: op.map("m", s, boom_on_2))
    with pytest.raises(FlowsparkRuntimeError) as info:
        runtime.run(flow)
    err = info.value
    assert str(err) == "error in step 't.m.flat_map_batch': Boom: kaboom on 2 (item: 2)"
    assert not isinstance(err, Boom)
    assert isinstance(err.__cause__, Boom)
    assert err.__cause__.args == ("kaboom on 2",)


@pytest.mark.notimpl(
    ["spark-streaming"],
    raises=AssertionError,
    reason="a stage fused into the Python data source is pickled again by Spark on the way, so a class "
    "defined inside a function comes back as an equal copy (a module-level class is found by its name)",
)
def test_a_user_error_of_a_class_defined_in_a_function_is_the_cause_as_that_class(runtime):
    """A class defined in the user's script or a function (pickled by value) comes back as the same class."""

    class LocalBoom(Exception):
        pass

    def mapper(x):
        if x == 2:
            msg = f"kaboom on {x}"
            raise LocalBoom(msg)
        return x

    flow, _ = pipe([1, 2, 3], lambda s: op.map("m", s, mapper))
    with pytest.raises(FlowsparkRuntimeError) as info:
        runtime.run(flow)
    assert str(info.value) == "error in step 't.m.flat_map_batch': LocalBoom: kaboom on 2 (item: 2)"
    assert type(info.value.__cause__) is LocalBoom
    assert info.value.__cause__.args == ("kaboom on 2",)


@pytest.mark.parametrize("bad", [(1, 2), 5, ("a", 1, 2)])
def test_a_bad_item_before_a_stateful_step_is_also_a_type_error(runtime, bad):
    """As in Bytewax, which raises TypeError: a test ported from it catches flowspark's error."""
    flow, _ = pipe([("ok", 1), bad], lambda s: op.stateful_map("s", s, lambda st, v: (st, v)))
    with pytest.raises(TypeError) as info:
        runtime.run(flow)
    assert isinstance(info.value, FlowsparkRuntimeError)
    assert info.value.step_id == "t.s.stateful_batch"


def _needs_user(e: dict) -> str:
    return e["user"]


def test_a_user_error_in_a_stateless_step_names_the_item(runtime):
    flow, _ = pipe([{"user": "a"}, {"nouser": 1}, {"user": "b"}], lambda s: op.key_on("k", s, _needs_user))
    with pytest.raises(FlowsparkRuntimeError) as info:
        runtime.run(flow)
    assert str(info.value) == "error in step 't.k.flat_map_batch': KeyError: 'user' (item: {'nouser': 1})"
    assert info.value.item == "{'nouser': 1}"
