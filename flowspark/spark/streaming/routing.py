"""Routed lowering: every stage of a streaming query is read exactly once.

Spark plans a streaming DataFrame once per reader: a keyed stage
(`applyInPandasWithState` / `transformWithStateInPandas`) read by two sinks, by
a sink and the next keyed stage, or by two branches would run (and keep state)
twice, and Spark refuses a second `applyInPandasWithState` in one query. When a
plan has a stage with more than one reader, the streaming lowering therefore
threads all rows through *one chain* of DataFrames in stage order: stage `T`
reads every row of the chain so far, consumes the rows of the ports it reads,
passes on (*forwards*) the rows some later stage or a sink still needs, and adds
its own rows. The last DataFrame of the chain feeds the query's one writer,
which routes rows to sinks by port. Every row carries its *route*: `stage id *
ROUTE + port` (the `p` column).

A keyed stage groups its consumed rows by bucket as usual and sends the rows it
forwards to one extra group, `buckets`, whose call only hands them back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark.plan.types import Plan, StageSpec
from flowspark.spark.worker.codec import apply_pad, encode_task_error, loads_all

__all__ = ["ROUTE", "Route", "needs_routing", "routed_stage_function", "routes"]

#: Route of a row: `stage id * ROUTE + port` (a stage has fewer than ROUTE ports).
ROUTE = 1024
#: Route of tick rows (they only make a micro-batch run).
TICK_ROUTE = -1


@dataclass(frozen=True)
class Route:
    """What one stage does with the rows of the chain.

    Attributes:
        stage: The stage id.
        consumed: Route -> pad (see `StagePlan.inputs`) of every port the stage reads.
        forward: Routes of rows the stage passes on unchanged (a later stage or a
            sink still reads them).
    """

    stage: int
    consumed: dict[int, bytes]
    forward: frozenset[int]

    @property
    def offset(self) -> int:
        """Added to a port index of this stage to make its route."""
        return self.stage * ROUTE


def needs_routing(plan: Plan) -> bool:
    """Whether some stage's DataFrame would be read more than once.

    Readers: each port another stage reads, and the query's writer (which reads
    every stage with a sink or inspect port once).

    Args:
        plan: The plan.

    Returns:
        True when the routed lowering is needed.
    """
    reads: dict[int, int] = {}
    for st in plan.stages:
        for s, _p, _pad in st.inputs:
            reads[s] = reads.get(s, 0) + 1
    for s in {sk.port[0] for sk in plan.sinks} | {ins.port[0] for ins in plan.inspects}:
        reads[s] = reads.get(s, 0) + 1
    return any(n > 1 for n in reads.values())


def routes(plan: Plan) -> dict[int, Route]:
    """The route of every stage of the chain (see the module doc).

    Args:
        plan: The plan.

    Returns:
        Stage id -> its `Route`.
    """
    readers: dict[int, set[int]] = {}
    for st in plan.stages:
        for s, p, _pad in st.inputs:
            readers.setdefault(s * ROUTE + p, set()).add(st.spec.stage_id)
    written = [sk.port for sk in plan.sinks] + [i.port for i in plan.inspects] + plan.dead_ports()
    at_writer = {s * ROUTE + p for s, p in written}
    out: dict[int, Route] = {}
    for st in plan.stages:
        t = st.spec.stage_id
        forward = frozenset(
            r
            for r in set(readers) | at_writer
            if r // ROUTE < t and (r in at_writer or any(x > t for x in readers.get(r, ())))
        )
        out[t] = Route(t, {s * ROUTE + p: pad for s, p, pad in st.inputs}, forward)
    return out


def routed_stage_function(
    spec: StageSpec,
    route: Route,
    stage: Callable[[list[tuple[bytes, Any]]], Any],
    clock: Optional[Callable[[], datetime]],
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The `mapInArrow` function of a map stage in the chain.

    Args:
        spec: The stage.
        route: Its route.
        stage: Runs the stage over `(sequence, item)` pairs of its entry stream and
            returns its port rows (`flowspark.spark.worker.stage.run_stage_rows` bound to `spec`).
        clock: The injected clock (read when a task starts), else the wall clock.

    Returns:
        A function from Arrow batches `(p, k, seq, v)` to Arrow batches of the same schema.
    """

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from flowspark._time import use_clock
        from flowspark.spark.worker.stage import task_gc

        t = clock() if clock is not None else datetime.now(timezone.utc)
        try:
            with use_clock(lambda: t), task_gc():
                for b in batches:
                    ps = b.column(0).to_pylist()
                    keep = [i for i, p in enumerate(ps) if p in route.forward]
                    mine = [i for i, p in enumerate(ps) if p in route.consumed]
                    seqs = b.column(2).to_pylist()
                    vs = b.column(3).to_pylist()
                    items = list(
                        zip(
                            [apply_pad(seqs[i], route.consumed[ps[i]]) for i in mine],
                            loads_all([vs[i] for i in mine]),
                            strict=True,
                        )
                    )
                    cols = stage(items) if items else ([], [], [], [])
                    ks = b.column(1).to_pylist()
                    yield pa.RecordBatch.from_arrays(
                        [
                            pa.array([ps[i] for i in keep] + [route.offset + p for p in cols[0]], pa.int32()),
                            pa.array([ks[i] for i in keep] + cols[1], pa.string()),
                            pa.array([seqs[i] for i in keep] + cols[2], pa.binary()),
                            pa.array([vs[i] for i in keep] + cols[3], pa.binary()),
                        ],
                        names=["p", "k", "seq", "v"],
                    )
        except FlowsparkRuntimeError as f:
            raise RuntimeError(encode_task_error(f)) from None

    return fn


def forward_frame(pdfs: Iterator[Any], forward: frozenset[int]) -> Optional[Any]:
    """The rows a keyed stage's forward group hands back (tick rows dropped).

    Args:
        pdfs: pandas DataFrames `(p, k, seq, v, ...)`.
        forward: Routes to pass on.

    Returns:
        A pandas DataFrame `(p, k, seq, v)`, or `None` when empty.
    """
    import pandas as pd

    parts = [pdf[pdf["p"].isin(list(forward))][["p", "k", "seq", "v"]] for pdf in pdfs]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else None
