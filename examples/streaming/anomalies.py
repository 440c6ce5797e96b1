"""Anomaly detection with bounded state per sensor, as a stream (reuses `examples/anomaly_detection.py`).

Input: JSON files of readings `{"sensor", "value"}`. Each sensor keeps its last 20 values
(a bounded deque, snapshotted into the checkpoint); a reading whose z-score against them is
above 3 is written as `{"sensor", "value", "z"}`. Run it with `python examples/streaming/anomalies.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import flowspark.operators as op
from flowspark.dataflow import Stream

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from anomaly_detection import by_sensor, make_detector  # noqa: E402
from common import demo, local_flow, streaming_flow  # noqa: E402

IN_SCHEMA = "sensor STRING, value DOUBLE"
OUT_SCHEMA = "sensor STRING, value DOUBLE, z DOUBLE"
_NORMAL = [20.0, 20.5, 19.5, 20.2, 19.8, 20.1, 19.9, 20.3, 19.7, 20.0]
BATCH_1 = [{"sensor": s, "value": v + (0 if s == "s1" else 30)} for v in _NORMAL for s in ("s1", "s2")]
BATCH_2 = [{"sensor": "s1", "value": 35.0}, {"sensor": "s2", "value": 50.1}, {"sensor": "s2", "value": 10.0}]


def _row(hit: tuple[str, tuple[float, float]]) -> dict[str, Any]:
    sensor, (value, z) = hit
    return {"sensor": sensor, "value": value, "z": round(z, 6)}


def pipeline(events: Stream[dict[str, Any]]) -> Stream[dict[str, Any]]:
    """Readings -> anomaly rows."""
    keyed = op.map("by_sensor", events, by_sensor)
    hits = op.stateful_flat_map("detect", keyed, make_detector(20, 5, 3.0))
    return op.map("rows", hits, _row)


def streaming(in_dir: Path, out_dir: Path) -> Any:
    """The flow on Spark streaming."""
    return streaming_flow("anomalies", in_dir, IN_SCHEMA, pipeline, out_dir, OUT_SCHEMA)


def local(events: list[Any], out: list[Any]) -> Any:
    """The flow in memory."""
    return local_flow("anomalies", events, pipeline, out)


def main() -> None:
    demo("anomalies", streaming, [BATCH_1, BATCH_2])


if __name__ == "__main__":
    main()
