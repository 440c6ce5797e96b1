"""The sink rules, decided for each output step.

`schema_sampling`, `prefix_sample`, `driver_prefix`, `aggregate_sample`, `sink_fusion`,
`native_rows` (`flowspark.spark.rules.optimizer.RULES` gives their order).

A sink rule is decided for each output step (`SinkPlan`): whether Spark writes it, how
it gets its schema, whether its stage emits its rows itself. Each check returns `None`
when the rule applies, else the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from flowspark.spark.plan.types import SinkPlan
from flowspark.spark.rules.book import BATCH, BOTH, Rule, Work

__all__ = [
    "AGGREGATE_SAMPLE",
    "DRIVER_PREFIX",
    "NATIVE_ROWS",
    "NOT_NATIVE",
    "PREFIX_SAMPLE",
    "SCHEMA_SAMPLING",
    "SINK_FUSION",
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


def sink_mode(name: str) -> Callable[[Work, str], None]:
    """A sink rule's effect: mode `name` on the sink and on the stage feeding it."""

    def apply(w: Work, step: str) -> None:
        sk = w.sinks[step]
        w.sinks[step] = dataclasses.replace(sk, modes=sk.modes | {name})
        w.add_mode(sk.port[0], name)

    return apply


def _check_sampling(w: Work, step: str) -> Optional[str]:
    """`schema_sampling`: a SparkSink without a schema, alone on its stage, which is cheap to run again."""
    sk = w.sinks[step]
    why = _sole_spark_sink(w, sk)
    if why is not None:
        return why
    if sk.sink.schema is not None:
        return "the sink has a schema"
    return _cheap_to_rerun(w, sk.port[0])


SCHEMA_SAMPLING = Rule(
    "schema_sampling",
    "sink",
    BATCH,
    False,
    "a SparkSink without a schema gets it from a sampling job that stops after 100 items, "
    "so its stage can write the rows in one pass",
    _check_sampling,
    sink_mode("schema_sampling"),
)


def _aggregate_sink(w: Work, step: str, rule: str) -> Optional[str]:
    """Why sink `step` is not one the rule `rule` applied to, fed by a Spark aggregate; `None` when it is."""
    if not w.applied(rule, f"sink {step}"):
        return f"{rule} did not apply"
    sid = w.sinks[step].port[0]
    if not w.applied("native_reduction", f"stage {sid}"):
        return f"stage {sid} is not a Spark aggregate (native_reduction)"
    return None


def _check_prefix_sample(w: Work, step: str) -> Optional[str]:
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


PREFIX_SAMPLE = Rule(
    "prefix_sample",
    "sink",
    BATCH,
    False,
    "a SparkSink without a schema fed by a Spark-keyed stage of stateful_map steps infers it from the stage's "
    "steps run at the driver over the source's first rows (a limit: no scan of the whole input); a key's first "
    "values give its first emits",
    _check_prefix_sample,
    sink_mode("prefix_sample"),
)


def _check_driver_prefix(w: Work, step: str) -> Optional[str]:
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


DRIVER_PREFIX = Rule(
    "driver_prefix",
    "sink",
    BATCH,
    False,
    "the first rows prefix_sample takes from a parquet SparkSource are read at the driver with pyarrow, from "
    "the files Spark's plan gives partition 0 when they are whole local files of plain columns (no Spark "
    "job); otherwise the limit job",
    _check_driver_prefix,
    sink_mode("driver_prefix"),
)


def _check_aggregate_sample(w: Work, step: str) -> Optional[str]:
    """`aggregate_sample`: a sampled sink fed by a Spark aggregate takes the check job's first rows."""
    return _aggregate_sink(w, step, "schema_sampling")


AGGREGATE_SAMPLE = Rule(
    "aggregate_sample",
    "sink",
    BATCH,
    False,
    "a SparkSink without a schema fed by a stage Spark aggregates infers it from the first aggregated rows, "
    "kept by the job that checks the aggregate for nulls, the stage's steps run over them at the driver "
    "(no sampling job)",
    _check_aggregate_sample,
    sink_mode("aggregate_sample"),
)


def _check_fusion(w: Work, step: str) -> Optional[str]:
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


SINK_FUSION = Rule(
    "sink_fusion",
    "sink",
    BOTH,
    False,
    "the stage feeding a SparkSink emits the sink's typed rows itself (no pass converting pickled items)",
    _check_fusion,
    sink_mode("sink_fusion"),
)


def _check_native_rows(w: Work, step: str) -> Optional[str]:
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


NATIVE_ROWS = Rule(
    "native_rows",
    "sink",
    BATCH,
    False,
    "a SparkSink whose stage Spark aggregates and then maps each (key, result) to a dict of two names, "
    "proven, gets the aggregate's columns renamed (a select, no Python pass) when their Spark types are "
    "the sink's column types",
    _check_native_rows,
    sink_mode("native_rows"),
)
