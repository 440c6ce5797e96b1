"""The sink rules' checks (`flowspark.spark.optimize.RULES` lists the rules, in order).

A sink rule is decided for each output step (`SinkPlan`): whether Spark writes it, how
it gets its schema, whether its stage emits its rows itself; `concurrent_sinks`, decided
once for the job, whether its SparkSinks are written at once. Each check returns `None`
when the rule applies, else the reason.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

from flowspark.spark.outputs import SparkSink
from flowspark.spark.plan import Plan, SinkPlan
from flowspark.spark.rulebook import Work

__all__ = [
    "NOT_NATIVE",
    "apply_concurrent",
    "check_aggregate_sample",
    "check_concurrent",
    "check_fusion",
    "check_native_rows",
    "check_sampling",
    "sink_mode",
    "stage_reads",
]

NOT_NATIVE = "not written by Spark: neither a SparkSink nor a ForeachBatchSink"


def _cheap_to_rerun(w: Work, sid: int) -> Optional[str]:
    """Why stage `sid` should not run twice (a sampling job, then the write), or `None`."""
    st = w.stage(sid)
    if st.kind == "source":
        if w.spec(sid).source in ("native", "chunks"):
            return None
        return "its stage reads a Python source, whose partitions would be opened twice"
    if st.kind == "keyed" and any(w.applied(r, f"stage {sid}") for r in ("spark_keys", "native_reduction")):
        return None
    return "its stage is fed by another Python stage, which would run twice"


def _sole_spark_sink(w: Work, sk: SinkPlan) -> Optional[str]:
    """Why `sk` is not a sink Spark writes that alone reads its stage's only port, or `None`."""
    if sk.where != "native" or not hasattr(sk.sink, "schema"):
        return NOT_NATIVE
    if w.plan.dead_letter is not None:
        return "the run has a dead letter"
    if w.sink_of(sk.port[0]) is not sk:
        return f"stage {sk.port[0]} has other outputs"
    return None


def check_sampling(w: Work, step: str) -> Optional[str]:
    """`schema_sampling`: a SparkSink without a schema, alone on its stage, which is cheap to run again."""
    sk = w.sinks[step]
    why = _sole_spark_sink(w, sk)
    if why is not None:
        return why
    if sk.sink.schema is not None:
        return "the sink has a schema"
    return _cheap_to_rerun(w, sk.port[0])


def check_fusion(w: Work, step: str) -> Optional[str]:
    """`sink_fusion`: the stage feeding a SparkSink alone can emit the sink's typed rows itself."""
    sk = w.sinks[step]
    sid = sk.port[0]
    why = _sole_spark_sink(w, sk)
    if why is not None:
        return why
    if w.env.target == "batch":
        if sk.sink.schema is None and not w.applied("schema_sampling", f"sink {step}"):
            return "the schema comes from the stage's persisted output"
        return None
    if w.env.writer_sink != step:
        return "Spark's streaming writer does not take it (not the query's lone SparkSink with a schema)"
    if w.stage(sid).kind != "keyed":
        return f"stage {sid} is not keyed"
    if w.env.routed:
        return "the query is routed"
    if not w.env.session:
        return "the schema's columns are checked with a session; this plan was made without one"
    if step not in w.env.atomic_sinks:
        return "the schema has non-atomic columns"
    return None


def sink_mode(name: str) -> Callable[[Work, str], None]:
    """A sink rule's effect: mode `name` on the sink and on the stage feeding it."""

    def apply(w: Work, step: str) -> None:
        sk = w.sinks[step]
        w.sinks[step] = dataclasses.replace(sk, modes=sk.modes | {name})
        w.add_mode(sk.port[0], name)

    return apply


def _aggregate_sink(w: Work, step: str, rule: str) -> Optional[str]:
    """Why sink `step` is not one the rule `rule` applied to, fed by a Spark aggregate; `None` when it is."""
    if not w.applied(rule, f"sink {step}"):
        return f"{rule} did not apply"
    sid = w.sinks[step].port[0]
    if not w.applied("native_reduction", f"stage {sid}"):
        return f"stage {sid} is not a Spark aggregate (native_reduction)"
    return None


def check_prefix_sample(w: Work, step: str) -> Optional[str]:
    """`prefix_sample`: a sampled sink fed by a Spark-keyed stage of `stateful_map` steps samples the first rows."""
    if not w.applied("schema_sampling", f"sink {step}"):
        return "schema_sampling did not apply"
    sid = w.sinks[step].port[0]
    if not w.applied("spark_keys", f"stage {sid}"):
        return f"stage {sid} is not keyed by Spark (spark_keys)"
    plain = [ks.step_id for ks in w.spec(sid).chain if ks.batch_fn is None]
    if plain:
        return (
            f"step {plain[0]!r} is not a function of its state (stateful_map): a key's first values need not "
            "give its first emits"
        )
    return None


def check_driver_prefix(w: Work, step: str) -> Optional[str]:
    """`driver_prefix`: the first rows `prefix_sample` takes come from a parquet source's files, read at the driver."""
    if not w.applied("prefix_sample", f"sink {step}"):
        return "prefix_sample did not apply"
    if w.env.connect:
        return "the session is a Spark Connect session (the scan's plan is not at the driver)"
    ck = w.spec(w.sinks[step].port[0]).column_key
    assert ck is not None
    fmt = getattr(w.stage(ck.source_stage).source, "format", None)
    if fmt != "parquet":
        return f"the SparkSource reads {fmt}, not parquet files"
    return None


def check_aggregate_sample(w: Work, step: str) -> Optional[str]:
    """`aggregate_sample`: a sampled sink fed by a Spark aggregate takes the check job's first rows."""
    return _aggregate_sink(w, step, "schema_sampling")


def check_native_rows(w: Work, step: str) -> Optional[str]:
    """`native_rows`: a fused sink fed by a Spark aggregate through one proven pair-to-dict map."""
    why = _aggregate_sink(w, step, "sink_fusion")
    if why is not None:
        return why
    spec = w.spec(w.sinks[step].port[0])
    maps = [o for o in spec.ops if o.kind != "pass"]
    if spec.one_to_one_mappers() is None or len(maps) != 1 or maps[0].pair_row is None:
        return (
            "the stage's steps after the reduction are not one map proven to make {name: key, name: value} "
            "(lambda kv: {'user': kv[0], 'n': kv[1]})"
        )
    return None


def stage_reads(plan: Plan) -> dict[int, int]:
    """How often a batch job reads each stage's DataFrame; one read more than once is persisted and materialized.

    The batch lowering (`flowspark.spark.batch._Job.build`) persists a stage read more than once and
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


def check_concurrent(w: Work, _subject: Any) -> Optional[str]:
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


def apply_concurrent(w: Work, _subject: Any) -> None:
    """`concurrent_sinks`: mode `concurrent_sinks` on each SparkSink (the lowering writes them at once)."""
    for sk in _spark_sinks(w):
        w.sinks[sk.step_id] = dataclasses.replace(sk, modes=sk.modes | {"concurrent_sinks"})
