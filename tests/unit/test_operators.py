"""Every operator on the in-memory executor, and the logic classes driven directly."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

import pytest

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark import ir
from flowspark._time import use_clock, utc_now
from flowspark.dataflow import Dataflow, Stream
from flowspark.errors import FlowsparkBuildError, FlowsparkRuntimeError, FlowsparkTypeError
from flowspark.inputs import DynamicSource, StatelessSourcePartition
from flowspark.testing import TestingSink, TestingSource, TimeTestingGetter, per_key, run_main

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
PAUSE0 = TestingSource.PAUSE(timedelta(0))  # ends the executor's pass: what follows is a new batch
# Input idle on the real clock while notifications a few ms ahead fire; tests assert the order
# of events only. Long enough that a loaded machine does not reorder them.
IDLE = TestingSource.PAUSE(timedelta(seconds=0.5))


def run(
    items: list[Any],
    build: Callable[[Stream[Any]], Stream[Any]],
    *,
    batch_size: int = 1,
    **run_kw: Any,
) -> list[Any]:
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource(items, batch_size))
    out: list[Any] = []
    op.output("out", build(s), TestingSink(out))
    run_main(flow, **run_kw)
    return out


def run_fails(items: list[Any], build: Callable[[Stream[Any]], Stream[Any]]) -> FlowsparkRuntimeError:
    with pytest.raises(FlowsparkRuntimeError) as info:
        run(items, build)
    return info.value


def builder_of(flow: Dataflow, step_prefix: str) -> Callable[[Any], Any]:
    """The StatefulBatch builder of the core step under `step_prefix` (to drive logic directly)."""
    for node in flow.graph().nodes:
        if isinstance(node, ir.StatefulBatch) and node.step_id.startswith(step_prefix):
            return node.builder
    raise AssertionError(step_prefix)


# ---------------------------------------------------------------------------
# input / output
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 2, 7, 100])
def test_input_reads_every_item_in_order(batch_size):
    items = list(range(23))
    assert run(items, lambda s: s, batch_size=batch_size) == items


def test_input_dynamic_source():
    class Part(StatelessSourcePartition):
        def __init__(self):
            self.batches = [[1, 2], [], [3]]

        def next_batch(self):
            if not self.batches:
                raise StopIteration
            return self.batches.pop(0)

    class Src(DynamicSource):
        def build(self, step_id, worker_index, worker_count):
            assert (step_id, worker_index, worker_count) == ("f.inp", 0, 1)
            return Part()

    flow = Dataflow("f")
    out: list[int] = []
    op.output("out", op.input("inp", flow, Src()), TestingSink(out))
    run_main(flow)
    assert out == [1, 2, 3]


def test_input_rejects_non_source():
    flow = Dataflow("f")
    with pytest.raises(FlowsparkTypeError, match=r"step 'f\.inp': source must be a flowspark Source"):
        op.input("inp", flow, [1, 2])


def test_output_rejects_non_sink():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    with pytest.raises(FlowsparkTypeError, match=r"step 'f\.out': sink must be a flowspark Sink"):
        op.output("out", s, [])


def test_output_sink_error_names_step():
    from flowspark.outputs import DynamicSink, StatelessSinkPartition

    class Boom(StatelessSinkPartition):
        def write_batch(self, items):
            raise OSError("disk full")

    class Sink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return Boom()

    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, TestingSource([1])), Sink())
    with pytest.raises(FlowsparkRuntimeError, match=r"'f\.out'.*disk full") as info:
        run_main(flow)
    assert isinstance(info.value.__cause__, OSError)


def _partitioned_sink(got: dict[str, list[Any]], parts: list[str]) -> Any:
    from flowspark.outputs import FixedPartitionedSink, StatefulSinkPartition

    class Part(StatefulSinkPartition):
        def __init__(self, name, resume):
            self.name = name
            self.n = resume or 0

        def write_batch(self, values):
            self.n += len(values)
            got.setdefault(self.name, []).extend(values)

        def snapshot(self):
            return self.n

    class Sink(FixedPartitionedSink):
        def list_parts(self):
            return parts

        def part_fn(self, item_key):
            return int(item_key)

        def build_part(self, step_id, for_part, resume_state):
            return Part(for_part, resume_state)

    return Sink()


def test_partitioned_sink_routes_by_part_fn_over_sorted_partitions():
    got: dict[str, list[Any]] = {}
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([("0", "v0"), ("1", "v1"), ("2", "v2"), ("4", "v4"), ("-1", "v-1")]))
    op.output("out", s, _partitioned_sink(got, ["zz", "aa", "mm"]))
    run_main(flow)
    # Values only (keys dropped); index part_fn(key) wraps over ["aa", "mm", "zz"].
    assert got == {"aa": ["v0"], "mm": ["v1", "v4"], "zz": ["v2", "v-1"]}


def test_partitioned_sink_needs_keyed_items():
    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, TestingSource(["x"])), _partitioned_sink({}, ["p"]))
    with pytest.raises(FlowsparkTypeError, match=r"step 'f\.out'.*needs `\(str key, value\)` items"):
        run_main(flow)


# ---------------------------------------------------------------------------
# inspect / inspect_debug
# ---------------------------------------------------------------------------


def test_inspect_default_prints_step_id_and_repr(capsys):
    out = run(["a", 1], lambda s: op.inspect("look", s))
    assert out == ["a", 1]
    assert capsys.readouterr().out == "f.look: 'a'\nf.look: 1\n"


def test_inspect_custom_inspector():
    seen = []
    out = run([1, 2], lambda s: op.inspect("look", s, lambda sid, x: seen.append((sid, x))))
    assert out == [1, 2]
    assert seen == [("f.look", 1), ("f.look", 2)]


def test_inspect_debug_default_format(capsys):
    out = run([("k", 1)], lambda s: op.inspect_debug("dbg", s))
    assert out == [("k", 1)]
    assert capsys.readouterr().out == "f.dbg W0 @1: ('k', 1)\n"


def test_inspect_debug_custom_gets_epoch_and_worker():
    seen = []
    run([1, 2], lambda s: op.inspect_debug("dbg", s, lambda *a: seen.append(a)))
    assert seen == [("f.dbg", 1, 1, 0), ("f.dbg", 2, 1, 0)]


def test_inspect_debug_epoch_advances():
    seen = []
    items = [1, PAUSE0, 2, PAUSE0, 3]
    run(items, lambda s: op.inspect_debug("dbg", s, lambda *a: seen.append(a)), epoch_interval=timedelta(0))
    epochs = [e for _sid, _x, e, _w in seen]
    assert [x for _sid, x, _e, _w in seen] == [1, 2, 3]
    assert epochs == sorted(epochs)
    assert epochs[0] < epochs[-1]


def test_inspect_rejects_non_callable():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    with pytest.raises(FlowsparkTypeError, match=r"'f\.look': inspector must be callable"):
        op.inspect("look", s, "print")


# ---------------------------------------------------------------------------
# Stateless operators
# ---------------------------------------------------------------------------


def test_map():
    assert run([1, 2, 3], lambda s: op.map("m", s, lambda x: x * 10)) == [10, 20, 30]


def test_map_value():
    out = run([("a", 1), ("b", 2)], lambda s: op.map_value("m", s, lambda v: v + 1))
    assert out == [("a", 2), ("b", 3)]


def test_map_value_on_unkeyed_item_names_step():
    err = run_fails([5], lambda s: op.map_value("m", s, str))
    assert "'f.m'" in str(err)
    assert isinstance(err.__cause__, FlowsparkTypeError)
    assert "requires `(key, value)` 2-tuple items; received 5" in str(err.__cause__)


def test_filter():
    assert run(list(range(6)), lambda s: op.filter("f", s, lambda x: x % 2 == 0)) == [0, 2, 4]


def test_filter_non_bool_predicate():
    err = run_fails([1], lambda s: op.filter("odd", s, lambda x: x % 2))
    assert "step 'f.odd': the return value of predicate must be a `bool`; returned 1" in str(err)


def test_filter_value():
    out = run([("a", 1), ("a", -1), ("b", 3)], lambda s: op.filter_value("pos", s, lambda v: v > 0))
    assert out == [("a", 1), ("b", 3)]


def test_filter_value_non_bool_predicate():
    err = run_fails([("a", 1)], lambda s: op.filter_value("pos", s, lambda v: None))
    assert "step 'f.pos': the return value of predicate must be a `bool`" in str(err)


def test_filter_map():
    out = run(["1", "x", "3", "0"], lambda s: op.filter_map("p", s, lambda x: int(x) if x.isdigit() else None))
    assert out == [1, 3, 0]  # 0 is falsy but not None: kept


def test_filter_map_value():
    out = run([("a", 0), ("a", 1), ("b", 2)], lambda s: op.filter_map_value("p", s, lambda v: None if v == 1 else v))
    assert out == [("a", 0), ("b", 2)]


def test_flat_map():
    out = run(["a b", "", "c"], lambda s: op.flat_map("split", s, str.split))
    assert out == ["a", "b", "c"]


def test_flat_map_generator_results():
    out = run([2, 0, 3], lambda s: op.flat_map("rng", s, lambda n: (i for i in range(n))))
    assert out == [0, 1, 0, 1, 2]


def test_flat_map_non_iterable_names_step():
    err = run_fails([1], lambda s: op.flat_map("fm", s, lambda x: x))
    assert "step 'f.fm': mapper must return an iterable" in str(err)
    assert "returned 1 of type int" in str(err)


def test_flat_map_value():
    out = run([("a", 2), ("b", 0), ("c", 1)], lambda s: op.flat_map_value("rep", s, lambda v: [v] * v))
    assert out == [("a", 2), ("a", 2), ("c", 1)]


def test_flat_map_value_non_iterable_names_step():
    err = run_fails([("a", 1)], lambda s: op.flat_map_value("fm", s, lambda v: v))
    assert "step 'f.fm': mapper must return an iterable" in str(err)


def test_flat_map_batch_sees_whole_batches():
    seen: list[list[int]] = []

    def mapper(xs):
        seen.append(list(xs))
        return [sum(xs)]

    out = run([1, 2, 3, PAUSE0, 4, 5], lambda s: op.flat_map_batch("b", s, mapper), batch_size=2)
    assert seen == [[1, 2, 3], [4, 5]]
    assert out == [6, 9]


def test_flat_map_batch_non_iterable_names_step():
    err = run_fails([1], lambda s: op.flat_map_batch("b", s, len))
    assert "step 'f.b': mapper must return an iterable" in str(err)


def test_flat_map_batch_shared_upstream_is_not_mutated():
    # Two consumers of one stream: a mapper mutating its list must not affect the other.
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1, 2]))

    def evil(xs):
        xs.append(99)
        return xs

    a: list[int] = []
    b: list[int] = []
    op.output("a", op.flat_map_batch("evil", s, evil), TestingSink(a))
    op.output("b", op.map("same", s, lambda x: x), TestingSink(b))
    run_main(flow)
    assert a == [1, 2, 99]
    assert b == [1, 2]


@pytest.mark.parametrize("through", ["inspect", "inspect_debug", "redistribute"])
def test_mutating_mapper_behind_pass_through_step_does_not_leak(through):
    # inspect/redistribute pass their batch on unchanged; a mutating mapper behind them
    # must not change what a sibling consumer of the same upstream sees.
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1, 2]))
    if through == "inspect":
        p = op.inspect("p", s, lambda _sid, _x: None)
    elif through == "inspect_debug":
        p = op.inspect_debug("p", s, lambda *_a: None)
    else:
        p = op.redistribute("p", s)

    def evil(xs):
        xs.append(99)
        return xs

    a: list[int] = []
    b: list[int] = []
    op.output("a", op.flat_map_batch("evil", p, evil), TestingSink(a))
    op.output("b", s, TestingSink(b))
    run_main(flow)
    assert a == [1, 2, 99]
    assert b == [1, 2]


def test_mutating_sink_does_not_leak_to_sibling_consumer():
    from flowspark.outputs import DynamicSink, StatelessSinkPartition

    class Clearing(StatelessSinkPartition):
        def write_batch(self, items):
            items.clear()

    class Sink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return Clearing()

    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1, 2]))
    op.output("clear", s, Sink())
    b: list[int] = []
    op.output("b", op.map("same", s, lambda x: x), TestingSink(b))
    run_main(flow)
    assert b == [1, 2]


def test_flatten():
    assert run([[1, 2], [], (3,)], lambda s: op.flatten("fl", s)) == [1, 2, 3]


def test_flatten_non_iterable_names_step():
    err = run_fails([1], lambda s: op.flatten("fl", s))
    assert "step 'f.fl': flatten requires upstream to be iterables (lists, tuples, ...); received 1" in str(err)


def test_branch():
    flow = Dataflow("f")
    b = op.branch("even", op.input("inp", flow, TestingSource(list(range(7)))), lambda x: x % 2 == 0)
    assert isinstance(b, op.BranchOut)
    t: list[int] = []
    f: list[int] = []
    op.output("t", b.trues, TestingSink(t))
    op.output("f_", b.falses, TestingSink(f))
    run_main(flow)
    assert t == [0, 2, 4, 6]
    assert f == [1, 3, 5]


def test_branch_non_bool_names_step():
    flow = Dataflow("f")
    b = op.branch("br", op.input("inp", flow, TestingSource([1])), lambda x: x)
    op.output("t", b.trues, TestingSink([]))
    with pytest.raises(
        FlowsparkRuntimeError, match=r"step 'f\.br': the return value of branch predicate must be a `bool`"
    ):
        run_main(flow)


def test_merge_keeps_per_upstream_order():
    flow = Dataflow("f")
    a = op.input("a", flow, TestingSource([("a", i) for i in range(50)], batch_size=3))
    b = op.input("b", flow, TestingSource([("b", i) for i in range(40)], batch_size=5))
    c = op.input("c", flow, TestingSource([("c", i) for i in range(10)]))
    out: list[tuple[str, int]] = []
    op.output("out", op.merge("m", a, b, c), TestingSink(out))
    run_main(flow)
    got = per_key(out)
    assert got == {"a": list(range(50)), "b": list(range(40)), "c": list(range(10))}


def test_merge_of_branches_and_single_upstream():
    def build(s):
        b = op.branch("br", s, lambda x: x < 3)
        return op.merge("m", op.merge("solo", b.trues), b.falses)

    assert sorted(run(list(range(6)), build)) == list(range(6))


def test_merge_needs_upstreams():
    with pytest.raises(FlowsparkTypeError, match="received no Dataflow or Stream"):
        op.merge("m")  # no stream at all: the flow cannot be found


def test_redistribute():
    assert run([3, 1, 2], lambda s: op.redistribute("r", s)) == [3, 1, 2]


def test_key_on_and_key_rm():
    out = run([{"u": "a", "n": 1}, {"u": "b", "n": 2}], lambda s: op.key_on("k", s, lambda e: e["u"]))
    assert out == [("a", {"u": "a", "n": 1}), ("b", {"u": "b", "n": 2})]
    out = run([("a", 1), ("b", 2)], lambda s: op.key_rm("rm", s))
    assert out == [1, 2]


def test_key_on_non_str_key_names_step():
    err = run_fails([7], lambda s: op.key_on("by_id", s, lambda x: x))
    assert err.step_id.startswith("f.by_id")
    assert isinstance(err.__cause__, TypeError)
    assert "step 'f.by_id': key function must return a str; returned 7 of type int" in str(err)


def test_key_rm_on_unkeyed_item_names_step():
    err = run_fails(["x"], lambda s: op.key_rm("rm", s))
    assert "step 'f.rm' requires `(key, value)` 2-tuple items; received 'x'" in str(err)


def test_stateful_step_rejects_non_str_keys_at_run_time():
    err = run_fails([(1, 2)], lambda s: op.stateful_map("sm", s, lambda st, v: (st, v)))
    assert "keys must be str; received key 1 of type int" in str(err)
    assert "'f.sm" in str(err)


def test_stateful_step_rejects_unkeyed_items():
    err = run_fails([5], lambda s: op.reduce_final("r", s, max))
    assert "requires `(key, value)` 2-tuple items; received 5" in str(err)


# ---------------------------------------------------------------------------
# enrich_cached / TTLCache
# ---------------------------------------------------------------------------


def test_ttl_cache_refetches_after_ttl():
    clock = TimeTestingGetter(T0)
    calls: list[str] = []

    def getter(k):
        calls.append(k)
        return f"{k}@{clock.get().second}"

    cache = op.TTLCache(getter, clock.get, timedelta(seconds=10))
    assert cache.get("a") == "a@0"
    clock.advance(timedelta(seconds=10))
    assert cache.get("a") == "a@0"  # exactly ttl old: still fresh
    clock.advance(timedelta(seconds=1))
    assert cache.get("a") == "a@11"
    assert cache.get("b") == "b@11"
    cache.remove("a")
    assert cache.get("a") == "a@11"
    assert calls == ["a", "a", "b", "a"]


def test_enrich_cached_uses_cache_and_refetches_after_ttl():
    clock = TimeTestingGetter(T0)
    calls: list[str] = []

    def getter(k):
        calls.append(k)
        return len(calls)

    def tick(_sid, x):
        if x == "tick":
            clock.advance(timedelta(seconds=61))

    def build(s):
        s = op.inspect("tick", s, tick)
        s = op.filter("no_tick", s, lambda x: x != "tick")
        return op.enrich_cached(
            "e", s, getter, lambda c, x: (x, c.get(x)), ttl=timedelta(seconds=60), _now_getter=clock.get
        )

    out = run(["k", "j", "k", PAUSE0, "k", PAUSE0, "tick", "k", "j"], build)
    assert out == [("k", 1), ("j", 2), ("k", 1), ("k", 1), ("k", 3), ("j", 4)]
    assert calls == ["k", "j", "k", "j"]


@pytest.mark.parametrize(
    ("batch_size", "want", "fetches"),
    # Bytewax 0.21.1 gives these (one "now" per source batch; each batch goes through on its
    # own, so with batch_size=1 every item sees the clock its mapper moved).
    [(1, [1, 2, 3, 4], 4), (3, [1, 1, 1, 2], 2)],
)
def test_enrich_cached_now_is_fixed_per_batch(batch_size: int, want: list[int], fetches: int) -> None:
    clock = TimeTestingGetter(T0)
    calls: list[str] = []

    def getter(k):
        calls.append(k)
        return len(calls)

    def mapper(cache, x):
        v = cache.get(x)
        clock.advance(timedelta(hours=1))  # time passes inside the batch: the batch's "now" does not move
        return v

    out = run(
        ["k", "k", "k", PAUSE0, "k"],
        lambda s: op.enrich_cached("e", s, getter, mapper, ttl=timedelta(seconds=1), _now_getter=clock.get),
        batch_size=batch_size,
    )
    assert out == want
    # a batch's "now" stands still, so an entry fetched in it stays fresh for the batch
    assert calls == ["k"] * fetches


# ---------------------------------------------------------------------------
# raises
# ---------------------------------------------------------------------------


def test_raises_accepts_empty_stream():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1, 2]))
    op.raises("never", op.filter("none", s, lambda x: False))
    run_main(flow)


def test_raises_on_item():
    flow = Dataflow("f")
    op.raises("never", op.input("inp", flow, TestingSource([1])))
    with pytest.raises(FlowsparkRuntimeError, match=r"'f\.never'") as info:
        run_main(flow)
    assert isinstance(info.value.__cause__, RuntimeError)


# ---------------------------------------------------------------------------
# Errors from user callables
# ---------------------------------------------------------------------------


class Oops(Exception):
    pass


def _boom(x):
    if x == 2:
        raise Oops(f"bad {x}")
    return x


@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("m", lambda s: op.map("m", s, _boom)),
        ("fm", lambda s: op.flat_map("fm", s, lambda x: [_boom(x)])),
        ("flt", lambda s: op.filter("flt", s, lambda x: _boom(x) > 0)),
        ("fmap", lambda s: op.filter_map("fmap", s, _boom)),
        ("insp", lambda s: op.inspect("insp", s, lambda _sid, x: _boom(x))),
        ("br", lambda s: op.branch("br", s, lambda x: _boom(x) > 0).trues),
        ("k", lambda s: op.key_on("k", s, lambda x: str(_boom(x)))),
        ("sm", lambda s: op.stateful_map("sm", op.key_on("key", s, str), lambda st, v: (1, _boom(v)))),
        ("ff", lambda s: op.fold_final("ff", op.key_on("key", s, str), int, lambda a, v: _boom(v))),
    ],
)
def test_user_exception_surfaces_naming_step(name, build):
    err = run_fails([1, 2, 3], build)
    assert err.step_id.startswith(f"f.{name}")
    assert f"'f.{name}" in str(err)
    assert "Oops: bad 2" in str(err)
    assert isinstance(err.__cause__, Oops)
    assert str(err.__cause__) == "bad 2"
    assert isinstance(err, RuntimeError)


def test_stateful_map_bad_return_shape_names_step():
    err = run_fails([("a", 1)], lambda s: op.stateful_map("sm", s, lambda st, v: v))
    assert (
        "step 'f.sm': the return value of mapper must be a 2-tuple (updated_state, emit); returned 1 of type int"
        in str(err)
    )


def test_stateful_map_accepts_any_two_item_iterable():
    # Bytewax unpacks `state, emit = mapper(...)`, so a list works too.
    out = run([("a", 1), ("a", 2)], lambda s: op.stateful_map("sm", s, lambda st, v: [(st or 0) + v, v * 10]))
    assert out == [("a", 10), ("a", 20)]


def test_on_item_may_return_a_list():
    class ListReturn(_BadItem):
        def on_item(self, value):
            return [[value], self.RETAIN]

    assert run([("a", 1)], lambda s: op.stateful("st", s, ListReturn)) == [("a", 1)]


def test_stateful_flat_map_bad_return_shape_names_step():
    err = run_fails([("a", 1)], lambda s: op.stateful_flat_map("sfm", s, lambda st, v: [v]))
    assert "step 'f.sfm': the return value of mapper must be a 2-tuple" in str(err)


def test_stateful_flat_map_non_iterable_emits_names_step():
    err = run_fails([("a", 1)], lambda s: op.stateful_flat_map("sfm", s, lambda st, v: (st, v)))
    assert (
        "step 'f.sfm': the return value of mapper must be a 2-tuple (updated_state, iterable_of_emits); "
        "returned (None, 1)" in str(err)
    )


def test_on_item_non_iterable_emits_names_step():
    class NotIterable(_BadItem):
        def on_item(self, value):
            return value, self.RETAIN

    err = run_fails([("a", 1)], lambda s: op.stateful("st", s, NotIterable))
    assert "step 'f.st': on_item() must return (emits, discard) with an iterable of emits" in str(err)


class _BadItem(op.StatefulLogic):
    def __init__(self, _resume):
        pass

    def on_item(self, value):
        return [value]

    def snapshot(self):
        return None


def test_on_item_bad_return_shape_names_step():
    err = run_fails([("a", 1)], lambda s: op.stateful("st", s, _BadItem))
    assert "step 'f.st': on_item() must return a 2-tuple (emits, discard)" in str(err)


class _BadBatch(op.StatefulBatchLogic):
    def __init__(self, _resume):
        pass

    def on_batch(self, values):
        return values

    def snapshot(self):
        return None


def test_on_batch_bad_return_shape_names_step():
    err = run_fails([("a", 1)], lambda s: op.stateful_batch("sb", s, _BadBatch))
    assert "step 'f.sb': on_batch()/on_item() must return a 2-tuple (emits, discard)" in str(err)


def test_stateful_builder_bad_return_names_step():
    err = run_fails([("a", 1)], lambda s: op.stateful("st", s, lambda r: object()))
    assert "step 'f.st': builder must return a StatefulLogic" in str(err)
    err = run_fails([("a", 1)], lambda s: op.stateful_batch("sb", s, lambda r: 3))
    assert "step 'f.sb': builder must return a StatefulBatchLogic" in str(err)


def test_notify_at_naive_datetime_names_step():
    class Naive(_Recorder):
        def notify_at(self):
            return datetime(2024, 1, 1)  # noqa: DTZ001

    err = run_fails([("a", 1)], lambda s: op.stateful("st", s, Naive.builder([])))
    assert "notify_at() must return an aware datetime" in str(err)


@pytest.mark.parametrize(
    "build",
    [
        lambda f, s: op.map("m", s, 3),
        lambda f, s: op.filter("m", s, None),
        lambda f, s: op.stateful_map("m", s, "x"),
        lambda f, s: op.fold_final("m", s, list, 1),
        lambda f, s: op.collect("m", s, 5, 2),
        lambda f, s: op.collect("m", s, timedelta(1), 0),
    ],
)
def test_bad_arguments_fail_at_build_time(build):
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([]))
    with pytest.raises((FlowsparkTypeError, FlowsparkBuildError), match=r"step 'f\.m'"):
        build(flow, s)


# ---------------------------------------------------------------------------
# stateful_batch / stateful / StatefulLogic
# ---------------------------------------------------------------------------


class _Count(op.StatefulBatchLogic):
    def __init__(self, resume, batches):
        self.n = resume or 0
        self.batches = batches

    def on_batch(self, values):
        self.batches.append(list(values))
        self.n += len(values)
        return [self.n], self.RETAIN

    def snapshot(self):
        return self.n


@pytest.mark.parametrize(
    ("batch_size", "want_out", "want_batches"),
    [
        # One on_batch per key and source batch, keys in sorted order (as bytewax 0.21.1).
        (1, [("a", 1), ("a", 2), ("b", 1), ("a", 3), ("a", 4)], [[1], [2], [3], [4], [5]]),
        (2, [("a", 2), ("a", 3), ("b", 1), ("a", 4)], [[1, 2], [4], [3], [5]]),
        (3, [("a", 2), ("b", 1), ("a", 3), ("a", 4)], [[1, 2], [3], [4], [5]]),
    ],
)
def test_stateful_batch_gets_each_keys_values_of_a_source_batch(batch_size, want_out, want_batches):
    batches: list[list[int]] = []
    items = [("a", 1), ("a", 2), ("b", 3), ("a", 4), PAUSE0, ("a", 5)]
    out = run(items, lambda s: op.stateful_batch("c", s, lambda r: _Count(r, batches)), batch_size=batch_size)
    assert out == want_out
    assert batches == want_batches


class _Recorder(op.StatefulLogic):
    """Records every call in a shared event list; behaviour is set by class attributes."""

    DELAY = timedelta(milliseconds=3)

    def __init__(self, events, resume):
        self.events = events
        self.n = 0 if resume is None else resume
        self.at: Optional[datetime] = None
        events.append(("build", resume))

    @classmethod
    def builder(cls, events):
        return lambda resume: cls(events, resume)

    def on_item(self, value):
        self.n += 1
        self.events.append(("item", value))
        if value == "discard":
            return [("discarded", self.n)], self.DISCARD
        if value == "arm":
            self.at = utc_now() + self.DELAY
        return [("item", value, self.n)], self.RETAIN

    def on_notify(self):
        self.events.append(("notify", self.n))
        self.at = None
        return [("notify", self.n)], self.RETAIN

    def on_eof(self):
        self.events.append(("eof", self.n))
        return [("eof", self.n)], self.RETAIN

    def notify_at(self):
        return self.at

    def snapshot(self):
        return self.n


def test_stateful_discard_mid_batch_rebuilds_with_none():
    events: list[Any] = []
    items = [("a", 1), ("a", "discard"), ("a", 2), ("a", 3)]
    out = run(items, lambda s: op.stateful("st", s, _Recorder.builder(events)), batch_size=4)
    assert out == [
        ("a", ("item", 1, 1)),
        ("a", ("discarded", 2)),
        ("a", ("item", 2, 1)),
        ("a", ("item", 3, 2)),
        ("a", ("eof", 2)),
    ]
    assert [e for e in events if e[0] == "build"] == [("build", None), ("build", None)]


def test_stateful_discard_at_end_of_batch_then_new_key_state():
    events: list[Any] = []
    items = [("a", 1), ("a", "discard"), PAUSE0, ("a", 2)]
    out = run(items, lambda s: op.stateful("st", s, _Recorder.builder(events)))
    assert out == [("a", ("item", 1, 1)), ("a", ("discarded", 2)), ("a", ("item", 2, 1)), ("a", ("eof", 1))]


def test_stateful_logic_driven_directly():
    clock = TimeTestingGetter(T0)
    events: list[Any] = []
    with use_clock(clock.get):
        logic = _Recorder(events, None)
        assert logic.on_item("x") == ([("item", "x", 1)], op.StatefulLogic.RETAIN)
        assert logic.notify_at() is None
        assert logic.on_item("arm") == ([("item", "arm", 2)], False)
        assert logic.notify_at() == T0 + _Recorder.DELAY
        assert logic.on_notify() == ([("notify", 2)], False)
        assert logic.notify_at() is None
        assert logic.snapshot() == 2
        assert logic.on_eof() == ([("eof", 2)], False)
        assert logic.on_item("discard") == ([("discarded", 3)], True)
    resumed = _Recorder(events, 2)
    assert resumed.on_item("y") == ([("item", "y", 3)], False)


def test_logic_defaults():
    class Minimal(op.StatefulLogic):
        def on_item(self, value):
            return [value], self.RETAIN

        def snapshot(self):
            return None

    m = Minimal()
    assert (op.StatefulLogic.RETAIN, op.StatefulLogic.DISCARD) == (False, True)
    assert list(m.on_notify()[0]) == []
    assert m.on_notify()[1] is False
    assert list(m.on_eof()[0]) == []
    assert m.notify_at() is None

    class MinimalBatch(op.StatefulBatchLogic):
        def on_batch(self, values):
            return values, self.RETAIN

        def snapshot(self):
            return None

    b = MinimalBatch()
    assert list(b.on_eof()[0]) == []
    assert b.notify_at() is None
    with pytest.raises(TypeError):
        op.StatefulLogic()  # abstract


def test_notify_fires_on_system_time_while_input_paused():
    events: list[Any] = []
    items = [("a", "arm"), IDLE, ("a", "after")]
    out = run(items, lambda s: op.stateful("st", s, _Recorder.builder(events)))
    assert [e for e in events if e[0] != "build"] == [
        ("item", "arm"),
        ("notify", 1),
        ("item", "after"),
        ("eof", 2),
    ]
    assert out == [("a", ("item", "arm", 1)), ("a", ("notify", 1)), ("a", ("item", "after", 2)), ("a", ("eof", 2))]


def test_fired_notification_is_spent():
    # on_notify clears the time: no second notification although the input stays idle.
    events: list[Any] = []
    items = [("a", "arm"), IDLE, ("a", "x")]
    run(items, lambda s: op.stateful("st", s, _Recorder.builder(events)))
    assert [e[0] for e in events].count("notify") == 1


class _Rearm(_Recorder):
    def on_notify(self):
        res = super().on_notify()
        if sum(1 for e in self.events if e[0] == "notify") < 3:
            self.at = utc_now() + self.DELAY
        return res


def test_notification_rearms_when_notify_at_returns_a_time_again():
    events: list[Any] = []
    items = [("a", "arm"), IDLE, ("a", "x")]
    run(items, lambda s: op.stateful("st", s, _Rearm.builder(events)))
    kinds = [e[0] for e in events]
    assert kinds == ["build", "item", "notify", "notify", "notify", "item", "eof"]


class _ArmThenDiscard(_Recorder):
    def on_item(self, value):
        if value == "arm_and_discard":
            self.at = utc_now() + self.DELAY
            self.events.append(("item", value))
            return [], self.DISCARD
        return super().on_item(value)


def test_discard_drops_the_schedule():
    events: list[Any] = []
    items = [("a", "arm_and_discard"), IDLE, ("a", "x")]
    out = run(items, lambda s: op.stateful("st", s, _ArmThenDiscard.builder(events)))
    assert events == [("build", None), ("item", "arm_and_discard"), ("build", None), ("item", "x"), ("eof", 1)]
    assert out == [("a", ("item", "x", 1)), ("a", ("eof", 1))]


def test_on_eof_called_once_per_live_key_at_end():
    events: list[Any] = []
    items = [("a", 1), ("b", 1), ("b", "discard"), ("c", 1)]
    out = run(items, lambda s: op.stateful("st", s, _Recorder.builder(events)))
    eofs = sorted(v for _k, v in out if v[0] == "eof")
    assert eofs == [("eof", 1), ("eof", 1)]
    assert {k for k, v in out if v[0] == "eof"} == {"a", "c"}
    assert [e[0] for e in events][-2:] == ["eof", "eof"]


def test_notify_on_logical_clock_is_deterministic():
    events: list[Any] = []

    class Slow(_Recorder):
        DELAY = timedelta(minutes=5)

    items = [("a", "arm"), TestingSource.PAUSE(timedelta(hours=1)), ("a", "x")]
    out = run(items, lambda s: op.stateful("st", s, Slow.builder(events)), clock="logical", start_time=T0)
    assert [v[0] for _k, v in out] == ["item", "notify", "item", "eof"]


# ---------------------------------------------------------------------------
# stateful_map / stateful_flat_map
# ---------------------------------------------------------------------------


def _running(state, v):
    total = (state or 0) + v
    return total, total


def test_stateful_map_running_total_per_key():
    items = [("a", 1), ("b", 10), ("a", 2), ("b", 20), ("a", 3)]
    out = run(items, lambda s: op.stateful_map("sum", s, _running), batch_size=3)
    assert per_key(out) == {"a": [1, 3, 6], "b": [10, 30]}
    # Source batches of 3: each batch's items grouped by key, keys sorted (as bytewax 0.21.1).
    assert out == [("a", 1), ("a", 3), ("b", 10), ("a", 6), ("b", 30)]


def test_stateful_map_none_state_discards():
    seen_states: list[Any] = []

    def mapper(state, v):
        seen_states.append(state)
        if v == "reset":
            return None, "reset"
        state = (state or 0) + 1
        return state, state

    items = [("a", "x"), ("a", "x"), ("a", "reset"), ("a", "x"), PAUSE0, ("a", "reset"), PAUSE0, ("a", "x")]
    out = run(items, lambda s: op.stateful_map("sm", s, mapper))
    assert [v for _k, v in out] == [1, 2, "reset", 1, "reset", 1]
    assert seen_states == [None, 1, 2, None, 1, None]


def test_stateful_flat_map():
    def mapper(seen, v):
        seen = (seen or 0) + 1
        return (None if v == "stop" else seen), [v] * (seen % 2)

    items = [("a", "p"), ("a", "q"), ("a", "r"), ("b", "s"), ("a", "stop"), ("a", "t")]
    out = run(items, lambda s: op.stateful_flat_map("sfm", s, mapper))
    assert out == [("a", "p"), ("a", "r"), ("b", "s"), ("a", "t")]


# ---------------------------------------------------------------------------
# collect
# ---------------------------------------------------------------------------


def test_collect_max_size_and_eof():
    items = [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2), ("a", 4), ("a", 5)]
    out = run(items, lambda s: op.collect("c", s, timedelta(hours=1), max_size=2), batch_size=3)
    assert per_key(out) == {"a": [[1, 2], [3, 4], [5]], "b": [[1, 2]]}


def test_collect_timeout_while_input_paused_system_clock():
    items = [("a", 1), ("a", 2), IDLE, ("a", 3)]
    out = run(items, lambda s: op.collect("c", s, timedelta(milliseconds=5), max_size=100))
    assert out == [("a", [1, 2]), ("a", [3])]


def test_collect_timeout_logical_clock():
    items = [("a", 1), ("b", 1), TestingSource.PAUSE(timedelta(seconds=30)), ("a", 2), ("a", 3)]
    out = run(items, lambda s: op.collect("c", s, timedelta(seconds=10), max_size=100), clock="logical")
    assert out[:2] == [("a", [1]), ("b", [1])]
    assert out[2:] == [("a", [2, 3])]


def test_collect_timeout_counts_from_latest_item_injected_clock():
    # Drive collect's logic directly with an injected clock.
    clock = TimeTestingGetter(T0)
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([]))
    op.output("out", op.collect("c", s, timedelta(seconds=10), max_size=3, _now_getter=clock.get), TestingSink([]))
    logic = builder_of(flow, "f.c")(None)
    assert logic.on_batch([1]) == ([], False)
    assert logic.notify_at() == T0 + timedelta(seconds=10)
    clock.advance(timedelta(seconds=8))
    assert logic.on_batch([2]) == ([], False)
    assert logic.notify_at() == T0 + timedelta(seconds=18)  # from the latest item
    snap = logic.snapshot()
    assert snap.acc == [1, 2]
    emits, discard = logic.on_notify()
    assert (list(emits), discard) == ([[1, 2]], True)
    # Resume from the snapshot: the state and the deadline come back.
    resumed = builder_of(flow, "f.c")(snap)
    assert resumed.notify_at() == T0 + timedelta(seconds=18)
    emits, discard = resumed.on_batch([3, 4])
    assert (list(emits), discard) == ([[1, 2, 3]], False)  # max_size reached mid-batch; a fresh list keeps 4
    assert resumed.snapshot().acc == [4]
    emits, discard = resumed.on_eof()
    assert (list(emits), discard) == ([[4]], True)


def test_collect_timeout_with_use_clock_in_run_main():
    clock = TimeTestingGetter(T0)

    def ticker(_sid, item):
        # The item after the pause arrives "a minute later".
        if item == ("b", "late"):
            clock.advance(timedelta(minutes=1))

    def build(s):
        s = op.inspect("tick", s, ticker)
        return op.collect("c", s, timedelta(seconds=10), max_size=100)

    items = [("a", 1), ("a", 2), PAUSE0, ("b", "late"), PAUSE0, ("b", "x")]
    with use_clock(clock.get):
        out = run(items, build)
    # "a" timed out as soon as the clock jumped (same pass as b's item); "b" waits for EOF.
    assert out == [("a", [1, 2]), ("b", ["late", "x"])]


# ---------------------------------------------------------------------------
# *_final
# ---------------------------------------------------------------------------


def test_fold_final():
    items = [("a", 1), ("b", 5), ("a", 2), ("c", 0)]
    out = run(items, lambda s: op.fold_final("f", s, list, lambda acc, v: [*acc, v]), batch_size=2)
    assert sorted(out) == [("a", [1, 2]), ("b", [5]), ("c", [0])]


def test_fold_final_emits_only_at_eof():
    seen: list[Any] = []
    items = [("a", 1), PAUSE0, ("a", 2)]

    def build(s):
        s = op.fold_final("f", s, int, lambda acc, v: acc + v)
        return op.inspect("look", s, lambda _sid, x: seen.append(x))

    assert run(items, build) == [("a", 3)]
    assert seen == [("a", 3)]


def test_fold_final_builder_called_per_key():
    calls = []

    def builder():
        calls.append(1)
        return 0

    run([("a", 1), ("b", 1), ("a", 1)], lambda s: op.fold_final("f", s, builder, lambda a, v: a + v))
    assert len(calls) == 2


def test_reduce_final():
    items = [("a", "x"), ("b", "y"), ("a", "z"), ("a", "w")]
    out = run(items, lambda s: op.reduce_final("r", s, lambda a, b: a + b), batch_size=3)
    assert sorted(out) == [("a", "xzw"), ("b", "y")]


def test_reduce_final_keeps_none_values():
    # Bytewax 0.21.1 treats a `None` accumulator as "no value yet" and returns ('a', None)
    # here without calling the reducer; we call the reducer on every value after the first.
    out = run([("a", None), ("a", None)], lambda s: op.reduce_final("r", s, lambda a, b: (a, b)))
    assert out == [("a", (None, None))]


def test_count_final():
    out = run(["x", "y", "x", "x"], lambda s: op.count_final("c", s, lambda w: w))
    assert sorted(out) == [("x", 3), ("y", 1)]


def test_count_final_non_str_key_names_step():
    err = run_fails([1], lambda s: op.count_final("c", s, lambda w: w))
    assert "'f.c." in str(err)
    assert "key function must return a str" in str(err)


def test_max_min_final():
    items = [("a", 3), ("a", 7), ("b", -1), ("a", 5)]
    assert sorted(run(items, lambda s: op.max_final("mx", s))) == [("a", 7), ("b", -1)]
    assert sorted(run(items, lambda s: op.min_final("mn", s))) == [("a", 3), ("b", -1)]


def test_max_min_final_by_key_keeps_first_of_ties():
    items = [("a", ("x", 2)), ("a", ("y", 9)), ("a", ("z", 9)), ("a", ("w", 1)), ("a", ("v", 1))]
    assert run(items, lambda s: op.max_final("mx", s, by=lambda t: t[1])) == [("a", ("y", 9))]
    assert run(items, lambda s: op.min_final("mn", s, by=lambda t: t[1])) == [("a", ("w", 1))]


def test_final_state_is_discarded_at_eof():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([]))
    op.output("out", op.fold_final("ff", s, int, lambda a, v: a + v), TestingSink([]))
    logic = builder_of(flow, "f.ff")(None)
    assert logic.on_batch([1, 2]) == ((), False)
    assert logic.snapshot() == 3
    emits, discard = logic.on_eof()
    assert (list(emits), discard) == ([3], True)
    assert builder_of(flow, "f.ff")(10).on_eof()[0] == (10,)


# ---------------------------------------------------------------------------
# join
# ---------------------------------------------------------------------------


def _join_flow(events: list[tuple[str, str, Any]], **modes: str) -> list[tuple[str, Any]]:
    """`events` are (side, key, value); each is its own batch so the join sees them in this order."""
    items: list[Any] = []
    for e in events:
        items += [e, PAUSE0]

    def build(s):
        b = op.branch("side", s, lambda e: e[0] == "L")
        left = op.map("left", b.trues, lambda e: (e[1], e[2]))
        right = op.map("right", b.falses, lambda e: (e[1], e[2]))
        return op.join("j", left, right, **modes)

    return run(items, build)


JOIN_EVENTS = [("L", "k", "a1"), ("L", "k", "a2"), ("R", "k", "b1"), ("R", "k", "b2"), ("L", "solo", "s1")]

JOIN_EXPECTED = {
    ("first", "complete"): [("k", ("a1", "b1"))],
    ("last", "complete"): [("k", ("a2", "b1"))],
    ("product", "complete"): [("k", ("a1", "b1")), ("k", ("a2", "b1"))],
    ("first", "final"): [("k", ("a1", "b1")), ("solo", ("s1", None))],
    ("last", "final"): [("k", ("a2", "b2")), ("solo", ("s1", None))],
    ("product", "final"): [
        ("k", ("a1", "b1")),
        ("k", ("a1", "b2")),
        ("k", ("a2", "b1")),
        ("k", ("a2", "b2")),
        ("solo", ("s1", None)),
    ],
    ("first", "running"): [
        ("k", ("a1", None)),
        ("k", ("a1", None)),
        ("k", ("a1", "b1")),
        ("k", ("a1", "b1")),
        ("solo", ("s1", None)),
    ],
    ("last", "running"): [
        ("k", ("a1", None)),
        ("k", ("a2", None)),
        ("k", ("a2", "b1")),
        ("k", ("a2", "b2")),
        ("solo", ("s1", None)),
    ],
    ("product", "running"): [
        ("k", ("a1", None)),
        ("k", ("a1", None)),
        ("k", ("a2", None)),
        ("k", ("a1", "b1")),
        ("k", ("a2", "b1")),
        ("k", ("a1", "b1")),
        ("k", ("a1", "b2")),
        ("k", ("a2", "b1")),
        ("k", ("a2", "b2")),
        ("solo", ("s1", None)),
    ],
}


@pytest.mark.parametrize(("insert_mode", "emit_mode"), sorted(JOIN_EXPECTED))
def test_join_modes(insert_mode, emit_mode):
    out = _join_flow(JOIN_EVENTS, insert_mode=insert_mode, emit_mode=emit_mode)
    expected = JOIN_EXPECTED[(insert_mode, emit_mode)]
    assert per_key(out) == per_key(expected)


def test_join_complete_clears_and_joins_again():
    events = [("L", "k", 1), ("R", "k", 2), ("R", "k", 3), ("L", "k", 4)]
    assert _join_flow(events) == [("k", (1, 2)), ("k", (4, 3))]


def test_join_three_sides_in_argument_order():
    flow = Dataflow("f")
    a = op.input("a", flow, TestingSource([("k", "a")]))
    b = op.input("b", flow, TestingSource([("k", "b")]))
    c = op.input("c", flow, TestingSource([("k", "c"), ("z", "c")]))
    out: list[Any] = []
    op.output("out", op.join("j", c, a, b, emit_mode="final"), TestingSink(out))
    run_main(flow)
    assert sorted(out) == [("k", ("c", "a", "b")), ("z", ("c", None, None))]


@pytest.mark.parametrize(
    ("kw", "word"),
    [({"insert_mode": "all"}, "insert_mode"), ({"emit_mode": "eager"}, "emit_mode"), ({"emit_mode": None}, "emit")],
)
def test_join_bad_modes_fail_at_build_time(kw, word):
    flow = Dataflow("f")
    a = op.input("a", flow, TestingSource([]))
    with pytest.raises(ValueError, match=rf"step 'f\.j': unknown {word}"):
        op.join("j", a, a, **kw)


def test_stateful_step_accepts_tuple_and_str_subclasses():
    from collections import namedtuple

    pair = namedtuple("pair", "k v")  # noqa: PYI024

    class Key(str):
        pass

    items = [pair("a", 1), (Key("a"), 2), ("a", 3)]
    out = run(items, lambda s: op.stateful_map("sm", s, _running))
    assert [v for _k, v in out] == [1, 3, 6]


def test_join_of_two_sources_sees_items_batch_by_batch():
    # As in Bytewax, each source batch goes through the flow before the next one, so the
    # classic "join two TestingSources" pairs items in order.
    flow = Dataflow("f")
    a = op.input("a", flow, TestingSource([("k", f"a{i}") for i in range(3)]))
    b = op.input("b", flow, TestingSource([("k", f"b{i}") for i in range(3)]))
    out: list[Any] = []
    op.output("out", op.join("j", a, b), TestingSink(out))
    run_main(flow)
    assert out == [("k", ("a0", "b0")), ("k", ("a1", "b1")), ("k", ("a2", "b2"))]


def test_merge_of_two_sources_interleaves_source_batches():
    flow = Dataflow("f")
    a = op.input("a", flow, TestingSource(["a0", "a1", "a2", "a3"], batch_size=2))
    b = op.input("b", flow, TestingSource(["b0", "b1"]))
    out: list[str] = []
    op.output("out", op.merge("m", a, b), TestingSink(out))
    run_main(flow)
    assert out == ["a0", "a1", "b0", "a2", "a3", "b1"]


def test_on_eof_bad_return_shape_names_step():
    class BadEof(_BadItem):
        def on_item(self, value):
            return [value], self.RETAIN

        def on_eof(self):
            return None

    err = run_fails([("a", 1)], lambda s: op.stateful("st", s, BadEof))
    assert "step 'f.st.stateful_batch': on_eof() must return a 2-tuple (emits, discard)" in str(err)
    assert "for key 'a'" in str(err)


# --------------------------------------------------------------------------- never_notifies
def _stateful_nodes(build) -> list:
    from flowspark import ir

    flow = Dataflow("nn")
    s = op.input("inp", flow, TestingSource([("a", 1)]))
    op.output("out", build(s), TestingSink([]))
    return [n for n in flow.graph().nodes if isinstance(n, ir.StatefulBatch)]


class _Quiet(op.StatefulLogic):
    def __init__(self, resume_state=None):
        self.state = resume_state

    def on_item(self, value):
        return [value], self.RETAIN

    def snapshot(self):
        return None


class _Alarm(_Quiet):
    def notify_at(self):
        return None


@pytest.mark.parametrize(
    ("build", "never"),
    [
        (lambda s: op.stateful_map("m", s, lambda st, v: (st, v)), True),
        (lambda s: op.stateful_flat_map("m", s, lambda st, v: (st, [v])), True),
        (lambda s: op.fold_final("m", s, list, lambda a, v: a), True),
        (lambda s: op.reduce_final("m", s, lambda a, b: a), True),
        (lambda s: op.max_final("m", s), True),
        (lambda s: op.count_final("m", s, lambda kv: kv[0]), True),
        (lambda s: op.join("m", s, s), True),
        (lambda s: op.stateful("m", s, _Quiet), True),  # a class that keeps the default notify_at
        (lambda s: op.stateful("m", s, _Alarm), False),
        (lambda s: op.stateful("m", s, lambda st: _Quiet()), False),  # a function: unknown
        (lambda s: op.collect("m", s, timeout=timedelta(seconds=1), max_size=3), False),
    ],
)
def test_never_notifies_marks_only_steps_whose_logics_cannot_notify(build, never):
    from flowspark.logic import wants_notify

    nodes = _stateful_nodes(build)
    assert nodes
    assert all(not n.notifies for n in nodes) is never  # the IR's fact, set by the operator
    if never:  # the mark never lies: the logics really keep the default notify_at
        assert not any(wants_notify(n.builder(None)) for n in nodes)


def test_windowing_steps_can_notify():
    clock = win.EventClock(lambda v: v, wait_for_system_duration=timedelta(0))
    windower = win.TumblingWindower(length=timedelta(minutes=1), align_to=datetime(2024, 1, 1, tzinfo=timezone.utc))
    nodes = _stateful_nodes(lambda s: win.count_window("w", s, clock, windower, lambda v: "k").down)
    assert nodes
    assert all(n.notifies for n in nodes)
