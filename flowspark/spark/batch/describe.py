"""What a batch job's stages lower to, in words (`flowspark plan --spark`, `explain=True`).

The batch counterpart of `flowspark.spark.streaming.Lowering.stage`: generated from the
physical plan (`StageSpec.modes`, `column_key`, `native`), not written beside the code.
"""

from __future__ import annotations

from flowspark.spark.batch.native import describe_aggregate
from flowspark.spark.plan.types import StagePlan

__all__ = ["describe_keyed_state", "describe_stage"]


def describe_stage(st: StagePlan) -> str:
    """What a stage of the plan lowers to in a batch job.

    Args:
        st: The stage.

    Returns:
        A one-line description.
    """
    if st.kind == "source":
        head = {
            "chunks": "createDataFrame(chunks of items pickled at the driver)",
            "parts": "spark.range(one row per source partition)",
            "native": "the SparkSource DataFrame",
        }[st.spec.source]
        return f"{head} -> mapInArrow"
    if st.spec.native is not None:
        return describe_aggregate(st.spec.native)
    if st.kind == "keyed":
        ck = st.spec.column_key
        if ck is None:
            return f"({st.union()}) -> repartition(k) -> sortWithinPartitions(k, seq) -> mapInArrow"
        return (
            f"Spark keys the rows: the SparkSource DataFrame with k = column {ck.column!r} and each row's position "
            f"-> repartition(k) -> sortWithinPartitions(k, position) -> mapInArrow (runs stage {ck.source_stage}'s "
            "steps, which then need no pass of their own)"
        )
    if "keyed_by_spark" in st.spec.modes:
        return "no pass of its own: the keyed stage reading it runs its steps (rule spark_keys)"
    return f"({st.union()}) -> mapInArrow"


def describe_keyed_state(st: StagePlan) -> str:
    """How a keyed stage of a batch job keeps its state.

    Args:
        st: A keyed stage.

    Returns:
        The text.
    """
    return (
        "not stored: each key's logics live in its task while the key's sorted values are driven, "
        "then on_eof; a failed task reruns from its input"
    )
