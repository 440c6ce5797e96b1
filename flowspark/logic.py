"""The runtime contract of keyed state: what every runtime drives, and nothing else.

`StatefulBatchLogic` is the one contract runtimes drive (the `stateful_batch`
core step); `StatefulLogic` (one value at a time, `op.stateful`) reaches them
through `StatefulAdapter`. `wants_notify` tells whether a logic's class can ask
for a notification at all (so runtimes skip `notify_at` calls that cannot
matter); `class_never_notifies` answers the same for a builder that is a logic
class, for operators that record it in the IR (`ir.StatefulBatch.notifies`).

The code that *calls* these methods (build, feed, notify, end of input,
snapshot, checks, error wording) lives in one place: `flowspark.runtime.driver`.
Importing this module needs nothing but the standard library and typing_extensions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Callable, ClassVar, Generic, Optional, TypeVar

from typing_extensions import override

from flowspark.errors import FlowsparkTypeError

V = TypeVar("V")
W = TypeVar("W")
S = TypeVar("S")

__all__ = [
    "StatefulAdapter",
    "StatefulBatchLogic",
    "StatefulLogic",
    "check_logic",
    "class_never_notifies",
    "wants_notify",
]

_EMPTY: tuple[Any, ...] = ()


class StatefulBatchLogic(ABC, Generic[V, W, S]):
    """Per-key state driven a batch of values at a time (the lowest-level state API).

    Each `on_*` method returns `(emits, discard)`: the values to emit (the runtime
    pairs each with the key) and whether to drop this logic (`DISCARD`) or keep
    it (`RETAIN`).
    """

    RETAIN: ClassVar[bool] = False
    DISCARD: ClassVar[bool] = True

    @abstractmethod
    def on_batch(self, values: list[V]) -> tuple[Iterable[W], bool]:
        """Handle the values that arrived for this key, in order.

        Args:
            values: Values, oldest first.

        Returns:
            `(emits, discard)`.
        """

    def on_notify(self) -> tuple[Iterable[W], bool]:
        """Called when the time `notify_at` returned has passed.

        Returns:
            `(emits, discard)`; by default nothing and `RETAIN`.
        """
        return (_EMPTY, self.RETAIN)

    def on_eof(self) -> tuple[Iterable[W], bool]:
        """Called once when the upstream reaches end of input.

        Returns:
            `(emits, discard)`; by default nothing and `RETAIN`.
        """
        return (_EMPTY, self.RETAIN)

    def notify_at(self) -> Optional[datetime]:
        """Return the next system time to call `on_notify`, or `None`.

        Returns:
            An aware UTC datetime, or `None` for no notification.
        """
        return None

    @abstractmethod
    def snapshot(self) -> S:
        """Return picklable, immutable state; the builder gets it back on resume.

        Returns:
            State.
        """


class StatefulLogic(ABC, Generic[V, W, S]):
    """Per-key state driven one value at a time.

    Each `on_*` method returns `(emits, discard)`. After every activation the
    runtime asks `notify_at()` for the next time to call `on_notify`.
    """

    RETAIN: ClassVar[bool] = False
    DISCARD: ClassVar[bool] = True

    @abstractmethod
    def on_item(self, value: V) -> tuple[Iterable[W], bool]:
        """Handle one value for this key.

        Args:
            value: The value.

        Returns:
            `(emits, discard)`.
        """

    def on_notify(self) -> tuple[Iterable[W], bool]:
        """Called when the time `notify_at` returned has passed.

        Returns:
            `(emits, discard)`; by default nothing and `RETAIN`.
        """
        return (_EMPTY, self.RETAIN)

    def on_eof(self) -> tuple[Iterable[W], bool]:
        """Called once when the upstream reaches end of input.

        Returns:
            `(emits, discard)`; by default nothing and `RETAIN`.
        """
        return (_EMPTY, self.RETAIN)

    def notify_at(self) -> Optional[datetime]:
        """Return the next system time to call `on_notify`, or `None`.

        Returns:
            An aware UTC datetime or `None`.
        """
        return None

    @abstractmethod
    def snapshot(self) -> S:
        """Return picklable, immutable state; the builder gets it back on resume.

        Returns:
            State.
        """


class StatefulAdapter(StatefulBatchLogic[V, W, S]):
    """Adapts a `StatefulLogic` to the batch contract (rebuilds after a mid-batch discard)."""

    __slots__ = ("builder", "logic", "step_id")

    def __init__(
        self,
        builder: Callable[[Optional[S]], StatefulLogic[V, W, S]],
        logic: StatefulLogic[V, W, S],
        step_id: str = "?",
    ):
        self.builder = builder
        self.logic: Optional[StatefulLogic[V, W, S]] = logic
        self.step_id = step_id

    @override
    def on_batch(self, values: list[V]) -> tuple[Iterable[W], bool]:
        emits: list[W] = []
        logic = self.logic
        for v in values:
            if logic is None:
                logic = check_logic(self.step_id, self.builder(None))
            res = logic.on_item(v)
            try:
                ws, discard = res
            except (TypeError, ValueError):
                msg = (
                    f"step {self.step_id!r}: on_item() must return a 2-tuple (emits, discard) such as "
                    f"`([x], StatefulLogic.RETAIN)`; returned {res!r} of type {type(res).__name__}"
                )
                raise FlowsparkTypeError(msg) from None
            try:
                emits.extend(ws)
            except TypeError:
                if isinstance(ws, Iterable):
                    raise
                msg = (
                    f"step {self.step_id!r}: on_item() must return (emits, discard) with an iterable "
                    f"of emits such as `([x], StatefulLogic.RETAIN)`; returned {res!r}"
                )
                raise FlowsparkTypeError(msg) from None
            if discard:
                logic = None
        self.logic = logic
        return (emits, logic is None)

    @override
    def on_notify(self) -> tuple[Iterable[W], bool]:
        assert self.logic is not None
        return self.logic.on_notify()

    @override
    def on_eof(self) -> tuple[Iterable[W], bool]:
        assert self.logic is not None
        return self.logic.on_eof()

    @override
    def notify_at(self) -> Optional[datetime]:
        assert self.logic is not None
        return self.logic.notify_at()

    @override
    def snapshot(self) -> S:
        assert self.logic is not None
        return self.logic.snapshot()


def check_logic(step_id: str, logic: Any) -> StatefulLogic[Any, Any, Any]:
    """Return `logic` if it is a `StatefulLogic`, else raise naming the step.

    Args:
        step_id: The stateful step.
        logic: What the builder returned.

    Returns:
        The logic.

    Raises:
        FlowsparkTypeError: It is not a `StatefulLogic`.
    """
    if not isinstance(logic, StatefulLogic):
        msg = (
            f"step {step_id!r}: builder must return a StatefulLogic; returned {logic!r} of type {type(logic).__name__}"
        )
        raise FlowsparkTypeError(msg)
    return logic


_NOTIFY_CACHE: dict[type, bool] = {}


def wants_notify(logic: Any) -> bool:
    """Whether a logic's class overrides `notify_at` (cached per class).

    A logic that keeps the default `notify_at` can never be notified, so runtimes
    skip the call. For a `StatefulAdapter` the wrapped `StatefulLogic` counts.

    Args:
        logic: A `StatefulBatchLogic` (or `StatefulAdapter`).

    Returns:
        True when `notify_at` is overridden.
    """
    inner = logic.logic if type(logic) is StatefulAdapter else logic
    cls: type = type(inner)
    hit = _NOTIFY_CACHE.get(cls)
    if hit is None:
        base: type = StatefulLogic if isinstance(inner, StatefulLogic) else StatefulBatchLogic
        hit = getattr(cls, "notify_at") is not getattr(base, "notify_at")  # noqa: B009
        _NOTIFY_CACHE[cls] = hit
    return hit


def class_never_notifies(builder: Any) -> bool:
    """Whether `builder` is a logic class that keeps the default `notify_at`.

    Operators use it to fill `ir.StatefulBatch.notifies` when a user passes a
    logic class itself as the builder. Anything else (a function returning a
    logic) may notify.

    Args:
        builder: A builder passed to `op.stateful` / `op.stateful_batch`.

    Returns:
        True when no logic the builder makes can ask for a notification.
    """
    if isinstance(builder, type) and issubclass(builder, (StatefulLogic, StatefulBatchLogic)):
        base: type = StatefulLogic if issubclass(builder, StatefulLogic) else StatefulBatchLogic
        return getattr(builder, "notify_at") is getattr(base, "notify_at")  # noqa: B009
    return False
