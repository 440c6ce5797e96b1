"""Any flow shape starts as a stream: a keyed stage runs once per micro-batch whatever reads it.

Each case runs the same flow on the in-memory executor (a bounded copy of the source) and as a
Structured Streaming query (`available_now`, two runs on one checkpoint with new files between
them) and compares what every sink received, per key.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest
from streaming_helpers import JsonlDirSource, count_mapper, parity_key, write_jsonl

import flowspark.operators as op
import flowspark.operators.windowing as win
from flowspark.dataflow import Dataflow
from flowspark.testing import TestingSink, per_key, run_main

pytestmark = [pytest.mark.spark]

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

FIRST = [{"user": f"u{i % 3}", "n": i, "t": i * 10} for i in range(12)]
SECOND = [{"user": f"u{i % 2}", "n": 100 + i, "t": 200 + i * 10} for i in range(6)]


def _user(e: dict) -> str:
    return e["user"]


def _is_even(kv: tuple[str, Any]) -> bool:
    return kv[1] % 2 == 0


def _two_sinks(s: Any, sinks: dict[str, list]) -> None:
    counts = op.stateful_map("count", op.key_on("key", s, _user), count_mapper)
    op.output("all", counts, TestingSink(sinks["all"]))
    op.output("even_out", op.filter("even", counts, _is_even), TestingSink(sinks["even"]))


def _branch_after_stateful(s: Any, sinks: dict[str, list]) -> None:
    counts = op.stateful_map("count", op.key_on("key", s, _user), count_mapper)
    b = op.branch("parity", counts, _is_even)
    op.output("evens", b.trues, TestingSink(sinks["evens"]))
    op.output("odds", b.falses, TestingSink(sinks["odds"]))


def _running_sum(state: Any, e: dict) -> tuple[int, int]:
    total = (state or 0) + e["n"]
    return total, total


def _merge_two_stateful(s: Any, sinks: dict[str, list]) -> None:
    keyed = op.key_on("key", s, _user)
    counts = op.map_value("tag_count", op.stateful_map("count", keyed, count_mapper), _tag("count"))
    sums = op.map_value("tag_sum", op.stateful_map("sum", keyed, _running_sum), _tag("sum"))
    op.output("both_out", op.merge("both", counts, sums), TestingSink(sinks["both"]))


def _tag(name: str) -> Callable[[Any], tuple[str, Any]]:
    return lambda v: (name, v)


def _per_key_and_upstream(items: list[Any]) -> dict[tuple[str, str], list[Any]]:
    """A merge keeps each upstream's order; across upstreams the order depends on batching."""
    return per_key(((k, tag), v) for k, (tag, v) in items)


def _rekeyed_chain(s: Any, sinks: dict[str, list]) -> None:
    counts = op.stateful_map("count", op.key_on("key", s, _user), count_mapper)
    op.output("per_user", counts, TestingSink(sinks["per_user"]))
    by_parity = op.key_on("parity", counts, parity_key)
    op.output("per_parity", op.stateful_map("count2", by_parity, count_mapper), TestingSink(sinks["per_parity"]))


def _inspect_and_sink(s: Any, sinks: dict[str, list]) -> None:
    counts = op.stateful_map("count", op.key_on("key", s, _user), count_mapper)
    seen = sinks["seen"]
    counts = op.inspect("look", counts, lambda _sid, x: seen.append(x))
    op.output("out", counts, TestingSink(sinks["out"]))


def _event_time(e: dict) -> datetime:
    return T0 + timedelta(seconds=e["t"])


def _add_n(acc: int, e: dict) -> int:
    return acc + e["n"]


def _window_ports(s: Any, sinks: dict[str, list]) -> None:
    clock = win.EventClock(_event_time, wait_for_system_duration=timedelta(0))
    windower = win.TumblingWindower(length=timedelta(seconds=60), align_to=T0)
    out = win.fold_window("w", op.key_on("key", s, _user), clock, windower, int, _add_n, int.__add__)
    op.output("down", out.down, TestingSink(sinks["down"]))
    op.output("late", out.late, TestingSink(sinks["late"]))
    meta = op.map_value("times", out.meta, lambda m: (m[0], m[1].open_time, m[1].close_time))
    op.output("meta", meta, TestingSink(sinks["meta"]))


# Window input: per user, windows [0, 60) and [60, 120) s; a late value for [0, 60); a value at
# 1000 s closes [60, 120) on data (its own window only closes at end of input, left out below).
WIN_FIRST = [{"user": u, "n": n, "t": t} for u in ("a", "b") for n, t in ((1, 0), (2, 30), (3, 70))]
WIN_SECOND = [{"user": u, "n": n, "t": t} for u in ("a", "b") for n, t in ((4, 10), (5, 1000))]


def _before_flush(item: tuple[str, Any]) -> bool:
    """Leave out what only end of input emits: the window holding the 1000 s flush value."""
    return item[1][0] < 1000 // 60


SHAPES: list[tuple[str, Callable[..., None], list[str], list, list, Callable[[Any], bool]]] = [
    ("two_sinks", _two_sinks, ["all", "even"], FIRST, SECOND, lambda x: True),
    ("branch", _branch_after_stateful, ["evens", "odds"], FIRST, SECOND, lambda x: True),
    ("merge_of_two_stateful", _merge_two_stateful, ["both"], FIRST, SECOND, lambda x: True),
    ("rekeyed_chain_two_sinks", _rekeyed_chain, ["per_user", "per_parity"], FIRST, SECOND, lambda x: True),
    ("inspect_and_sink", _inspect_and_sink, ["seen", "out"], FIRST, SECOND, lambda x: True),
    ("window_down_late_meta", _window_ports, ["down", "late", "meta"], WIN_FIRST, WIN_SECOND, _before_flush),
]


def _flow(src: Any, build: Callable[..., None], sinks: dict[str, list]) -> Dataflow:
    flow = Dataflow("shape")
    build(op.input("inp", flow, src), sinks)
    return flow


@pytest.mark.parametrize(("name", "build", "names", "first", "second", "keep"), SHAPES, ids=[s[0] for s in SHAPES])
def test_shape_starts_as_a_stream_and_matches_the_in_memory_executor(
    spark, tmp_path, name, build, names, first, second, keep
):
    from flowspark.spark.streaming import run_streaming

    root = str(tmp_path / "in")
    write_jsonl(f"{root}/p/0001.jsonl", first)
    local: dict[str, list] = {n: [] for n in names}
    streamed: dict[str, list] = {n: [] for n in names}
    chk = str(tmp_path / "chk")
    for part in (1, 2):
        if part == 2:
            write_jsonl(f"{root}/p/0002.jsonl", second)
        run_streaming(
            _flow(JsonlDirSource(root, ["p"], batch=4), build, streamed),
            spark=spark,
            checkpoint=chk,
            trigger="available_now",
            progress=False,
            max_items=5,  # several micro-batches per run
        )
    run_main(_flow(JsonlDirSource(root, ["p"], batch=4, bounded=True), build, local))
    for n in names:
        want = [x for x in local[n] if keep(x)]
        got = [x for x in streamed[n] if keep(x)]
        assert len(got) == len(want) > 0, n
        group = _per_key_and_upstream if name == "merge_of_two_stateful" else per_key
        assert group(got) == group(want), n
