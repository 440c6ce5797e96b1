"""The stateless ops of a stage, over `(sequence, item)` lists: what every stage runs between its entry and its ports.

`apply_ops` runs a stage's fused `map` (`flat_map_batch`), `branch`, `merge`,
`inspect` and `pass` (`redistribute`) ops over its streams, in place; a user error
becomes the step's `FlowsparkRuntimeError`, or, with a dead letter, the item's
record. `screen_keyed` and `checked_keys` check the items entering a keyed step;
`through` runs the rule `mapper_line`: a line of one-to-one mappers called on whole lists;
`unordered_streams` runs any ops on whole lists for a stage writing a sink's rows.
Called by the stage function (`flowspark.spark.worker.stage`) and the streaming state's
bucket calls (`flowspark.spark.streaming.state`).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional

from flowspark._checks import all_pairs, check_bool
from flowspark.deadletter import record as dead_record
from flowspark.errors import FlowsparkTypeError, routing_error, step_error
from flowspark.runtime.driver import NOT_FOUND, bad_item_error, failing_item
from flowspark.runtime.tags import idx
from flowspark.spark.plan.types import Op, StageSpec
from flowspark.spark.worker.codec import apply_pad

#: Where a stage's dead-letter entries go: `None` (no dead letter: refused items fail the
#: stage) or a list receiving `(seq, record)` pairs (`flowspark.deadletter.record`).
Dead = Optional[list[tuple[bytes, Any]]]

__all__ = ["Dead", "apply_ops", "checked_keys", "screen_keyed", "stage_streams", "through", "unordered_streams"]

_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
_IDX0 = idx(0)


def apply_ops(ops: tuple[Op, ...], streams: dict[str, list[tuple[bytes, Any]]], dead: Dead = None) -> None:
    """Run the stateless ops over `streams` (stream id -> [(seq, item)]), in place.

    Each op runs over its whole input list at once (one call per op, none per item).

    Args:
        ops: The ops, in order.
        streams: Stream id -> `(sequence, item)` pairs; each op's outputs are added.
        dead: With a dead letter (a list), an item a mapper or predicate fails on goes there
            as `(seq, record)` (`flowspark.deadletter.record`) instead of failing the stage.

    Raises:
        FlowsparkRuntimeError: A user callable failed (without a dead letter).
    """
    empty: list[tuple[bytes, Any]] = []
    for op in ops:
        kind = op.kind
        if kind == "merge":
            streams[op.downs[0]] = _merged(op, streams, empty)
            continue
        ins = streams.get(op.ups[0], empty)
        if kind == "map":
            streams[op.downs[0]] = _mapped(op, ins, dead)
        elif kind == "branch":
            streams[op.downs[0]], streams[op.downs[1]] = _branched(op, ins, dead)
        else:  # inspect (downs: passthrough, side copy) and pass (redistribute)
            for d in op.downs:
                streams[d] = ins


def _merged(
    op: Op, streams: dict[str, list[tuple[bytes, Any]]], empty: list[tuple[bytes, Any]]
) -> list[tuple[bytes, Any]]:
    """A `merge` op's output: each upstream's items, their sequences padded (`Op.pads`)."""
    out: list[tuple[bytes, Any]] = []
    for up, pad in zip(op.ups, op.pads, strict=True):
        out.extend([(apply_pad(s, pad), x) for s, x in streams.get(up, empty)])
    return out


def _mapped(op: Op, ins: list[tuple[bytes, Any]], dead: Dead) -> list[tuple[bytes, Any]]:
    """A `map` op's output: each item's outputs, under its sequence plus the output's index."""
    fn = op.fn
    assert fn is not None
    if op.one_to_one and ins:
        return _mapped_one_to_one(op, fn, ins, dead)
    out: list[tuple[bytes, Any]] = []
    for s, x in ins:
        try:
            res = fn([x])
            if type(res) is list and len(res) == 1:
                out.append((s + _IDX0, res[0]))
                continue
            ys = list(_iterable(op.step_id, res))
        except Exception as e:
            if dead is None:
                raise step_error(op.step_id, e, item=x) from e
            dead.append((s, dead_record(op.step_id, e, x)))
            continue
        out.extend([(s + idx(j), y) for j, y in enumerate(ys)])
    return out


def _mapped_one_to_one(
    op: Op, fn: Callable[[list[Any]], Any], ins: list[tuple[bytes, Any]], dead: Dead
) -> list[tuple[bytes, Any]]:
    """A one-to-one `map` op's output: the mapper called once on every item, each output under its input's sequence.

    The compiler adds no sequence component for these steps. When the batch call fails, with
    a dead letter each item is mapped alone (`_each_one_to_one`); without, the error names the
    item that fails alone.
    """
    xs = [x for _, x in ins]
    try:
        res = fn(xs)
    except Exception as e:
        if dead is not None:
            return _each_one_to_one(op, ins, dead)
        bad = failing_item(fn, xs)
        raise (step_error(op.step_id, e) if bad is NOT_FOUND else step_error(op.step_id, e, item=bad)) from e
    if type(res) is list and len(res) == len(ins):
        return list(zip([sx[0] for sx in ins], res, strict=True))
    msg = f"step {op.step_id!r}: a one-to-one mapper returned {len(res)} items for {len(ins)} inputs"
    raise step_error(op.step_id, FlowsparkTypeError(msg))


def _branched(
    op: Op, ins: list[tuple[bytes, Any]], dead: Dead
) -> tuple[list[tuple[bytes, Any]], list[tuple[bytes, Any]]]:
    """A `branch` op's two outputs: the items its predicate holds for, and the others."""
    pred = op.fn
    assert pred is not None
    trues: list[tuple[bytes, Any]] = []
    falses: list[tuple[bytes, Any]] = []
    for sx in ins:
        try:
            r = pred(sx[1])
            if r is not True and r is not False:
                check_bool(op.step_id, "branch predicate", sx[1], r)
        except Exception as e:
            if dead is None:
                raise step_error(op.step_id, e, item=sx[1]) from e
            dead.append((sx[0], dead_record(op.step_id, e, sx[1])))
            continue
        (trues if r else falses).append(sx)
    return trues, falses


def _iterable(step_id: str, res: Any) -> Any:
    """`res` if it is iterable, else the error a mapper returning it gets."""
    try:
        iter(res)
    except TypeError:
        msg = f"step {step_id!r}: the mapper must return an iterable; returned {res!r} of type {type(res).__name__}"
        raise FlowsparkTypeError(msg) from None
    return res


def _each_one_to_one(op: Op, ins: list[tuple[bytes, Any]], dead: list[Any]) -> list[tuple[bytes, Any]]:
    """A one-to-one mapper over each item alone (its batch failed): failing items go to `dead`.

    Each output keeps its input's sequence, as on the batch path.
    """
    fn = op.fn
    assert fn is not None
    out: list[tuple[bytes, Any]] = []
    for s, x in ins:
        try:
            res = fn([x])
            ys = res if type(res) is list else list(_iterable(op.step_id, res))
            if len(ys) != 1:
                msg = f"step {op.step_id!r}: a one-to-one mapper returned {len(ys)} items for one input"
                raise FlowsparkTypeError(msg)
        except Exception as e:  # noqa: BLE001
            dead.append((s, dead_record(op.step_id, e, x)))
            continue
        out.append((s, ys[0]))
    return out


def screen_keyed(step_id: str, items: list[tuple[bytes, Any]], dead: list[Any]) -> list[tuple[bytes, Any]]:
    """The `(seq, item)` pairs entering stateful step `step_id` that are `(str, value)`; the others go to `dead`."""
    xs = list(map(_second, items))
    if all_pairs(xs) and set(map(type, map(_first, xs))) == {str}:
        return items
    kept = []
    for sx in items:
        kv = sx[1]
        if isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str):
            kept.append(sx)
        else:
            dead.append((sx[0], dead_record(step_id, bad_item_error(step_id, kv), kv)))
    return kept


def _first_bad_key_item(step_id: str, xs: list[Any]) -> FlowsparkTypeError:
    for x in xs:
        if type(x) is not tuple or len(x) != 2 or type(x[0]) is not str:
            return bad_item_error(step_id, x)
    raise AssertionError(step_id)


def checked_keys(step_id: str, xs: list[Any]) -> list[str]:
    """The keys of items entering stateful step `step_id`, checked column-wise: 2-tuples with a str key."""
    if not all_pairs(xs):
        raise routing_error(step_id, _first_bad_key_item(step_id, xs))
    ks = list(map(_first, xs))
    if set(map(type, ks)) != {str}:
        raise routing_error(step_id, _first_bad_key_item(step_id, xs))
    return ks


def through(fns: tuple[Callable[[list[Any]], Any], ...], xs: list[Any]) -> Optional[list[Any]]:
    """`xs` through each one-to-one batch mapper in turn, or `None` when one raises or breaks its promise."""
    try:
        for fn in fns:
            res = fn(xs)
            if type(res) is not list or len(res) != len(xs):
                return None
            xs = res
    except Exception:  # noqa: BLE001  # the caller reruns the steps one by one, for the step's error
        return None
    return xs


def unordered_streams(spec: StageSpec, xs: list[Any]) -> Optional[dict[str, list[Any]]]:
    """`stage_streams` without sequences, for a stage whose items are written in any order (a sink's rows).

    Each `map` op's mapper is called once on its whole input list (a `flat_map_batch` mapper
    takes batches of any size; a call on no items is skipped, as item by item), a `branch`'s
    predicate on each item, a `merge` concatenates: the same items per stream, in another order.

    Args:
        spec: The stage.
        xs: The items of the stage's entry stream.

    Returns:
        Every stream of the stage: stream id -> items; `None` when a step raised or returned
        something malformed: the caller reruns the steps item by item (`stage_streams`) for
        the step's error, which may call a mapper a second time on some items.
    """
    streams: dict[str, list[Any]] = {spec.entry: xs}
    empty: list[Any] = []
    try:
        for op in spec.ops:
            kind = op.kind
            if kind == "merge":
                streams[op.downs[0]] = [x for up in op.ups for x in streams.get(up, empty)]
                continue
            ins = streams.get(op.ups[0], empty)
            if kind == "map":
                fn = op.fn
                assert fn is not None
                res = fn(ins) if ins else []
                if type(res) is not list:
                    res = list(res)
                if op.one_to_one and len(res) != len(ins):
                    return None
                streams[op.downs[0]] = res
            elif kind == "branch":
                pred = op.fn
                assert pred is not None
                trues: list[Any] = []
                falses: list[Any] = []
                for x in ins:
                    r = pred(x)
                    if r is True:
                        trues.append(x)
                    elif r is False:
                        falses.append(x)
                    else:
                        return None  # not a bool: `check_bool` words it
                streams[op.downs[0]], streams[op.downs[1]] = trues, falses
            else:  # inspect and pass
                for d in op.downs:
                    streams[d] = ins
    except Exception:  # noqa: BLE001  # the caller reruns the steps item by item, for the step's error
        return None
    return streams


def stage_streams(
    spec: StageSpec, items: list[tuple[bytes, Any]], dead: Dead = None
) -> dict[str, list[tuple[bytes, Any]]]:
    """Push items of the stage's entry stream through its stateless ops.

    Args:
        spec: The stage.
        items: `(sequence, item)` pairs of the entry stream.
        dead: With a dead letter, receives `(seq, record)` for each item a step refused.

    Returns:
        Every stream of the stage: stream id -> `(sequence, item)` pairs.

    Raises:
        FlowsparkRuntimeError: A user callable failed.
    """
    streams: dict[str, list[tuple[bytes, Any]]] = {spec.entry: items}
    apply_ops(spec.ops, streams, dead)
    return streams
