"""Which lowering runs a flow whose sources do not say they end: `drain_sources`.

A user-written `FixedPartitionedSource`, `DynamicSource` or `SimplePollingSource` has no
`is_bounded()` unless its author wrote one, so the compiler calls it unbounded. Bytewax
runs such a flow until every partition ends (`StopIteration`), then returns. Without a
checkpoint, the rule `drain_sources` runs it as a batch job whose source tasks read each
partition to its end (sleeping until `next_awake`), which gives Bytewax's output and
order at the sinks; with a checkpoint the flow runs as a streaming query and resumes
from the partitions' snapshots, as Bytewax's recovery does. Of the two lowerings of the same
partitioned source, the batch job was about four times faster than a streaming query with a
temporary checkpoint and `trigger="available_now"` (local[2], warm session; CHANGELOG), and it
gives the sinks Bytewax's total order, where a stream gives each key's.
"""

from __future__ import annotations

from typing import Any, Optional

from flowspark.errors import FlowsparkCompileError
from flowspark.spark.plan.types import Plan
from flowspark.spark.rules.book import BATCH, Rule, Work, noop

__all__ = ["DRAIN_SOURCES", "check_bounded", "drain_why_not", "runs_as_batch"]


def drain_why_not(plan: Plan) -> Optional[str]:
    """Why a batch job cannot read the plan's sources that do not say they end (`None`: it can).

    Args:
        plan: A plan (`compile_flow`).

    Returns:
        `None`, or the reason in words `flowspark plan --spark` prints.
    """
    unbounded = [st for st in plan.stages if st.kind == "source" and not st.bounded]
    if not unbounded:
        return "every source says it ends (is_bounded() -> True): the flow is a batch job anyway"
    for st in unbounded:
        if st.spec.source != "parts":
            return (
                f"source step {st.spec.source_step!r} ({type(st.source).__name__}) is a Spark stream, which "
                "a batch job cannot read: the flow runs as a streaming query with a checkpoint"
            )
    return None


def runs_as_batch(plan: Plan, checkpoint: Optional[str], rules: frozenset[str]) -> bool:
    """Whether `flowspark.spark.run` lowers the plan to a batch job (else a streaming query).

    Args:
        plan: The plan.
        checkpoint: The checkpoint asked for (`None`: none).
        rules: The rules switched on (`rules_arg`).

    Returns:
        `True` when every source ends, or when no checkpoint was given and the rule
        `drain_sources` is on and applies.
    """
    if plan.bounded:
        return True
    return checkpoint is None and DRAIN_SOURCES.name in rules and drain_why_not(plan) is None


def _check_drain(w: Work, _subject: Any) -> Optional[str]:
    why = drain_why_not(w.plan)
    if why is None:
        names = [st.spec.source_step for st in w.plan.stages if st.kind == "source" and not st.bounded]
        w.note(
            DRAIN_SOURCES.name,
            "query",
            f"source(s) {', '.join(map(repr, names))} do not say they end: each partition is read until it "
            "ends (StopIteration); with a checkpoint the flow runs as a streaming query instead",
        )
    return why


DRAIN_SOURCES = Rule(
    "drain_sources",
    "query",
    BATCH,
    False,
    "without a checkpoint, a flow whose flowspark sources do not say they end (no is_bounded()) runs as a "
    "batch job reading every partition until it ends, instead of a streaming query",
    _check_drain,
    noop,
)


def check_bounded(plan: Plan) -> None:
    """Refuse a plan with a source that does not say it ends, unless the rule `drain_sources` applied.

    Args:
        plan: The plan (plain, or physical: `optimize`).

    Raises:
        FlowsparkCompileError: Naming the first such source's step and why.
    """
    drain = next((d for d in plan.decisions if d.rule == "drain_sources"), None)
    if plan.bounded or (drain is not None and drain.applied):
        return
    st = next(st for st in plan.stages if st.kind == "source" and not st.bounded)
    why = drain.reason if drain is not None else "the plan was not optimized for a batch job"
    msg = (
        f"step {st.spec.source_step!r}: source {type(st.source).__name__} does not say it ends (no is_bounded() "
        f"-> True) and a batch job cannot read it to its end ({why}); run the flow with a checkpoint to run it "
        "as a streaming query"
    )
    raise FlowsparkCompileError(msg)
