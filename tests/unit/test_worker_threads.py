"""N workers in one process: the same flows on bytewax 0.21.1 and flowspark with N workers.

Bytewax runs N worker threads (`cluster_main(flow, [], 0, worker_count_per_proc=N)`);
flowspark's in-memory executor runs N logical workers in turn. Both must give each
worker the same source partitions and keys (observable with `inspect_debug`, and with
sources and sinks built per worker), the same results per key as one worker, and each
worker's order across keys.

No `from __future__ import annotations`: operator annotations must evaluate as in user code.
"""

import importlib
import importlib.util
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import ModuleType
from typing import Any, Callable, Optional

import pytest

import flowspark.testing
from flowspark.errors import FlowsparkRuntimeError, FlowsparkTypeError
from flowspark.runtime.routing import key_worker, primaries
from flowspark.runtime.workers import run_workers

HAVE_BYTEWAX = importlib.util.find_spec("bytewax") is not None
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
KEYS = [f"user{i}" for i in range(60)] + ["a", "b", "c", "", "é", "日本", "with space", "x" * 40]


def differential(fn: Callable[..., Any]) -> Any:
    """Mark a test that runs bytewax 0.21.1 too."""
    fn = pytest.mark.skipif(not HAVE_BYTEWAX, reason="bytewax 0.21.1 is not installed")(fn)
    return pytest.mark.bytewax(fn)


@dataclass(frozen=True)
class Lib:
    name: str
    op: ModuleType
    win: ModuleType
    dataflow: ModuleType
    inputs: ModuleType
    outputs: ModuleType
    testing: ModuleType
    errors: ModuleType

    def run(self, flow: Any, workers: int, **kwargs: Any) -> None:
        self.testing.cluster_main(flow, [], 0, worker_count_per_proc=workers, **kwargs)


def _lib(name: str) -> Lib:
    mods = ("operators", "operators.windowing", "dataflow", "inputs", "outputs", "testing", "errors")
    return Lib(name, *(importlib.import_module(f"{name}.{m}") for m in mods))


def _libs() -> list[Lib]:
    return [_lib("bytewax"), _lib("flowspark")] if HAVE_BYTEWAX else [_lib("flowspark")]


def _per_key(items: list[Any]) -> dict[str, list[Any]]:
    return flowspark.testing.per_key(items)


def _per_step_and_key(items: list[Any]) -> dict[Any, list[Any]]:
    """`(key, (tag, value))` items by step tag and key: where streams merge, only each one's order is kept."""
    return flowspark.testing.per_key([((tag, k), v) for k, (tag, v) in items])  # type: ignore[misc]


# -- which worker owns what ------------------------------------------------------------------


def _key_owners(lib: Lib, workers: int) -> dict[str, int]:
    seen: dict[str, set[int]] = {}
    flow = lib.dataflow.Dataflow("keys")
    s = lib.op.input("inp", flow, lib.testing.TestingSource([(k, 1) for k in KEYS] * 2))
    s = lib.op.stateful_map("keep", s, lambda st, v: (st, v))
    lib.op.inspect_debug("where", s, lambda _sid, kv, _ep, w: seen.setdefault(kv[0], set()).add(w))
    lib.run(flow, workers)
    assert all(len(ws) == 1 for ws in seen.values()), seen  # a key lives on one worker
    return {k: ws.pop() for k, ws in seen.items()}


@differential
@pytest.mark.parametrize("workers", [2, 3, 5])
def test_a_stateful_steps_keys_go_to_the_workers_bytewax_picks(workers: int) -> None:
    bw, fs = (_key_owners(lib, workers) for lib in _libs())
    assert fs == bw
    assert fs == {k: key_worker(k, workers) for k in KEYS}
    assert len(set(fs.values())) == workers


class _Part:
    def __init__(self, key: str, resume: Optional[int]) -> None:
        self.key = key
        self.left = 2 if resume is None else resume

    def next_batch(self) -> list[str]:
        if not self.left:
            raise StopIteration
        self.left -= 1
        return [f"{self.key}{self.left}"]

    def next_awake(self) -> Optional[datetime]:
        return None

    def snapshot(self) -> int:
        return self.left

    def close(self) -> None:
        pass


def _fixed_source(lib: Lib, parts: list[str]) -> Any:
    part_cls = type("Part", (_Part, lib.inputs.StatefulSourcePartition), {})

    class Source(lib.inputs.FixedPartitionedSource):  # type: ignore[name-defined,misc]
        def list_parts(self) -> list[str]:
            return parts

        def build_part(self, step_id: str, for_part: str, resume_state: Optional[int]) -> Any:
            return part_cls(for_part, resume_state)

    return Source()


def _part_owners(lib: Lib, parts: list[str], workers: int) -> dict[str, int]:
    seen: dict[str, int] = {}
    flow = lib.dataflow.Dataflow("parts")
    s = lib.op.input("inp", flow, _fixed_source(lib, parts))
    lib.op.inspect_debug("where", s, lambda _sid, x, _ep, w: seen.__setitem__(x[:-1], w))
    lib.run(flow, workers)
    return seen


@differential
@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("parts", [["p"], ["q", "p"], ["c", "a", "b"], [f"p{i}" for i in range(7)]])
def test_fixed_partitions_go_to_the_workers_bytewax_picks(parts: list[str], workers: int) -> None:
    bw, fs = (_part_owners(lib, parts, workers) for lib in _libs())
    assert fs == bw == primaries(parts, workers)


# -- sources and sinks built per worker ------------------------------------------------------


def _dynamic_flow(lib: Lib, log: list[Any]) -> Any:
    class Part(lib.inputs.StatelessSourcePartition):  # type: ignore[name-defined,misc]
        def __init__(self, index: int, count: int) -> None:
            self.items = [(f"k{(index + i) % 5}", f"w{index}of{count}-{i}") for i in range(4)]

        def next_batch(self) -> list[Any]:
            if not self.items:
                raise StopIteration
            return [self.items.pop(0)]

    class Source(lib.inputs.DynamicSource):  # type: ignore[name-defined,misc]
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
            log.append(("source", worker_index, worker_count))
            return Part(worker_index, worker_count)

    class SinkPart(lib.outputs.StatelessSinkPartition):  # type: ignore[name-defined,misc]
        def __init__(self, index: int) -> None:
            self.index = index

        def write_batch(self, items: list[Any]) -> None:
            log.extend(("wrote", self.index, x) for x in items)

    class Sink(lib.outputs.DynamicSink):  # type: ignore[name-defined,misc]
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
            log.append(("sink", worker_index, worker_count))
            return SinkPart(worker_index)

    flow = lib.dataflow.Dataflow("dyn")
    s = lib.op.input("inp", flow, Source())
    s = lib.op.stateful_map("n", s, lambda n, v: ((n or 0) + 1, ((n or 0) + 1, v)))
    lib.op.output("out", s, Sink())
    return flow


@differential
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_dynamic_sources_and_sinks_are_built_on_every_worker_like_bytewax(workers: int) -> None:
    logs = []
    for lib in _libs():
        log: list[Any] = []
        lib.run(_dynamic_flow(lib, log), workers)
        logs.append(log)
    bw, fs = logs
    builds = [("source", i, workers) for i in range(workers)] + [("sink", i, workers) for i in range(workers)]
    assert sorted(e for e in fs if e[0] != "wrote") == sorted(e for e in bw if e[0] != "wrote") == sorted(builds)
    # Each sink partition (worker) gets the same values. A key's values come from several
    # workers' partitions here, so their order, hence the running count, depends on the
    # threads in Bytewax: the counts are compared per key as a set.
    assert Counter((e[1], e[2][0], e[2][1][1]) for e in fs if e[0] == "wrote") == Counter(
        (e[1], e[2][0], e[2][1][1]) for e in bw if e[0] == "wrote"
    )
    for log in logs:
        for key, counted in _per_key([e[2] for e in log if e[0] == "wrote"]).items():
            assert sorted(n for n, _ in counted) == list(range(1, len(counted) + 1)), key


def _fixed_sink_flow(lib: Lib, written: dict[str, list[Any]], items: list[Any]) -> Any:
    class Part(lib.outputs.StatefulSinkPartition):  # type: ignore[name-defined,misc]
        def __init__(self, key: str) -> None:
            self.key = key

        def write_batch(self, values: list[Any]) -> None:
            written.setdefault(self.key, []).extend(values)

        def snapshot(self) -> None:
            return None

    class Sink(lib.outputs.FixedPartitionedSink):  # type: ignore[name-defined,misc]
        def list_parts(self) -> list[str]:
            return ["p2", "p0", "p1"]

        def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Any:
            return Part(for_part)

    flow = lib.dataflow.Dataflow("fixed")
    s = lib.op.input("inp", flow, lib.testing.TestingSource(items))
    lib.op.output("out", s, Sink())
    return flow


@differential
@pytest.mark.parametrize("workers", [2, 3])
def test_a_fixed_sinks_partitions_get_the_same_items_like_bytewax(workers: int) -> None:
    items = [(k, i) for i, k in enumerate(KEYS[:20] * 3)]
    outs = []
    for lib in _libs():
        written: dict[str, list[Any]] = {}
        lib.run(_fixed_sink_flow(lib, written, items), workers)
        outs.append(written)
    assert outs[1] == outs[0]  # one source partition: each sink partition keeps the input order
    one: dict[str, list[Any]] = {}
    flowspark.testing.run_main(_fixed_sink_flow(_lib("flowspark"), one, items))
    assert outs[1] == one


def test_an_item_a_fixed_sink_cannot_route_fails_as_with_one_worker() -> None:
    lib = _lib("flowspark")
    for workers in (1, 2):
        with pytest.raises(FlowsparkTypeError, match=r"step 'fixed.out': Sink is partitioned.*received 7"):
            lib.run(_fixed_sink_flow(lib, {}, [("a", 1), 7]), workers)


# -- results: per key as one worker; across keys, each worker's order --------------------------


def _stateful_flows(lib: Lib, out: list[Any], items: list[Any]) -> Any:
    flow = lib.dataflow.Dataflow("res")
    s = lib.op.input("inp", flow, lib.testing.TestingSource(items, batch_size=3))
    running = lib.op.stateful_map("run", s, lambda n, v: ((n or 0) + v, (n or 0) + v))
    total = lib.op.fold_final("tot", s, lambda: 0, lambda acc, v: acc + v)
    lists = lib.op.collect("lists", s, timeout=timedelta(hours=1), max_size=3)
    clock = lib.win.EventClock(lambda v: T0 + timedelta(seconds=v), wait_for_system_duration=timedelta(0))
    windows = lib.win.count_window(
        "win",
        lib.op.key_rm("unkey", s),
        clock,
        lib.win.TumblingWindower(timedelta(seconds=50), T0),
        lambda v: str(v % 4),
    )
    tagged = [
        lib.op.map_value("t_run", running, lambda v: ("run", v)),
        lib.op.map_value("t_tot", total, lambda v: ("tot", v)),
        lib.op.map_value("t_lists", lists, lambda v: ("lists", v)),
        lib.op.map_value("t_win", windows.down, lambda v: ("win", v)),
    ]
    lib.op.output("out", lib.op.merge("all", *tagged), lib.testing.TestingSink(out))
    return flow


ITEMS = [(KEYS[(i * 7) % 11], i) for i in range(120)]


@differential
@pytest.mark.parametrize("workers", [2, 3])
def test_results_per_key_are_those_of_one_worker_and_of_bytewax(workers: int) -> None:
    one: list[Any] = []
    flowspark.testing.run_main(_stateful_flows(_lib("flowspark"), one, ITEMS))
    for lib in _libs():
        out: list[Any] = []
        lib.run(_stateful_flows(lib, out, ITEMS), workers)
        assert _per_step_and_key(out) == _per_step_and_key(one), lib.name


def test_across_keys_each_worker_keeps_its_order() -> None:
    lib = _lib("flowspark")
    one: list[Any] = []
    flowspark.testing.run_main(_stateful_flows(lib, one, ITEMS))
    for workers in (2, 3, 4):
        out: list[Any] = []
        lib.run(_stateful_flows(lib, out, ITEMS), workers)
        assert Counter(map(repr, out)) == Counter(map(repr, one))
        for w in range(workers):
            mine = [kv for kv in one if key_worker(kv[0], workers) == w]
            assert [kv for kv in out if key_worker(kv[0], workers) == w] == mine, (workers, w)


def test_redistribute_spreads_items_over_the_workers_and_keeps_the_results() -> None:
    lib = _lib("flowspark")
    where: list[int] = []

    def build(out: list[Any]) -> Any:
        flow = lib.dataflow.Dataflow("redis")
        s = lib.op.input("inp", flow, lib.testing.TestingSource(ITEMS, batch_size=10))
        s = lib.op.inspect_debug("where", lib.op.redistribute("spread", s), lambda _s, _x, _e, w: where.append(w))
        s = lib.op.stateful_map("run", s, lambda n, v: ((n or 0) + 1, (n or 0) + 1))
        lib.op.output("out", s, lib.testing.TestingSink(out))
        return flow

    one: list[Any] = []
    flowspark.testing.run_main(build(one))
    out: list[Any] = []
    where.clear()
    lib.run(build(out), 3)
    assert sorted(Counter(where)) == [0, 1, 2]
    assert _per_key(out) == _per_key(one)  # counts per key: 1, 2, 3 ... whatever the spread


# -- errors, epochs, the rest of a run ---------------------------------------------------------


@differential
def test_a_user_error_on_a_worker_is_chained_like_bytewax() -> None:
    """Bytewax's `test_reraises_custom_exception`, with its `cluster_main-2thread` entry point."""

    class CustomError(Exception):
        def __init__(self, msg: str, b: int) -> None:
            self.msg = msg
            self.b = b

    def boom(kv: Any) -> Any:
        if kv[1] == 2:
            msg = "BOOM"
            raise CustomError(msg, 1)
        return kv

    for lib in _libs():
        flow = lib.dataflow.Dataflow("test_df")
        s = lib.op.input("inp", flow, lib.testing.TestingSource([(k, i) for i, k in enumerate("abcd")]))
        s = lib.op.stateful_map("keep", s, lambda st, v: (st, v))
        s = lib.op.map("explode", s, boom)
        out: list[Any] = []
        lib.op.output("out", s, lib.testing.TestingSink(out))
        with pytest.raises(lib.errors.BytewaxRuntimeError) as info:
            lib.run(flow, 2)
        chain, err = [], info.value
        while err is not None:
            chain.append(type(err))
            err = err.__cause__
        assert CustomError in chain, lib.name
        assert len(out) < 4


@differential
def test_inspect_debug_shows_the_worker_and_epoch_like_bytewax() -> None:
    lines = []
    for lib in _libs():
        seen: list[str] = []
        show = seen.append
        flow = lib.dataflow.Dataflow("dbg")
        s = lib.op.input("inp", flow, lib.testing.TestingSource([(k, 1) for k in KEYS[:12]]))
        s = lib.op.stateful_map("keep", s, lambda st, v: (st, v))
        lib.op.inspect_debug("show", s, lambda sid, x, ep, w, show=show: show(f"{sid} W{w} @{ep}: {x!r}"))
        lib.run(flow, 3, epoch_interval=timedelta(seconds=60))
        lines.append(sorted(seen))
    assert lines[-1] == lines[0]


def test_one_worker_is_the_single_worker_executor(monkeypatch: Any) -> None:
    import flowspark.runtime.workers as workers_mod

    made: list[str] = []
    real = workers_mod._Workers
    monkeypatch.setattr(workers_mod, "_Workers", lambda *a, **kw: made.append("workers") or real(*a, **kw))
    lib = _lib("flowspark")
    out: list[Any] = []
    lib.run(_stateful_flows(lib, out, ITEMS[:10]), 1)
    assert made == []
    lib.run(_stateful_flows(lib, out, ITEMS[:10]), 2)
    assert made == ["workers"]


def test_dead_letters_of_every_worker_are_kept() -> None:
    lib = _lib("flowspark")
    flow = lib.dataflow.Dataflow("dl")
    s = lib.op.input("inp", flow, lib.testing.TestingSource([(k, i) for i, k in enumerate(KEYS[:10])] + [3, 4]))
    s = lib.op.stateful_map("keep", s, lambda st, v: (st, v))
    out: list[Any] = []
    lib.op.output("out", lib.op.map("half", s, lambda kv: (kv[0], 10 // (kv[1] % 3))), lib.testing.TestingSink(out))
    dead: list[Any] = []
    run_workers("test", flow, 3, dead_letter=lib.testing.TestingSink(dead))
    bad = [3, 4, *[(k, i) for i, k in enumerate(KEYS[:10]) if i % 3 == 0]]
    assert sorted(r["item"] for r in dead) == sorted(map(repr, bad))
    assert len(out) == 10 - len([i for i in range(10) if i % 3 == 0])


def test_run_workers_checks_its_arguments_as_run_main() -> None:
    with pytest.raises(FlowsparkTypeError, match="cluster_main needs a Dataflow"):
        flowspark.testing.cluster_main("not a flow", [], 0, worker_count_per_proc=2)
    with pytest.raises(ValueError, match="worker_count_per_proc must be >= 1; received 0"):
        flowspark.testing.cluster_main("not a flow", [], 0, worker_count_per_proc=0)
    with pytest.raises(FlowsparkRuntimeError, match="error building dataflow 'empty'"):
        flowspark.testing.cluster_main(_lib("flowspark").dataflow.Dataflow("empty"), [], 0, worker_count_per_proc=2)
