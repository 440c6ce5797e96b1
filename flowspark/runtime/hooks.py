"""One stateful step's hooks, one call at a time, checked and worded once.

`LogicHooks` builds or resumes a key's logic and calls each of its hooks
(`on_batch`, `notify_at`, `on_notify`, `on_eof`, `snapshot`), checks every
return value and wraps what user code raises into one `FlowsparkRuntimeError`
naming the step and the key (`flowspark.errors.step_error`, or `resumed_error`
for a logic resumed from an earlier run's snapshot). `bad_item_error` words an
item that is not `(str key, value)`. The timelines that decide the order of
these calls are `flowspark.runtime.driver.StepDriver`'s (a subclass).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Callable, Optional

from flowspark.errors import FlowsparkRuntimeError, FlowsparkTypeError, resumed_error, step_error
from flowspark.logic import StatefulBatchLogic, wants_notify

__all__ = ["LogicHooks", "bad_item_error"]


def bad_item_error(step_id: str, kv: Any) -> FlowsparkTypeError:
    """What is wrong with an item before a stateful step that is not `(str key, value)`.

    The step raises `flowspark.errors.routing_error` caused by it (a `TypeError`, as
    in Bytewax); a dead letter keeps it as the item's error.

    Args:
        step_id: The stateful step.
        kv: The item.

    Returns:
        The error (to raise).
    """
    if isinstance(kv, tuple) and len(kv) == 2:
        msg = (
            f"step {step_id!r}: keys must be str; received key {kv[0]!r} of type "
            f"{type(kv[0]).__name__} in item {kv!r}; convert it in `op.key_on` (e.g. `str(...)`)"
        )
    else:
        msg = (
            f"step {step_id!r} requires `(key, value)` 2-tuple items; received {kv!r} "
            f"of type {type(kv).__name__}; use `op.key_on` to make a keyed stream"
        )
    return FlowsparkTypeError(msg)


class LogicHooks:
    """Calls the hooks of one stateful step's logics, key by key.

    Every method that calls user code wraps what it raises (or a malformed
    return value) into `flowspark.errors.step_error`.

    Args:
        step_id: The step's fully qualified id.
        builder: `builder(resume_state | None) -> StatefulBatchLogic`.
        level: Stateful steps on the longest path from a source to this step
            (itself included); orders end-of-key tags after their inputs.
        regroup: Whether `drive` moves the key into its emits' tags (`regroup`). Only
            needed where the order across keys is seen: emits that reach a driver-side
            sink or a step keyed otherwise; the compiler turns it off inside a fused
            chain (the next step has the same key) and before partitioned sinks.
    """

    __slots__ = ("batch_fn", "builder", "eof_only", "level", "regroup", "resumed", "step_id", "store")

    def __init__(
        self,
        step_id: str,
        builder: Callable[[Any], Any],
        level: int = 1,
        regroup: bool = True,
        eof_only: bool = False,
        batch_fn: Optional[Callable[[Any, list[Any]], tuple[Any, list[Any]]]] = None,
    ) -> None:
        """Describe the step (`eof_only`, `batch_fn`: the IR's facts, see `ir.StatefulBatch`)."""
        self.step_id = step_id
        self.builder = builder
        self.level = level
        self.regroup = regroup
        self.eof_only = eof_only
        self.batch_fn = batch_fn
        #: Keys whose logic was resumed from an earlier run's snapshot (`build(resumed=True)`) and
        #: has not yet returned from `on_batch`, `on_notify` or `on_eof`: key -> the snapshot.
        self.resumed: dict[str, Any] = {}
        #: Where the runtime keeps snapshots, for `resumed_error`'s fix (set by the runtime).
        self.store = "checkpoint or recovery directory"

    # -- one hook at a time ----------------------------------------------------
    def fail(self, key: Optional[str], error: BaseException) -> FlowsparkRuntimeError:
        """Wrap `error` raised for `key` (see `flowspark.errors.step_error`).

        For a key in `resumed`, `flowspark.errors.resumed_error` (and the key leaves `resumed`).

        Args:
            key: The key.
            error: The exception.

        Returns:
            The error to raise.
        """
        if self.resumed and key in self.resumed:
            return self.resumed_fail(key, error, self.resumed.pop(key))
        return step_error(self.step_id, error, key=key)

    def resumed_fail(self, key: str, error: BaseException, snapshot: Any) -> FlowsparkRuntimeError:
        """Wrap `error` raised for `key` on its state `snapshot` resumed from an earlier run.

        Args:
            key: The key.
            error: The exception.
            snapshot: The resumed snapshot or bare state.

        Returns:
            The error to raise (see `flowspark.errors.resumed_error`).
        """
        return resumed_error(self.step_id, error, key, snapshot, self.store)

    def build(self, key: str, state: Any = None, resumed: bool = False) -> StatefulBatchLogic[Any, Any, Any]:
        """Build a key's logic, fresh (`state=None`) or resumed from a snapshot.

        Args:
            key: The key.
            state: What `snapshot()` returned, or `None`.
            resumed: `state` was read from storage an earlier run wrote (not written by this
                run): until the logic's first `on_batch`, `on_notify` or `on_eof` returns,
                failures are worded by `resumed_error` (see the module doc).

        Returns:
            The logic.
        """
        if resumed:
            self.resumed[key] = state
        elif self.resumed:
            self.resumed.pop(key, None)
        try:
            logic = self.builder(state)
        except Exception as e:
            raise self.fail(key, e) from e
        if not isinstance(logic, StatefulBatchLogic):
            msg = (
                f"step {self.step_id!r}: builder must return a StatefulBatchLogic (or, for "
                f"`op.stateful`, a StatefulLogic); returned {logic!r} for key {key!r}"
            )
            raise self.fail(key, FlowsparkTypeError(msg))
        return logic

    def result(self, key: str, res: Any, where: str) -> tuple[list[Any], bool]:
        """Check what an `on_*` hook returned.

        Args:
            key: The key.
            res: The return value.
            where: The hook, for the message (e.g. `"on_eof()"`).

        Returns:
            `(emits as a list, discard)`.
        """
        if type(res) is tuple and len(res) == 2:
            emits, discard = res
            if type(emits) is list:
                return emits, bool(discard)
            if isinstance(emits, Iterable):
                try:
                    return list(emits), bool(discard)
                except Exception as e:
                    raise self.fail(key, e) from e
        msg = (
            f"step {self.step_id!r}: {where} must return a 2-tuple (emits, discard) such as "
            f"`([x], StatefulLogic.RETAIN)`; returned {res!r} for key {key!r}"
        )
        raise self.fail(key, FlowsparkTypeError(msg))

    def feed(self, key: str, logic: Any, values: list[Any]) -> tuple[list[Any], bool]:
        """Hand values to `on_batch`.

        Args:
            key: The key.
            logic: Its logic.
            values: The values, oldest first.

        Returns:
            `(emits, discard)`.
        """
        try:
            res = logic.on_batch(values)
        except Exception as e:
            raise self.fail(key, e) from e
        if type(res) is tuple and len(res) == 2 and type(res[0]) is list:
            if self.resumed:
                self.resumed.pop(key, None)
            return res[0], bool(res[1])
        out = self.result(key, res, "on_batch()/on_item()")
        if self.resumed:
            self.resumed.pop(key, None)
        return out

    def notify_at(self, key: str, logic: Any) -> Optional[datetime]:
        """The logic's next notification time (checked), or `None`.

        Logic classes that keep the default `notify_at` are not asked.

        Args:
            key: The key.
            logic: Its logic.

        Returns:
            An aware datetime, or `None`.
        """
        if not wants_notify(logic):
            return None
        try:
            at = logic.notify_at()
        except Exception as e:
            raise self.fail(key, e) from e
        if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
            msg = (
                f"step {self.step_id!r}: notify_at() must return an aware datetime "
                f"(e.g. datetime.now(timezone.utc)) or None; returned {at!r} for key {key!r}"
            )
            raise self.fail(key, FlowsparkTypeError(msg))
        return at

    def notify(self, key: str, logic: Any) -> tuple[list[Any], bool]:
        """Call `on_notify`.

        Args:
            key: The key.
            logic: Its logic.

        Returns:
            `(emits, discard)`.
        """
        return self._hook(key, logic.on_notify, "on_notify()")

    def eof(self, key: str, logic: Any) -> tuple[list[Any], bool]:
        """Call `on_eof`.

        Args:
            key: The key.
            logic: Its logic.

        Returns:
            `(emits, discard)`.
        """
        return self._hook(key, logic.on_eof, "on_eof()")

    def _hook(self, key: str, hook: Callable[[], Any], where: str) -> tuple[list[Any], bool]:
        try:
            res = hook()
        except Exception as e:
            raise self.fail(key, e) from e
        out = self.result(key, res, where)
        if self.resumed:
            self.resumed.pop(key, None)
        return out

    def snapshot(self, key: str, logic: Any) -> Any:
        """Call `snapshot`.

        Args:
            key: The key.
            logic: Its logic.

        Returns:
            The snapshot.
        """
        try:
            return logic.snapshot()
        except Exception as e:
            raise self.fail(key, e) from e

    def fire_due(self, key: str, logic: Any, now: datetime) -> tuple[Any, list[Any]]:
        """Fire every notification due at a fixed `now`.

        `notify_at()` is read again after each fire; a time equal to the one just
        fired does not fire again at the same `now`.

        Args:
            key: The key.
            logic: Its logic.
            now: The time.

        Returns:
            `(logic or None if a notification discarded it, emits in order)`.
        """
        out: list[Any] = []
        last: Optional[datetime] = None
        while logic is not None:
            at = self.notify_at(key, logic)
            if at is None or at > now or at == last:
                break
            last = at
            ws, discard = self.notify(key, logic)
            out.extend(ws)
            if discard:
                logic = None
        return logic, out
