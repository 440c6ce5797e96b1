"""Rules that let Spark aggregate a keyed stage (batch jobs): `native_reduction`, `long_sums`.

The aggregates themselves are built by `flowspark.spark.batch.native`.
"""

from __future__ import annotations

from typing import Optional

from flowspark.ir import WindowCount
from flowspark.spark.plan.types import Aggregate
from flowspark.spark.rules.book import BATCH, Rule, Work, mode
from flowspark.spark.rules.keys import column_refusal
from flowspark.spark.worker.times import fixed_offset

__all__ = ["LONG_SUMS", "NATIVE_REDUCTION"]


#: SparkSource formats whose rows come in the files' order, whichever columns are read.
_FILE_FORMATS = frozenset({"parquet", "json", "csv", "orc"})


_INTEGRAL = frozenset({"tinyint", "smallint", "int", "bigint"})


_FLOATS = frozenset({"float", "double"})


def _check_native(w: Work, sid: int) -> Optional[str]:
    agg = w.plan.aggregate_of(sid)
    if isinstance(agg, str):
        return agg
    if w.plan.dead_letter is not None:
        return "the run has a dead letter"
    why = column_refusal(w, agg.source_stage, agg.key)
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


def _window_refusal(w: Work, sid: int, source: int, window: Optional[WindowCount]) -> Optional[str]:
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


def _apply_native(w: Work, sid: int) -> None:
    agg = w.plan.aggregate_of(sid)
    assert isinstance(agg, Aggregate)
    w.set(sid, native=agg)
    w.add_mode(sid, "native_reduction")


NATIVE_REDUCTION = Rule(
    "native_reduction",
    "stage",
    BATCH,
    False,
    "a keyed stage that is one built-in reduction (count, sum, max, min) of a SparkSource's column keyed on a "
    "column runs as groupBy(key).agg(...), several such stages of one source and key as one; a count per "
    "event-time window (count_window) whose late values nobody reads, as groupBy(key, window id) over the "
    "values on time; a null key, value or time falls back to the Python pass, for Python's result or error",
    _check_native,
    _apply_native,
)


def _check_long_sums(w: Work, sid: int) -> Optional[str]:
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


LONG_SUMS = Rule(
    "long_sums",
    "stage",
    BATCH,
    False,
    "an integer sum Spark aggregates is a LONG try_sum (null once it leaves 64 bits) instead of a "
    "DECIMAL(38,0) sum; an aggregate where a key's sum overflowed is computed again with decimals",
    _check_long_sums,
    mode("long_sums"),
)
