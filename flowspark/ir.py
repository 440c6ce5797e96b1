"""The intermediate representation: the few core steps every runtime implements.

A `Dataflow` records user operators as a tree of composites whose leaves are
the core steps below. Runtimes only ever see a `Graph`: the core steps in
creation order (which is a topological order: a step can only consume streams
that already exist) plus the composite tree, kept for visualisation.

Every stream is named by a string id (`"<step id>.<port>"`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Optional, Union


@dataclass(frozen=True)
class Input:
    """Read a source. `source` is a `flowspark.inputs.Source`."""

    step_id: str
    source: Any
    down: str

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return ()

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return (self.down,)


@dataclass(frozen=True)
class Output:
    """Write to a sink. `sink` is a `flowspark.outputs.Sink`."""

    step_id: str
    up: str
    sink: Any

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return (self.up,)

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return ()


@dataclass(frozen=True)
class InspectDebug:
    """Call `inspector(step_id, item, epoch, worker)` for each item; pass items on."""

    step_id: str
    up: str
    inspector: Callable[[str, Any, int, int], None]
    down: str

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return (self.up,)

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return (self.down,)


@dataclass(frozen=True)
class FlatMapBatch:
    """Call `mapper(list_of_items) -> iterable` on each runtime batch.

    `one_to_one`: the mapper returns exactly one output per input, in order (set by
    `map`, `map_value`, `key_on`, `key_rm`); a runtime may then keep each input's
    position for its output instead of numbering outputs.

    `keeps`: what every output keeps of its input: `"items"` (the outputs are some of
    the inputs, unchanged and in order: `filter`), `"key"` (each output is a `(key,
    value)` pair with its input's key: `map_value`, `filter_value`, `flat_map_value`),
    or `""` (nothing known).

    `key_column`: set by `key_on` when its key function is proven to return
    `item[key_column]` (`lambda r: r["user"]`, `operator.itemgetter("user")`); a runtime
    whose items are rows may then compute the key from the column itself.

    `value_mapper`: set by `map_value`: each `(key, value)` input gives `(key,
    value_mapper(value))`; a runtime holding a batch's keys and values in separate
    columns may then map the values alone (`mapper` stays the reference, and gives
    the step's error for an item that is not a pair). `value_column`: set by `map_value`
    when `value_mapper` is proven to return `value[value_column]` (as `key_column`).

    `clocked`: the mapper reads the clock once per call (`enrich_cached` with a `ttl`),
    so how items are cut into calls can be seen; the in-memory executor then moves one
    source batch (activation) at a time, as Bytewax does.

    `value_constant`: set by an operator whose `value_mapper` returns the same value for
    every value and never raises (`count_final`'s ones): a runtime that only counts the
    values need not call it.

    `pair_row`: set by `map` when its mapper is proven to turn each `(key, value)` pair into
    the dict `{pair_row[0]: key, pair_row[1]: value}` (`lambda kv: {"user": kv[0], "n":
    kv[1]}`, `flowspark._keyfn.pair_row_of`): a runtime holding keys and values as columns
    may name the columns instead of calling it.
    """

    step_id: str
    up: str
    mapper: Callable[[list[Any]], Any]
    down: str
    one_to_one: bool = False
    keeps: str = ""
    key_column: Optional[str] = None
    value_mapper: Optional[Callable[[Any], Any]] = None
    value_column: Optional[str] = None
    clocked: bool = False
    value_constant: bool = False
    pair_row: Optional[tuple[str, str]] = None

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return (self.up,)

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return (self.down,)


@dataclass(frozen=True)
class Branch:
    """Split by `predicate(item) -> bool` into `trues` and `falses`."""

    step_id: str
    up: str
    predicate: Callable[[Any], bool]
    trues: str
    falses: str

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return (self.up,)

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return (self.trues, self.falses)


@dataclass(frozen=True)
class Merge:
    """Union of several streams; the order within each upstream is kept."""

    step_id: str
    ups_: tuple[str, ...]
    down: str

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return self.ups_

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return (self.down,)


@dataclass(frozen=True)
class Redistribute:
    """Spread items over workers (a no-op for a single worker)."""

    step_id: str
    up: str
    down: str

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return (self.up,)

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return (self.down,)


@dataclass(frozen=True)
class WindowCount:
    """A window step that counts each key's values per window (`StatefulBatch.window_count`).

    Set by `count_window`, and by `fold_window` with the builder and folder of a count
    (`flowspark.reducers.zero` / `count`), for an `EventClock` with tumbling or sliding windows.
    The step emits, per key, `(0, window_id, n)` then `(2, window_id, WindowMetadata)` for
    each window when it closes (the events `WindowOut` splits), where `n` counts the key's
    values that were not late. A value's windows are `range((d - length) // offset + 1,
    d // offset + 1)` with `d = ts - align_to` (tumbling: `offset == length`). A value is
    late (emitted on the stream `late` instead) when, at its arrival, the watermark is past
    its timestamp; with the step's time fixed (the Spark batch runtime) the watermark is the
    largest `ts - wait` of the key's earlier values.

    `ts_column`: the column `ts_getter` is proven to read (`flowspark._keyfn.column_of`), or
    `None`. `default_now`: the clock reads the system time (`utc_now`, no `now_getter` of
    its own).
    """

    ts_column: Optional[str]
    default_now: bool
    wait: timedelta
    length: timedelta
    offset: timedelta
    align_to: datetime
    late: str


@dataclass(frozen=True)
class StatefulBatch:
    """Keyed state: `builder(resume_state | None) -> StatefulBatchLogic` per key.

    `notifies`: whether a logic of this step can ask for a notification
    (`notify_at`). False is a promise, set by the operator that built the step
    (`stateful_map`, `fold_final`, `join`, a logic class keeping the default
    `notify_at`...); a runtime may then run the step without timers.

    `eof_only`: whether the step's logics emit only from `on_eof` (nothing for a value,
    no notification). True is a promise, set by `fold_final` (and the operators built
    on it); a runtime then need not order the values it gets (the Spark runtimes skip
    their tags: `flowspark.runtime.driver.drive_chain`).

    `batch_fn`: the step's whole logic as a function of its state, set by `stateful_map`:
    `batch_fn(state, values) -> (state, emits)` gives what a logic built from `state`
    (`None`: fresh) and fed `values` emits and ends with (`None`: discarded). Such a logic
    never notifies, emits nothing at EOF and snapshots a deep copy of its state, so a
    runtime may drive bare states instead of logic objects (`StepDriver.drive_state`).

    `reduction`: what the step emits, set by the operator that knows it: `"count"` (the number
    of a key's values), `"sum"` (their sum with `+`), `"max"` or `"min"` (the largest or
    smallest, as `builtins.max` / `min` compare), one `(key, result)` per key at end of input
    (`reduce_final` with `operator.add`, `max` or `min`; `count_final`; `max_final` / `min_final`
    without `by`; `fold_final` with `flowspark.reducers`). A runtime may then compute it as an
    aggregate instead of driving the logic (the builder stays the reference).

    `window_count`: the step is a count per window (`WindowCount`); a runtime may compute it
    as an aggregate per key and window (the builder stays the reference).
    """

    step_id: str
    up: str
    builder: Callable[[Any], Any]
    down: str
    notifies: bool = True
    eof_only: bool = False
    batch_fn: Optional[Callable[[Any, list[Any]], tuple[Any, list[Any]]]] = None
    reduction: Optional[str] = None
    window_count: Optional[WindowCount] = None

    @property
    def ups(self) -> tuple[str, ...]:
        """Upstream stream ids."""
        return (self.up,)

    @property
    def downs(self) -> tuple[str, ...]:
        """Downstream stream ids."""
        return (self.down,)


Node = Union[Input, Output, InspectDebug, FlatMapBatch, Branch, Merge, Redistribute, StatefulBatch]
CORE_STEPS: tuple[type, ...] = (
    Input,
    Output,
    InspectDebug,
    FlatMapBatch,
    Branch,
    Merge,
    Redistribute,
    StatefulBatch,
)


@dataclass(frozen=True)
class Composite:
    """A user-visible operator call: its name, ports and sub-steps (for visualisation)."""

    step_id: str
    name: str
    ups: tuple[str, ...]
    downs: tuple[str, ...]
    substeps: tuple[str, ...] = field(default=())
    #: Named ports, as Bytewax names them: `(port name, stream ids)` per `Stream` parameter
    #: (`*ups` / `**kw` of streams: one port of several streams) and per returned stream
    #: (`"down"`, or the fields of a returned dataclass such as `trues` / `falses`).
    up_ports: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())
    down_ports: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())


@dataclass(frozen=True)
class Graph:
    """A built dataflow: its core steps in topological order and its operator tree."""

    flow_id: str
    nodes: tuple[Node, ...]
    composites: tuple[Composite, ...] = ()

    def producers(self) -> dict[str, Node]:
        """Map each stream id to the node that produces it."""
        out: dict[str, Node] = {}
        for node in self.nodes:
            for down in node.downs:
                out[down] = node
        return out

    def consumers(self) -> dict[str, list[Node]]:
        """Map each stream id to the nodes that consume it, in creation order."""
        out: dict[str, list[Node]] = {}
        for node in self.nodes:
            for up in node.ups:
                out.setdefault(up, []).append(node)
        return out


def walk(graph: Graph) -> Iterator[Node]:
    """Yield the core steps of `graph` in topological order.

    Args:
        graph: A built graph.

    Yields:
        Each core step, upstream steps before downstream ones.
    """
    yield from graph.nodes
