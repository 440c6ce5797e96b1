"""The optimizer: every fast path of the Spark lowerings is a named rule, decided here and only here.

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
may build on one before it (`value_column` on `spark_keys`).

Rules can be switched off (`rules_arg`): `flowspark.spark.run(..., rules=...)`,
`flowspark run --rules` or the environment variable `FLOWSPARK_RULES`: `all` (the
default), `none`, or `-NAME,-NAME` (all but those). With `none` every stage runs the
reference lowering: each row a `(k, seq, v)` row keyed by the Python pass, every
emit tagged, every logic built and snapshotted.

Not rules, because nothing is decided per flow: the codec's per-value encodings
(`flowspark.spark.codec.dumps` marks each value with its encoding, so any reader
decodes any value) and the lowering of each source and sink kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from flowspark.ir import WindowCount
from flowspark.spark.columns import ID_COLUMN
from flowspark.spark.plan import Aggregate, ColumnKey, Decision, Plan, StageSpec
from flowspark.spark.rulebook import Rule, Work
from flowspark.spark.rules_sinks import (
    apply_concurrent,
    check_aggregate_sample,
    check_concurrent,
    check_driver_prefix,
    check_fusion,
    check_native_rows,
    check_prefix_sample,
    check_sampling,
    sink_mode,
)
from flowspark.spark.times import fixed_offset

_Work = Work

__all__ = [
    "RULES",
    "Decision",
    "Env",
    "Rule",
    "optimize",
    "shape_choices",
]


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


# -- the rules' checks and effects ---------------------------------------------------------------


def _keyed_only_ports(w: _Work, sid: int) -> list[int]:
    """Ports of stage `sid` feeding a stateful step and read by keyed stages only."""
    out = []
    for p, port in enumerate(w.spec(sid).ports):
        readers = w.plan.readers((sid, p))
        if port.key_for and readers and all(isinstance(r, int) and w.stage(r).kind == "keyed" for r in readers):
            out.append(p)
    return out


def _check_value_only(w: _Work, sid: int) -> Optional[str]:
    if not _keyed_only_ports(w, sid):
        return "no port of the stage is read by keyed stages only"
    return None


def _apply_value_only(w: _Work, sid: int) -> None:
    ports = list(w.spec(sid).ports)
    for p in _keyed_only_ports(w, sid):
        ports[p] = dataclasses.replace(ports[p], value_only=True)
        for r in w.plan.readers((sid, p)):
            w.set(r, input_value_only=True)
    w.set(sid, ports=tuple(ports))


def _check_unordered(w: _Work, sid: int) -> Optional[str]:
    for p in range(len(w.spec(sid).ports)):
        for r in w.plan.readers((sid, p)):
            if isinstance(r, int):
                return f"stage {r} reads port{p}"
            if r in w.plan.driver_readers():
                return f"{r} sees port{p} at the driver in order"
    return None


def _apply_unordered(w: _Work, sid: int) -> None:
    chain = list(w.spec(sid).chain)
    chain[-1] = dataclasses.replace(chain[-1], regroup=False)
    w.set(sid, chain=tuple(chain))


def _check_eof_only(w: _Work, sid: int) -> Optional[str]:
    if not any(ks.eof_only for ks in w.spec(sid).chain[1:]):
        return "no step after the first emits only at end of input"
    return None


def _check_bare(w: _Work, sid: int) -> Optional[str]:
    chain = w.spec(sid).chain
    plain = [ks.step_id for ks in chain if ks.batch_fn is None]
    if plain:
        return f"step {plain[0]!r} is not a function of its state (stateful_map)"
    if w.env.ttl:
        return "the run has a state_ttl"
    return None


def _check_one_step(w: _Work, sid: int) -> Optional[str]:
    if len(w.spec(sid).chain) != 1:
        return "the stage chains several steps"
    if w.applied("bare_state", f"stage {sid}"):
        return "bare_state applies (its own path)"
    if w.env.ttl:
        return "the run has a state_ttl (the chain's bookkeeping keeps each step's last value time)"
    return None


def _check_values(w: _Work, sid: int) -> Optional[str]:
    spec = w.spec(sid)
    if w.env.target == "streaming":
        if not w.applied("one_step", f"stage {sid}"):
            return "one_step did not apply"
        if "sink_fusion" not in spec.modes:
            return "the stage does not write a sink's rows (sink_fusion)"
    elif w.applied("native_reduction", f"stage {sid}"):
        return "native_reduction applies (Spark aggregates the stage)"
    else:
        notifying = [ks.step_id for ks in spec.chain if ks.notifies]
        if notifying and len(spec.chain) > 1:
            return f"step {notifying[0]!r} may ask for notifications, in a chain of several steps"
        if notifying and not w.applied("spark_keys", f"stage {sid}"):
            # Due notifications fire between a key's activations, which the values' sequences tell
            # apart; a SparkSource's rows are one activation (what spark_keys reads).
            return (
                f"step {notifying[0]!r} may ask for notifications, which fire between the activations its values' "
                "sequences tell apart (spark_keys did not apply)"
            )
        if "sink_fusion" not in spec.modes and not spec.chain[-1].eof_only:
            return (
                "the stage's emits need sequences: it does not write a sink's rows (sink_fusion) and its last step "
                "emits before end of input"
            )
    if w.plan.dead_letter is not None:
        return "the run has a dead letter (its entries carry sequences)"
    if w.env.routed:
        return "the query routes every stage's rows through one chain (their sequences order them)"
    return None


def _column_key(w: _Work, sid: int) -> ColumnKey | str:
    """The Spark-keyed form of keyed stage `sid` (`ColumnKey`), or why it has none."""
    st = w.stage(sid)
    if len(st.inputs) != 1:
        return "it reads several ports"
    src_id, port, _pad = st.inputs[0]
    src = w.stage(src_id)
    spec = w.spec(src_id)
    if src.kind != "source" or spec.source != "native":
        return "its input does not come straight from a SparkSource"
    if len(spec.ports) != 1 or w.plan.readers((src_id, port)) != [sid]:
        return f"stage {src_id}'s rows go elsewhere too"
    stream = spec.entry
    column = None
    for o in spec.ops:
        if o.ups != (stream,) or len(o.downs) != 1:
            return f"step {o.step_id!r} branches or merges"
        if o.kind == "map" and column is None and o.key_column is not None:
            column = o.key_column
        elif not (
            o.kind == "pass" or (o.kind == "map" and o.keeps in (("items",) if column is None else ("items", "key")))
        ):
            return f"step {o.step_id!r} is neither proven to keep the items nor a key_on proven to read a column"
        stream = o.downs[0]
    if column is None:
        return "no key_on is proven to read a column (row[column])"
    out = spec.ports[0].stream
    if stream != out:
        return "the key is not the last step of its source stage"
    return ColumnKey(column, src_id, spec.source_step, spec.source_index, spec.entry, tuple(spec.ops), out)


def _column_refusal(w: _Work, stage: int, column: str) -> Optional[str]:
    cols = w.env.columns.get(stage)
    if cols is None:
        return "the SparkSource's columns are read with a session; this plan was made without one"
    names = [n for n, _t in cols]
    if names.count(column) != 1:
        return f"the DataFrame has {names.count(column)} columns named {column!r}"
    if ID_COLUMN in names:
        return f"the DataFrame has a column named {ID_COLUMN!r}"
    kind = dict(cols)[column]
    if kind != "string":
        return f"column {column!r} is {kind}, not string"
    return None


#: SparkSource formats whose rows come in the files' order, whichever columns are read.
_FILE_FORMATS = frozenset({"parquet", "json", "csv", "orc"})
_INTEGRAL = frozenset({"tinyint", "smallint", "int", "bigint"})
_FLOATS = frozenset({"float", "double"})


def _check_native(w: _Work, sid: int) -> Optional[str]:
    agg = w.plan.aggregate_of(sid)
    if isinstance(agg, str):
        return agg
    if w.plan.dead_letter is not None:
        return "the run has a dead letter"
    why = _column_refusal(w, agg.source_stage, agg.key)
    if why is not None or agg.window is not None:
        return why or _window_refusal(w, sid, agg.source_stage, agg.window)
    if agg.value is None:
        return None
    cols = w.env.columns[agg.source_stage]
    kinds = [t for n, t in cols if n == agg.value]
    if len(kinds) != 1:
        return f"the DataFrame has {len(kinds)} columns named {agg.value!r}"
    kind, red = kinds[0], agg.reduction
    if kind in _INTEGRAL or (kind == "string" and red != "sum"):
        return None
    if kind in _FLOATS:
        if w.env.float_reductions:
            return None
        return (
            f"column {agg.value!r} is {kind}: a float {red} may differ from Python's (addition order, NaN, -0.0); "
            "run with float_reductions=True to accept that"
        )
    return f"column {agg.value!r} is {kind}: Spark's {red} of it is not proven to equal Python's"


def _window_refusal(w: _Work, sid: int, source: int, window: Optional[WindowCount]) -> Optional[str]:
    assert window is not None
    assert window.ts_column is not None
    if not w.applied("unordered_emits", f"stage {sid}"):
        # The events of a key's windows keep their order; across keys they all come at the end.
        return "the order of the stage's emits across keys is read (unordered_emits did not apply)"
    fmt = getattr(w.stage(source).source, "format", None)
    if fmt not in _FILE_FORMATS:
        # A DataFrame's (or a view's) row order may depend on the columns read (a round-robin
        # repartition sorts the rows it gets): the aggregate reads two, the Python pass all.
        return (
            f"the SparkSource reads a {fmt}, whose row order may depend on the columns read (files keep "
            "theirs): the late values are found by the rows' order"
        )
    kinds = [t for n, t in w.env.columns[source] if n == window.ts_column]
    if len(kinds) != 1:
        return f"the DataFrame has {len(kinds)} columns named {window.ts_column!r}"
    if kinds[0] != "timestamp":
        return f"the clock's column {window.ts_column!r} is {kinds[0]}, not timestamp (an instant)"
    if not fixed_offset(w.env.time_zone):
        return (
            f"the session time zone {w.env.time_zone!r} has no fixed UTC offset: the clock's times, in that zone, "
            "subtract the wait in wall-clock time"
        )
    return None


def _apply_native(w: _Work, sid: int) -> None:
    agg = w.plan.aggregate_of(sid)
    assert isinstance(agg, Aggregate)
    w.set(sid, native=agg)
    w.add_mode(sid, "native_reduction")


def _check_long_sums(w: _Work, sid: int) -> Optional[str]:
    if not w.applied("native_reduction", f"stage {sid}"):
        return "native_reduction did not apply"
    agg = w.spec(sid).native
    assert agg is not None
    if agg.reduction != "sum":
        return f"the reduction is a {agg.reduction}, not a sum"
    kinds = [t for n, t in w.env.columns[agg.source_stage] if n == agg.value]
    if kinds[0] not in _INTEGRAL:
        return f"column {agg.value!r} is {kinds[0]}, not an integer column"
    return None


def _check_spark_keys(w: _Work, sid: int) -> Optional[str]:
    if w.applied("native_reduction", f"stage {sid}"):
        return "Spark aggregates the stage (native_reduction)"
    ck = _column_key(w, sid)
    if isinstance(ck, str):
        return ck
    why = _column_refusal(w, ck.source_stage, ck.column)
    if why is not None:
        return why
    if w.env.routed:
        return "the query is routed (some stage has several readers)"
    if w.env.recorded.get("spark_keys") is False:
        return "the checkpoint was started without it"
    return None


def _apply_spark_keys(w: _Work, sid: int) -> None:
    ck = _column_key(w, sid)
    assert isinstance(ck, ColumnKey)
    w.set(sid, column_key=ck)
    w.add_mode(ck.source_stage, "keyed_by_spark")  # its Python pass is skipped


def _check_value_mappers(w: _Work, sid: int) -> Optional[str]:
    if not w.applied("spark_keys", f"stage {sid}"):
        return "spark_keys did not apply"
    if w.plan.dead_letter is not None:
        return "the run has a dead letter (each refused item needs its sequence)"
    ck = w.spec(sid).column_key
    assert ck is not None
    first = ck.ops[0]
    if first.kind != "map" or first.key_column != ck.column:
        return f"step {first.step_id!r} comes before the key_on"
    for o in ck.ops[1:]:
        if o.kind != "pass" and not (o.kind == "map" and o.value_fn is not None):
            return f"step {o.step_id!r} after the key_on is not a map_value"
    return None


def _check_value_column(w: _Work, sid: int) -> Optional[str]:
    if not w.applied("value_mappers", f"stage {sid}"):
        return "value_mappers did not apply"
    ck = w.spec(sid).column_key
    assert ck is not None
    col = ck.value_candidate
    if col is None:
        return "the step after the key is not a map_value proven to read a column"
    names = [n for n, _t in w.env.columns.get(ck.source_stage, ())]
    if names.count(col) != 1:
        return f"the DataFrame has {names.count(col)} columns named {col!r}"
    return None


def _apply_value_column(w: _Work, sid: int) -> None:
    ck = w.spec(sid).column_key
    assert ck is not None
    w.set(sid, column_key=dataclasses.replace(ck, value_from=ck.value_candidate))


def _check_line(w: _Work, sid: int) -> Optional[str]:
    if "sink_fusion" not in w.spec(sid).modes:
        return "the stage does not write a sink's rows (sink_fusion)"
    if w.spec(sid).one_to_one_mappers() is None:
        return "the stage's steps after its entry are not one line of one-to-one maps"
    return None


def _check_flat(w: _Work, sid: int) -> Optional[str]:
    if not w.applied("bare_state", f"stage {sid}"):
        return "bare_state did not apply"
    if len(w.spec(sid).chain) != 1:
        return "the stage chains several steps"
    if "sink_fusion" not in w.spec(sid).modes:
        return "the stage does not write a sink's rows (sink_fusion)"
    if w.env.timers:
        return "the query has timers"
    if w.plan.dead_letter is not None:
        return "the run has a dead letter"
    return None


def _check_ordered(w: _Work, sid: int) -> Optional[str]:
    if not w.applied("flat_driver", f"stage {sid}"):
        return "flat_driver did not apply"
    if w.applied("spark_keys", f"stage {sid}"):
        return "Spark keys the stage's rows (spark_keys)"
    st = w.stage(sid)
    if len(st.inputs) != 1 or st.inputs[0][2]:
        return "it reads a merge"
    src_id = st.inputs[0][0]
    src = w.stage(src_id)
    if src.kind != "source" or src.spec.source == "native":
        return "its input is not a Python source's stage"
    if len(src.spec.ports) != 1 or w.plan.readers((src_id, 0)) != [sid]:
        return f"stage {src_id}'s items go elsewhere too"
    if not all(o.kind == "map" and o.one_to_one for o in src.spec.ops):
        return f"a step of stage {src_id} is not one-to-one"
    return None


def _apply_ordered(w: _Work, sid: int) -> None:
    w.add_mode(sid, "ordered_source")
    w.add_mode(w.stage(sid).inputs[0][0], "ordered_source")


def _check_file_order(w: _Work, sid: int) -> Optional[str]:
    # Sequences are read by nothing but a dead letter when the stage writes a sink's rows.
    if "sink_fusion" not in w.spec(sid).modes:
        return "the stage does not write a sink's rows (sink_fusion): its rows need sequences"
    if w.plan.dead_letter is not None:
        return "the run has a dead letter (its entries carry sequences)"
    ck = w.spec(sid).column_key
    if ck is None:
        return "spark_keys did not apply"
    if ck.source_stage not in w.env.file_streams:
        return "the source is not a parquet file stream with file and row indexes"
    return None


def _check_lean(w: _Work, _subject: Any) -> Optional[str]:
    if not w.env.session:
        return "the session is known when the run starts; this plan was made without one"
    if w.env.connect:
        return "a Spark Connect session delivers events as JSON already"
    return None


def _mode(name: str) -> Callable[[_Work, int], None]:
    def apply(w: _Work, sid: int) -> None:
        w.add_mode(sid, name)

    return apply


def _noop(_w: _Work, _subject: Any) -> None:
    pass


_TARGET_NAMES = {"batch": "batch jobs", "streaming": "streaming queries"}
_BOTH = frozenset({"batch", "streaming"})
_STREAM = frozenset({"streaming"})
_BATCH = frozenset({"batch"})

#: Every rule, in the order they are decided.
RULES: tuple[Rule, ...] = (
    Rule(
        "value_only_ports",
        "stage",
        _BOTH,
        False,
        "a port read only by keyed stages carries each item's value alone (the key is in column k)",
        _check_value_only,
        _apply_value_only,
        frozenset({"source", "map", "keyed"}),
    ),
    Rule(
        "unordered_emits",
        "stage",
        _BOTH,
        False,
        "the last step's emits keep their value's sequence instead of moving the key into it, "
        "when nobody reads their order across keys",
        _check_unordered,
        _apply_unordered,
    ),
    Rule(
        "eof_only",
        "stage",
        _BOTH,
        False,
        "a step followed by one that emits only at end of input (fold_final, collect...) tags no emits",
        _check_eof_only,
        _mode("eof_only"),
    ),
    Rule(
        "bare_state",
        "stage",
        _STREAM,
        False,
        "stateful_map steps are driven on their bare states, without building and snapshotting a logic per key",
        _check_bare,
        _mode("bare_state"),
    ),
    Rule(
        "one_step",
        "stage",
        _STREAM,
        False,
        "a keyed stage of one stateful step without a state_ttl drives each key's logic directly, without the "
        "bookkeeping of a chain of steps",
        _check_one_step,
        _mode("one_step"),
    ),
    Rule(
        "native_reduction",
        "stage",
        _BATCH,
        False,
        "a keyed stage that is one built-in reduction (count, sum, max, min) of a SparkSource's column keyed on a "
        "column runs as groupBy(key).agg(...), several such stages of one source and key as one; a count per "
        "event-time window (count_window) whose late values nobody reads, as groupBy(key, window id) over the "
        "values on time; a null key, value or time falls back to the Python pass, for Python's result or error",
        _check_native,
        _apply_native,
    ),
    Rule(
        "long_sums",
        "stage",
        _BATCH,
        False,
        "an integer sum Spark aggregates is a LONG try_sum (null once it leaves 64 bits) instead of a "
        "DECIMAL(38,0) sum; an aggregate where a key's sum overflowed is computed again with decimals",
        _check_long_sums,
        _mode("long_sums"),
    ),
    Rule(
        "spark_keys",
        "stage",
        _BOTH,
        True,
        "Spark keys a SparkSource's rows on the key column, shuffles and sorts them natively, and the keyed "
        "stage runs the source's steps (one Python pass instead of two)",
        _check_spark_keys,
        _apply_spark_keys,
    ),
    Rule(
        "value_mappers",
        "stage",
        _BOTH,
        False,
        "a Spark-keyed stage whose key_on comes first and whose later steps are map_value builds its items as "
        "columns: keys as Spark gives them, each mapper called on the whole list of values",
        _check_value_mappers,
        _mode("value_mappers"),
    ),
    Rule(
        "value_column",
        "stage",
        _BOTH,
        False,
        "a Spark-keyed stage whose map_value reads one column reads that column's values, building no row dict",
        _check_value_column,
        _apply_value_column,
    ),
    Rule(
        "schema_sampling",
        "sink",
        _BATCH,
        False,
        "a SparkSink without a schema gets it from a sampling job that stops after 100 items, "
        "so its stage can write the rows in one pass",
        check_sampling,
        sink_mode("schema_sampling"),
    ),
    Rule(
        "prefix_sample",
        "sink",
        _BATCH,
        False,
        "a SparkSink without a schema fed by a Spark-keyed stage of stateful_map steps infers it from the stage's "
        "steps run at the driver over the source's first rows (a limit: no scan of the whole input); a key's first "
        "values give its first emits",
        check_prefix_sample,
        sink_mode("prefix_sample"),
    ),
    Rule(
        "driver_prefix",
        "sink",
        _BATCH,
        False,
        "the first rows prefix_sample takes from a parquet SparkSource are read at the driver with pyarrow, from "
        "the files Spark's plan gives partition 0 when they are whole local files of plain columns (no Spark "
        "job); otherwise the limit job",
        check_driver_prefix,
        sink_mode("driver_prefix"),
    ),
    Rule(
        "aggregate_sample",
        "sink",
        _BATCH,
        False,
        "a SparkSink without a schema fed by a stage Spark aggregates infers it from the first aggregated rows, "
        "kept by the job that checks the aggregate for nulls, the stage's steps run over them at the driver "
        "(no sampling job)",
        check_aggregate_sample,
        sink_mode("aggregate_sample"),
    ),
    Rule(
        "sink_fusion",
        "sink",
        _BOTH,
        False,
        "the stage feeding a SparkSink emits the sink's typed rows itself (no pass converting pickled items)",
        check_fusion,
        sink_mode("sink_fusion"),
    ),
    Rule(
        "native_rows",
        "sink",
        _BATCH,
        False,
        "a SparkSink whose stage Spark aggregates and then maps each (key, result) to a dict of two names, "
        "proven, gets the aggregate's columns renamed (a select, no Python pass) when their Spark types are "
        "the sink's column types",
        check_native_rows,
        sink_mode("native_rows"),
    ),
    Rule(
        "concurrent_sinks",
        "query",
        _BATCH,
        False,
        "a batch job's SparkSinks (two or more, distinct directories, no dead letter) are written as concurrent "
        "Spark jobs from driver threads, when no stage two writes read would run twice (every stage they share "
        "is persisted and materialized first)",
        check_concurrent,
        apply_concurrent,
    ),
    Rule(
        "mapper_line",
        "stage",
        _BOTH,
        False,
        "a stage writing a sink's rows whose steps are one line of one-to-one maps calls each mapper on the "
        "whole list of items, with no sequences",
        _check_line,
        _mode("mapper_line"),
        frozenset({"source", "map", "keyed"}),
    ),
    Rule(
        "flat_driver",
        "stage",
        _STREAM,
        False,
        "one stateful_map writing a sink's rows maps each key's values as a list, computing no sequences",
        _check_flat,
        _mode("flat_driver"),
    ),
    Rule(
        "values_driver",
        "stage",
        _BOTH,
        False,
        "a keyed stage whose values' sequences nobody reads drives each key's values as plain lists, without a "
        "dead letter: in a streaming query one_step writing a sink's rows; in a batch job a stage writing a sink's "
        "rows or whose last step emits only at end of input, its steps not notifying (or one step keyed by Spark)",
        _check_values,
        _mode("values_driver"),
    ),
    Rule(
        "ordered_source",
        "stage",
        _STREAM,
        False,
        "the Python source's read numbers each micro-batch's items in order (8 bytes instead of a sequence)",
        _check_ordered,
        _apply_ordered,
    ),
    Rule(
        "file_order",
        "stage",
        _STREAM,
        False,
        "a parquet file stream's rows are ordered by Spark's file and row index, with no numbering pass",
        _check_file_order,
        _mode("file_order"),
    ),
    Rule(
        "lean_listener",
        "query",
        _STREAM,
        False,
        "the progress listener reads each event as one JSON string from the JVM (classic sessions)",
        _check_lean,
        _noop,
    ),
)


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
    w = _Work(plan, env)
    decisions: list[Decision] = []
    for rule in RULES:
        for subject in _subjects(rule, plan):
            where = _where(rule, subject)
            if env.target not in rule.targets:
                why: Optional[str] = "only for " + " and ".join(_TARGET_NAMES[t] for t in sorted(rule.targets))
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
