"""The rule `concurrent_sinks`: a batch job's SparkSinks written as concurrent Spark jobs.

And the reads of each stage it relies on (`stage_reads`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from flowspark.spark.io.outputs import SparkSink
from flowspark.spark.plan.types import Plan, SinkPlan
from flowspark.spark.rules.book import BATCH, Rule, Work

__all__ = ["CONCURRENT_SINKS", "stage_reads"]


def stage_reads(plan: Plan) -> dict[int, int]:
    """How often a batch job reads each stage's DataFrame; one read more than once is persisted and materialized.

    The batch lowering (`flowspark.spark.batch.job._Job.build`) persists a stage read more than once and
    counts it (one job) before any sink is written, so no user callable runs twice for an item; the
    rule `concurrent_sinks` relies on that. A stage Spark aggregates reads no DataFrame of its
    input (the aggregate reads the SparkSource's rows), and a sink its stage writes itself
    (`sink_fusion`) reads none of the stage's.

    Args:
        plan: A physical plan.

    Returns:
        `stage id -> reads` (stages nobody reads are missing).
    """
    n: dict[int, int] = {}
    for st in plan.stages:
        for s, _p, _pad in () if st.spec.native else st.inputs:  # Spark aggregates the source's rows
            n[s] = n.get(s, 0) + 1
    driver_stages = {sk.port[0] for sk in plan.sinks if sk.where == "driver"}
    driver_stages |= {ins.port[0] for ins in plan.inspects}
    for s in driver_stages:
        n[s] = n.get(s, 0) + 1
    for s, _p in plan.dead_ports():
        n[s] = n.get(s, 0) + 1  # the dead letter's read
    for sk in plan.sinks:
        if "sink_fusion" in sk.modes:
            continue  # the sink's rows come from the stage's input (`write_native`), not its DataFrame
        if sk.where != "driver":
            infer = sk.where == "native" and sk.sink.schema is None and "schema_sampling" not in sk.modes
            n[sk.port[0]] = n.get(sk.port[0], 0) + (2 if infer else 1)
    return n


def _out_path(sink: SparkSink) -> str:
    """A SparkSink's directory, comparable: absolute for a local path, else as given without a trailing `/`."""
    path = sink.path
    if path.startswith("file:"):
        path = path[len("file:") :].lstrip("/")
        path = "/" + path
    if "://" in path:
        return path.rstrip("/")
    return os.path.normpath(os.path.abspath(path))


def _same_place(a: str, b: str) -> bool:
    """Whether two output directories are one, or one holds the other (an overwrite deletes the inner one)."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _what_writes_read(w: Work, sk: SinkPlan, reads: dict[int, int]) -> set[tuple[Any, ...]]:
    """What one sink's write job reads (`(kind, ...)`): the stages it computes and what it finds computed.

    `("computed", s)`: stage `s`'s Python pass runs in the write; `("materialized", s)`: the write reads
    stage `s`'s persisted DataFrame, materialized before any write (`stage_reads`); `("aggregate", s,
    key)`: a Spark aggregate of stage `s`'s rows, persisted and materialized by its check job
    (`native_reduction`); `("scan", s)`: stage `s`'s SparkSource rows, read by Spark alone (its steps
    run in the Spark-keyed stages reading it).
    """
    out: set[tuple[Any, ...]] = set()
    todo = [sk.port[0]]
    cached = "sink_fusion" not in sk.modes  # else the write runs its stage from the stage's input
    while todo:
        s = todo.pop()
        spec = w.spec(s)
        if "keyed_by_spark" in spec.modes:
            out.add(("scan", s))
        elif cached and reads.get(s, 0) > 1:
            out.add(("materialized", s))
        else:
            out.add(("computed", s))
            if spec.native is not None:
                out.add(("aggregate", spec.native.source_stage, spec.native.key))
            else:
                todo.extend(i for i, _p, _pad in w.stage(s).inputs)
        cached = True
    return out


def _describe_shared(shared: list[tuple[Any, ...]]) -> str:
    if not shared:
        return "the writes share no stage"
    what = []
    for kind, s, *key in sorted(shared):
        if kind == "aggregate":
            what.append(f"the Spark aggregate of stage {s} on {key[0]!r}, persisted and materialized by its check job")
        elif kind == "materialized":
            what.append(f"stage {s}, persisted and materialized before the writes")
        else:
            what.append(f"stage {s}'s SparkSource rows, each write's own scan (no Python pass)")
    return "the writes share " + "; ".join(what)


def _spark_sinks(w: Work) -> list[SinkPlan]:
    """The job's sinks Spark writes as a `SparkSink` (what `concurrent_sinks` writes at once)."""
    return [sk for sk in w.sinks.values() if sk.where == "native" and isinstance(sk.sink, SparkSink)]


def _check_concurrent(w: Work, _subject: Any) -> Optional[str]:
    """`concurrent_sinks`: two or more SparkSinks of a batch job, written at once without sharing work."""
    sinks = _spark_sinks(w)
    if len(sinks) < 2:
        return f"the job writes {len(sinks)} SparkSink{'' if len(sinks) == 1 else 's'}, not two or more"
    if w.plan.dead_letter is not None:
        return "the run has a dead letter (it collects the sinks' misfits after the writes)"
    tables = [sk.step_id for sk in sinks if sk.sink.format == "table"]
    if tables:
        return f"sink {tables[0]} writes a table (concurrent catalog updates are not verified here)"
    paths = [(sk.step_id, _out_path(sk.sink)) for sk in sinks]
    for i, (a, pa) in enumerate(paths):
        for b, pb in paths[i + 1 :]:
            if _same_place(pa, pb):
                return f"sinks {a} and {b} write to one directory ({pa} and {pb})"
    reads = stage_reads(w.current())
    seen: dict[tuple[Any, ...], int] = {}
    for sk in sinks:
        for thing in _what_writes_read(w, sk, reads):
            seen[thing] = seen.get(thing, 0) + 1
    shared = [t for t, n in seen.items() if n > 1]
    computed = sorted(t[1] for t in shared if t[0] == "computed")
    if computed:
        return f"stage {computed[0]} is not persisted and two writes would both run its Python pass"
    w.note("concurrent_sinks", "query", _describe_shared(shared))
    return None


def _apply_concurrent(w: Work, _subject: Any) -> None:
    """`concurrent_sinks`: mode `concurrent_sinks` on each SparkSink (the lowering writes them at once)."""
    for sk in _spark_sinks(w):
        w.sinks[sk.step_id] = dataclasses.replace(sk, modes=sk.modes | {"concurrent_sinks"})


CONCURRENT_SINKS = Rule(
    "concurrent_sinks",
    "query",
    BATCH,
    False,
    "a batch job's SparkSinks (two or more, distinct directories, no dead letter) are written as concurrent "
    "Spark jobs from driver threads, when no stage two writes read would run twice (every stage they share "
    "is persisted and materialized first)",
    _check_concurrent,
    _apply_concurrent,
)
