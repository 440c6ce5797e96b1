"""What a ported project's own tests rely on, on bytewax 0.21.1 and flowspark.

Every test runs the same user code on both libraries (the `lib` fixture) and asserts
what a ported Bytewax test asserts, so a difference fails here. Differences flowspark
keeps on purpose are `xfail(strict=True)` for flowspark with the reason, so fixing one
shows up too.

No `from __future__ import annotations`: operator annotations must evaluate as in user code.
"""

import importlib
import importlib.util
import os
import random
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

HAVE_BYTEWAX = importlib.util.find_spec("bytewax") is not None
LIBS = ["bytewax", "flowspark"]
T0 = datetime(2023, 1, 1, 5, 0, tzinfo=timezone.utc)
#: Bytewax's own stateful tests run with epoch_interval=0 (an epoch per activation).
ZERO = timedelta(0)

pytestmark = pytest.mark.bytewax


@dataclass(frozen=True)
class Lib:
    name: str
    op: ModuleType
    dataflow: ModuleType
    inputs: ModuleType
    testing: ModuleType
    demo: ModuleType
    files: ModuleType

    def flow(self, flow_id: str = "test_df") -> Any:
        return self.dataflow.Dataflow(flow_id)


def _lib(name: str) -> Lib:
    mods = [
        importlib.import_module(f"{name}.{m}")
        for m in ("operators", "dataflow", "inputs", "testing", "connectors.demo", "connectors.files")
    ]
    return Lib(name, *mods)


@pytest.fixture(params=LIBS)
def lib(request: Any) -> Lib:
    if request.param == "bytewax" and not HAVE_BYTEWAX:
        pytest.skip("bytewax 0.21.1 is not installed")
    return _lib(request.param)


def _run(lib: Lib, items: list[Any], build: Callable[[Lib, Any], Any], **run_kw: Any) -> list[Any]:
    flow = lib.flow()
    out: list[Any] = []
    lib.op.output(
        "out", build(lib, lib.op.input("inp", flow, lib.testing.TestingSource(items))), lib.testing.TestingSink(out)
    )
    lib.testing.run_main(flow, **run_kw)
    return out


# =====================================================================================
# Point 1: SimplePollingSource[X, S]
# =====================================================================================


def _list_source(lib: Lib) -> Any:
    class ListSource(lib.inputs.SimplePollingSource[str, int]):  # type: ignore[name-defined,misc]
        def __init__(self, items: list[Any]) -> None:
            super().__init__(interval=timedelta(seconds=0))
            self.items = items
            self.next_idx = 0

        def next_item(self) -> str:
            if self.next_idx >= len(self.items):
                raise StopIteration
            item = self.items[self.next_idx]
            self.next_idx += 1
            if item == "ABORT":
                self.items[self.next_idx - 1] = None
                raise lib.inputs.AbortExecution
            return item

        def snapshot(self) -> int:
            return self.next_idx

        def resume(self, resume_state: int) -> None:
            self.next_idx = resume_state

    return ListSource


def test_simple_polling_source_takes_item_and_state_types_and_resumes(lib: Lib) -> None:
    src = _list_source(lib)(["a", "b", "ABORT", None, "c"])
    flow = lib.flow()
    out: list[Any] = []
    lib.op.output("out", lib.op.input("inp", flow, src), lib.testing.TestingSink(out))
    lib.testing.run_main(flow)
    assert out == ["a", "b"]
    out.clear()
    lib.testing.run_main(flow)
    assert out == ["c"]
    # The resume hook: build_part hands resume_state to resume() before the first poll.
    part = _list_source(lib)(["x", "y", "z"]).build_part("test_df.inp", "singleton", 2)
    assert (part.next_batch(), part.snapshot()) == (["z"], 3)


@pytest.mark.parametrize(
    ("now", "first"),
    [
        (datetime(2023, 1, 1, 5, 0, tzinfo=timezone.utc), datetime(2023, 1, 1, 5, 0, tzinfo=timezone.utc)),
        (datetime(2023, 1, 1, 5, 15, tzinfo=timezone.utc), datetime(2023, 1, 1, 5, 30, tzinfo=timezone.utc)),
        (datetime(2023, 1, 1, 3, 10, tzinfo=timezone.utc), datetime(2023, 1, 1, 3, 30, tzinfo=timezone.utc)),
    ],
    ids=["on_a_mark", "between_marks", "before_align_to"],
)
def test_simple_polling_align_to_first_poll(lib: Lib, now: datetime, first: datetime) -> None:
    def retry() -> Any:
        raise lib.inputs.SimplePollingSource.Retry(timedelta(seconds=5))

    align = datetime(2023, 1, 1, 4, 0, tzinfo=timezone.utc)
    polling = lib.inputs._SimplePollingPartition
    part = polling(now, interval=timedelta(minutes=30), align_to=align, getter=lambda: 1, snapshot=lambda: None)
    assert part.next_awake() == first
    assert part.next_batch() == [1]
    assert part.next_awake() == first + timedelta(minutes=30)
    part = polling(now, interval=timedelta(minutes=30), align_to=align, getter=retry, snapshot=lambda: None)
    assert part.next_batch() == []
    assert part.next_awake() == first + timedelta(seconds=5)


# =====================================================================================
# Activation order: due notifications fire between source batches
# =====================================================================================


def _notify_logic(lib: Lib, after_notify: bool, log: list[Any]) -> Any:
    """Bytewax's own test logic (pytests/operators/test_stateful.py): each item asks for a
    notification now; `on_notify` clears it and keeps or discards the state."""

    class Logic(lib.op.StatefulLogic):  # type: ignore[name-defined,misc]
        def __init__(self, state: Any) -> None:
            self.at: Any = None
            self.state = state if state is not None else "NEW"

        def _to(self, new: str, discard: bool) -> Any:
            old, self.state = self.state, new
            log.append((old, new))
            return [(old, new)], discard

        def on_item(self, value: Any) -> Any:
            self.at = datetime.now(timezone.utc)
            return self._to("ITEM", False)

        def on_notify(self) -> Any:
            self.at = None
            return self._to("NOTIFY", after_notify)

        def on_eof(self) -> Any:
            return self._to("EOF", False)

        def notify_at(self) -> Any:
            return self.at

        def snapshot(self) -> Any:
            return self.state

    return Logic


@pytest.mark.parametrize(
    ("discard", "want"),
    [
        (True, [("NEW", "ITEM"), ("ITEM", "NOTIFY"), ("NEW", "ITEM"), ("ITEM", "NOTIFY")]),
        (False, [("NEW", "ITEM"), ("ITEM", "NOTIFY"), ("NOTIFY", "ITEM"), ("ITEM", "NOTIFY")]),
    ],
)
def test_a_due_notification_fires_before_the_next_source_batch(lib: Lib, discard: bool, want: list[Any]) -> None:
    # Bytewax's test_stateful_on_notify_discard / _retain, unchanged.
    log: list[Any] = []
    logic = _notify_logic(lib, discard, log)

    def build(lib: Lib, s: Any) -> Any:
        return lib.op.stateful("stateful", lib.op.key_on("key", s, lambda _x: "ALL"), logic)

    out = _run(lib, [1, 2, lib.testing.TestingSource.ABORT()], build, epoch_interval=ZERO)
    assert [v for _k, v in out] == want


def test_notifications_and_end_of_input_interleave_with_the_items(lib: Lib) -> None:
    # Without ABORT: each item's notification fires before the next item, then on_eof.
    log: list[Any] = []
    logic = _notify_logic(lib, False, log)

    def build(lib: Lib, s: Any) -> Any:
        return lib.op.stateful("stateful", lib.op.key_on("key", s, lambda _x: "ALL"), logic)

    out = _run(lib, [1, 2, 3], build, epoch_interval=ZERO)
    assert [v[1] for _k, v in out] == ["ITEM", "NOTIFY", "ITEM", "NOTIFY", "ITEM", "NOTIFY", "EOF"]


def test_inspect_upstream_of_a_timer_sees_one_source_batch_at_a_time(lib: Lib) -> None:
    seen: list[Any] = []
    logic = _notify_logic(lib, False, [])

    def build(lib: Lib, s: Any) -> Any:
        s = lib.op.inspect("saw", s, lambda _sid, x: seen.append(("saw", x)))
        s = lib.op.stateful("stateful", lib.op.key_on("key", s, lambda _x: "ALL"), logic)
        return lib.op.inspect("emit", s, lambda _sid, kv: seen.append(kv[1][1]))

    _run(lib, [1, 2], build, epoch_interval=ZERO)
    assert seen == [("saw", 1), "ITEM", "NOTIFY", ("saw", 2), "ITEM", "NOTIFY", "EOF"]


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(hours=1)])
def test_enrich_cached_reads_the_clock_once_per_source_batch(lib: Lib, ttl: timedelta) -> None:
    # With ttl=0 every source batch (one item each) fetches again: its "now" is later than
    # the previous batch's; within one batch the "now" stands still.
    fetches: list[str] = []

    def getter(k: str) -> int:
        fetches.append(k)
        return len(fetches)

    def build(lib: Lib, s: Any) -> Any:
        return lib.op.enrich_cached("e", s, getter, lambda c, x: c.get(x), ttl=ttl)

    out = _run(lib, ["k", "k", "k"], build)
    assert out == ([1, 2, 3] if ttl == timedelta(0) else [1, 1, 1])


# =====================================================================================
# Point 2: exceptions and messages a ported test matches
# =====================================================================================


def _nested_stream(lib: Lib) -> None:
    @lib.dataflow.operator
    def test_op(step_id: str, up: lib.dataflow.Stream, not_allowed: list) -> lib.dataflow.Stream:  # type: ignore[name-defined]
        return lib.op.merge("merge", up, *not_allowed)

    flow = lib.flow()
    inp1 = lib.op.input("inp1", flow, lib.testing.TestingSource([]))
    inp2 = lib.op.input("inp2", flow, lib.testing.TestingSource([]))
    test_op("test_op", inp1, [inp2])


BUILD_ERRORS: dict[str, tuple[Callable[[Lib], Any], type, str]] = {
    "step_id_not_str": (
        lambda lib: lib.op.input(1, lib.flow(), lib.testing.TestingSource([])),
        TypeError,
        "must be a `str`",
    ),
    "step_id_period": (
        lambda lib: lib.op.input("1.5", lib.flow(), lib.testing.TestingSource([])),
        ValueError,
        "can't contain any periods",
    ),
    "not_a_stream": (lambda lib: lib.op.map("map", 1, lambda x: x), TypeError, "'up' argument must be a `Stream`"),
    "not_a_stream_vararg": (lambda lib: lib.op.merge("merge", 1, 2, 3), TypeError, "*args all must be a `Stream`"),
    "nested_stream": (_nested_stream, AssertionError, "inconsistent stream scoping"),
}


@pytest.mark.parametrize("case", list(BUILD_ERRORS))
def test_build_errors_have_bytewax_class_and_wording(lib: Lib, case: str) -> None:
    call, cls, needle = BUILD_ERRORS[case]
    with pytest.raises(cls, match=re.escape(needle)):
        call(lib)


@pytest.mark.parametrize("what", ["does not exist", "is not a directory"])
def test_dir_source_on_a_bad_path_is_a_value_error(lib: Lib, tmp_path: Path, what: str) -> None:
    path = tmp_path / "nodir"
    if what == "is not a directory":
        path.write_text("x\n")
    with pytest.raises(ValueError, match=re.escape(f"input directory `{path}` {what}")):
        lib.files.DirSource(path)


@pytest.mark.parametrize(("missing", "needle"), [("input", "at least one input"), ("output", "at least one output")])
def test_incomplete_flow_is_a_runtime_error_caused_by_a_value_error(lib: Lib, missing: str, needle: str) -> None:
    flow = lib.flow()
    if missing == "output":
        lib.op.input("inp", flow, lib.testing.TestingSource(range(3)))
    # Bytewax's own test: pytest.raises(RuntimeError) around pytest.raises(ValueError, match=...).
    with pytest.raises(RuntimeError) as info:
        lib.testing.run_main(flow)
    assert not isinstance(info.value, ValueError)
    assert isinstance(info.value.__cause__, ValueError)
    assert needle in str(info.value.__cause__)


def _chain(err: BaseException) -> str:
    parts = []
    cur: Any = err
    while cur is not None:
        parts.append(str(cur))
        cur = cur.__cause__
    return " <- ".join(parts)


RUN_ERRORS: dict[str, tuple[list[Any], Callable[[Lib, Any], Any], str]] = {
    "branch_not_bool": ([1], lambda lib, s: lib.op.branch("branch", s, lambda x: "no").trues, "must be a `bool`"),
    "filter_not_bool": ([1], lambda lib, s: lib.op.filter("filter", s, lambda x: "no"), "must be a `bool`"),
    "key_on_not_str": ([1], lambda lib, s: lib.op.key_on("key", s, lambda x: x), "must be a `str`"),
    "flatten_not_iterable": ([666], lambda lib, s: lib.op.flatten("flatten", s), "to be iterables"),
    "stateful_map_not_tuple": (
        [("ALL", 1)],
        lambda lib, s: lib.op.stateful_map("bad_mapper", s, lambda st, v: 1),
        "must be a 2-tuple",
    ),
}


@pytest.mark.parametrize("case", list(RUN_ERRORS))
def test_run_errors_carry_bytewax_wording(lib: Lib, case: str) -> None:
    items, build, needle = RUN_ERRORS[case]
    with pytest.raises(RuntimeError) as info:
        _run(lib, items, build)
    assert needle in _chain(info.value)


def _causes(err: BaseException) -> list[BaseException]:
    out = []
    cur: Any = err.__cause__
    while cur is not None:
        out.append(cur)
        cur = cur.__cause__
    return out


def _add_str(x: Any) -> Any:
    return x + "a"


@pytest.mark.parametrize("case", [*RUN_ERRORS, "user_type_error"])
def test_a_type_error_in_a_step_is_not_itself_a_type_error(lib: Lib, case: str) -> None:
    """Bytewax's tests nest pytest.raises(TypeError, match=...) in pytest.raises(RuntimeError).

    Only the outer one may catch: the error is a RuntimeError whose causes hold the TypeError
    (raised by user code, or by a check of what a user callable returned).
    """
    items, build = (
        ([1], lambda lib, s: lib.op.map("add", s, _add_str)) if case == "user_type_error" else RUN_ERRORS[case][:2]
    )
    with pytest.raises(RuntimeError) as info:
        _run(lib, items, build)
    assert not isinstance(info.value, TypeError)
    assert any(isinstance(c, TypeError) for c in _causes(info.value)), _chain(info.value)


# =====================================================================================
# Point 3: RandomMetricSource, python -m <lib>.testing
# =====================================================================================


def test_random_metric_source_emits_count_values(lib: Lib) -> None:
    src = lib.demo.RandomMetricSource("volts", interval=timedelta(seconds=0), count=3, next_random=lambda: 42)
    flow = lib.flow()
    out: list[Any] = []
    lib.op.output("out", lib.op.input("inp", flow, src), lib.testing.TestingSink(out))
    lib.testing.run_main(flow)
    assert out == [("volts", 42), ("volts", 42), ("volts", 42)]


def _seeded_values(lib: Lib, seed: int) -> list[Any]:
    random.seed(seed)
    src = lib.demo.RandomMetricSource("m", interval=timedelta(seconds=0), count=8)
    flow = lib.flow()
    out: list[Any] = []
    lib.op.output("out", lib.op.input("inp", flow, src), lib.testing.TestingSink(out))
    lib.testing.run_main(flow)
    return out


def test_random_metric_source_is_repeatable_with_a_seed_like_bytewax() -> None:
    if not HAVE_BYTEWAX:
        pytest.skip("bytewax 0.21.1 is not installed")
    fs = _seeded_values(_lib("flowspark"), 7)
    assert fs == _seeded_values(_lib("bytewax"), 7)
    assert fs == _seeded_values(_lib("flowspark"), 7)
    assert {v for _m, v in fs} <= set(range(10))
    assert len({v for _m, v in fs}) > 1


def test_random_metric_source_wakes_an_interval_after_the_previous_wake_and_resumes(lib: Lib) -> None:
    interval = timedelta(minutes=1)
    src = lib.demo.RandomMetricSource("m", interval=interval, count=2, next_random=lambda: 1)
    (part_name,) = src.list_parts()
    assert part_name == "m"
    part = src.build_part("f.inp", "m", None)
    first = part.next_awake()
    assert part.next_batch() == [("m", 1)]
    assert part.next_awake() == first + interval
    snap = part.snapshot()
    resumed = src.build_part("f.inp", "m", snap)
    assert resumed.next_awake() == first + interval
    assert resumed.next_batch() == [("m", 1)]
    with pytest.raises(StopIteration):
        resumed.next_batch()


FLOW_PY = """
import {lib}.operators as op
from {lib}.dataflow import Dataflow
from {lib}.testing import TestingSource

flow = Dataflow("t")
op.inspect("show", op.input("inp", flow, TestingSource([1, 2, 3])))
"""


def _testing_cli(lib: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / f"{lib}_flow.py").write_text(textwrap.dedent(FLOW_PY.format(lib=lib)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSPARK_", "BYTEWAX_"))}
    env["RUST_BACKTRACE"] = "0"
    return subprocess.run(
        [sys.executable, "-m", f"{lib}.testing", f"{lib}_flow:flow", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_testing_module_runs_a_flow_like_bytewax(tmp_path: Path) -> None:
    if not HAVE_BYTEWAX:
        pytest.skip("bytewax 0.21.1 is not installed")
    bw = _testing_cli("bytewax", tmp_path)
    fs = _testing_cli("flowspark", tmp_path)
    assert (fs.returncode, fs.stdout) == (bw.returncode, bw.stdout) == (0, "t.show: 1\nt.show: 2\nt.show: 3\n")
    assert fs.stderr == ""


@pytest.mark.parametrize("args", [["-w", "2"], ["-p", "2"], ["-p", "2", "-w", "2"]])
def test_testing_module_runs_workers_like_bytewax(tmp_path: Path, args: list[str]) -> None:
    if HAVE_BYTEWAX and "-p" not in args:
        # Bytewax runs 2 worker threads (with -p, processes on the fixed ports 2101...: not run
        # here, the machine is shared); flowspark runs P x W workers in this one process.
        bw = _testing_cli("bytewax", tmp_path, *args)
        assert bw.returncode == 0
        assert sorted(bw.stdout.splitlines()) == ["t.show: 1", "t.show: 2", "t.show: 3"]
    fs = _testing_cli("flowspark", tmp_path, *args)
    assert (fs.returncode, fs.stderr) == (0, "")
    assert sorted(fs.stdout.splitlines()) == ["t.show: 1", "t.show: 2", "t.show: 3"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-p", "2", "-a", "h:1"], "-p/--processes 2 with -a/--addresses h:1: -p runs 2 x 1 workers"),
        (["-a", "h:1;h:2", "-i", "0"], "lists 2 processes"),
    ],
)
def test_testing_module_refuses_a_cluster_of_processes_on_one_line(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    fs = _testing_cli("flowspark", tmp_path, *args)
    assert fs.returncode == 1
    assert fs.stdout == ""
    (line,) = fs.stderr.strip().splitlines()
    assert line.startswith("python -m flowspark.testing: error: ")
    assert needle in line


def _past_notify_logic(lib: Lib, log: list[Any]) -> Any:
    """Each item asks for a notification at a time already past; `on_notify` clears it."""
    past = datetime(2000, 1, 1, tzinfo=timezone.utc)

    class Logic(lib.op.StatefulLogic):  # type: ignore[name-defined,misc]
        def __init__(self, _state: Any) -> None:
            self.pending = False

        def on_item(self, value: Any) -> Any:
            log.append(value)
            self.pending = True
            return [value], False

        def on_notify(self) -> Any:
            log.append("notify")
            self.pending = False
            return [], False

        def on_eof(self) -> Any:
            log.append("eof")
            return [], False

        def notify_at(self) -> Any:
            return past if self.pending else None

        def snapshot(self) -> Any:
            return None

    return Logic


@pytest.mark.parametrize(
    ("epoch_interval", "batch_size", "want"),
    [
        # Bytewax reads `notify_at` after an activation and fires what is due after the next
        # activation's items; an epoch that closes in between (epoch_interval=0: after every
        # activation) fires it before them.
        (None, 1, [1, 2, "notify", 3, 4, "notify", "notify", "eof", "eof"]),
        (timedelta(seconds=30), 2, [1, 2, 3, 4, "notify", "notify", "eof", "eof"]),
        (ZERO, 1, [1, "notify", 2, "notify", 3, "notify", 4, "notify", "eof", "eof"]),
        (ZERO, 2, [1, 2, "notify", 3, 4, "notify", "notify", "eof", "eof"]),
    ],
)
def test_epoch_interval_orders_due_notifications_as_in_bytewax(
    lib: Lib, epoch_interval: Any, batch_size: int, want: list[Any]
) -> None:
    log: list[Any] = []
    flow = lib.flow()
    src = lib.testing.TestingSource([("a", 1), ("a", 2), ("a", 3), ("b", 4)], batch_size=batch_size)
    up = lib.op.input("inp", flow, src)
    lib.op.output("out", lib.op.stateful("st", up, _past_notify_logic(lib, log)), lib.testing.TestingSink([]))
    kw = {} if epoch_interval is None else {"epoch_interval": epoch_interval}
    lib.testing.run_main(flow, **kw)
    assert log == want


@pytest.mark.parametrize(("epoch_interval", "batch_size"), [(None, 1), (None, 2), (ZERO, 1), (ZERO, 2)])
def test_the_fixed_clock_gives_each_key_the_system_clocks_order(epoch_interval: Any, batch_size: int) -> None:
    """`clock="fixed"` (the Spark batch timeline) orders each key's calls as the system clock does, which is
    bytewax's (the test above); only the interleaving of keys at end of input differs."""
    from flowspark import operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.testing import TestingSink, TestingSource, run_main

    def calls(**kw: Any) -> dict[str, list[Any]]:
        out: list[Any] = []
        flow = Dataflow("f")
        items = [("a", 1), ("a", 2), ("b", 3), ("a", 4), ("b", 5), ("c", 6), ("a", 7), ("a", 8)]
        up = op.input("inp", flow, TestingSource(items, batch_size=batch_size))
        op.output("out", op.stateful("st", up, _keyed_past), TestingSink(out))
        run_main(flow, **({} if epoch_interval is None else {"epoch_interval": epoch_interval}), **kw)
        per_key: dict[str, list[Any]] = {}
        for k, w in out:
            per_key.setdefault(k, []).append(w)
        return per_key

    system = calls()
    assert calls(clock="fixed", start_time=datetime(2024, 1, 1, tzinfo=timezone.utc)) == system
    assert "notify" in system["a"]


def _keyed_past(_state: Any) -> Any:
    """A logic whose every value asks for a notification long past; `on_notify` clears it (flowspark's)."""
    from flowspark.operators import StatefulLogic

    class Past(StatefulLogic):
        def __init__(self) -> None:
            self.pending = False

        def on_item(self, value: Any) -> Any:
            self.pending = True
            return [value], False

        def on_notify(self) -> Any:
            self.pending = False
            return ["notify"], False

        def on_eof(self) -> Any:
            return ["eof"], False

        def notify_at(self) -> Any:
            return datetime(2000, 1, 1, tzinfo=timezone.utc) if self.pending else None

        def snapshot(self) -> Any:
            return None

    return Past()
