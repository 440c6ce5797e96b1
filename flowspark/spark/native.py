"""Spark aggregates for the keyed stages the rule `native_reduction` chose (batch jobs).

A keyed stage that is one built-in reduction of a `SparkSource`'s column, keyed on a
column (`flowspark.spark.plan.Aggregate`), needs no Python call per row: Spark computes
`groupBy(key).agg(...)`, and the stage's Python pass runs over one row per key (the
`(key, result)` emit at end of input, then the stage's later steps). Every such stage
of one source keyed on the same column shares one aggregate, so the source is read
once for all of them (e.g. `count_final` and `reduce_final(operator.add)` on two
branches of one source).

Exactness: an integer sum is computed as `DECIMAL(38,0)` (no `LONG` overflow; no sum of
at most 2**63 rows of 64-bit integers reaches 10**38) and becomes a Python `int` in the
pass. A null key, or a null value of a `sum`, `max` or `min`, is what Python would
refuse (or, for a key's lone null, emit as `None`): Spark skips nulls, so the stages of
such an aggregate fall back to the Python pass (`Aggregates.input` returns `None`), which
gives the in-memory executor's result or error.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from flowspark.spark.plan import Aggregate, Plan, StagePlan

__all__ = ["Aggregates", "describe_aggregate", "python_pass"]

_log = logging.getLogger("flowspark.spark")


def _col(name: str) -> Any:
    from pyspark.sql import functions as F  # noqa: N812

    return F.col("`" + name.replace("`", "``") + "`")


def describe_aggregate(agg: Aggregate) -> str:
    """What a stage the rule `native_reduction` chose lowers to, in one line.

    Args:
        agg: The stage's aggregate.

    Returns:
        The text.
    """
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


class Aggregates:
    """The aggregates of a batch job's `native_reduction` stages, built and checked once per source and key."""

    def __init__(self, plan: Plan) -> None:
        """Group the plan's aggregated stages by source stage and key column.

        Args:
            plan: A physical plan.
        """
        self.groups: dict[tuple[int, str], list[tuple[int, Aggregate]]] = {}
        for st in plan.stages:
            agg = st.spec.native
            if agg is not None:
                self.groups.setdefault((agg.source_stage, agg.key), []).append((st.spec.stage_id, agg))
        self.built: dict[tuple[int, str], tuple[Any, set[int]]] = {}

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
            The DataFrame, or `None` when a null key or value sends the stage back to Python.
        """
        group = (agg.source_stage, agg.key)
        if group not in self.built:
            self.built[group] = self._build(self.groups[group], source, persisted if run else None)
        df, refused = self.built[group]
        if sid in refused:
            return None
        return df.select(_col("k"), _col(f"r{sid}").alias("v"))

    @staticmethod
    def _build(
        stages: list[tuple[int, Aggregate]], source: Any, persisted: Optional[list[Any]]
    ) -> tuple[Any, set[int]]:
        """One `groupBy(key).agg(...)` for every stage of a group, persisted, and the stages a null refuses."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F  # noqa: N812
        from pyspark.sql.types import IntegralType

        key = stages[0][1].key
        exprs = []
        nulls = []
        for sid, agg in stages:
            if agg.reduction == "count":
                exprs.append(F.count(F.lit(1)).alias(f"r{sid}"))
                continue
            assert agg.value is not None
            v = _col(agg.value)
            if agg.reduction == "sum" and isinstance(source.schema[agg.value].dataType, IntegralType):
                v = v.cast("decimal(38,0)")
            fn = {"sum": F.sum, "max": F.max, "min": F.min}[agg.reduction]
            exprs.append(fn(v).alias(f"r{sid}"))
            exprs.append((F.count(F.lit(1)) - F.count(_col(agg.value))).alias(f"n{sid}"))
            nulls.append(sid)
        df = source.groupBy(_col(key).alias("k")).agg(*exprs)
        if persisted is None:
            return df, set()
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(df)
        checks = [F.count(F.when(_col("k").isNull(), 1)).alias("null_keys")]
        checks += [F.max(_col(f"n{sid}")).alias(f"n{sid}") for sid in nulls]
        row = df.agg(*checks).collect()[0]
        if row["null_keys"]:
            return df, {sid for sid, _a in stages}
        return df, {sid for sid in nulls if row[f"n{sid}"]}
