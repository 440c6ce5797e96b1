"""A compiled Spark plan: pure data, shipped to workers in parts, printable.

A plan is a list of *stages*; each stage is one Python pass over Spark rows
`(p int, k string, seq binary, v binary)` (port, key, sequence, encoded item):

- a **source stage** turns a source into items: items held by the driver
  (`flowspark.inputs.DriverItems`, e.g. `TestingSource`), source partitions, or
  the rows of a Spark DataFrame (`flowspark.spark.io.inputs.SparkSource`);
- a **map stage** reads the union of some ports of earlier stages (a `merge` of
  streams living in different stages);
- a **keyed stage** drives a chain of consecutive stateful steps key by key.

A stream leaving its stage (to another stage, a sink or the driver) is a
*port*. The batch runtime (`flowspark.spark.batch.job`) and the streaming runtime
(`flowspark.spark.streaming`) are two lowerings of the same plan; each describes
its own lowering (`describe`), which `print(plan)` and `flowspark plan --spark` show.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Optional

from flowspark.ir import WindowCount

#: Python's datetime range, about: a window count with a longer wait or window runs in Python.
_LONGEST = timedelta(days=3_652_059)
#: Windows per value Spark may list (`explode(sequence(...))`) for a sliding window count.
_MOST_WINDOWS = 10_000

#: The port of every stage's dead-letter rows (`flowspark.deadletter`): `v` holds a pickled
#: record, `seq` the dead item's sequence. Stages have far fewer ports (and routes keep
#: `ROUTE` = 1024 ports per stage).
DEAD_PORT = 1023

__all__ = [
    "DEAD_PORT",
    "Aggregate",
    "ColumnKey",
    "Decision",
    "InspectPlan",
    "KeyedStep",
    "Op",
    "Plan",
    "Port",
    "SinkPlan",
    "StagePlan",
    "StageSpec",
]


@dataclass(frozen=True)
class Op:
    """One stateless core step inside a fused stage.

    `kind` is `map` (flat_map_batch), `inspect` (pass through and copy to
    `side`), `pass` (redistribute), `branch` or `merge`. `one_to_one`: the IR's
    `FlatMapBatch.one_to_one` (one output per input: it keeps the input's sequence). `ups`/`downs` are
    stream ids; for `merge`, `pads[i]` is the upstream's 4-byte index (inserted
    after the source header) then zero padding (appended). `keeps` and `key_column`:
    the IR's `FlatMapBatch` facts of the same names; `value_fn` and `value_column`: its
    `value_mapper` and `value_column`; `pair_row`: its `pair_row`.
    """

    kind: str
    step_id: str
    ups: tuple[str, ...]
    downs: tuple[str, ...]
    fn: Optional[Callable[..., Any]] = None
    pads: tuple[bytes, ...] = ()
    one_to_one: bool = False
    keeps: str = ""
    key_column: Optional[str] = None
    value_fn: Optional[Callable[[Any], Any]] = None
    value_column: Optional[str] = None
    value_constant: bool = False
    pair_row: Optional[tuple[str, str]] = None


@dataclass(frozen=True)
class KeyedStep:
    """One stateful step of a fused keyed chain.

    `level`: the number of stateful steps on the longest path from a source to
    this step (itself included); it orders end-of-key emits after their inputs.
    `notifies`: the IR's `StatefulBatch.notifies` (whether a logic can ask for a
    notification). `regroup`: whether its emits' sequences carry the key (see
    `StepDriver`; the last step of a chain does, unless the rule `unordered_emits` applied).
    `eof_only`, `batch_fn`, `reduction`, `window_count`: the IR's `StatefulBatch.eof_only`,
    `.batch_fn`, `.reduction`, `.window_count`; in a physical plan (`flowspark.spark.rules.optimizer`) they
    are kept only where the rules `eof_only`, `bare_state` and `native_reduction` applied.
    """

    step_id: str
    builder: Callable[[Any], Any]
    level: int = 1
    notifies: bool = True
    regroup: bool = True
    eof_only: bool = False
    batch_fn: Optional[Callable[[Any, list[Any]], tuple[Any, list[Any]]]] = None
    reduction: Optional[str] = None
    window_count: Optional[WindowCount] = None


@dataclass(frozen=True)
class Aggregate:
    """A keyed stage Spark can compute as `groupBy(key).agg(...)` (`Plan.aggregate_of`).

    Its one stateful step `step_id` is a built-in reduction (`KeyedStep.reduction`: `count`,
    `sum`, `max`, `min`) and its input comes straight from the `SparkSource` of stage
    `source_stage`: a `key_on` proven to read `row[key]` first, then for `sum`, `max` and `min`
    one `map_value` proven to read `row[value]`, for `count` only `map_value`s that cannot fail
    (`value` is `None`); redistributes anywhere. `level`: the step's `KeyedStep.level` (its
    end-of-input emits' sequences).

    `window`: the step counts each key's values per window (`KeyedStep.window_count`, its
    `ts_column` set): the aggregate is `groupBy(key, window id)` over the values that are not
    late, and the stage's items are the step's events, one window after another.
    """

    key: str
    value: Optional[str]
    reduction: str
    source_stage: int
    step_id: str
    level: int
    window: Optional[WindowCount] = None


@dataclass(frozen=True)
class ColumnKey:
    """A keyed stage whose input Spark can key by itself: rows of a `SparkSource` keyed on a column.

    The source stage `source_stage` reads a `SparkSource` and its only port,
    `port`, is this keyed stage's input; its `ops` are item-keeping steps
    (`filter`), one `key_on` whose key function is proven to be `row[column]`, then
    key-keeping steps (`map_value`, `filter_value`, `flat_map_value`, `filter`). A
    lowering may then compute the key column and each row's position in Spark,
    shuffle and sort the rows natively, and run `ops` inside the keyed stage
    (one Python pass instead of two); when the column is not a string column it
    keeps the source stage's Python pass.
    """

    column: str
    source_stage: int
    source_step: str
    source_index: int
    entry: str
    ops: tuple[Op, ...]
    port: str
    #: The column the stage reads its values from (set by the rule `value_column`), or `None`.
    value_from: Optional[str] = None

    @property
    def value_candidate(self) -> Optional[str]:
        """The column a Spark-keyed stage could read its values from, or `None`.

        That is when the `key_on` comes first and the next step (past redistributes) is a
        `map_value` proven to return `row[column]`.
        """
        if self.ops[0].kind != "map" or self.ops[0].key_column != self.column:
            return None
        for o in self.ops[1:]:
            if o.kind != "pass":
                return o.value_column if o.kind == "map" else None
        return None


@dataclass(frozen=True)
class Port:
    """A stream that leaves its stage (to another stage, a sink or the driver).

    `key_for` names the stateful step whose input this stream is: the stage
    then checks items are `(str, value)` and fills the key column. `value_only`:
    every reader of the port is a keyed stage, so the `v` column holds only the
    value (the key is in `k`); otherwise it holds the whole `(key, value)` item.
    """

    stream: str
    key_for: Optional[str] = None
    value_only: bool = False


@dataclass(frozen=True)
class StageSpec:
    """What one Python pass of a stage does (shipped to the workers, pickled once per stage).

    `source`: how input rows become items: `rows` (k, seq, v rows of a previous
    stage), `chunks` (pickled lists of items sent from the driver), `ordered_chunks`
    (the same, each headed by its first item's position in the micro-batch instead of a
    sequence: `pysource.stream_options(order=True)`), `parts` (source partitions to
    build and read), `native` (rows of a Spark DataFrame, one dict per row). `entry` is
    the stream the input items (or, when `chain` is not empty, the chain's emits) belong to.
    `input_value_only`: for a keyed stage, whether its input rows carry only the value in
    `v` (see `Port.value_only`).
    `depth_in`: for a keyed stage, the sequence length of its input stream.
    `column_key`: for a keyed stage, set when Spark keys its input (`ColumnKey`, the rule `spark_keys`).
    `native`: for a keyed stage, set when Spark computes it as an aggregate (`Aggregate`, the
    rule `native_reduction`).
    `modes`: the names of the rules that applied to the stage (`flowspark.spark.rules.optimizer`); empty
    in the plain plan `compile_flow` builds.
    `dead_letter`: the run has a dead letter: items a stateless step, a key check or a
    `SparkSink`'s schema refuses leave the stage on `DEAD_PORT` instead of failing it.
    `per_batch`: for a `chunks` source, its items per source batch (activation; see
    `flowspark.spark.worker.codec`); 1: each item is an activation of its own; 0: each chunk
    row's items are one activation (the streaming reader cuts chunks at source batches).
    """

    stage_id: int
    source: str
    entry: str
    chain: tuple[KeyedStep, ...] = ()
    ops: tuple[Op, ...] = ()
    ports: tuple[Port, ...] = ()
    source_step: str = ""
    source_index: int = 0
    input_value_only: bool = False
    depth_in: int = 0
    column_key: Optional[ColumnKey] = None
    dead_letter: bool = False
    per_batch: int = 1
    modes: frozenset[str] = frozenset()
    #: For a keyed stage Spark aggregates (the rule `native_reduction`): what it computes.
    native: Optional[Aggregate] = None

    def one_to_one_mappers(self) -> Optional[tuple[Callable[[list[Any]], Any], ...]]:
        """The batch mappers from the stage's entry to its only port, or `None`.

        That is when the stage's steps are one line of one-to-one `map` steps (and
        redistributes) ending at its only port (what the rule `mapper_line` needs).
        """
        stream = self.entry
        fns = []
        for o in self.ops:
            one_to_one = o.kind == "pass" or (o.kind == "map" and o.one_to_one)
            if o.ups != (stream,) or len(o.downs) != 1 or not one_to_one:
                return None
            if o.kind == "map":
                assert o.fn is not None
                fns.append(o.fn)
            stream = o.downs[0]
        return tuple(fns) if len(self.ports) == 1 and stream == self.ports[0].stream else None


@dataclass(frozen=True)
class Decision:
    """What one rule decided for one stage, sink or the query.

    Attributes:
        rule: The rule's name.
        where: `stage N`, `sink STEP_ID` or `query`.
        applied: Whether it applied.
        reason: Why not; when applied, which case held (empty for most rules).
    """

    rule: str
    where: str
    applied: bool
    reason: str = ""

    def __str__(self) -> str:
        """`rule NAME: applied`, `rule NAME: applied (CASE)` or `rule NAME: not applied (REASON)`."""
        if self.applied:
            return f"rule {self.rule}: applied" + (f" ({self.reason})" if self.reason else "")
        return f"rule {self.rule}: not applied ({self.reason})"


@dataclass(frozen=True)
class StagePlan:
    """One stage of a plan.

    Attributes:
        spec: What the Python pass does (shipped to the workers).
        kind: `source`, `map` or `keyed`.
        inputs: For `map` and `keyed` stages, the ports read: `(stage id, port, pad)`;
            for a merge, `pad` is the upstream's index (inserted after the source
            header of each sequence) then zero padding (appended); else empty.
        steps: Ids of the core steps fused into the stage, in order.
        source: For source stages, the source object.
        bounded: For source stages, whether the source ends (`is_bounded()`).
    """

    spec: StageSpec
    kind: str
    inputs: tuple[tuple[int, int, bytes], ...]
    steps: tuple[str, ...]
    source: Any = None
    bounded: bool = True

    def union(self) -> str:
        """The ports a map or keyed stage reads, as text (`stage0.port0 + stage1.port0`).

        Returns:
            The text.
        """
        return " + ".join(f"stage{s}.port{p}" for s, p, _ in self.inputs)


@dataclass(frozen=True)
class SinkPlan:
    """An output step: where its items are written.

    `where` is `driver` (collected and written at the driver in sequence order:
    `TestingSink`, `StdOutSink`), `dynamic` (one sink partition per Spark
    partition), `fixed` (items routed by `part_fn` to the sink's partitions) or
    `native` (dict items become rows of a Spark DataFrame handed to a Spark writer or
    to the user's function: `flowspark.spark.io.outputs`). `modes`: the rules that applied
    to the sink (`sink_fusion`, `schema_sampling`: `flowspark.spark.rules.optimizer`).
    """

    step_id: str
    sink: Any
    where: str
    port: tuple[int, int]
    modes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class InspectPlan:
    """An inspect step: its items are collected and shown at the driver in sequence order."""

    step_id: str
    inspector: Any
    port: tuple[int, int]
    order: int


@dataclass(frozen=True)
class Plan:
    """A compiled dataflow, ready for `flowspark.spark.run`."""

    flow_id: str
    stages: tuple[StagePlan, ...]
    sinks: tuple[SinkPlan, ...]
    inspects: tuple[InspectPlan, ...]
    dead_letter: Any = None
    #: In a physical plan (`flowspark.spark.rules.optimizer.optimize`): every rule's decision, and the target.
    decisions: tuple[Decision, ...] = ()
    target: str = ""

    def readers(self, port: tuple[int, int]) -> list[Any]:
        """Who reads a port: the ids of the stages reading it, then the step ids of its sinks and inspects.

        Args:
            port: `(stage id, port)`.

        Returns:
            The readers (an `int` for a stage, a `str` step id for an output or inspect).
        """
        out: list[Any] = [st.spec.stage_id for st in self.stages if any((s, p) == port for s, p, _ in st.inputs)]
        out.extend(sk.step_id for sk in self.sinks if sk.port == port)
        out.extend(ins.step_id for ins in self.inspects if ins.port == port)
        return out

    def driver_readers(self) -> set[str]:
        """The step ids of the outputs and inspects that get their items at the driver, in sequence order.

        Returns:
            The step ids.
        """
        out = {sk.step_id for sk in self.sinks if sk.where == "driver"}
        out.update(ins.step_id for ins in self.inspects)
        return out

    def decision(self, rule: str, where: str) -> Decision:
        """The decision of `rule` for `where` (`stage N`, `sink STEP_ID`, `query`) in a physical plan.

        Args:
            rule: The rule's name.
            where: Where it was decided.

        Returns:
            The decision.

        Raises:
            KeyError: No such decision (a plain plan has none).
        """
        for d in self.decisions:
            if d.rule == rule and d.where == where:
                return d
        raise KeyError((rule, where))

    def with_dead_letter(self, sink: Any) -> Plan:
        """This plan with a dead letter (`flowspark.deadletter`): every stage sends refused items to `DEAD_PORT`.

        Args:
            sink: The dead-letter sink, or `None` (the plan is returned unchanged).

        Returns:
            The plan.
        """
        if sink is None:
            return self
        stages = tuple(
            dataclasses.replace(st, spec=dataclasses.replace(st.spec, dead_letter=True)) for st in self.stages
        )
        return dataclasses.replace(self, stages=stages, dead_letter=sink)

    def dead_ports(self) -> list[tuple[int, int]]:
        """The dead-letter port of every stage (empty without a dead letter).

        Returns:
            `(stage id, DEAD_PORT)` pairs.
        """
        if self.dead_letter is None:
            return []
        return [(st.spec.stage_id, DEAD_PORT) for st in self.stages]

    @property
    def bounded(self) -> bool:
        """Whether every source ends (the plan runs as a batch job, else as a streaming query)."""
        return all(st.bounded for st in self.stages if st.kind == "source")

    def aggregate_of(self, sid: int) -> Aggregate | str:
        """What keyed stage `sid` computes as a Spark aggregate (`Aggregate`), or why it is not one.

        Args:
            sid: A keyed stage's id.

        Returns:
            The aggregate, or the reason (words a user reads in `flowspark plan --spark`).
        """
        st = self.stages[sid]
        chain = st.spec.chain
        step = chain[-1]
        window = step.window_count
        reduction = "count" if window is not None else step.reduction
        if len(chain) != 1 or reduction is None:
            return f"step {step.step_id!r} is not a built-in reduction (see flowspark.reducers)"
        if window is not None:
            why = self._window_refusal(window)
            if why:
                return f"step {step.step_id!r} counts per window, but {why}"
        if len(st.inputs) != 1:
            return "it reads several ports"
        src_id, port, _pad = st.inputs[0]
        src = self.stages[src_id].spec
        if self.stages[src_id].kind != "source" or src.source != "native":
            return "its input does not come straight from a SparkSource"
        ops = _path(src, src.ports[port].stream)
        if isinstance(ops, str):
            return ops
        if not ops or ops[0].kind != "map" or ops[0].key_column is None:
            return "its input is not keyed first by a key_on proven to read a column (row[column])"
        later = ops[1:]
        odd = [o for o in later if o.kind != "map" or o.value_fn is None]
        if odd:
            return f"step {odd[0].step_id!r} after the key_on is not a map_value"
        if window is not None:
            if later:
                return f"step {later[0].step_id!r} is between the key_on and the window count: the clock reads rows"
            return Aggregate(ops[0].key_column, None, "count", src_id, step.step_id, step.level, window)
        value, why = _values_of(reduction, later)
        if why:
            return why
        return Aggregate(ops[0].key_column, value, reduction, src_id, step.step_id, step.level)

    def _window_refusal(self, window: WindowCount) -> str:
        """Why a window count is not one Spark can compute (`""`: it is)."""
        if window.ts_column is None:
            return "its EventClock's ts_getter is not proven to read a column (row[column])"
        if not window.default_now:
            return "its EventClock has a now_getter of its own"
        longest = max(window.wait, window.length)
        if longest > _LONGEST:
            return f"a duration ({longest}) is longer than Python's datetime range"
        if window.length // window.offset > _MOST_WINDOWS:
            return f"a value falls in more than {_MOST_WINDOWS} windows (length {window.length}, every {window.offset})"
        readers = [o.step_id for st in self.stages for o in st.spec.ops if window.late in o.ups]
        for st in self.stages:
            for p, port in enumerate(st.spec.ports):
                if port.stream == window.late:
                    readers.extend(str(r) for r in self.readers((st.spec.stage_id, p)))
        if readers:
            return f"its late values are read (by {readers[0]}); Spark counts only the values on time"
        return ""

    def keyed_steps(self) -> list[KeyedStep]:
        """Every stateful step of the plan, stage by stage.

        Returns:
            The steps.
        """
        return [ks for st in self.stages for ks in st.spec.chain]

    def __str__(self) -> str:
        """Render the plan's structure (`render` adds what a lowering makes of each stage)."""
        return self.render()

    def render(self, describe: Optional[Callable[[StagePlan], str]] = None) -> str:
        """Render the plan for people.

        Args:
            describe: What a stage lowers to, in one line (each lowering describes itself:
                `flowspark.spark.batch.describe.describe_stage`, `flowspark.spark.streaming.Lowering.stage`);
                default: the ports the stage reads.

        Returns:
            The text.
        """
        lines = [f"plan for dataflow {self.flow_id!r}: {len(self.stages)} stage(s)"]
        for st in self.stages:
            spec = st.spec
            what = describe(st) if describe is not None else (f"reads {st.union()}" if st.inputs else "a source")
            lines.append(f"stage {spec.stage_id} [{st.kind}]: {what}")
            for sid in st.steps:
                lines.append(f"    {sid}")
            for p, port in enumerate(spec.ports):
                extra = f" (keyed for {port.key_for})" if port.key_for else ""
                lines.append(f"    port{p} <- {port.stream}{extra}")
            lines.extend(self._decision_lines(f"stage {spec.stage_id}"))
        for sk in self.sinks:
            src = f"stage{sk.port[0]}.port{sk.port[1]}"
            lines.append(f"sink {sk.step_id}: {type(sk.sink).__name__} ({sk.where}) <- {src}")
            lines.extend(self._decision_lines(f"sink {sk.step_id}"))
        for ins in self.inspects:
            lines.append(f"inspect {ins.step_id}: shown at the driver <- stage{ins.port[0]}.port{ins.port[1]}")
        if self.dead_letter is not None:
            lines.append(f"dead letter: {self.dead_letter!r} <- port{DEAD_PORT} of every stage (items a step refused)")
        query = self._decision_lines("query")
        if query:
            lines.append(f"query ({self.target}):")
            lines.extend(query)
        return "\n".join(lines)

    def _decision_lines(self, where: str) -> list[str]:
        return [f"    {d}" for d in self.decisions if d.where == where]


def _path(src: StageSpec, stream: str) -> list[Op] | str:
    """The steps of source stage `src` from its entry to `stream` (redistributes left out), or why there is no line."""
    made = {d: o for o in src.ops for d in o.downs}
    path: list[Op] = []
    while stream != src.entry:
        o = made[stream]
        if len(o.ups) != 1:
            return f"step {o.step_id!r} merges"
        if o.kind != "pass":
            path.insert(0, o)
        stream = o.ups[0]
    return path


def _values_of(reduction: str, later: list[Op]) -> tuple[Optional[str], str]:
    """`(the column a reduction reads after the key (None for a count), "")`, or `(None, why it reads none)`."""
    if reduction == "count":
        odd = [o for i, o in enumerate(later) if not (o.value_constant or (i == 0 and o.value_column))]
        if odd:
            return None, f"step {odd[0].step_id!r} may fail (a count calls it): not a map_value proven to read a column"
        return None, ""
    if len(later) != 1 or later[0].value_column is None:
        return None, "its values are not one column: no single map_value proven to read one (row[column])"
    return later[0].value_column, ""
