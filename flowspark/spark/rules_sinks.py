"""The sink rules' checks (`flowspark.spark.optimize.RULES` lists the rules, in order).

A sink rule is decided for each output step (`SinkPlan`): whether Spark writes it, how
it gets its schema, whether its stage emits its rows itself. Each check returns `None`
when the rule applies, else the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from flowspark.spark.plan import SinkPlan
from flowspark.spark.rulebook import Work

__all__ = [
    "NOT_NATIVE",
    "check_aggregate_sample",
    "check_fusion",
    "check_native_rows",
    "check_sampling",
    "sink_mode",
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
