"""Spark aggregates for the keyed stages the rule `native_reduction` chose (batch jobs).

A keyed stage that is one built-in reduction of a `SparkSource`'s column, keyed on a
column (`flowspark.spark.plan.types.Aggregate`), needs no Python call per row: Spark computes
`groupBy(key).agg(...)`, and the stage's Python pass runs over one row per key (the
`(key, result)` emit at end of input, then the stage's later steps). Every such stage
of one source keyed on the same column shares one aggregate, so the source is read
once for all of them (e.g. `count_final` and `reduce_final(operator.add)` on two
branches of one source).

Exactness: an integer sum is computed as `DECIMAL(38,0)` (no `LONG` overflow; no sum of
at most 2**63 rows of 64-bit integers reaches 10**38) and becomes a Python `int` in the
pass; with the rule `long_sums`, as Spark's `try_sum` (a `LONG`, null once the key's sum
leaves 64 bits, at any point), and an aggregate where a key's sum overflowed is computed
again with `DECIMAL(38,0)`. A null key, or a null value of a `sum`, `max` or `min`, is
what Python would refuse (or, for a key's lone null, emit as `None`): Spark skips nulls,
so the stages of such an aggregate fall back to the Python pass (`Aggregates.input`
returns `None`), which gives the in-memory executor's result or error.

A window count (`count_window`, `Aggregate.window`) is `groupBy(key, window id)` over the rows
that are not late (`_window_counts`: a window function over the rows' positions gives each key's
watermark, as `EventClock` computes it when time does not pass), and its Python pass makes each
window's two events (`_window_events`).

The shared aggregate is persisted and checked by one Spark job (`_check`: per partition of
the aggregate, one row per key, it counts null keys, null values and overflowed sums), which
also keeps each partition's first rows when a sink reading one of the stages gets its schema
from them (the rule `aggregate_sample`, `Aggregates.first_rows`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from flowspark.ir import WindowCount
from flowspark.spark.compat import to_arrow
from flowspark.spark.io.columns import sampled_items
from flowspark.spark.plan.types import Aggregate, Plan, StagePlan

__all__ = [
    "SAMPLE_ROWS",
    "Aggregates",
    "describe_aggregate",
    "pair_rows",
    "python_pass",
    "sample_first_rows",
]

_log = logging.getLogger("flowspark.spark")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Rows of each partition of an aggregate the check job keeps for `aggregate_sample` (a sink infers from 100 items).
SAMPLE_ROWS = 100


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _col(name: str) -> Any:
    from pyspark.sql import functions as F  # noqa: N812

    return F.col(_quoted(name))


def describe_aggregate(agg: Aggregate) -> str:
    """What a stage the rule `native_reduction` chose lowers to, in one line.

    Args:
        agg: The stage's aggregate.

    Returns:
        The text.
    """
    if agg.window is not None:
        w = agg.window
        return (
            f"the SparkSource DataFrame (stage {agg.source_stage}) -> late values ({w.ts_column!r} below the key's "
            f"largest earlier {w.ts_column!r} - {w.wait}) left out by a window function over the rows' positions -> "
            f"groupBy({agg.key!r}, window id (length {w.length}, every {w.offset})).agg(count(*)) -> mapInArrow over "
            "one row per key and window (a null key or time: the Python pass instead)"
        )
    what = "count(*)" if agg.reduction == "count" else f"{agg.reduction}({agg.value!r})"
    return (
        f"the SparkSource DataFrame (stage {agg.source_stage}) -> groupBy({agg.key!r}).agg({what}, with every "
        "aggregate of the same source and key) -> mapInArrow over one row per key (a null key or value: the "
        "Python pass instead)"
    )


def python_pass(plan: Plan, st: StagePlan) -> tuple[Plan, StagePlan]:
    """`plan` and `st` with `st` run by its Python pass (a stage Spark aggregated falls back: a null key or value).

    Args:
        plan: A physical plan.
        st: One of its stages.

    Returns:
        The plan and the stage, unchanged when the stage is not aggregated.
    """
    if st.spec.native is None:
        return plan, st
    _log.info("flowspark: stage %d: a null key or value: its Python pass runs it", st.spec.stage_id)
    spec = dataclasses.replace(st.spec, native=None, modes=st.spec.modes - {"native_reduction"})
    st = dataclasses.replace(st, spec=spec)
    stages = tuple(st if s.spec.stage_id == spec.stage_id else s for s in plan.stages)
    return dataclasses.replace(plan, stages=stages), st


def sample_first_rows(
    fn: Callable[[Iterator[Any]], Iterator[Any]],
    first: list[tuple[Any, bool]],
    n: int,
    action: Callable[[Callable[[], Any]], Any],
) -> Optional[list[Any]]:
    """The first `n` items of an aggregated stage's port, from its first rows (the rule `aggregate_sample`).

    The job that checked the aggregate kept each partition's first rows (`Aggregates.first_rows`);
    the stage's steps run over them here, at the driver, partition after partition: the items the
    sampling job would give.

    Args:
        fn: The stage's sampling function (`stage_function(..., sample=(port, n))`).
        first: The stage's kept rows per partition, and whether the partition has more.
        n: Items wanted.
        action: Runs `fn` and turns a step's error into the run's error (`batch._action`).

    Returns:
        The items, or `None` when a partition's kept rows give too few items and it has more
        rows (they could give the missing items: the sampling job then runs).
    """
    got: list[Any] = []
    for batch, more in first:
        got.extend(sampled_items(fn, [batch], action))
        if len(got) >= n:
            return got[:n]
        if more:
            return None
    return got


def pair_rows(st: StagePlan, inp: Any, struct: Any) -> Optional[Any]:
    """The sink's rows of an aggregated stage whose map makes `{name: key, name: value}` (the rule `native_rows`).

    Args:
        st: The stage (its one map carries `Op.pair_row`).
        inp: Its `(k, v)` input, one row per key.
        struct: The sink's row schema (`StructType`).

    Returns:
        `inp` with its columns renamed in the schema's order, or `None` when the schema's columns
        are not those two names or a column's type is not the aggregate's (the map's Python pass
        then converts each item, as without the rule).
    """
    if st.spec.native is None:  # it fell back to its Python pass
        return None
    fields = next(o.pair_row for o in st.spec.ops if o.kind == "map")
    assert fields is not None
    names = struct.fieldNames()
    if sorted(names) != sorted(fields):
        return None
    types = {fields[0]: inp.schema["k"].dataType, fields[1]: inp.schema["v"].dataType}
    if any(struct[n].dataType != types[n] for n in names):
        return None
    return inp.selectExpr(*[("k" if n == fields[0] else "v") + " AS " + _quoted(n) for n in names])


class Aggregates:
    """The aggregates of a batch job's `native_reduction` stages, built and checked once per source and key."""

    def __init__(self, plan: Plan) -> None:
        """Group the plan's aggregated stages by source stage and key column.

        Args:
            plan: A physical plan.
        """
        self.groups: dict[tuple[int, str, Optional[WindowCount]], list[tuple[int, Aggregate]]] = {}
        for st in plan.stages:
            agg = st.spec.native
            if agg is not None:
                self.groups.setdefault((agg.source_stage, agg.key, agg.window), []).append((st.spec.stage_id, agg))
        #: The stages whose integer sum is a `LONG` `try_sum` (the rule `long_sums`).
        self.long_sums = {st.spec.stage_id for st in plan.stages if "long_sums" in st.spec.modes}
        #: The stages a sink samples the first rows of (the rule `aggregate_sample`).
        self.sampled = {sk.port[0] for sk in plan.sinks if "aggregate_sample" in sk.modes}
        self.built: dict[tuple[int, str, Optional[WindowCount]], tuple[Any, set[int]]] = {}
        #: Per stage: each partition's first rows `(k, v)` (an Arrow batch) and whether it has more.
        self.first: dict[int, list[tuple[Any, bool]]] = {}

    def input(self, sid: int, agg: Aggregate, source: Any, persisted: list[Any], run: bool = True) -> Optional[Any]:
        """The `(k, v)` DataFrame of stage `sid` (one row per key), or `None`: it falls back to the Python pass.

        Args:
            sid: The stage.
            agg: Its aggregate.
            source: The source stage's DataFrame (the `SparkSource`'s rows).
            persisted: Where the shared aggregate goes to be unpersisted after the job.
            run: Whether to persist it and look for nulls (a job); `False`: build it only
                (`flowspark plan`), assuming no null.

        Returns:
            The DataFrame, or `None` when a null key or value sends the stage back to Python. A
            window count's has a column `wid` between `k` and `v` (one row per key and window,
            sorted by both in each partition).
        """
        group = (agg.source_stage, agg.key, agg.window)
        if group not in self.built:
            self.built[group] = self._build(self.groups[group], source, persisted if run else None, self.long_sums)
        df, refused = self.built[group]
        if sid in refused:
            return None
        return df.selectExpr("k", *(["wid"] if agg.window is not None else []), f"r{sid} AS v")

    def first_rows(self, sid: int) -> Optional[list[tuple[Any, bool]]]:
        """Stage `sid`'s input rows the check job kept (`aggregate_sample`): per partition, in order.

        Args:
            sid: A stage Spark aggregates.

        Returns:
            `[(Arrow batch of columns k and v, whether the partition has rows after them)]`,
            or `None` when the stage was not sampled (or fell back to its Python pass).
        """
        return self.first.get(sid)

    def _build(
        self,
        stages: list[tuple[int, Aggregate]],
        source: Any,
        persisted: Optional[list[Any]],
        long_sums: set[int],
    ) -> tuple[Any, set[int]]:
        """One `groupBy(key).agg(...)` for every stage of a group, persisted, and the stages a null refuses."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F  # noqa: N812

        key = stages[0][1].key
        window = stages[0][1].window
        if window is not None:
            df = _window_counts(source, key, window, [sid for sid, _a in stages])
            nulls: list[int] = []
            longs: list[int] = []
        else:
            exprs, nulls, longs = _aggregations(stages, {f.name: f.dataType for f in source.schema.fields}, long_sums)
            df = source.groupBy(_col(key).alias("k")).agg(*[F.expr(e) for e in exprs])
        if persisted is None:
            return df, set()
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(df)
        sampled = [sid for sid, _a in stages if sid in self.sampled]
        parts = _check(df, nulls, longs, [f"r{sid}" for sid in sampled], window is not None)
        overflowed = {sid for sid in longs if any(p[f"o{sid}"] for p in parts)}
        if overflowed:
            # A key's sum left 64 bits: the group again, those sums as decimals (Python's exact result).
            _log.info("flowspark: a LONG sum overflowed in stages %s: computed again as DECIMAL(38,0)", overflowed)
            persisted.remove(df)
            df.unpersist()
            return self._build(stages, source, persisted, long_sums - overflowed)
        if any(p["null_keys"] or p.get("bad_times") for p in parts):
            return df, {sid for sid, _a in stages}
        refused = {sid for sid in nulls if any(p[f"n{sid}"] for p in parts)}
        for sid in sampled:
            if sid not in refused:
                self.first[sid] = [
                    (_first(p, sid, window is not None), p["rows"] > SAMPLE_ROWS) for p in parts if len(p["first"])
                ]
        return df, refused


#: Python's `datetime` range in microseconds since the epoch (0001-01-01 and 9999-12-31 23:59:59.999999 UTC).
_PY_MIN_US = -62135596800000000
_PY_MAX_US = 253402300799999999
#: Two days: no time zone's wall clock is that far from UTC.
_MARGIN_US = 2 * 86400 * 10**6


def _window_counts(source: Any, key: str, window: WindowCount, sids: list[int]) -> Any:
    """The counts per key and window of a window count (`Aggregate.window`): columns k, wid, r{sid}...

    A value is late when its time is below the largest `time - wait` of the key's earlier values
    (the watermark of `EventClock` when time does not pass, as in a batch job); the positions are
    the Python pass's order of the rows (`monotonically_increasing_id`: partition, then row). A
    null time, or one within two days (plus the wait) of the ends of Python's `datetime` range,
    gets a null window id: the check job sends the group back to the Python pass, which gives
    Python's result or error.
    """
    from pyspark.sql import functions as F  # noqa: N812

    wait = window.wait // timedelta(microseconds=1)
    length = window.length // timedelta(microseconds=1)
    offset = window.offset // timedelta(microseconds=1)
    align = (window.align_to - _EPOCH) // timedelta(microseconds=1)
    low, high = _PY_MIN_US + wait + _MARGIN_US, _PY_MAX_US - _MARGIN_US
    assert window.ts_column is not None
    rows = source.select(
        _col(key).alias("k"),
        F.expr(f"unix_micros({_quoted(window.ts_column)})").alias("u"),
        F.expr("monotonically_increasing_id()").alias("_p"),
    ).selectExpr("k", "u", "_p", f"u IS NULL OR u < {low} OR u > {high} AS bad")
    earlier = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"
    rows = rows.selectExpr(
        "k",
        "u",
        "bad",
        f"max(CASE WHEN NOT bad THEN u - {wait} END) OVER (PARTITION BY k ORDER BY _p {earlier}) AS wm",
    )
    x = f"(u - {align})"
    if offset == length:
        ids = f"array(({x} - pmod({x}, {length})) div {length})"
    else:
        hi = f"(({x} - pmod({x}, {offset})) div {offset})"
        lo_x = f"({x} - {length})"
        lo = f"(({lo_x} - pmod({lo_x}, {offset})) div {offset} + 1)"
        ids = f"sequence({lo}, {hi})"
    on_time = rows.where("bad OR wm IS NULL OR u >= wm")
    wids = on_time.selectExpr("k", f"explode(CASE WHEN bad THEN array(CAST(NULL AS BIGINT)) ELSE {ids} END) AS wid")
    counts = wids.groupBy("k", "wid").agg(*[F.expr(f"count(1) AS r{sid}") for sid in sids])
    return counts.sortWithinPartitions("k", "wid")


def _aggregations(
    stages: list[tuple[int, Aggregate]], types: dict[str, Any], long_sums: set[int]
) -> tuple[list[str], list[int], list[int]]:
    """The aggregate's columns as SQL text (one py4j call each; `pyspark.sql.functions` costs one per function).

    Returns:
        `(expressions, the stages with a null count n{sid}, the stages summed as a LONG try_sum)`.
    """
    from pyspark.sql.types import IntegralType

    exprs = []
    nulls = []
    longs = []
    for sid, agg in stages:
        if agg.reduction == "count":
            exprs.append(f"count(1) AS r{sid}")
            continue
        assert agg.value is not None
        v = _quoted(agg.value)
        fn = agg.reduction
        if agg.reduction == "sum" and isinstance(types[agg.value], IntegralType):
            if sid in long_sums:
                fn = "try_sum"
                longs.append(sid)
            else:
                v = f"CAST({v} AS DECIMAL(38,0))"
        exprs.append(f"{fn}({v}) AS r{sid}")
        exprs.append(f"count(1) - count({_quoted(agg.value)}) AS n{sid}")
        nulls.append(sid)
    return exprs, nulls, longs


def _check(df: Any, nulls: list[int], longs: list[int], sampled: list[str], windowed: bool) -> list[dict[str, Any]]:
    """The check job over a persisted aggregate: one summary per partition.

    Each has its rows, null keys, keys with a null value (`n{sid}`), overflowed `LONG` sums
    (`o{sid}`), for window counts (`windowed`) the rows of times Python would refuse
    (`bad_times`: a null window id) and, when `sampled` names columns, its first rows (`first`).

    One Spark job, no Python pass: `monotonically_increasing_id()` is the partition id times
    2**33 plus the row's position in the partition, so a row's position is its low 33 bits.
    """
    import pyarrow as pa
    from pyspark.sql import functions as F  # noqa: N812

    rows = df.selectExpr(
        "spark_partition_id() AS _part", f"monotonically_increasing_id() & {(1 << 33) - 1} AS _pos", "*"
    )
    checks = ["count(1) AS rows", "count(CASE WHEN k IS NULL THEN 1 END) AS null_keys"]
    if windowed:
        checks.append("count(CASE WHEN wid IS NULL THEN 1 END) AS bad_times")
    checks += [f"count(CASE WHEN n{sid} > 0 THEN 1 END) AS n{sid}" for sid in nulls]
    checks += [f"count(CASE WHEN r{sid} IS NULL AND n{sid} = 0 THEN 1 END) AS o{sid}" for sid in longs]
    if sampled:
        kept = ", ".join(["_pos", "k", *(["wid"] if windowed else []), *sampled])
        checks.append(f"sort_array(collect_list(CASE WHEN _pos < {SAMPLE_ROWS} THEN struct({kept}) END)) AS first")
    table = to_arrow(rows.groupBy("_part").agg(*[F.expr(c) for c in checks]))
    out = []
    for i in range(table.num_rows):
        part = {name: table.column(name)[i] for name in table.column_names}
        first = part.pop("first", None)
        row = {name: v.as_py() for name, v in part.items()}
        row["first"] = first.values if first is not None and first.is_valid else pa.array([], pa.struct([]))
        out.append(row)
    return sorted(out, key=lambda r: r["_part"])


def _first(part: dict[str, Any], sid: int, windowed: bool) -> Any:
    """Stage `sid`'s `(k, v)` (`(k, wid, v)`) input rows among a partition's first rows kept by `_check` (Arrow)."""
    import pyarrow as pa

    first = part["first"]
    names = ["k", "wid", "v"] if windowed else ["k", "v"]
    cols = [first.field("k"), *([first.field("wid")] if windowed else []), first.field(f"r{sid}")]
    return pa.RecordBatch.from_arrays(cols, names=names)
