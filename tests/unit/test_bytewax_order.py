"""Order across keys: the in-memory executor emits exactly bytewax 0.21.1's lists.

Bytewax groups the items of one activation (one source batch; where streams merge,
the batches polled together) by key, keys in sorted order, before a stateful step;
due notifications and `on_eof` go in sorted key order too. Each case builds the same
flow with both libraries and compares the output lists exactly.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import pytest

pytestmark = pytest.mark.bytewax

bytewax = pytest.importorskip("bytewax")

from bytewax_pair import lib as names  # noqa: E402

T0 = datetime(2000, 1, 1, tzinfo=timezone.utc)
ITEMS = ["b1", "a1", "c1", "b2", "a2", "b3", "a3", "c2", "c3", "a4", "d1", "b4"]


def _both(build: Callable[[dict[str, Any], list[Any]], Any]) -> tuple[list[Any], list[Any]]:
    outs = []
    for name in ("bytewax", "flowspark"):
        lib = names(name)
        out: list[Any] = []
        lib["run_main"](build(lib, out))
        outs.append(out)
    return outs[0], outs[1]


def _batch_logic(lib: dict[str, Any]) -> Any:
    class Echo(lib["StatefulBatchLogic"]):  # type: ignore[misc,name-defined]
        """Emits each batch it gets (as one list) and `eof` at the end."""

        def on_batch(self, values: list[Any]) -> Any:
            return [list(values)], False

        def on_eof(self) -> Any:
            return ["eof"], False

        def snapshot(self) -> Any:
            return None

    return Echo


@pytest.mark.parametrize("batch_size", [1, 2, 3, 10])
@pytest.mark.parametrize("mid", [None, "map", "flat_map", "filter"])
def test_batches_grouped_by_sorted_key(batch_size: int, mid: str | None) -> None:
    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("order")
        s = op.input("inp", flow, lib["TestingSource"](ITEMS, batch_size))
        if mid == "map":
            s = op.map("m", s, str.upper)
        elif mid == "flat_map":
            s = op.flat_map("fm", s, lambda x: [x, "z" + x, x + "'"])
        elif mid == "filter":
            s = op.filter("fl", s, lambda x: x not in ("b2", "a3"))
        keyed = op.key_on("key", s, lambda x: x[0])
        echo = _batch_logic(lib)
        op.output("out", op.stateful_batch("echo", keyed, lambda _s: echo()), lib["TestingSink"](out))
        return flow

    want, got = _both(build)
    assert got == want


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_two_stateful_steps_and_merge(batch_size: int) -> None:
    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("order2")
        a = op.input("a", flow, lib["TestingSource"](ITEMS, batch_size))
        b = op.input("b", flow, lib["TestingSource"](["d9", "a9", "c9", "b9", "a8"], batch_size))
        keyed = op.key_on("key", op.merge("m", a, b), lambda x: x[0])
        counts = op.stateful_map("count", keyed, lambda n, v: ((n or 0) + 1, v + str((n or 0) + 1)))
        rekeyed = op.map("rekey", counts, lambda kv: (kv[1][-1], kv[1]))
        op.output("out", op.fold_final("last", rekeyed, list, lambda acc, v: [*acc, v]), lib["TestingSink"](out))
        op.output("out2", counts, lib["TestingSink"](out))
        return flow

    want, got = _both(build)
    assert got == want


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_two_stateful_steps_in_a_row(batch_size: int) -> None:
    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("order3")
        s = op.input("inp", flow, lib["TestingSource"](ITEMS, batch_size))
        keyed = op.key_on("key", s, lambda x: x[0])
        echo = _batch_logic(lib)
        first = op.stateful_batch("echo", keyed, lambda _s: echo())
        rekeyed = op.map("rekey", first, lambda kv: (str(len(kv[1])) if kv[1] != "eof" else "e", kv))
        op.output("out", op.stateful_batch("echo2", rekeyed, lambda _s: echo()), lib["TestingSink"](out))
        return flow

    want, got = _both(build)
    assert got == want


def test_file_source_key_on_stateful_map(tmp_path: Path) -> None:
    rng = random.Random(13)
    path = tmp_path / "events.txt"
    path.write_text("".join(f"k{rng.randrange(40)},{i}\n" for i in range(2500)))

    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("file")
        s = op.input("inp", flow, lib["FileSource"](path))
        keyed = op.key_on("key", s, lambda line: line.split(",")[0])
        total = op.stateful_map("sum", keyed, lambda acc, line: ((acc or 0) + 1, (acc or 0) + 1))
        op.output("out", total, lib["TestingSink"](out))
        return flow

    want, got = _both(build)
    assert len(want) == 2500
    assert got == want


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_fold_final_many_keys(batch_size: int) -> None:
    keys = [f"key{i:02d}" for i in range(50)]
    random.Random(7).shuffle(keys)
    items = [(k, i) for i in range(3) for k in keys]

    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]
        flow = lib["Dataflow"]("fold")
        s = op.input("inp", flow, lib["TestingSource"](items, batch_size))
        op.output("out", op.fold_final("sum", s, lambda: 0, lambda a, v: a + v), lib["TestingSink"](out))
        return flow

    want, got = _both(build)
    assert [k for k, _ in want] == sorted(keys)
    assert got == want


def test_stateful_logic_on_eof_and_notify_order() -> None:
    keys = ["m", "c", "x", "a", "q", "b"]

    def build(lib: dict[str, Any], out: list[Any]) -> Any:
        op = lib["op"]

        class Timer(lib["StatefulLogic"]):  # type: ignore[misc,name-defined]
            """Asks for a notification in the past (due at once, earliest for the last keys)."""

            def __init__(self) -> None:
                self.seen: list[Any] = []
                self.at: datetime | None = None

            def on_item(self, value: Any) -> Any:
                self.seen.append(value)
                self.at = T0 + timedelta(seconds=100 - value)
                return [("item", value)], False

            def on_notify(self) -> Any:
                self.at = None
                return [("notify", self.seen[:])], False

            def notify_at(self) -> datetime | None:
                return self.at

            def on_eof(self) -> Any:
                return [("eof", self.seen[:])], False

            def snapshot(self) -> Any:
                return None

        flow = lib["Dataflow"]("timers")
        s = op.input("inp", flow, lib["TestingSource"]([(k, i) for i, k in enumerate(keys)], 10))
        op.output("out", op.stateful("t", s, lambda _s: Timer()), lib["TestingSink"](out))
        return flow

    want, got = _both(build)
    assert got == want
