"""Every operator users call, with Bytewax 0.21 names, signatures and emit timing.

Users write `import flowspark.operators as op`. The *core* operators (`input`,
`output`, `inspect_debug`, `flat_map_batch`, `branch`, `merge`, `redistribute`,
`stateful_batch`) add steps to the graph that runtimes execute; every other
operator here is a short composite of them.
"""

from __future__ import annotations

import builtins
import copy
import functools
import itertools
import operator as pyoperator
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any, Callable, Generic, Literal, Optional, TypeVar

from typing_extensions import Self, TypeAlias, override

from flowspark import ir, reducers
from flowspark._checks import all_pairs, check_bool
from flowspark._keyfn import column_of, pair_row_of
from flowspark._time import utc_now
from flowspark.dataflow import Dataflow, KeyedStream, Stream, operator
from flowspark.errors import FlowsparkBuildError, FlowsparkTypeError
from flowspark.inputs import Source
from flowspark.logic import StatefulAdapter, StatefulBatchLogic, StatefulLogic, check_logic, class_never_notifies
from flowspark.outputs import DynamicSink, Sink, StatelessSinkPartition

X = TypeVar("X")
Y = TypeVar("Y")
V = TypeVar("V")
W = TypeVar("W")
S = TypeVar("S")
DK = TypeVar("DK")
DV = TypeVar("DV")

__all__ = [
    "BranchOut",
    "JoinEmitMode",
    "JoinInsertMode",
    "KeyedStream",
    "StatefulBatchLogic",
    "StatefulLogic",
    "TTLCache",
    "branch",
    "collect",
    "count_final",
    "enrich_cached",
    "filter",
    "filter_map",
    "filter_map_value",
    "filter_value",
    "flat_map",
    "flat_map_batch",
    "flat_map_value",
    "flatten",
    "fold_final",
    "input",
    "inspect",
    "inspect_debug",
    "join",
    "key_on",
    "key_rm",
    "map",
    "map_value",
    "max_final",
    "merge",
    "min_final",
    "output",
    "raises",
    "redistribute",
    "reduce_final",
    "stateful",
    "stateful_batch",
    "stateful_flat_map",
    "stateful_map",
]

_EMPTY: tuple[Any, ...] = ()


def _declare(down: Stream[X], **facts: Any) -> Stream[X]:
    """Record facts about the core step producing `down` in the IR (see `ir.FlatMapBatch`, `ir.StatefulBatch`)."""
    down.flow()._refine(down.stream_id, **facts)
    return down


def _identity(x: X) -> X:
    return x


def _check_callable(step_id: str, name: str, fn: Any) -> None:
    if not callable(fn):
        msg = (
            f"step {step_id!r}: {name} must be callable; received {fn!r} of type "
            f"{type(fn).__name__}; pass a function or lambda"
        )
        raise FlowsparkTypeError(msg)


def _check_stream(step_id: str, name: str, s: Any) -> Stream[Any]:
    if not isinstance(s, Stream):
        msg = (
            f"step {step_id!r}: {name} must be a Stream returned by another operator; "
            f"received {s!r} of type {type(s).__name__}"
        )
        raise FlowsparkTypeError(msg)
    return s


# ---------------------------------------------------------------------------
# Core operators
# ---------------------------------------------------------------------------


@operator(_core=True)
def input(step_id: str, flow: Dataflow, source: Source[X]) -> Stream[X]:  # noqa: A001
    """Read items from a source.

    Args:
        step_id: Unique id.
        flow: The dataflow.
        source: A `FixedPartitionedSource` or `DynamicSource`.

    Returns:
        The source's items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> nums = op.input("inp", flow, TestingSource([1, 2, 3]))
    """
    if not isinstance(flow, Dataflow):
        msg = f"step {step_id!r}: flow must be a Dataflow; received {type(flow).__name__}"
        raise FlowsparkTypeError(msg)
    if not isinstance(source, Source):
        msg = (
            f"step {step_id!r}: source must be a flowspark Source (e.g. TestingSource, "
            f"FileSource); received {source!r} of type {type(source).__name__}"
        )
        raise FlowsparkTypeError(msg)
    down = f"{step_id}.down"
    flow._add_node(ir.Input(step_id, source, down))
    return Stream(down, flow)


@operator(_core=True)
def output(step_id: str, up: Stream[X], sink: Sink[X]) -> None:
    """Write items to a sink.

    Args:
        step_id: Unique id.
        up: Items to write; `(key, value)` pairs for a `FixedPartitionedSink`.
        sink: The sink.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> out = []
        >>> op.output("out", op.input("inp", flow, TestingSource([1])), TestingSink(out))
        >>> run_main(flow); out
        [1]
    """
    _check_stream(step_id, "up", up)
    if not isinstance(sink, Sink):
        msg = (
            f"step {step_id!r}: sink must be a flowspark Sink (e.g. TestingSink, "
            f"StdOutSink); received {sink!r} of type {type(sink).__name__}"
        )
        raise FlowsparkTypeError(msg)
    up.flow()._add_node(ir.Output(step_id, up.stream_id, sink))


def _default_debug_inspector(step_id: str, item: Any, epoch: int, worker: int) -> None:
    print(f"{step_id} W{worker} @{epoch}: {item!r}", flush=True)


@operator(_core=True)
def inspect_debug(
    step_id: str,
    up: Stream[X],
    inspector: Callable[[str, X, int, int], None] = _default_debug_inspector,
) -> Stream[X]:
    """Observe items with their epoch and worker.

    Args:
        step_id: Unique id.
        up: Stream.
        inspector: Called as `inspector(step_id, item, epoch, worker)`; prints by default.

    Returns:
        The upstream, unmodified.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> _ = op.inspect_debug("dbg", op.input("inp", flow, TestingSource([1])))
        >>> run_main(flow)
        eg.dbg W0 @1: 1
    """
    _check_stream(step_id, "up", up)
    _check_callable(step_id, "inspector", inspector)
    down = f"{step_id}.down"
    up.flow()._add_node(ir.InspectDebug(step_id, up.stream_id, inspector, down))
    return Stream(down, up.flow())


@operator(_core=True)
def flat_map_batch(step_id: str, up: Stream[X], mapper: Callable[[list[X]], Iterable[Y]]) -> Stream[Y]:
    """Transform a whole runtime batch of items at once.

    Args:
        step_id: Unique id.
        up: Stream.
        mapper: `mapper(list_of_items) -> iterable_of_outputs`.

    Returns:
        Everything the mapper returned.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.flat_map_batch("sq", op.input("inp", flow, TestingSource([1, 2])), lambda xs: [x * x for x in xs])
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [1, 4]
    """
    _check_stream(step_id, "up", up)
    _check_callable(step_id, "mapper", mapper)
    down = f"{step_id}.down"
    up.flow()._add_node(ir.FlatMapBatch(step_id, up.stream_id, mapper, down))
    return Stream(down, up.flow())


@dataclass(frozen=True)
class BranchOut(Generic[X, Y]):
    """The two streams `branch` returns."""

    trues: Stream[X]
    falses: Stream[Y]


@operator(_core=True)
def branch(step_id: str, up: Stream[X], predicate: Callable[[X], bool]) -> BranchOut[X, X]:
    """Split a stream in two by a predicate.

    Args:
        step_id: Unique id.
        up: Stream.
        predicate: Returns a `bool` for each item (anything else is an error).

    Returns:
        `BranchOut(trues, falses)`.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> b = op.branch("even", op.input("inp", flow, TestingSource([1, 2, 3])), lambda x: x % 2 == 0)
        >>> evens = []; op.output("out", b.trues, TestingSink(evens)); run_main(flow); evens
        [2]
    """
    _check_stream(step_id, "up", up)
    _check_callable(step_id, "predicate", predicate)
    trues, falses = f"{step_id}.trues", f"{step_id}.falses"
    up.flow()._add_node(ir.Branch(step_id, up.stream_id, predicate, trues, falses))
    return BranchOut(Stream(trues, up.flow()), Stream(falses, up.flow()))


@operator(_core=True)
def merge(step_id: str, *ups: Stream[Any]) -> Stream[Any]:
    """Combine several streams into one; the order within each upstream is kept.

    Args:
        step_id: Unique id.
        *ups: Streams.

    Returns:
        All their items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> a = op.input("a", flow, TestingSource([1])); b = op.input("b", flow, TestingSource([2]))
        >>> out = []; op.output("out", op.merge("m", a, b), TestingSink(out)); run_main(flow); sorted(out)
        [1, 2]
    """
    if not ups:
        msg = f"step {step_id!r}: merge needs at least one upstream stream"
        raise FlowsparkBuildError(msg)
    for i, up in enumerate(ups):
        _check_stream(step_id, f"upstream #{i}", up)
    flow = ups[0].flow()
    down = f"{step_id}.down"
    flow._add_node(ir.Merge(step_id, tuple(u.stream_id for u in ups), down))
    return Stream(down, flow)


@operator(_core=True)
def redistribute(step_id: str, up: Stream[X]) -> Stream[X]:
    """Spread items over workers to balance load (no-op with one worker).

    Args:
        step_id: Unique id.
        up: Stream.

    Returns:
        The same items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.redistribute("spread", op.input("inp", flow, TestingSource([1])))
    """
    _check_stream(step_id, "up", up)
    down = f"{step_id}.down"
    up.flow()._add_node(ir.Redistribute(step_id, up.stream_id, down))
    return Stream(down, up.flow())


@operator(_core=True)
def stateful_batch(
    step_id: str,
    up: KeyedStream[V],
    builder: Callable[[Optional[S]], StatefulBatchLogic[V, W, S]],
) -> KeyedStream[W]:
    """Run keyed state logic on batches of values.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream; keys must be `str`.
        builder: `builder(resume_state_or_None) -> StatefulBatchLogic`, called per new key.

    Returns:
        `(key, emitted_value)` stream.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> class Count(op.StatefulBatchLogic):
        ...     def __init__(self, n): self.n = n or 0
        ...     def on_batch(self, vs): self.n += len(vs); return [self.n], self.RETAIN
        ...     def snapshot(self): return self.n
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 1), ("b", 1), ("a", 1)]))
        >>> out = []; op.output("out", op.stateful_batch("count", s, Count), TestingSink(out))
        >>> run_main(flow); out
        [('a', 1), ('b', 1), ('a', 2)]
    """
    _check_stream(step_id, "up", up)
    _check_callable(step_id, "builder", builder)
    down = f"{step_id}.down"
    notifies = not class_never_notifies(builder)
    up.flow()._add_node(ir.StatefulBatch(step_id, up.stream_id, builder, down, notifies=notifies))
    return Stream(down, up.flow())


# ---------------------------------------------------------------------------
# Stateless composites
# ---------------------------------------------------------------------------


@operator
def flat_map(step_id: str, up: Stream[X], mapper: Callable[[X], Iterable[Y]]) -> Stream[Y]:
    """Transform each item into zero or more items.

    Args:
        step_id: Unique id.
        up: Stream.
        mapper: `mapper(item) -> iterable`.

    Returns:
        The flattened results.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.flat_map("split", op.input("inp", flow, TestingSource(["a b"])), str.split)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        ['a', 'b']
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_mapper(xs: list[X]) -> list[Y]:
        out: list[Y] = []
        extend = out.extend
        for x in xs:
            ys = mapper(x)
            try:
                extend(ys)
            except TypeError:
                if not isinstance(ys, Iterable):
                    raise _not_iterable(step_id, "mapper", ys, x) from None
                raise
        return out

    return flat_map_batch("flat_map_batch", up, shim_mapper)


def _not_iterable(step_id: str, what: str, got: Any, x: Any) -> FlowsparkTypeError:
    msg = (
        f"step {step_id!r}: {what} must return an iterable (e.g. a list); returned {got!r} of "
        f"type {type(got).__name__} for item {x!r}"
    )
    return FlowsparkTypeError(msg)


@operator
def flat_map_value(step_id: str, up: KeyedStream[V], mapper: Callable[[V], Iterable[W]]) -> KeyedStream[W]:
    """Transform each value of a keyed stream into zero or more values.

    Args:
        step_id: Unique id.
        up: Keyed stream.
        mapper: `mapper(value) -> iterable`.

    Returns:
        `(key, new_value)` for each result.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.flat_map_value("dup", op.input("inp", flow, TestingSource([("k", 1)])), lambda v: [v, v])
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('k', 1), ('k', 1)]
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_mapper(k_v: tuple[str, V]) -> Iterable[tuple[str, W]]:
        k, v = _unpack_kv(step_id, k_v)
        ws = mapper(v)
        if not isinstance(ws, Iterable):
            raise _not_iterable(step_id, "mapper", ws, k_v)
        return [(k, w) for w in ws]

    return _declare(flat_map("flat_map", up, shim_mapper), keeps="key")


@operator
def flatten(step_id: str, up: Stream[Iterable[X]]) -> Stream[X]:
    """Flatten a stream of iterables.

    Args:
        step_id: Unique id.
        up: Stream of iterables.

    Returns:
        Their items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.flatten("flat", op.input("inp", flow, TestingSource([[1, 2], [3]])))
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [1, 2, 3]
    """

    def shim_mapper(x: Iterable[X]) -> Iterable[X]:
        if not isinstance(x, Iterable):
            msg = (
                f"step {step_id!r}: flatten requires upstream to be iterables (lists, tuples, ...); "
                f"received {x!r} of type {type(x).__name__}"
            )
            raise FlowsparkTypeError(msg)
        return x

    return flat_map("flat_map", up, shim_mapper)


@operator
def map(step_id: str, up: Stream[X], mapper: Callable[[X], Y]) -> Stream[Y]:  # noqa: A001
    """Transform each item one to one.

    Args:
        step_id: Unique id.
        up: Stream.
        mapper: `mapper(item) -> new_item`.

    Returns:
        The mapped items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.map("inc", op.input("inp", flow, TestingSource([1])), lambda x: x + 1)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [2]
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_mapper(xs: list[X]) -> list[Y]:
        return list(_map(mapper, xs))

    return _declare(flat_map_batch("flat_map_batch", up, shim_mapper), one_to_one=True, pair_row=pair_row_of(mapper))


_map = builtins.map  # `map` is the operator below
_first = itemgetter(0)
_second = itemgetter(1)


def _unpack_kv(step_id: str, k_v: Any) -> tuple[Any, Any]:
    try:
        k, v = k_v
    except (TypeError, ValueError):
        msg = (
            f"step {step_id!r} requires `(key, value)` 2-tuple items; received {k_v!r} of "
            f"type {type(k_v).__name__}; use `op.key_on` to make a keyed stream"
        )
        raise FlowsparkTypeError(msg) from None
    return k, v


@operator
def map_value(step_id: str, up: KeyedStream[V], mapper: Callable[[V], W]) -> KeyedStream[W]:
    """Transform the value of each `(key, value)` item.

    Args:
        step_id: Unique id.
        up: Keyed stream.
        mapper: `mapper(value) -> new_value`.

    Returns:
        `(key, new_value)` items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.map_value("inc", op.input("inp", flow, TestingSource([("a", 1)])), lambda v: v + 1)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', 2)]
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_mapper(xs: list[tuple[str, V]]) -> list[tuple[str, W]]:
        if all_pairs(xs):
            return list(zip(_map(_first, xs), _map(mapper, _map(_second, xs)), strict=True))
        out = []
        for k_v in xs:
            k, v = _unpack_kv(step_id, k_v)
            out.append((k, mapper(v)))
        return out

    return _declare(
        flat_map_batch("flat_map_batch", up, shim_mapper),
        one_to_one=True,
        keeps="key",
        value_mapper=mapper,
        value_column=column_of(mapper),
    )


@operator
def filter(step_id: str, up: Stream[X], predicate: Callable[[X], bool]) -> Stream[X]:  # noqa: A001
    """Keep the items for which the predicate returns `True`.

    Args:
        step_id: Unique id.
        up: Stream.
        predicate: `predicate(item) -> bool`.

    Returns:
        The kept items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.filter("odd", op.input("inp", flow, TestingSource([1, 2, 3])), lambda x: x % 2 == 1)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [1, 3]
    """
    _check_callable(step_id, "predicate", predicate)

    def shim_mapper(xs: list[X]) -> list[X]:
        out = []
        for x in xs:
            r = predicate(x)
            if r is True:
                out.append(x)
            elif r is not False:
                check_bool(step_id, "predicate", x, r)
        return out

    return _declare(flat_map_batch("flat_map_batch", up, shim_mapper), keeps="items")


@operator
def filter_value(step_id: str, up: KeyedStream[V], predicate: Callable[[V], bool]) -> KeyedStream[V]:
    """Keep the `(key, value)` items whose value passes the predicate.

    Args:
        step_id: Unique id.
        up: Keyed stream.
        predicate: `predicate(value) -> bool`.

    Returns:
        The kept items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.filter_value("pos", op.input("inp", flow, TestingSource([("a", -1), ("a", 2)])), lambda v: v > 0)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', 2)]
    """
    _check_callable(step_id, "predicate", predicate)

    def shim_mapper(xs: list[tuple[str, V]]) -> list[tuple[str, V]]:
        out = []
        for k_v in xs:
            _k, v = _unpack_kv(step_id, k_v)
            if check_bool(step_id, "predicate", v, predicate(v)):
                out.append(k_v)
        return out

    return _declare(flat_map_batch("flat_map_batch", up, shim_mapper), keeps="items")


@operator
def filter_map(step_id: str, up: Stream[X], mapper: Callable[[X], Optional[Y]]) -> Stream[Y]:
    """Map each item and drop the `None` results.

    Args:
        step_id: Unique id.
        up: Stream.
        mapper: `mapper(item) -> new_item or None`.

    Returns:
        The non-`None` results.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource(["1", "x"]))
        >>> s = op.filter_map("parse", s, lambda s: int(s) if s.isdigit() else None)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [1]
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_mapper(xs: list[X]) -> list[Y]:
        out = []
        for x in xs:
            y = mapper(x)
            if y is not None:
                out.append(y)
        return out

    return flat_map_batch("flat_map_batch", up, shim_mapper)


@operator
def filter_map_value(step_id: str, up: KeyedStream[V], mapper: Callable[[V], Optional[W]]) -> KeyedStream[W]:
    """Map each value and drop the items whose new value is `None`.

    Args:
        step_id: Unique id.
        up: Keyed stream.
        mapper: `mapper(value) -> new_value or None`.

    Returns:
        `(key, new_value)` for the non-`None` results.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 4), ("a", 3)]))
        >>> s = op.filter_map_value("half", s, lambda v: v // 2 if v % 2 == 0 else None)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', 2)]
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_mapper(xs: list[tuple[str, V]]) -> list[tuple[str, W]]:
        out = []
        for k_v in xs:
            k, v = _unpack_kv(step_id, k_v)
            w = mapper(v)
            if w is not None:
                out.append((k, w))
        return out

    return flat_map_batch("flat_map_batch", up, shim_mapper)


@operator
def key_on(step_id: str, up: Stream[X], key: Callable[[X], str]) -> KeyedStream[X]:
    """Key each item: `(key(item), item)`; keys must be `str`.

    Args:
        step_id: Unique id.
        up: Stream.
        key: `key(item) -> str`.

    Returns:
        A keyed stream.

    Raises:
        FlowsparkTypeError: (while running) the key function returned a non-`str`.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.key_on("by_user", op.input("inp", flow, TestingSource([{"user": "a"}])), lambda e: e["user"])
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', {'user': 'a'})]
    """
    _check_callable(step_id, "key", key)

    def shim_mapper(xs: list[X]) -> list[tuple[str, X]]:
        ks = list(_map(key, xs))
        if set(_map(type, ks)) <= {str}:
            return list(zip(ks, xs, strict=True))
        out = []
        for k, x in zip(ks, xs, strict=True):
            if type(k) is not str and not isinstance(k, str):
                msg = (
                    f"step {step_id!r}: key function must return a str; returned {k!r} of "
                    f"type {type(k).__name__} for item {x!r}; a key must be a `str`: convert it, e.g. `str(...)`"
                )
                raise FlowsparkTypeError(msg)
            out.append((k, x))
        return out

    keyed = flat_map_batch("flat_map_batch", up, shim_mapper)
    return _declare(keyed, one_to_one=True, key_column=column_of(key))


@operator
def key_rm(step_id: str, up: KeyedStream[X]) -> Stream[X]:
    """Drop the key of each `(key, value)` item.

    Args:
        step_id: Unique id.
        up: Keyed stream.

    Returns:
        The values.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.key_rm("unkey", op.input("inp", flow, TestingSource([("a", 1)])))
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [1]
    """

    def shim_mapper(xs: list[tuple[str, X]]) -> list[X]:
        return [_unpack_kv(step_id, k_v)[1] for k_v in xs]

    return _declare(flat_map_batch("flat_map_batch", up, shim_mapper), one_to_one=True)


def _default_inspector(step_id: str, item: Any) -> None:
    print(f"{step_id}: {item!r}", flush=True)


@operator
def inspect(step_id: str, up: Stream[X], inspector: Callable[[str, X], None] = _default_inspector) -> Stream[X]:
    """Observe items for debugging.

    Args:
        step_id: Unique id.
        up: Stream.
        inspector: Called as `inspector(step_id, item)`; prints `step_id: item` by default.

    Returns:
        The upstream, unmodified.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> _ = op.inspect("look", op.input("inp", flow, TestingSource([1, 2])))
        >>> run_main(flow)
        eg.look: 1
        eg.look: 2
    """
    _check_callable(step_id, "inspector", inspector)

    def shim_inspector(_fq: str, item: X, _epoch: int, _worker: int) -> None:
        inspector(step_id, item)

    return inspect_debug("inspect_debug", up, shim_inspector)


class _RaisePartition(StatelessSinkPartition[Any]):
    def __init__(self, step_id: str) -> None:
        self._step_id = step_id

    @override
    def write_batch(self, items: list[Any]) -> None:
        for item in items:
            msg = f"step {self._step_id!r} raises on every item; received {item!r}"
            raise RuntimeError(msg)


class _RaiseSink(DynamicSink[Any]):
    def __init__(self, step_id: str) -> None:
        self._step_id = step_id

    @override
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _RaisePartition:
        return _RaisePartition(self._step_id)


@operator
def raises(step_id: str, up: Stream[Any]) -> None:
    """Raise a `RuntimeError` on any item (to assert a stream stays empty).

    Args:
        step_id: Unique id.
        up: Stream that must never carry an item.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> op.raises("never", op.input("inp", flow, TestingSource([])))
        >>> run_main(flow)
    """
    output("output", up, _RaiseSink(step_id))


@dataclass
class TTLCache(Generic[DK, DV]):
    """A cache whose entries are fetched again once older than `ttl`.

    Args:
        v_getter: Fetches the value for a key on a miss.
        now_getter: Returns the current time.
        ttl: Maximum age of an entry.
    """

    v_getter: Callable[[DK], DV]
    now_getter: Callable[[], datetime]
    ttl: timedelta
    _cache: dict[DK, tuple[datetime, DV]] = field(default_factory=dict)

    def get(self, k: DK) -> DV:
        """Return the value for `k`, fetching it if missing or expired.

        Args:
            k: Key.

        Returns:
            Value.
        """
        now = self.now_getter()
        hit = self._cache.get(k)
        if hit is not None and now - hit[0] <= self.ttl:
            return hit[1]
        v = self.v_getter(k)
        self._cache[k] = (now, v)
        return v

    def remove(self, k: DK) -> None:
        """Forget `k`.

        Args:
            k: Key.
        """
        del self._cache[k]


@operator
def enrich_cached(
    step_id: str,
    up: Stream[X],
    getter: Callable[[DK], DV],
    mapper: Callable[[TTLCache[DK, DV], X], Y],
    ttl: timedelta = timedelta.max,
    _now_getter: Callable[[], datetime] = utc_now,
) -> Stream[Y]:
    """Enrich items from a per-worker cache of slowly changing values.

    Args:
        step_id: Unique id.
        up: Stream.
        getter: `getter(cache_key) -> value`, called on a miss or once `ttl` passed.
        mapper: `mapper(cache, item) -> new_item`; call `cache.get(k)` inside.
        ttl: Age after which a cached value is fetched again.
        _now_getter: Clock (for tests).

    Returns:
        The mapper's results.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> rates = {"EUR": 1.1}
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("EUR", 10)]))
        >>> s = op.enrich_cached("fx", s, rates.get, lambda c, x: x[1] * c.get(x[0]))
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [11.0]
    """
    _check_callable(step_id, "getter", getter)
    _check_callable(step_id, "mapper", mapper)
    # A shared list, not a `nonlocal`: cloudpickle (Spark) does not keep two closures'
    # cells shared, while a list both reference stays one object.
    now: list[Optional[datetime]] = [None]

    def batch_now() -> datetime:
        t = now[0]
        assert t is not None
        return t

    cache: TTLCache[DK, DV] = TTLCache(getter, batch_now, ttl)

    def shim_mapper(xs: list[X]) -> list[Y]:
        now[0] = _now_getter()
        return [mapper(cache, x) for x in xs]

    # Each call reads the clock: with a finite `ttl` the cut into calls is visible.
    return _declare(flat_map_batch("flat_map_batch", up, shim_mapper), clocked=ttl != timedelta.max)


# ---------------------------------------------------------------------------
# Stateful composites
# ---------------------------------------------------------------------------


@operator
def stateful(
    step_id: str,
    up: KeyedStream[V],
    builder: Callable[[Optional[S]], StatefulLogic[V, W, S]],
) -> KeyedStream[W]:
    """Run keyed `StatefulLogic` one value at a time.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        builder: `builder(resume_state_or_None) -> StatefulLogic`, called per new key.

    Returns:
        `(key, emitted_value)` stream.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> class Last(op.StatefulLogic):
        ...     def __init__(self, s): self.last = s
        ...     def on_item(self, v): prev, self.last = self.last, v; return [(prev, v)], self.RETAIN
        ...     def snapshot(self): return self.last
        >>> flow = Dataflow("eg")
        >>> s = op.stateful("pairs", op.input("inp", flow, TestingSource([("a", 1), ("a", 2)])), Last)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', (None, 1)), ('a', (1, 2))]
    """
    _check_callable(step_id, "builder", builder)

    def shim_builder(resume_state: Optional[S]) -> StatefulAdapter[V, W, S]:
        return StatefulAdapter(builder, check_logic(step_id, builder(resume_state)), step_id)

    return _declare(stateful_batch("stateful_batch", up, shim_builder), notifies=not class_never_notifies(builder))


class _StatefulFlatMapLogic(StatefulBatchLogic[V, W, Optional[S]]):
    __slots__ = ("mapper", "state", "step_id")

    def __init__(
        self, step_id: str, mapper: Callable[[Optional[S], V], tuple[Optional[S], Iterable[W]]], state: Optional[S]
    ):
        self.step_id = step_id
        self.mapper = mapper
        self.state = state

    @override
    def on_batch(self, values: list[V]) -> tuple[Iterable[W], bool]:
        mapper = self.mapper
        state = self.state
        emits: list[W] = []
        for v in values:
            res = mapper(state, v)
            try:
                state, ws = res
            except (TypeError, ValueError):
                raise _bad_mapper_return(self.step_id, "(updated_state, iterable_of_emits)", res) from None
            try:
                emits.extend(ws)
            except TypeError:
                if isinstance(ws, Iterable):
                    raise
                raise _bad_mapper_return(self.step_id, "(updated_state, iterable_of_emits)", res) from None
        self.state = state
        return (emits, state is None)

    @override
    def snapshot(self) -> Optional[S]:
        return copy.deepcopy(self.state)


class _StatefulMapLogic(StatefulBatchLogic[V, W, Optional[S]]):
    __slots__ = ("mapper", "state", "step_id")

    def __init__(self, step_id: str, mapper: Callable[[Optional[S], V], tuple[Optional[S], W]], state: Optional[S]):
        self.step_id = step_id
        self.mapper = mapper
        self.state = state

    @override
    def on_batch(self, values: list[V]) -> tuple[Iterable[W], bool]:
        state, emits = _map_values(self.step_id, self.mapper, self.state, values)
        self.state = state
        return (emits, state is None)

    @override
    def snapshot(self) -> Optional[S]:
        return copy.deepcopy(self.state)


def _map_values(
    step_id: str, mapper: Callable[[Optional[S], V], tuple[Optional[S], W]], state: Optional[S], values: list[V]
) -> tuple[Optional[S], list[W]]:
    """`stateful_map`'s logic as a function of its state: `(state after values, emits)` (IR `batch_fn`)."""
    emits: list[W] = []
    append = emits.append
    for v in values:
        res = mapper(state, v)
        try:
            # Any 2-item iterable unpacks (as in Bytewax), e.g. `[state, emit]`.
            state, w = res
        except (TypeError, ValueError):
            raise _bad_mapper_return(step_id, "(updated_state, emit)", res) from None
        append(w)
    return state, emits


def _bad_mapper_return(step_id: str, want: str, got: Any) -> FlowsparkTypeError:
    msg = (
        f"step {step_id!r}: the return value of mapper must be a 2-tuple {want}; "
        f"returned {got!r} of type {type(got).__name__}"
    )
    return FlowsparkTypeError(msg)


@operator
def stateful_map(
    step_id: str,
    up: KeyedStream[V],
    mapper: Callable[[Optional[S], V], tuple[Optional[S], W]],
) -> KeyedStream[W]:
    """Map each value with per-key state; returning `None` state discards it.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        mapper: `mapper(state_or_None, value) -> (new_state_or_None, emit)`.

    Returns:
        `(key, emit)` for each value.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> def running(total, v):
        ...     total = (total or 0) + v
        ...     return total, total
        >>> flow = Dataflow("eg")
        >>> s = op.stateful_map("sum", op.input("inp", flow, TestingSource([("a", 1), ("a", 2)])), running)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', 1), ('a', 3)]
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_builder(resume_state: Optional[S]) -> _StatefulMapLogic[V, W, S]:
        return _StatefulMapLogic(step_id, mapper, resume_state)

    batch_fn = functools.partial(_map_values, step_id, mapper)
    return _declare(stateful_batch("stateful_batch", up, shim_builder), notifies=False, batch_fn=batch_fn)


@operator
def stateful_flat_map(
    step_id: str,
    up: KeyedStream[V],
    mapper: Callable[[Optional[S], V], tuple[Optional[S], Iterable[W]]],
) -> KeyedStream[W]:
    """Like `stateful_map`, but each value emits zero or more values.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        mapper: `mapper(state_or_None, value) -> (new_state_or_None, iterable_of_emits)`.

    Returns:
        `(key, emit)` for every emitted value.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> def every_second(seen, v):
        ...     seen = (seen or 0) + 1
        ...     return seen, [v] if seen % 2 == 0 else []
        >>> flow = Dataflow("eg")
        >>> s = op.stateful_flat_map("pick", op.input("inp", flow, TestingSource([("a", 1), ("a", 2)])), every_second)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', 2)]
    """
    _check_callable(step_id, "mapper", mapper)

    def shim_builder(resume_state: Optional[S]) -> _StatefulFlatMapLogic[V, W, S]:
        return _StatefulFlatMapLogic(step_id, mapper, resume_state)

    return _declare(stateful_batch("stateful_batch", up, shim_builder), notifies=False)


@dataclass
class _CollectState(Generic[V]):
    acc: list[V] = field(default_factory=list)
    timeout_at: Optional[datetime] = None


class _CollectLogic(StatefulLogic[V, list[V], _CollectState[V]]):
    def __init__(self, now_getter: Callable[[], datetime], timeout: timedelta, max_size: int, state: _CollectState[V]):
        self.now_getter = now_getter
        self.timeout = timeout
        self.max_size = max_size
        self.state = state

    @override
    def on_item(self, value: V) -> tuple[Iterable[list[V]], bool]:
        self.state.timeout_at = self.now_getter() + self.timeout
        self.state.acc.append(value)
        if len(self.state.acc) >= self.max_size:
            return ((self.state.acc,), self.DISCARD)
        return (_EMPTY, self.RETAIN)

    @override
    def on_notify(self) -> tuple[Iterable[list[V]], bool]:
        return ((self.state.acc,), self.DISCARD)

    @override
    def on_eof(self) -> tuple[Iterable[list[V]], bool]:
        return ((self.state.acc,), self.DISCARD)

    @override
    def notify_at(self) -> Optional[datetime]:
        return self.state.timeout_at

    @override
    def snapshot(self) -> _CollectState[V]:
        return copy.deepcopy(self.state)


@operator
def collect(
    step_id: str,
    up: KeyedStream[V],
    timeout: timedelta,
    max_size: int,
    _now_getter: Callable[[], datetime] = utc_now,
) -> KeyedStream[list[V]]:
    """Collect values per key into lists.

    A list is emitted when it reaches `max_size`, when `timeout` of system time
    passed since the key's latest value, or at end of input.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        timeout: Inactivity time after which a partial list is emitted.
        max_size: Emit as soon as a list has this many values.
        _now_getter: Clock (for tests).

    Returns:
        `(key, list_of_values)`.

    Example:
        >>> from datetime import timedelta
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 1), ("a", 2), ("a", 3)]))
        >>> s = op.collect("pairs", s, timedelta(seconds=10), max_size=2)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [('a', [1, 2]), ('a', [3])]
    """
    if not isinstance(timeout, timedelta):
        msg = f"step {step_id!r}: timeout must be a datetime.timedelta; received {timeout!r}"
        raise FlowsparkTypeError(msg)
    if not isinstance(max_size, int) or max_size < 1:
        msg = f"step {step_id!r}: max_size must be an int >= 1; received {max_size!r}"
        raise FlowsparkBuildError(msg)

    def shim_builder(resume_state: Optional[_CollectState[V]]) -> _CollectLogic[V]:
        state = resume_state if resume_state is not None else _CollectState()
        return _CollectLogic(_now_getter, timeout, max_size, state)

    return stateful("stateful", up, shim_builder)


class _FoldFinalLogic(StatefulBatchLogic[V, S, S]):
    __slots__ = ("builder", "folder", "state")

    def __init__(self, builder: Callable[[], S], folder: Callable[[S, V], S], state: Optional[S]):
        self.builder = builder
        self.folder = folder
        self.state = builder() if state is None else state

    @override
    def on_batch(self, values: list[V]) -> tuple[Iterable[S], bool]:
        folder = self.folder
        state = self.state
        for v in values:
            state = folder(state, v)
        self.state = state
        return (_EMPTY, self.RETAIN)

    @override
    def on_eof(self) -> tuple[Iterable[S], bool]:
        return ((self.state,), self.DISCARD)

    @override
    def snapshot(self) -> S:
        return copy.deepcopy(self.state)


@operator
def fold_final(
    step_id: str,
    up: KeyedStream[V],
    builder: Callable[[], S],
    folder: Callable[[S, V], S],
) -> KeyedStream[S]:
    """Fold all values of each key into an accumulator; emit it at end of input.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        builder: `builder() -> initial accumulator`.
        folder: `folder(acc, value) -> acc`.

    Returns:
        `(key, final_accumulator)` at end of input.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 1), ("b", 5), ("a", 2)]))
        >>> s = op.fold_final("sum", s, lambda: 0, lambda acc, v: acc + v)
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); sorted(out)
        [('a', 3), ('b', 5)]
    """
    _check_callable(step_id, "builder", builder)
    _check_callable(step_id, "folder", folder)

    def shim_builder(resume_state: Optional[S]) -> _FoldFinalLogic[V, S]:
        return _FoldFinalLogic(builder, folder, resume_state)

    reduction = next((r for (b, f), r in reducers.FOLDS.items() if builder is b and folder is f), None)
    down = stateful_batch("stateful_batch", up, shim_builder)
    return _declare(down, notifies=False, eof_only=True, reduction=reduction)


class _ReduceFinalLogic(StatefulBatchLogic[V, V, tuple[V]]):
    __slots__ = ("has", "reducer", "state")

    def __init__(self, reducer: Callable[[V, V], V], state: Optional[tuple[V]]):
        self.reducer = reducer
        self.has = state is not None
        self.state: Any = state[0] if state is not None else None

    @override
    def on_batch(self, values: list[V]) -> tuple[Iterable[V], bool]:
        it = iter(values)
        if not self.has:
            self.state = next(it)
            self.has = True
        reducer = self.reducer
        state = self.state
        for v in it:
            state = reducer(state, v)
        self.state = state
        return (_EMPTY, self.RETAIN)

    @override
    def on_eof(self) -> tuple[Iterable[V], bool]:
        return ((self.state,), self.DISCARD)

    @override
    def snapshot(self) -> tuple[V]:
        return (copy.deepcopy(self.state),)


@operator
def reduce_final(step_id: str, up: KeyedStream[V], reducer: Callable[[V, V], V]) -> KeyedStream[V]:
    """Reduce all values of each key; the first value starts the accumulator; emit at EOF.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        reducer: `reducer(acc, value) -> acc`.

    Returns:
        `(key, reduced)` at end of input.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 1), ("a", 2)]))
        >>> out = []; op.output("out", op.reduce_final("sum", s, lambda a, b: a + b), TestingSink(out))
        >>> run_main(flow); out
        [('a', 3)]
    """
    _check_callable(step_id, "reducer", reducer)

    def shim_builder(resume_state: Optional[tuple[V]]) -> _ReduceFinalLogic[V]:
        return _ReduceFinalLogic(reducer, resume_state)

    reduction = next((r for f, r in _REDUCERS if reducer is f), None)
    down = stateful_batch("stateful_batch", up, shim_builder)
    return _declare(down, notifies=False, eof_only=True, reduction=reduction)


#: The reducers `reduce_final` recognises (by identity), and what they compute (`ir.StatefulBatch.reduction`).
_REDUCERS = ((pyoperator.add, "sum"), (builtins.max, "max"), (builtins.min, "min"))


@operator
def count_final(step_id: str, up: Stream[X], key: Callable[[X], str]) -> KeyedStream[int]:
    """Count the items of an unkeyed stream by `key(item)`; emit counts at end of input.

    Args:
        step_id: Unique id.
        up: Stream (not keyed).
        key: `key(item) -> str`.

    Returns:
        `(key, count)` at end of input.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource(["a", "b", "a"]))
        >>> out = []; op.output("out", op.count_final("count", s, lambda w: w), TestingSink(out))
        >>> run_main(flow); sorted(out)
        [('a', 2), ('b', 1)]
    """
    keyed = key_on("key", up, key)
    ones = _declare(map_value("init_count", keyed, _one), value_constant=True)
    return _declare(reduce_final("sum", ones, _add), reduction="count")


def _one(_v: Any) -> int:
    return 1


def _add(a: int, b: int) -> int:
    return a + b


@operator
def max_final(step_id: str, up: KeyedStream[V], by: Callable[[V], Any] = _identity) -> KeyedStream[V]:
    """Emit the largest value per key (by `by(value)`) at end of input.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        by: Sort key of a value.

    Returns:
        `(key, max_value)`.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 3), ("a", 7), ("a", 5)]))
        >>> out = []; op.output("out", op.max_final("max", s), TestingSink(out)); run_main(flow); out
        [('a', 7)]
    """
    _check_callable(step_id, "by", by)
    down = reduce_final("reduce_final", up, lambda a, b: max(a, b, key=by))
    return _declare(down, reduction="max") if by is _identity else down


@operator
def min_final(step_id: str, up: KeyedStream[V], by: Callable[[V], Any] = _identity) -> KeyedStream[V]:
    """Emit the smallest value per key (by `by(value)`) at end of input.

    Args:
        step_id: Unique id.
        up: `(key, value)` stream.
        by: Sort key of a value.

    Returns:
        `(key, min_value)`.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> s = op.input("inp", flow, TestingSource([("a", 3), ("a", 1)]))
        >>> out = []; op.output("out", op.min_final("min", s), TestingSink(out)); run_main(flow); out
        [('a', 1)]
    """
    _check_callable(step_id, "by", by)
    down = reduce_final("reduce_final", up, lambda a, b: min(a, b, key=by))
    return _declare(down, reduction="min") if by is _identity else down


# ---------------------------------------------------------------------------
# join
# ---------------------------------------------------------------------------

JoinInsertMode: TypeAlias = Literal["first", "last", "product"]
"""Which values `join` keeps per side: the `"first"`, the `"last"`, or all of them (`"product"`)."""
JoinEmitMode: TypeAlias = Literal["complete", "final", "running"]
"""When `join` emits: when every side has a value, then clears (`"complete"`), at end of input, missing sides
`None` (`"final"`), or on every value (`"running"`)."""
_INSERT_MODES = ("first", "last", "product")
_EMIT_MODES = ("complete", "final", "running")
_LONE_NONE = [None]


@dataclass
class _JoinState:
    seen: list[list[Any]]

    @classmethod
    def for_side_count(cls, side_count: int) -> Self:
        return cls([[] for _ in range(side_count)])

    def set_val(self, side: int, value: Any) -> None:
        self.seen[side] = [value]

    def add_val(self, side: int, value: Any) -> None:
        self.seen[side].append(value)

    def is_set(self, side: int) -> bool:
        return len(self.seen[side]) > 0

    def all_set(self) -> bool:
        return all(len(vs) > 0 for vs in self.seen)

    def astuples(self) -> list[tuple[Any, ...]]:
        return list(itertools.product(*(vs if vs else _LONE_NONE for vs in self.seen)))

    def clear(self) -> None:
        for vs in self.seen:
            vs.clear()


class _JoinLogic(StatefulLogic[tuple[int, Any], tuple[Any, ...], _JoinState]):
    def __init__(self, insert_mode: str, emit_mode: str, state: _JoinState):
        self.insert_mode = insert_mode
        self.emit_mode = emit_mode
        self.state = state

    @override
    def on_item(self, value: tuple[int, Any]) -> tuple[Iterable[tuple[Any, ...]], bool]:
        side, v = value
        mode = self.insert_mode
        if mode == "first":
            if not self.state.is_set(side):
                self.state.set_val(side, v)
        elif mode == "last":
            self.state.set_val(side, v)
        else:
            self.state.add_val(side, v)
        if self.emit_mode == "complete" and self.state.all_set():
            return (self.state.astuples(), self.DISCARD)
        if self.emit_mode == "running":
            return (self.state.astuples(), self.RETAIN)
        return (_EMPTY, self.RETAIN)

    @override
    def on_eof(self) -> tuple[Iterable[tuple[Any, ...]], bool]:
        if self.emit_mode == "final":
            return (self.state.astuples(), self.DISCARD)
        return (_EMPTY, self.RETAIN)

    @override
    def snapshot(self) -> _JoinState:
        return copy.deepcopy(self.state)


def _check_join_modes(step_id: str, insert_mode: Any, emit_mode: Any) -> None:
    if insert_mode not in _INSERT_MODES:
        msg = f"step {step_id!r}: unknown insert_mode {insert_mode!r}; use one of {', '.join(_INSERT_MODES)}"
        raise FlowsparkBuildError(msg)
    if emit_mode not in _EMIT_MODES:
        msg = f"step {step_id!r}: unknown emit_mode {emit_mode!r}; use one of {', '.join(_EMIT_MODES)}"
        raise FlowsparkBuildError(msg)


@operator
def _join_label_merge(step_id: str, *ups: KeyedStream[Any]) -> KeyedStream[tuple[int, Any]]:
    labeled = [map_value(f"label_{i}", up, _side_label(i)) for i, up in enumerate(ups)]
    return merge("merge", *labeled)


def _side_label(i: int) -> Callable[[Any], tuple[int, Any]]:

    def label(v: Any) -> tuple[int, Any]:
        return (i, v)

    return label


@operator
def join(
    step_id: str,
    *sides: KeyedStream[Any],
    insert_mode: JoinInsertMode = "last",
    emit_mode: JoinEmitMode = "complete",
) -> KeyedStream[tuple[Any, ...]]:
    """Join keyed streams on their keys; rows have one slot per side, in argument order.

    Args:
        step_id: Unique id.
        *sides: Keyed streams.
        insert_mode: `"first"`, `"last"` (default) or `"product"` values kept per side.
        emit_mode: `"complete"` (default: when every side has a value, then clear),
            `"final"` (at end of input, missing sides `None`) or `"running"` (on every value).

    Returns:
        `(key, row_tuple)` items.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> flow = Dataflow("eg")
        >>> names = op.input("names", flow, TestingSource([("1", "ann")]))
        >>> ages = op.input("ages", flow, TestingSource([("1", 31)]))
        >>> out = []; op.output("out", op.join("j", names, ages), TestingSink(out)); run_main(flow); out
        [('1', ('ann', 31))]
    """
    _check_join_modes(step_id, insert_mode, emit_mode)
    if not sides:
        msg = f"step {step_id!r}: join needs at least one side"
        raise FlowsparkBuildError(msg)
    side_count = len(sides)

    def shim_builder(resume_state: Optional[_JoinState]) -> _JoinLogic:
        state = resume_state if resume_state is not None else _JoinState.for_side_count(side_count)
        return _JoinLogic(insert_mode, emit_mode, state)

    merged = _join_label_merge("add_names", *sides)
    return _declare(stateful("join", merged, shim_builder), notifies=False)
