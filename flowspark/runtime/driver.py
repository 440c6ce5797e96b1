"""The per-key driver: the one place that drives a key's `StatefulBatchLogic`.

Every runtime (the in-memory executor with either clock, the Spark batch keyed
stage, the Spark streaming bucket call) drives stateful steps through
`StepDriver`: build or resume a key's logic, feed values, read and check
`notify_at`, fire notifications, call `on_eof`, snapshot, check every return
value, and wrap user errors into one `FlowsparkRuntimeError` naming the step and
the key (the same text on every runtime). A runtime only decides *when* (its
time model) and *where* state lives.
Each hook's call, its checks and its error wording are `flowspark.runtime.hooks`'s
(`LogicHooks`, which `StepDriver` extends); this module orders the calls.

Two timelines are offered here:

- `StepDriver.feed_grouped` / `feed_runs`: the in-memory executor with the
  system or logical clock, in Bytewax's order: the items of one activation (one
  source batch) grouped by key in sorted key order, each key's values of the
  activation in one `on_batch` (`feed_runs` when every activation holds one item;
  notifications are scheduled by the executor with `notify_at` / `notify`);
- `StepDriver.drive` / `drive_chain`: a fixed logical `now` for a whole call
  (the Spark runtimes and `run_main(clock="fixed")`), activation by activation
  in Bytewax's order for its default `epoch_interval`: when a key's activation
  follows the one that last woke it, its values go first, then one notification
  if the `notify_at()` read after that last one was due; after activations
  without the key's values, what is due fires first (`fire_due`: `notify_at()`
  re-read after each fire; a time equal to the one just fired does not fire
  again at the same point); at the end of the key's values due notifications
  fire, then `on_eof` (when `eof=True`). A runtime that cannot tell whether a
  key's first activation in a call follows its last one (a stream's micro-batch)
  fires what is due first.
  A runtime that keeps, with a key's snapshot, the `notify_at()` it read after the
  logic's last hook passes it on (`due`): when it is not due by `now`, a logic rebuilt
  from that snapshot is not asked again before its first activation.

Tags. `drive` carries each value's *tag*, bytes that sort in processing order
(`flowspark.runtime.tags` says how they are built and read).

Resumed keys. A runtime that rebuilds a key's logic from a snapshot an earlier run wrote
(a recovery store, a streaming checkpoint) says so: `StepDriver.build(..., resumed=True)`.
Until one of that logic's `on_batch` / `on_notify` / `on_eof` returns, a failure of the
builder or of a hook is worded by `flowspark.errors.resumed_error` (the snapshot may not fit
the step's new code). The bare-state paths (`drive_state`, `map_state`, `drive_states`) take
a `resumed` flag per key instead: the first call of the step's function on the state.
Nothing is checked per value.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from datetime import datetime
from operator import itemgetter
from typing import Any, Callable, Optional

from flowspark.errors import routing_error
from flowspark.logic import wants_notify
from flowspark.runtime.hooks import LogicHooks, bad_item_error
from flowspark.runtime.tags import HEAD_LEN, Emits, eof_emits, key_tag, tag_emits

__all__ = [
    "NOT_FOUND",
    "failing_item",
    "UNKNOWN",
    "StepDriver",
    "bad_item_error",
    "drive_chain",
    "drive_states",
]

_KEY_CHUNK = 4096
#: Types `copy.deepcopy` returns as they are (immutable atoms).
_ATOMIC = frozenset({type(None), int, float, bool, complex, str, bytes})
_KEY_OF = itemgetter(0)
#: `StepDriver.drive`'s `due` when the runtime does not know the logic's schedule.
UNKNOWN: Any = object()


class StepDriver(LogicHooks):
    """Drives the logics of one stateful step, key by key, on a runtime's timeline.

    The hooks, their checks and their errors are `LogicHooks`'s; this class orders
    their calls (the in-memory executor's item path, the fixed-time timeline with
    tags). The class stays here: runtimes and tests import it from this module.

    Args:
        step_id: The step's fully qualified id.
        builder: `builder(resume_state | None) -> StatefulBatchLogic`.
        level: See `LogicHooks`.
        regroup: See `LogicHooks`.
    """

    __slots__ = ()

    def feed_singles(
        self,
        logics: dict[str, Any],
        items: list[Any],
        out: list[Any],
        touched: dict[str, None],
        out_ends: Optional[list[int]],
    ) -> None:
        """Feed `(key, value)` items, each an activation of its own: one `on_batch` per item.

        The in-memory executor's hot loop with `TestingSource`'s default `batch_size=1`.
        """
        for kv in items:
            if type(kv) is not tuple or len(kv) != 2 or type(kv[0]) is not str:
                self.check_item(kv)
        self._feed_pairs(logics, ((kv[0], [kv[1]]) for kv in items), out, touched, out_ends)

    # -- the in-memory executor's item path ---------------------------------------
    def feed_grouped(
        self,
        logics: dict[str, Any],
        items: list[Any],
        ends: Optional[list[int]],
        out: list[Any],
        touched: dict[str, None],
        out_ends: Optional[list[int]] = None,
        *,
        now: Optional[datetime] = None,
        follows: Optional[set[str]] = None,
    ) -> None:
        """Feed the items of one or more activations in Bytewax's order.

        Within an activation (a source batch) the items are grouped by key, keys in
        sorted order, and each key's values of the activation (in arrival order) go to
        one `on_batch`.

        Args:
            logics: Live logic per key (see `feed_runs`).
            items: `(str key, value)` items in arrival order.
            ends: End offset in `items` of each activation, or `None` for one activation.
            out: Receives `(key, emit)` items.
            touched: Receives every key seen.
            out_ends: If given, receives the end offset in `out` of each activation's emits.
            now: Fixed time (`run_main(clock="fixed")`, the Spark batch timeline): each
                key's values of an activation go through `drive` at `now` instead.
            follows: With `now`: the keys whose activation (of one) follows the one that last
                woke them (`drive`'s `follows`).
        """
        n = len(items)
        start = 0
        for end in (n,) if ends is None else ends:
            seg = items if start == 0 and end == n else items[start:end]
            start = end
            if len(seg) > 1:
                try:
                    seg = sorted(seg, key=_KEY_OF)  # stable: each key's values keep their order
                except Exception:  # noqa: BLE001,S110
                    pass  # a malformed item: `feed_runs` reports it where it arrived
            self.feed_runs(logics, seg, out, touched, now=now, follows=follows)
            if out_ends is not None and len(out) != (out_ends[-1] if out_ends else 0):
                out_ends.append(len(out))

    def feed_runs(
        self,
        logics: dict[str, Any],
        items: list[Any],
        out: list[Any],
        touched: dict[str, None],
        out_ends: Optional[list[int]] = None,
        *,
        now: Optional[datetime] = None,
        follows: Optional[set[str]] = None,
    ) -> None:
        """Feed `(key, value)` items: each run of consecutive items of one key is one `on_batch`.

        Args:
            logics: Live logic per key (updated: built on a key's first value,
                removed when discarded).
            items: `(str key, value)` items in arrival order.
            out: Receives `(key, emit)` items.
            touched: Receives every key seen.
            out_ends: If given, receives the end offset in `out` of each run's emits
                (when it emitted something).
            now: Fixed time: each run goes through `drive` at `now` (due notifications
                fire between its values) instead of one `on_batch`.
            follows: As in `feed_grouped`.
        """
        if now is not None:
            for key, values in self._runs(items):
                touched[key] = None
                self._drive_run(logics, key, values, out, now, follows is not None and key in follows)
            return
        self._feed_pairs(logics, self._runs(items), out, touched, out_ends)

    def _runs(self, items: list[Any]) -> Iterator[tuple[str, list[Any]]]:
        """`(key, values)` for each run of consecutive items of one key (each item checked)."""
        n = len(items)
        i = 0
        while i < n:
            kv = items[i]
            if type(kv) is not tuple or len(kv) != 2 or type(kv[0]) is not str:
                self.check_item(kv)
            key = kv[0]
            j = i + 1
            while j < n:
                nxt = items[j]
                if type(nxt) is tuple and len(nxt) == 2 and nxt[0] == key:
                    j += 1
                else:
                    break
            yield key, [kv[1]] if j == i + 1 else [items[m][1] for m in range(i, j)]
            i = j

    def _feed_pairs(
        self,
        logics: dict[str, Any],
        runs: Iterable[tuple[str, list[Any]]],
        out: list[Any],
        touched: dict[str, None],
        out_ends: Optional[list[int]],
    ) -> None:
        """One `on_batch` per `(key, values)` run, in order (see `feed_runs`)."""
        append = out.append
        resumed = self.resumed
        for key, values in runs:
            touched[key] = None
            logic = logics.get(key)
            if logic is None:
                logic = logics[key] = self.build(key)
            try:
                res: Any = logic.on_batch(values)
            except Exception as e:
                raise self.fail(key, e) from e
            emits: Any
            if type(res) is tuple and len(res) == 2 and type(res[0]) in (list, tuple):
                emits, discard = res
            else:
                emits, discard = self.result(key, res, "on_batch()/on_item()")
            if resumed:
                resumed.pop(key, None)
            if emits:
                # No list comprehension: it costs a function frame per key run.
                if len(emits) == 1:
                    append((key, emits[0]))
                else:
                    for w in emits:
                        append((key, w))
                if out_ends is not None:
                    out_ends.append(len(out))
            if discard:
                del logics[key]

    def _drive_run(
        self, logics: dict[str, Any], key: str, values: list[Any], out: list[Any], now: datetime, follows: bool
    ) -> None:
        """`feed_runs`' run of a key at a fixed `now`: through `drive` (one activation)."""
        tagged, live = self.drive(key, [(b"", v) for v in values], logics.get(key), now, False, follows=follows)
        out.extend([(key, w) for _tag, w in tagged])
        if live is None:
            logics.pop(key, None)
        else:
            logics[key] = live

    def check_item(self, kv: Any) -> None:
        """Raise for an item that is not `(str, value)`; subclasses (namedtuples, str enums) pass.

        Args:
            kv: The item.
        """
        if isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str):
            return
        raise routing_error(self.step_id, bad_item_error(self.step_id, kv))

    # -- the fixed-time timeline with tags ------------------------------------------
    def drive_state(
        self, key: str, items: list[tuple[bytes, Any]], state: Any, tags: bool = True, resumed: bool = False
    ) -> tuple[Emits, Any]:
        """`drive` for a step with a `batch_fn`, on the bare state instead of a logic.

        Gives the emits, in the same order with the same tags, that `drive` gives with
        `eof=False` for a logic built from `state` (`None`: no logic yet); a step with a
        `batch_fn` never notifies, so the time plays no part.

        Args:
            key: The key.
            items: `(tag, value)` pairs in order.
            state: The key's state, or `None`.
            tags: As in `drive`.
            resumed: `state` was read from storage an earlier run wrote: a failure of the
                function's first call is worded by `resumed_error`.

        Returns:
            `(emits as (tag, value) pairs in order, state after the values or None)`.
        """
        fn = self.batch_fn
        assert fn is not None
        out: Emits = []
        mid = key_tag(key) if self.regroup and items and items[0][0] else b""
        for start in range(0, len(items), _KEY_CHUNK):
            chunk = items[start : start + _KEY_CHUNK]
            try:
                state, ws = fn(state, [v for _, v in chunk])
            except Exception as e:
                if resumed and start == 0:
                    raise self.resumed_fail(key, e, state) from e
                raise self.fail(key, e) from e
            if ws:
                tag_emits(chunk, ws, mid, tags, out)
        return out, state

    def map_state(self, key: str, values: list[Any], state: Any, resumed: bool = False) -> tuple[list[Any], Any]:
        """`drive_state` without tags: the emits of `values` in order, and the state after them."""
        fn = self.batch_fn
        assert fn is not None
        out: list[Any] = []
        for start in range(0, len(values), _KEY_CHUNK):
            try:
                state, ws = fn(state, values[start : start + _KEY_CHUNK])
            except Exception as e:
                if resumed and start == 0:
                    raise self.resumed_fail(key, e, state) from e
                raise self.fail(key, e) from e
            out.extend(ws)
        return out, state

    def state_snapshot(self, key: str, state: Any) -> Any:
        """The snapshot of a logic whose state is `state` (a step with a `batch_fn`): a deep copy."""
        if type(state) in _ATOMIC:
            return state  # what deepcopy gives
        try:
            return copy.deepcopy(state)
        except Exception as e:
            raise self.fail(key, e) from e

    def drive(
        self,
        key: str,
        items: list[tuple[bytes, Any]],
        logic: Any,
        now: datetime,
        eof: bool,
        tags: bool = True,
        due: Any = UNKNOWN,
        follows: bool = False,
    ) -> tuple[Emits, Any]:
        """Run the step over one key's tagged values at a fixed `now` (see the module doc).

        Args:
            key: The key.
            items: `(tag, value)` pairs in order.
            logic: The key's live logic, or `None` (built on the first value).
            now: The logical time notifications are compared with.
            eof: Whether the key's input ends here (due notifications, then `on_eof`).
            tags: `False` when nobody reads the emits' tags: the values' emits (and those of
                notifications fired before them) then get empty tags (same emits, same order).
            due: The key's schedule as the runtime last read it (see the module doc): a time
                no later than the earliest `notify_at()` of `logic`, or `None` when it asked
                for none. When nothing is due by `now`, `notify_at()` is not read before the
                first activation. Default `UNKNOWN`: read it.
            follows: The first activation of `items` comes right after the key's last one
                (the runtime counts activations itself: `run_main(clock="fixed")`); later
                activations of `items` are told by their tags' headers. Default `False`: a
                runtime that cannot tell (a stream's first activation of a key in a
                micro-batch) fires what is due before the values.

        Returns:
            `(emits as (tag, value) pairs in order, logic or None)`.
        """
        # A logic built for these values was never asked for a notification yet (every runtime
        # reads `notify_at()` after values): its first activation fires none.
        fresh = logic is None
        if items and logic is None:
            logic = self.build(key)
        # Emits sort by (activation, key, then as their values): see `regroup`.
        mid = key_tag(key) if self.regroup and items and items[0][0] else b""
        if logic is not None and not wants_notify(logic):
            return self._drive_plain(key, items, logic, now, eof, mid, tags)
        out: Emits = []
        # One activation at a time (the values sharing their tag's activation header; a
        # runtime without tags hands one activation), each key's values of an activation in
        # one `on_batch`, as in Bytewax, where due notifications are looked at between
        # activations, not between values. Bytewax (its default `epoch_interval`) reads a
        # key's `notify_at()` after each activation that woke it and fires what that read
        # holds after the *next* activation's items: so when this activation follows the
        # key's last one, its values go first, then one notification if that read was due;
        # when activations without the key's values came in between, what was due fired in
        # them, before these values.
        start, n = 0, len(items)
        prev = -1
        while start < n:
            head = items[start][0][:HEAD_LEN]
            end = start + 1
            while end < n and items[end][0][:HEAD_LEN] == head:
                end += 1
            chunk = items[start:end]
            start = end
            act = int.from_bytes(head, "big")
            after = follows if prev < 0 else act == prev + 1
            prev = act
            if logic is None:
                logic, fresh = self.build(key), True
            # A logic built for these values has no schedule yet: nothing is due.
            ws, logic = self._activation(key, logic, [v for _, v in chunk], now, None if fresh else due, after)
            fresh = False
            due = UNKNOWN  # the values change what the logic waits for
            if ws:
                tag_emits(chunk, ws, mid, tags, out)
        if eof and logic is not None:
            logic, ws = self._end(key, logic, now)
            out.extend(eof_emits(self.level, key, ws))
        return out, logic

    def _activation(
        self, key: str, logic: Any, values: list[Any], now: datetime, due: Any, after: bool
    ) -> tuple[list[Any], Any]:
        """One activation of a key in `drive`: `(emits, logic or None)`.

        `due`: the logic's schedule as last read (`UNKNOWN`: read it; `None`: nothing due).
        `after`: the activation follows the one that last woke the key: the values go first,
        then one notification if the schedule was due; otherwise what is due fires first.
        """
        fire = due is UNKNOWN or (due is not None and due <= now)
        ws: list[Any] = []
        if fire and after:
            at = due if due is not UNKNOWN else self.notify_at(key, logic)
            fire = at is not None and at <= now
        elif fire:
            logic, ws = self.fire_due(key, logic, now)
            if logic is None:
                logic = self.build(key)
        more, discard = self.feed(key, logic, values)
        ws.extend(more)
        if discard:
            return ws, None
        if fire and after:
            more, discard = self.notify(key, logic)
            ws.extend(more)
            if discard:
                return ws, None
        return ws, logic

    def _end(self, key: str, logic: Any, now: datetime) -> tuple[Any, list[Any]]:
        """A key's end of input: the notifications due by `now`, then `on_eof`: `(logic or None, emits)`."""
        ws: list[Any] = []
        if wants_notify(logic):
            logic, ws = self.fire_due(key, logic, now)
        if logic is not None:
            more, discard = self.eof(key, logic)
            ws.extend(more)
            if discard:
                logic = None
        return logic, ws

    def drive_values(
        self, key: str, values: list[Any], logic: Any, now: datetime, due: Any = UNKNOWN, eof: bool = False
    ) -> tuple[list[Any], Any]:
        """`drive` with `tags=False` over the values of one activation, given without tags.

        The same emits in the same order, and the same logic after them, as `drive` over
        `[(b"", v) for v in values]`, without building or reading a tag.

        Args:
            key: The key.
            values: Its values, in order.
            logic: The key's live logic, or `None` (built on the first value).
            now: The logical time notifications are compared with.
            due: As in `drive`.
            eof: As in `drive`: the key's input ends after `values` (due notifications, then `on_eof`).

        Returns:
            `(emits in order, logic or None)`.
        """
        if not eof:
            return self._values(key, values, logic, now, due)
        out, logic = self._values(key, values, logic, now, due)
        if logic is None:
            return out, None
        logic, ws = self._end(key, logic, now)
        if ws:
            out = out + ws if out else ws
        return out, logic

    def _values(self, key: str, values: list[Any], logic: Any, now: datetime, due: Any) -> tuple[list[Any], Any]:
        """`drive_values` with `eof=False`."""
        if not values:
            return [], logic
        if logic is None:
            logic = self.build(key)
            if not wants_notify(logic):
                return self._feed_plain(key, values, logic)
            ws, discard = self.feed(key, logic, values)
            return ws, None if discard else logic
        if not wants_notify(logic):
            return self._feed_plain(key, values, logic)
        out: list[Any] = []
        if due is UNKNOWN or (due is not None and due <= now):
            logic, out = self.fire_due(key, logic, now)
            if logic is None:
                logic = self.build(key)
        ws, discard = self.feed(key, logic, values)
        if out:
            out.extend(ws)
        else:
            out = ws
        return out, None if discard else logic

    def _feed_plain(self, key: str, values: list[Any], logic: Any) -> tuple[list[Any], Any]:
        """`_drive_plain` without tags or `on_eof`: the values in batches of `_KEY_CHUNK`."""
        out: list[Any] = []
        for start in range(0, len(values), _KEY_CHUNK):
            if logic is None:
                logic = self.build(key)
            ws, discard = self.feed(key, logic, values[start : start + _KEY_CHUNK])
            out.extend(ws)
            if discard:
                logic = None
        return out, logic

    def _drive_plain(
        self, key: str, items: list[tuple[bytes, Any]], logic: Any, now: datetime, eof: bool, mid: bytes, tags: bool
    ) -> tuple[Emits, Any]:
        """`drive` for a logic without notifications: the values in large batches, then `on_eof`.

        Emit j of a batch gets the tag of value min(j, n-1) plus j: strictly increasing, so
        order is kept.
        """
        out: Emits = []
        for start in range(0, len(items), _KEY_CHUNK):
            chunk = items[start : start + _KEY_CHUNK]
            if logic is None:
                logic = self.build(key)
            ws, discard = self.feed(key, logic, [v for _, v in chunk])
            if ws:
                tag_emits(chunk, ws, mid, tags, out)
            if discard:
                logic = None
        if eof and logic is not None:
            logic, ws = self._end(key, logic, now)
            out.extend(eof_emits(self.level, key, ws))
        return out, logic


def drive_chain(
    drivers: tuple[StepDriver, ...],
    key: str,
    items: list[tuple[bytes, Any]],
    logics: Optional[list[Any]] = None,
    *,
    now: datetime,
    eof: bool = True,
    fed: Optional[list[bool]] = None,
    tags: bool = True,
    due: Any = UNKNOWN,
) -> tuple[Emits, list[Any]]:
    """Run a fused chain of stateful steps over the values of one key.

    Time does not pass during the call (`now` is fixed), so running the chain
    step after step over the whole key is the same as interleaving the steps
    value by value.

    Args:
        drivers: The chain (each step consumes the previous one's emits).
        key: The key.
        items: `(tag, value)` pairs of the key, in order.
        logics: The live logic of each step for this key (`None` entries are built
            fresh on the first value); default all `None`. A streaming runtime passes
            logics rebuilt from state and keeps the returned ones.
        now: The logical time notifications are compared with.
        eof: Whether the input of this key ends here (fire due notifications and
            `on_eof` after the last value).
        fed: When given, gets one entry per step: whether the step got values (the
            state TTL counts from a step's last value).
        tags: `False` when the caller reads no tags of the emits (see `StepDriver.drive`).
            A step followed by one that emits only at EOF (`StepDriver.eof_only`) gets
            `False` too: nobody reads its emits' tags.
        due: The earliest notification time of `logics` as the runtime last read it (see
            `StepDriver.drive`), for every step; default `UNKNOWN`.

    Returns:
        `(emits, logics)`: the last step's emits as `(tag, value)` pairs in order
        (values only; the key is implied), and each step's logic after the call
        (`None` where it was discarded).

    Raises:
        FlowsparkRuntimeError: A user callable failed or returned something malformed.
    """
    cur = logics if logics is not None else [None] * len(drivers)
    new: list[Any] = []
    read = reads_tags(drivers, tags)
    for i, d in enumerate(drivers):
        if fed is not None:
            fed.append(bool(items))
        items, logic = d.drive(key, items, cur[i], now, eof, read[i], due)
        new.append(logic)
    return items, new


def reads_tags(drivers: tuple[StepDriver, ...], tags: bool) -> list[bool]:
    """Whether each step's emits need tags: the next step reads them, unless it emits only at EOF."""
    read = [tags] * len(drivers)
    for i in range(len(drivers) - 2, -1, -1):
        read[i] = read[i + 1] and not drivers[i + 1].eof_only
    return read


def drive_states(
    drivers: tuple[StepDriver, ...],
    key: str,
    items: list[tuple[bytes, Any]],
    states: list[Any],
    *,
    tags: bool = True,
    resumed: bool = False,
) -> tuple[Emits, list[Any]]:
    """`drive_chain` with `eof=False` for a chain whose every step has a `batch_fn`, on bare states.

    Args:
        drivers: The chain.
        key: The key.
        items: `(tag, value)` pairs of the key, in order.
        states: Each step's state for the key (`None`: no logic).
        tags: As in `drive_chain`.
        resumed: `states` were read from storage an earlier run wrote (see `StepDriver.drive_state`).

    Returns:
        `(emits, states)`: what `drive_chain` gives for logics built from `states`, and
        each step's state after the call (what their logics would hold).
    """
    new: list[Any] = []
    for d, state, read in zip(drivers, states, reads_tags(drivers, tags), strict=True):
        items, state = d.drive_state(key, items, state, read, resumed and state is not None)
        new.append(state)
    return items, new


#: What `failing_item` returns when no single item fails on its own.
NOT_FOUND: Any = object()


def failing_item(mapper: Callable[[list[Any]], Any], items: list[Any]) -> Any:
    """Find the item a batch mapper fails on, after the mapper failed on the whole batch.

    Called only on the error path of a stateless step, so that every runtime names
    the item in its error (`flowspark.errors.step_error(..., item=...)`): the mapper
    runs again on each item alone until one raises.

    Args:
        mapper: The step's batch function (`flat_map_batch`'s mapper).
        items: The batch it failed on.

    Returns:
        The first item that fails on its own, or `NOT_FOUND`.
    """
    for x in items:
        try:
            res = mapper([x])
            if not isinstance(res, Iterable):
                return x
            list(res)
        except Exception:  # noqa: BLE001
            return x
    return NOT_FOUND
