"""The Python pass over a stage Spark aggregated (the rule `native_reduction`), inside a Python worker.

The aggregate itself is built at the driver (`flowspark.spark.batch.native`); its rows reach the
stage function as Arrow batches, `(k, v)` for a reduction or `(k, wid, n)` for a window count,
and become the end-of-input emits the per-key driver would give (`eof_tag`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from flowspark.runtime.tags import EOF_BASE, eof_tag, idx
from flowspark.spark.plan.types import Aggregate, StageSpec

__all__ = ["aggregated_items"]


def aggregated_items(
    spec: StageSpec, batches: Iterator[Any], out_rows: int, ordered: bool
) -> Iterator[list[tuple[bytes, Any]]]:
    """The end-of-input emits of a stage Spark aggregated (the rule `native_reduction`): `(k, v)` rows, one per key.

    Each emit is `(key, result)` with the sequence the per-key driver gives an end-of-input
    emit (`eof_tag`); a sum computed as a decimal becomes a Python `int`. A window count's rows
    are `(k, wid, n)` (`_window_events`).
    """
    import pyarrow as pa

    agg = spec.native
    assert agg is not None
    if agg.window is not None:
        yield from _window_events(agg, batches, out_rows, ordered)
        return
    tail = idx(EOF_BASE)
    for b in batches:
        if not b.num_rows:
            continue
        keys = b.column(0).to_pylist()
        vs = b.column(1).to_pylist()
        if pa.types.is_decimal(b.column(1).type):
            vs = [None if v is None else int(v) for v in vs]
        seqs = [eof_tag(agg.level, k) + tail for k in keys] if ordered else [b""] * len(keys)
        items = list(zip(seqs, zip(keys, vs, strict=True), strict=True))
        for start in range(0, len(items), out_rows):
            yield items[start : start + out_rows]


def _window_events(agg: Aggregate, batches: Iterator[Any], out_rows: int, ordered: bool) -> Iterator[list[Any]]:
    """The events of a window count Spark aggregated: `(k, wid, n)` rows (sorted by key and window id in a partition).

    Each window gives the window step's two events, `(0, wid, n)` then `(2, wid, WindowMetadata)`:
    a key's windows close in window id order, on every runtime. They get end-of-input sequences
    (`eof_tag`), then the window id and the event: the order across keys is not read (the rule's
    precondition), a key's order is kept.
    """
    from flowspark.operators.windowing import closed_window_events

    w = agg.window
    assert w is not None
    pending: list[Any] = []
    last: Any = None
    head = b""
    for b in batches:
        for k, wid, n in zip(*(b.column(c).to_pylist() for c in range(3)), strict=True):
            down, meta = closed_window_events(w, wid, n)
            if ordered:
                if k != last:
                    last, head = k, eof_tag(agg.level, k) + idx(EOF_BASE)
                at = head + struct.pack(">Q", wid + (1 << 63))
                pending.append((at + b"\0", (k, down)))
                pending.append((at + b"\1", (k, meta)))
            else:
                pending.append((b"", (k, down)))
                pending.append((b"", (k, meta)))
            if len(pending) >= out_rows:
                yield pending
                pending = []
    if pending:
        yield pending
