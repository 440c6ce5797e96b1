"""Anomaly detection per key: |z-score| > 3 over the last 100 values (`stateful_flat_map`).

Input: readings `{"sensor", "value"}` from a CSV file (default
`examples/data/sensor_readings.csv`) or a list of dicts. Output:
`(sensor, value, z)` for each anomalous value, each sensor's in input order;
across sensors, Bytewax's order (each source batch grouped by sensor, sensors
sorted: the sample file is one batch).

For each reading, `z = (value - mean) / std` where mean and (population)
standard deviation are those of the sensor's previous `window` values (up to
100; at least `min_history` needed before anything is flagged). Every reading,
anomalous or not, then enters the window. If the window has no spread
(std 0), any different value is flagged with an infinite z.

State per sensor is bounded: a `deque(maxlen=window)` plus running sums of the
values and their squares (shifted by the sensor's first value for accuracy),
so each reading costs O(1); the sums are recomputed from the window every
`window` evictions so rounding errors cannot build up.

Run it:

    python examples/anomaly_detection.py
    python -m flowspark.run "examples/anomaly_detection.py:get_flow(threshold=2.5)"
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream
from flowspark.inputs import CSVSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "sensor_readings.csv"
WINDOW = 100
MIN_HISTORY = 10
THRESHOLD = 3.0


def read_readings(flow: Dataflow, path: Any, readings: Optional[list[Any]]) -> Stream[dict[str, Any]]:
    """Where the readings come from: a list of dicts if given, else the CSV file."""
    if readings is not None:
        return op.input("inp", flow, TestingSource(readings))
    return op.input("inp", flow, CSVSource(path))


def by_sensor(reading: dict[str, Any]) -> tuple[str, float]:
    """`{"sensor": "s1", "value": "20.1"}` -> `("s1", 20.1)`."""
    value = float(reading["value"])
    if not math.isfinite(value):
        msg = f"value must be a finite number; received {reading!r}"
        raise ValueError(msg)
    return str(reading["sensor"]), value


class Stats:
    """The last `window` values of one sensor and their shifted running sums."""

    def __init__(self, window: int, shift: float) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.shift = shift
        self.s1 = 0.0  # sum of (v - shift)
        self.s2 = 0.0  # sum of (v - shift) ** 2
        self.evictions = 0

    def zscore(self, value: float) -> Optional[float]:
        """The z-score of `value` against the window, or None if the window has no spread."""
        n = len(self.values)
        mean = self.s1 / n
        var = max(self.s2 / n - mean * mean, 0.0)
        d = value - self.shift - mean
        if var == 0.0:
            return None if d == 0.0 else math.copysign(math.inf, d)
        return d / math.sqrt(var)

    def push(self, value: float) -> None:
        values = self.values
        if len(values) == values.maxlen:
            old = values[0] - self.shift
            self.s1 -= old
            self.s2 -= old * old
            self.evictions += 1
        values.append(value)
        x = value - self.shift
        self.s1 += x
        self.s2 += x * x
        if self.evictions >= len(values):
            self.s1 = math.fsum(v - self.shift for v in values)
            self.s2 = math.fsum((v - self.shift) ** 2 for v in values)
            self.evictions = 0


def make_detector(window: int, min_history: int, threshold: float) -> Any:
    """The stateful_flat_map mapper: `(Stats | None, value) -> (Stats, [(value, z)] or [])`."""

    def detect(stats: Optional[Stats], value: float) -> tuple[Stats, list[tuple[float, float]]]:
        if stats is None:
            stats = Stats(window, value)
        emits = []
        if len(stats.values) >= min_history:
            z = stats.zscore(value)
            if z is not None and abs(z) > threshold:
                emits.append((value, z))
        stats.push(value)
        return stats, emits

    return detect


def flatten(sensor_hit: tuple[str, tuple[float, float]]) -> tuple[str, float, float]:
    sensor, (value, z) = sensor_hit
    return sensor, value, z


def get_flow(
    path: Any = DATA,
    readings: Optional[list[Any]] = None,
    sink: Any = None,
    window: int = WINDOW,
    min_history: int = MIN_HISTORY,
    threshold: float = THRESHOLD,
) -> Dataflow:
    """Build the flow.

    Args:
        path: CSV file with `sensor,value` columns.
        readings: Use these dicts instead of the file.
        sink: Where to write `(sensor, value, z)` (default: standard output).
        window: How many past values per sensor the z-score looks at.
        min_history: Flag nothing until a sensor has this many past values (>= 2).
        threshold: Flag values with `abs(z) > threshold`.
    """
    if window < 2 or not 2 <= min_history <= window:
        msg = f"need window >= 2 and 2 <= min_history <= window; received window={window}, min_history={min_history}"
        raise ValueError(msg)
    flow = Dataflow("anomaly_detection")
    s = read_readings(flow, path, readings)
    keyed = op.map("by_sensor", s, by_sensor)
    hits = op.stateful_flat_map("zscore", keyed, make_detector(window, min_history, threshold))
    op.output("out", op.map("flatten", hits, flatten), sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
