"""Order across keys on Spark batch: driver-side sinks get exactly bytewax 0.21.1's lists.

Bytewax polls one batch of every partition of every source in turn, groups the items
of one such activation by key, keys in sorted order, before a stateful step, and ends
keys in sorted key order. The Spark batch runtime sorts a driver-side sink's items by
their sequences, which start with the activation and, after a stateful step, the key
(`flowspark.spark.worker.codec`). Each case runs the
same flow on bytewax's `run_main` and on `flowspark.spark.run` and compares the lists.
The logics emit per value (`stateful_map`, `fold_final`): on Spark a key's values reach
`on_batch` in larger batches than Bytewax's, which only a logic that emits per batch sees.
"""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest

pytestmark = [pytest.mark.bytewax, pytest.mark.spark]

bytewax = pytest.importorskip("bytewax")

from bytewax_pair import lib as names  # noqa: E402

ITEMS = ["b1", "a1", "c1", "b2", "a2", "b3", "a3", "c2", "c3", "a4", "d1", "b4"]


def _both(spark: Any, build: Callable[..., Any], sinks: int = 1) -> tuple[list[Any], list[Any]]:
    """Each sink's list on bytewax (`want`) and on Spark batch (`got`); one list per sink when `sinks` > 1."""
    from bytewax.testing import run_main

    from flowspark.spark import run

    want: list[Any] = [[] for _ in range(sinks)]
    run_main(build(names("bytewax"), *want))
    got: list[Any] = [[] for _ in range(sinks)]
    run(build(names("flowspark"), *got), spark=spark)
    return (want[0], got[0]) if sinks == 1 else (want, got)


def _count(n: Any, v: Any) -> tuple[int, str]:
    n = (n or 0) + 1
    return n, f"{v}#{n}"


@pytest.mark.parametrize("batch_size", [1, 3, 10])
@pytest.mark.parametrize("mid", [None, "flat_map", "filter"])
def test_source_batches_grouped_by_sorted_key(spark, batch_size: int, mid: str | None) -> None:
    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("order")
        s = op.input("inp", flow, lib["Source"](ITEMS, batch_size))
        if mid == "flat_map":
            s = op.flat_map("fm", s, lambda x: [x, "z" + x, x + "'"])
        elif mid == "filter":
            s = op.filter("fl", s, lambda x: x not in ("b2", "a3"))
        keyed = op.key_on("key", s, lambda x: x[0])
        op.output("out", op.stateful_map("count", keyed, _count), lib["Sink"](out))
        return flow

    want, got = _both(spark, build)
    assert want[0][0] == ("a" if batch_size > 1 else "b")  # b1 comes first, but a1 is in its batch
    assert got == want


@pytest.mark.parametrize("batch_size", [3, 10])
def test_two_stateful_steps_with_a_rekey(spark, batch_size: int) -> None:
    def build(lib: dict[str, Any], out: list[Any], out_first: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("order2")
        s = op.input("inp", flow, lib["Source"](ITEMS, batch_size))
        counts = op.stateful_map("count", op.key_on("key", s, lambda x: x[0]), _count)
        rekeyed = op.map("rekey", counts, lambda kv: (kv[1][-1], kv[1]))
        op.output("out", op.stateful_map("count2", rekeyed, _count), lib["Sink"](out))
        op.output("out_first", counts, lib["Sink"](out_first))
        return flow

    want, got = _both(spark, build, sinks=2)
    assert got == want


@pytest.mark.parametrize("batch_size", [1, 4])
def test_branch_and_merge_of_one_source(spark, batch_size: int) -> None:
    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("order3")
        s = op.input("inp", flow, lib["Source"](ITEMS, batch_size))
        b = op.branch("br", s, lambda x: int(x[1]) % 2 == 0)
        both = op.merge("m", op.map("t", b.trues, str.upper), b.falses)
        keyed = op.key_on("key", both, lambda x: x[0].lower())
        op.output("out", op.stateful_map("count", keyed, _count), lib["Sink"](out))
        return flow

    want, got = _both(spark, build)
    assert got == want


def test_file_source_batches(spark, tmp_path: Path) -> None:
    rng = random.Random(13)
    path = tmp_path / "events.txt"
    path.write_text("".join(f"k{rng.randrange(40)},{i}\n" for i in range(2500)))

    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("file")
        s = op.input("inp", flow, lib["FileSource"](path))
        keyed = op.key_on("key", s, lambda line: line.split(",")[0])
        op.output("out", op.stateful_map("count", keyed, _count), lib["Sink"](out))
        return flow

    want, got = _both(spark, build)
    assert len(want) == 2500
    assert got == want


def test_end_of_input_emits_in_sorted_key_order_after_a_stateful_step(spark) -> None:
    keys = [f"key{i:02d}" for i in range(30)]
    random.Random(7).shuffle(keys)
    items = [(k, i) for i in range(3) for k in keys]

    def build(lib: dict[str, Any], out: list[Any], out_first: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("fold")
        s = op.input("inp", flow, lib["Source"](items, 7))
        counted = op.stateful_map("count", s, lambda n, v: ((n or 0) + v, (n or 0) + v))
        rekeyed = op.map("rekey", counted, lambda kv: (kv[0][-1], kv[1]))
        op.output("out", op.fold_final("sum", rekeyed, lambda: 0, lambda a, v: a + v), lib["Sink"](out))
        op.output("out_first", counted, lib["Sink"](out_first))
        return flow

    want, got = _both(spark, build, sinks=2)
    assert got == want


def test_a_pause_ends_a_source_batch(spark) -> None:
    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        src = lib["Source"]
        items = [*ITEMS[:4], src.PAUSE(timedelta(0)), *ITEMS[4:]]  # batches: b1 a1 c1 | b2 | a2 b3 a3 | ...
        flow = lib["Dataflow"]("pause")
        keyed = op.key_on("key", op.input("inp", flow, src(items, 3)), lambda x: x[0])
        op.output("out", op.stateful_map("count", keyed, _count), lib["Sink"](out))
        return flow

    want, got = _both(spark, build)
    assert want[3:6] == [("b", "b2#2"), ("a", "a2#2"), ("a", "a3#3")]
    assert got == want


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_two_sources_merged_are_polled_in_turn(spark, batch_size: int) -> None:
    def build(lib: dict[str, Any], out: list[Any], out_first: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("merged")
        a = op.input("a", flow, lib["Source"](ITEMS, batch_size))
        b = op.input("b", flow, lib["Source"](["z1", "a9", "b9", "y1", "a8"], batch_size))
        keyed = op.key_on("key", op.merge("m", a, b), lambda x: x[0])
        counts = op.stateful_map("count", keyed, _count)
        rekeyed = op.map("rekey", counts, lambda kv: (kv[1][-1], kv[1]))
        op.output("out", op.fold_final("last", rekeyed, list, lambda acc, v: [*acc, v]), lib["Sink"](out))
        op.output("out_first", counts, lib["Sink"](out_first))
        return flow

    want, got = _both(spark, build, sinks=2)
    assert got == want


def test_files_of_a_directory_are_polled_in_turn(spark, tmp_path: Path) -> None:
    rng = random.Random(5)
    for f in range(3):
        n = (1500, 700, 2100)[f]
        (tmp_path / f"part{f}.txt").write_text("".join(f"k{rng.randrange(25)},{f}-{i}\n" for i in range(n)))

    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("dir")
        s = op.input("inp", flow, lib["DirSource"](tmp_path))
        keyed = op.key_on("key", s, lambda line: line.split(",")[0])
        op.output("out", op.stateful_map("count", keyed, _count), lib["Sink"](out))
        return flow

    want, got = _both(spark, build)
    assert len(want) == 4300
    assert got == want


def _past_timer(lib: dict[str, Any]) -> Any:
    """A logic whose every value asks for a notification at a time long past; `on_notify` clears it."""
    from datetime import datetime, timezone

    past = datetime(2000, 1, 1, tzinfo=timezone.utc)

    class PastTimer(lib["StatefulLogic"]):  # type: ignore[misc,name-defined]
        def __init__(self, _state: Any) -> None:
            self.armed: Any = None

        def on_item(self, value: Any) -> Any:
            self.armed = value
            return [value], False

        def on_notify(self) -> Any:
            fired, self.armed = self.armed, None
            return [f"notify after {fired}"], False

        def on_eof(self) -> Any:
            return [], False

        def notify_at(self) -> Any:
            return past if self.armed is not None else None

        def snapshot(self) -> Any:
            return self.armed

    return PastTimer


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_due_notifications_fire_in_bytewaxs_default_order(spark, batch_size: int) -> None:
    """What an activation makes due fires after the values of the key's next activation when it comes right
    after (bytewax 0.21.1's default `epoch_interval`), before them after a gap: each key's list is bytewax's.

    Across keys the fixed timeline (Spark batch, `clock="fixed"`) places a notification fired in
    activations without the key's values with the key's next values, where Bytewax gives it after the
    first of those activations: the lists across keys are the fixed clock's, not bytewax's
    (docs/differences.md, "Timer granularity")."""
    from datetime import datetime, timezone

    from flowspark.testing import run_main

    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("timers")
        keyed = op.key_on("key", op.input("inp", flow, lib["Source"](ITEMS, batch_size)), lambda x: x[0])
        logic = _past_timer(lib)
        op.output("out", op.stateful("timer", keyed, logic), lib["Sink"](out))
        return flow

    want, got = _both(spark, build)
    assert _per_key(got) == _per_key(want)
    fixed: list[Any] = []
    run_main(build(names("flowspark"), fixed), clock="fixed", start_time=datetime(2024, 1, 1, tzinfo=timezone.utc))
    assert got == fixed
    if batch_size == 1:
        # c1 and c2 have other keys' activations after them: their notifications fire there, before c's next
        # value; c3's activation comes right after c2's: c3 first, then the notification (which sees c3).
        assert [v for k, v in want if k == "c"] == ["c1", "notify after c1", "c2", "c3", "notify after c3"]


def _per_key(items: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for k, v in items:
        out.setdefault(k, []).append(v)
    return out
