"""The optimizer's loop and the order of its rules: every fast path of the Spark lowerings is a named rule.

`compile_flow` builds the plain plan: stages, ports and the facts the IR carries (a
step's `batch_fn`, `eof_only`, a `key_on` proven to read a column...). `optimize(plan,
env)` returns the physical plan a lowering runs: the same stages, each carrying the
modes the rules chose (`StageSpec.modes`, `SinkPlan.modes`, and the fields a rule
sets: `Port.value_only`, `KeyedStep.regroup`, `StageSpec.column_key`...), and one
`Decision` per rule and subject, which `flowspark plan --spark` and `explain=True`
print (`Plan.render`). A lowering and the workers interpret modes; they decide
nothing themselves.

Each `Rule` has a name, the targets it applies to (`batch`, `streaming`), a check
that returns `None` when the rule applies or the reason it does not, and whether it
changes the streaming query's shape (`shape`: the choice is recorded in the
checkpoint and a later run makes the same one). Rules run in `RULES` order; a rule
may build on one before it (`value_column` on `spark_keys`). Each rule (its check, effect and
summary together) lives in this package's module of its concern: `ports`, `drivers`, `native`,
`keys`, `sinks`, `concurrent`, `streams`, `lowerings`.

Rules can be switched off (`rules_arg`): `flowspark.spark.run(..., rules=...)`,
`flowspark run --rules` or the environment variable `FLOWSPARK_RULES`: `all` (the
default), `none`, or `-NAME,-NAME` (all but those). With `none` every stage runs the
reference lowering: each row a `(k, seq, v)` row keyed by the Python pass, every
emit tagged, every logic built and snapshotted.

Not rules, because nothing is decided per flow: the codec's per-value encodings
(`flowspark.spark.worker.codec.dumps` marks each value with its encoding, so any reader
decodes any value) and the lowering of each source and sink kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from flowspark.spark.plan.types import Decision, Plan, StageSpec
from flowspark.spark.rules import concurrent, drivers, keys, lowerings, native, ports, sinks, streams
from flowspark.spark.rules.book import TARGET_NAMES, Rule, Work

__all__ = [
    "RULES",
    "Decision",
    "Env",
    "Rule",
    "optimize",
    "shape_choices",
]

#: Every rule, in the order they are decided.
RULES: tuple[Rule, ...] = (
    ports.VALUE_ONLY_PORTS,
    ports.UNORDERED_EMITS,
    ports.EOF_ONLY,
    drivers.BARE_STATE,
    drivers.ONE_STEP,
    native.NATIVE_REDUCTION,
    native.LONG_SUMS,
    keys.SPARK_KEYS,
    keys.VALUE_MAPPERS,
    keys.VALUE_COLUMN,
    sinks.SCHEMA_SAMPLING,
    sinks.PREFIX_SAMPLE,
    sinks.DRIVER_PREFIX,
    sinks.AGGREGATE_SAMPLE,
    sinks.SINK_FUSION,
    sinks.NATIVE_ROWS,
    concurrent.CONCURRENT_SINKS,
    drivers.MAPPER_LINE,
    drivers.FLAT_DRIVER,
    drivers.VALUES_DRIVER,
    streams.ORDERED_SOURCE,
    streams.FILE_ORDER,
    streams.LEAN_LISTENER,
    lowerings.DRAIN_SOURCES,
)


@dataclass(frozen=True)
class Env:
    """What the optimizer knows of a run besides the plan (each lowering fills it before building).

    Attributes:
        target: `batch` or `streaming`.
        rules: The rules switched on (`rules_arg`).
        rules_text: How they were asked for (shown in a switched-off rule's reason).
        session: Whether the lowering had a session to read the sources' and sinks' columns
            (`False` for `flowspark plan --no-physical`: rules needing them are not decided).
        connect: The session is a Spark Connect session.
        columns: For each `SparkSource` stage, its DataFrame's columns as `(name, type)`;
            type `string` only for a plain (non-collated) string column.
        file_streams: `SparkSource` stages that are parquet file streams whose rows Spark
            gives their file and row index (`streaming.frames.file_rows`).
        timers: The streaming query runs with timers.
        routed: The streaming query threads one chain of rows through every stage.
        ttl: The run has a `state_ttl`.
        writer_sink: The output Spark's own streaming writer takes (the query's lone
            `SparkSink` with a schema), or `None`.
        atomic_sinks: Outputs whose given schema has only atomic columns.
        recorded: Shape choices recorded in the checkpoint by an earlier run (`rule name ->
            applied`); a rule missing here was not recorded (a new checkpoint).
        float_reductions: The run allows sums, maxima and minima of float columns as Spark
            aggregates (`run_plan(float_reductions=True)`), which may differ from Python's.
        time_zone: The session's time zone (`spark.sql.session.timeZone`), in which a
            TIMESTAMP column's values become datetimes.
    """

    target: str
    rules: frozenset[str] = field(default_factory=lambda: frozenset(r.name for r in RULES))
    rules_text: str = "all"
    session: bool = True
    connect: bool = False
    columns: Mapping[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    file_streams: frozenset[int] = frozenset()
    timers: bool = False
    routed: bool = False
    ttl: bool = False
    writer_sink: Optional[str] = None
    atomic_sinks: frozenset[str] = frozenset()
    recorded: Mapping[str, bool] = field(default_factory=dict)
    float_reductions: bool = False
    time_zone: str = "UTC"


def _subjects(rule: Rule, plan: Plan) -> list[Any]:
    if rule.scope == "stage":
        return [st.spec.stage_id for st in plan.stages if st.kind in rule.subjects]
    if rule.scope == "sink":
        return [sk.step_id for sk in plan.sinks]
    return [None]


def _where(rule: Rule, subject: Any) -> str:
    if rule.scope == "stage":
        return f"stage {subject}"
    if rule.scope == "sink":
        return f"sink {subject}"
    return "query"


def optimize(plan: Plan, env: Env) -> Plan:
    """The physical plan of `plan` for a lowering: every rule decided, its modes set, its decisions recorded.

    Args:
        plan: The plain plan (`compile_flow`), maybe with a dead letter.
        env: What the lowering knows of the run.

    Returns:
        The physical plan (`Plan.decisions` holds every decision, in rule order).
    """
    w = Work(plan, env)
    decisions: list[Decision] = []
    for rule in RULES:
        for subject in _subjects(rule, plan):
            where = _where(rule, subject)
            if env.target not in rule.targets:
                why: Optional[str] = "only for " + " and ".join(TARGET_NAMES[t] for t in sorted(rule.targets))
            elif rule.name not in env.rules:
                why = f"switched off: rules={env.rules_text!r}"
            else:
                why = rule.check(w, subject)
            if why is None:
                rule.apply(w, subject)
                w.done.add((rule.name, where))
            decisions.append(Decision(rule.name, where, why is None, why or w.notes.get((rule.name, where), "")))
    stages = tuple(dataclasses.replace(st, spec=_physical(w.specs[st.spec.stage_id])) for st in plan.stages)
    sinks = tuple(w.sinks[sk.step_id] for sk in plan.sinks)
    return dataclasses.replace(plan, stages=stages, sinks=sinks, decisions=tuple(decisions), target=env.target)


def _physical(spec: StageSpec) -> StageSpec:
    """A stage's facts a rule did not take up are cleared: the workers read modes only."""
    modes = spec.modes
    chain = tuple(
        dataclasses.replace(
            ks,
            batch_fn=ks.batch_fn if "bare_state" in modes else None,
            eof_only=ks.eof_only and "eof_only" in modes,
            reduction=ks.reduction if "native_reduction" in modes else None,
            window_count=ks.window_count if "native_reduction" in modes else None,
        )
        for ks in spec.chain
    )
    return dataclasses.replace(spec, chain=chain)


def shape_choices(plan: Plan) -> dict[str, bool]:
    """The decisions of shape rules (recorded in a streaming checkpoint): `name -> applied anywhere`.

    Args:
        plan: A physical plan.

    Returns:
        The choices.
    """
    shape = {r.name for r in RULES if r.shape}
    out: dict[str, bool] = {}
    for d in plan.decisions:
        if d.rule in shape:
            out[d.rule] = out.get(d.rule, False) or d.applied
    return out
