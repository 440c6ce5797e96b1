"""The streaming examples: two runs on one checkpoint (new files between) equal the in-memory executor.

The in-memory run reads the same events with `TestingSource.ABORT()` at the end, so it stops
without end of input, as a stream does; the timeout examples put a `PAUSE` between the two
batches and run on a logical clock, the streaming runs on an injected clock that moves by the
same amount between the runs.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flowspark.testing import TestingSource, per_key, run_main

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "streaming"
T0 = datetime(2026, 1, 1, 9, tzinfo=timezone.utc)


def _load(name: str) -> Any:
    sys.path.insert(0, str(EXAMPLES))
    sys.path.insert(0, str(EXAMPLES.parent))
    spec = importlib.util.spec_from_file_location(f"streaming_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _canon(rows: list[dict[str, Any]], key: str) -> dict[str, list[tuple]]:
    return {k: sorted(v) for k, v in per_key((r[key], tuple(sorted(r.items()))) for r in rows).items()}


@pytest.mark.parametrize(
    ("name", "key", "gap"),
    [
        ("sessions", "user", timedelta(minutes=31)),
        ("active_users", "user", timedelta(minutes=6)),
        ("anomalies", "sensor", None),
        ("funnel", "user", None),
    ],
)
def test_streaming_example_equals_in_memory(spark, tmp_path, name, key, gap):
    mod = _load(name)
    common = sys.modules["common"]
    clock = sys.modules["common"].FileClock(tmp_path / "now") if gap is not None else None
    for i, (batch, at) in enumerate([(mod.BATCH_1, T0), (mod.BATCH_2, T0 + (gap or timedelta(0)))], start=1):
        common.stage_file(tmp_path / "in", f"{i:04d}.json", batch)
        if clock is not None:
            clock.set(at)
        lines: list[str] = []
        common.run(
            mod.streaming(tmp_path / "in", tmp_path / "out"),
            tmp_path / "chk",
            spark=spark,
            clock=clock,
            progress=lines.append,
        )
        assert lines, "one progress line per micro-batch"
    streamed = common.read_rows(tmp_path / "out")

    events: list[Any] = [*mod.BATCH_1]
    if gap is not None:
        events.append(TestingSource.PAUSE(gap))
    events += [*mod.BATCH_2, TestingSource.ABORT()]  # stop without end of input, as a stream does
    local: list[Any] = []
    run_main(mod.local(events, local), clock="logical", start_time=T0, roundtrip_state=True)
    assert streamed, "the example writes rows"
    assert _canon(streamed, key) == _canon(local, key)


def test_trades_windows_and_late_trades(spark, tmp_path):
    mod = _load("trades")
    common = sys.modules["common"]
    clock = common.FileClock(tmp_path / "now")
    clock.set(T0)  # system time stands still: the watermark moves with event time only
    for i, batch in enumerate([mod.BATCH_1, mod.BATCH_2], start=1):
        common.stage_file(tmp_path / "in", f"{i:04d}.json", batch)
        common.run(
            mod.streaming(tmp_path / "in", tmp_path / "out"), tmp_path / "chk", spark=spark, clock=clock, progress=False
        )
    profits = common.read_rows(tmp_path / "out" / "profits")
    late = common.read_rows(tmp_path / "out" / "late")
    local_p: list[Any] = []
    local_l: list[Any] = []
    run_main(
        mod.local([*mod.BATCH_1, *mod.BATCH_2, TestingSource.ABORT()], local_p, local_l), clock="logical", start_time=T0
    )
    assert _canon(profits, "symbol") == _canon(local_p, "symbol")
    assert _canon(late, "symbol") == _canon(local_l, "symbol")
    assert late == [
        {"symbol": "AAPL", "window_start": "2024-05-01T09:00:00+00:00", "trade_time": "2024-05-01T09:01:00+00:00"}
    ]
    assert len(profits) == 3  # AAPL 09:00 and 09:05, MSFT 09:00 closed by the watermark; the rest stay open
