"""The optimizer's book-keeping: the plan being optimized (`Work`) and a rule (`Rule`).

The rules themselves are in this package's modules by concern; their order and `optimize` in
`flowspark.spark.rules.optimizer`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional

from flowspark.spark.plan.types import Plan, SinkPlan, StagePlan, StageSpec

__all__ = ["BATCH", "BOTH", "STREAM", "TARGET_NAMES", "Rule", "Work", "mode", "noop"]


class Work:
    """The plan being optimized: mutable copies of its stage specs and sinks."""

    def __init__(self, plan: Plan, env: Any) -> None:
        """Start from `plan`; `env` is the run's `flowspark.spark.rules.optimizer.Env` (no import cycle)."""
        self.plan = plan
        self.env = env
        self.specs = {st.spec.stage_id: st.spec for st in plan.stages}
        self.sinks = {sk.step_id: sk for sk in plan.sinks}
        self.done: set[tuple[str, str]] = set()  # (rule, where) that applied
        #: What an applied rule says of the case that held (`(rule, where) -> text`), shown in the plan.
        self.notes: dict[tuple[str, str], str] = {}

    def stage(self, sid: int) -> StagePlan:
        """Stage `sid` of the plan."""
        return self.plan.stages[sid]

    def spec(self, sid: int) -> StageSpec:
        """Stage `sid`'s spec as the rules decided so far."""
        return self.specs[sid]

    def set(self, sid: int, **changes: Any) -> None:
        """Change fields of stage `sid`'s spec."""
        self.specs[sid] = dataclasses.replace(self.specs[sid], **changes)

    def add_mode(self, sid: int, mode: str) -> None:
        """Add a mode to stage `sid`'s spec."""
        self.set(sid, modes=self.specs[sid].modes | {mode})

    def applied(self, rule: str, where: str) -> bool:
        """Whether `rule` applied to `where` (`stage N`, a sink's step id, `query`)."""
        return (rule, where) in self.done

    def note(self, rule: str, where: str, text: str) -> None:
        """Record which case held when `rule` applied to `where` (shown as `applied (text)`)."""
        self.notes[(rule, where)] = text

    def current(self) -> Plan:
        """The plan with the stage specs and sinks as the rules decided so far."""
        stages = tuple(dataclasses.replace(st, spec=self.specs[st.spec.stage_id]) for st in self.plan.stages)
        sinks = tuple(self.sinks[sk.step_id] for sk in self.plan.sinks)
        return dataclasses.replace(self.plan, stages=stages, sinks=sinks)

    def sink_of(self, sid: int) -> Optional[SinkPlan]:
        """The sink that is the only reader of stage `sid`'s only port, if any."""
        for sk in self.sinks.values():
            if sk.port == (sid, 0) and len(self.spec(sid).ports) == 1 and self.plan.readers(sk.port) == [sk.step_id]:
                return sk
        return None


@dataclass(frozen=True)
class Rule:
    """One fast path.

    Attributes:
        name: Its name (what `rules=` switches off).
        scope: `stage`, `sink` or `query`: what it is decided for.
        targets: The lowerings it applies to.
        shape: Whether it changes a streaming query's shape (recorded in the checkpoint).
        summary: What it does, in a sentence.
        subjects: The kinds of stage (`keyed`, `source`, `map`) it is decided for, for `stage` rules.
        check: `(work, subject) -> None | reason` (subject: stage id, sink step id or `None`).
        apply: `(work, subject) -> None`: set the modes.
    """

    name: str
    scope: str
    targets: frozenset[str]
    shape: bool
    summary: str
    check: Callable[[Work, Any], Optional[str]]
    apply: Callable[[Work, Any], None]
    subjects: frozenset[str] = frozenset({"keyed"})


#: The lowerings a rule may apply to.
BOTH = frozenset({"batch", "streaming"})
STREAM = frozenset({"streaming"})
BATCH = frozenset({"batch"})
TARGET_NAMES = {"batch": "batch jobs", "streaming": "streaming queries"}


def mode(name: str) -> Callable[[Work, int], None]:
    """A rule's effect that adds mode `name` to the stage."""

    def apply(w: Work, sid: int) -> None:
        w.add_mode(sid, name)

    return apply


def noop(_w: Work, _subject: Any) -> None:
    """A rule's effect when the lowering reads the decision itself (a query rule)."""
