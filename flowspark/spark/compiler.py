"""Compile a dataflow's core steps into a Spark plan (pure: no SparkSession needed).

A plan is a list of *stages*; each stage is one Python pass over Spark rows
`(p int, k string, seq binary, v binary)` (port, key, sequence, pickled item):

- a **source stage** turns source tasks into items: chunks of `TestingSource`
  items sent from the driver, source partitions (one Spark partition each), or
  the rows of a Spark DataFrame (`flowspark.spark.inputs.SparkSource`);
- a **map stage** reads the union of some ports of earlier stages (a `merge` of
  streams living in different stages);
- a **keyed stage** repartitions its input by key, sorts within partitions by
  (key, sequence) and drives a chain of consecutive stateful steps key by key.

Every run of stateless steps (`flat_map_batch`, `branch`, `inspect_debug`,
`redistribute`, and `merge` of streams of the same stage) fuses into the stage
that produces its input, so each stage lowers to one `mapInArrow`. A stream
leaving its stage (to another stage, a sink or the driver) is a *port*.

`compile_flow(flow)` returns a `Plan`; `print(plan)` shows the stages, the core
steps fused into each and what each lowers to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import cloudpickle

from flowspark import ir
from flowspark.errors import FlowsparkCompileError, FlowsparkTypeError
from flowspark.inputs import DynamicSource, FixedPartitionedSource
from flowspark.outputs import DynamicSink, FixedPartitionedSink, StdOutSink
from flowspark.spark.inputs import SparkSource
from flowspark.spark.outputs import SparkSink
from flowspark.spark.runtime import KeyedStep, Op, Port, StageSpec, idx, is_one_to_one
from flowspark.testing import TestingSink, TestingSource

__all__ = ["InspectPlan", "Plan", "SinkPlan", "StagePlan", "compile_flow"]

_SOURCE_SEQ_LEN = 16
_COMPONENT_LEN = 4


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
    """

    spec: StageSpec
    kind: str
    inputs: tuple[tuple[int, int, bytes], ...]
    steps: tuple[str, ...]
    source: Any = None

    def lowering(self) -> str:
        """Describe the Spark operations this stage lowers to.

        Returns:
            A one-line description.
        """
        src = self.spec.source
        if self.kind == "source":
            head = {
                "chunks": "createDataFrame(chunks of items pickled at the driver)",
                "parts": "parallelize(one row per source partition)",
                "native": "the SparkSource DataFrame",
            }[src]
            return f"{head} -> mapInArrow"
        union = " + ".join(f"stage{s}.port{p}" for s, p, _ in self.inputs)
        if self.kind == "keyed":
            return f"({union}) -> repartition(k) -> sortWithinPartitions(k, seq) -> mapInArrow"
        return f"({union}) -> mapInArrow"


@dataclass(frozen=True)
class SinkPlan:
    """An output step: where its items are written.

    `where` is `driver` (collected and written at the driver in sequence order:
    `TestingSink`, `StdOutSink`), `dynamic` (one sink partition per Spark
    partition), `fixed` (items routed by `part_fn` to the sink's partitions) or
    `native` (a Spark writer, `flowspark.spark.outputs`).
    """

    step_id: str
    sink: Any
    where: str
    port: tuple[int, int]


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

    def __str__(self) -> str:
        """Render the plan for people."""
        lines = [f"plan for dataflow {self.flow_id!r}: {len(self.stages)} stage(s)"]
        for st in self.stages:
            spec = st.spec
            lines.append(f"stage {spec.stage_id} [{st.kind}]: {st.lowering()}")
            for sid in st.steps:
                lines.append(f"    {sid}")
            for p, port in enumerate(spec.ports):
                extra = f" (keyed for {port.key_for})" if port.key_for else ""
                lines.append(f"    port{p} <- {port.stream}{extra}")
        for sk in self.sinks:
            src = f"stage{sk.port[0]}.port{sk.port[1]}"
            lines.append(f"sink {sk.step_id}: {type(sk.sink).__name__} ({sk.where}) <- {src}")
        for ins in self.inspects:
            lines.append(f"inspect {ins.step_id}: shown at the driver <- stage{ins.port[0]}.port{ins.port[1]}")
        return "\n".join(lines)


@dataclass
class _Builder:
    stage_id: int
    kind: str
    source: str
    entry: str
    inputs: list[tuple[str, bytes]] = field(default_factory=list)
    chain: list[KeyedStep] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    key_for: dict[str, str] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    source_obj: Any = None
    source_step: str = ""
    source_index: int = 0


def _check_pickle(step_id: str, what: str, obj: Any) -> None:
    try:
        cloudpickle.dumps(obj)
    except Exception as e:
        msg = (
            f"step {step_id!r}: its {what} cannot be pickled, so it cannot be shipped to Spark "
            f"({type(e).__name__}: {e}); use a module-level function or one that does not capture "
            "locks, files, sockets or other unpicklable objects"
        )
        raise FlowsparkCompileError(msg) from e


def _source_kind(node: ir.Input) -> str:
    src = node.source
    if isinstance(src, SparkSource):
        return "native"
    bounded = src.is_bounded() if hasattr(src, "is_bounded") else False
    if not bounded:
        msg = (
            f"step {node.step_id!r}: source {type(src).__name__} is not bounded; the Spark batch "
            "runtime needs every source to end (is_bounded() -> True)"
        )
        raise FlowsparkCompileError(msg)
    if isinstance(src, TestingSource):
        return "chunks"
    if isinstance(src, (FixedPartitionedSource, DynamicSource)):
        _check_pickle(node.step_id, f"source {type(src).__name__}", src)
        return "parts"
    msg = (
        f"step {node.step_id!r}: source {type(src).__name__} must subclass FixedPartitionedSource, "
        "DynamicSource or flowspark.spark.inputs.SparkSource"
    )
    raise FlowsparkCompileError(msg)


def _sink_where(node: ir.Output) -> str:
    sink = node.sink
    if isinstance(sink, (TestingSink, StdOutSink)):
        return "driver"
    if isinstance(sink, SparkSink):
        return "native"
    if isinstance(sink, FixedPartitionedSink):
        _check_pickle(node.step_id, f"sink {type(sink).__name__}", sink)
        return "fixed"
    if isinstance(sink, DynamicSink):
        _check_pickle(node.step_id, f"sink {type(sink).__name__}", sink)
        return "dynamic"
    msg = (
        f"step {node.step_id!r}: sink {type(sink).__name__} must subclass FixedPartitionedSink, "
        "DynamicSink or flowspark.spark.outputs.SparkSink"
    )
    raise FlowsparkCompileError(msg)


def compile_flow(flow: Any) -> Plan:
    """Compile a dataflow into a Spark plan.

    Args:
        flow: A `flowspark.dataflow.Dataflow`.

    Returns:
        The plan.

    Raises:
        FlowsparkTypeError: `flow` is not a Dataflow.
        FlowsparkBuildError: The flow is malformed (no input, no output...).
        FlowsparkCompileError: A step cannot run on Spark (unpicklable callable,
            unbounded or unknown source, unknown sink or core step).

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1, 2])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> print(compile_flow(flow))  # doctest: +ELLIPSIS
        plan for dataflow 'eg': 1 stage(s)
        stage 0 [source]: createDataFrame(chunks of items pickled at the driver) -> mapInArrow
            eg.inp
            eg.double.flat_map_batch
            port0 <- eg.double.flat_map_batch.down
        sink eg.out: TestingSink (driver) <- stage0.port0
    """
    from flowspark.dataflow import Dataflow

    if not isinstance(flow, Dataflow):
        msg = f"flowspark.spark needs a Dataflow; received {flow!r} of type {type(flow).__name__}"
        raise FlowsparkTypeError(msg)
    graph = flow.validate()
    consumers = graph.consumers()
    producers = graph.producers()
    stages: list[_Builder] = []
    loc: dict[str, _Builder] = {}
    depth: dict[str, int] = {}
    level: dict[str, int] = {}  # stateful steps on the longest path from a source
    sinks: list[tuple[str, Any, str, str]] = []
    inspects: list[tuple[str, Any, str]] = []
    plain: set[str] = set()  # ports read by something other than a keyed stage
    n_inputs = 0

    def port(stream: str, key_for: Optional[str] = None) -> None:
        b = loc[stream]
        if stream not in b.ports:
            b.ports.append(stream)
        if key_for is None:
            plain.add(stream)
        elif stream not in b.key_for:
            b.key_for[stream] = key_for

    def new_stage(kind: str, source: str, entry: str) -> _Builder:
        b = _Builder(len(stages), kind, source, entry)
        stages.append(b)
        return b

    for node in ir.walk(graph):
        up_level = max((level[u] for u in node.ups), default=0)
        for d in node.downs:
            level[d] = up_level + (1 if isinstance(node, ir.StatefulBatch) else 0)
        if isinstance(node, ir.InspectDebug):
            level[f"{node.step_id}.__inspected__"] = up_level
        match node:
            case ir.Input():
                kind = _source_kind(node)
                b = new_stage("source", kind, node.down)
                b.source_obj = node.source
                b.source_step = node.step_id
                b.source_index = n_inputs
                n_inputs += 1
                b.steps.append(node.step_id)
                loc[node.down] = b
                depth[node.down] = _SOURCE_SEQ_LEN
            case ir.FlatMapBatch():
                _check_pickle(node.step_id, "mapper", node.mapper)
                b = loc[node.up]
                one = is_one_to_one(node.mapper)
                b.ops.append(Op("map", node.step_id, (node.up,), (node.down,), node.mapper, one_to_one=one))
                b.steps.append(node.step_id)
                loc[node.down] = b
                depth[node.down] = depth[node.up] + (0 if one else _COMPONENT_LEN)
            case ir.Branch():
                _check_pickle(node.step_id, "predicate", node.predicate)
                b = loc[node.up]
                b.ops.append(Op("branch", node.step_id, (node.up,), (node.trues, node.falses), node.predicate))
                b.steps.append(node.step_id)
                for d in node.downs:
                    loc[d] = b
                    depth[d] = depth[node.up]
            case ir.InspectDebug():
                b = loc[node.up]
                side = f"{node.step_id}.__inspected__"
                b.ops.append(Op("inspect", node.step_id, (node.up,), (node.down, side)))
                b.steps.append(node.step_id)
                for d in (node.down, side):
                    loc[d] = b
                    depth[d] = depth[node.up]
                port(side)
                inspects.append((node.step_id, node.inspector, side))
            case ir.Redistribute():
                b = loc[node.up]
                b.ops.append(Op("pass", node.step_id, (node.up,), (node.down,)))
                b.steps.append(node.step_id)
                loc[node.down] = b
                depth[node.down] = depth[node.up]
            case ir.Merge():
                ups = node.ups
                maxd = max(depth[u] for u in ups)
                pads = tuple(idx(i) + b"\0" * (maxd - depth[u]) for i, u in enumerate(ups))
                homes = {loc[u].stage_id for u in ups}
                if len(homes) == 1:
                    b = loc[ups[0]]
                    b.ops.append(Op("merge", node.step_id, tuple(ups), (node.down,), None, pads))
                else:
                    b = new_stage("map", "rows", node.down)
                    for u, pad in zip(ups, pads, strict=True):
                        port(u)
                        b.inputs.append((u, pad))
                b.steps.append(node.step_id)
                loc[node.down] = b
                depth[node.down] = maxd + _COMPONENT_LEN
            case ir.StatefulBatch():
                _check_pickle(node.step_id, "builder", node.builder)
                up = node.up
                prod = producers.get(up)
                home = loc[up]
                if (
                    isinstance(prod, ir.StatefulBatch)
                    and home.kind == "keyed"
                    and home.entry == up
                    and home.chain
                    and home.chain[-1].step_id == prod.step_id
                    and not home.ops
                    and len(consumers.get(up, [])) == 1
                ):
                    b = home
                else:
                    port(up, key_for=node.step_id)
                    b = new_stage("keyed", "rows", node.down)
                    b.inputs.append((up, b""))
                b.chain.append(KeyedStep(node.step_id, node.builder, level[node.down]))
                b.entry = node.down
                b.steps.append(node.step_id)
                loc[node.down] = b
                depth[node.down] = depth[up] + _COMPONENT_LEN
            case ir.Output():
                where = _sink_where(node)
                port(node.up)
                sinks.append((node.step_id, node.sink, where, node.up))
            case _:
                sid = getattr(node, "step_id", node)
                msg = f"step {sid!r}: the Spark runtime has no core step {type(node).__name__}"
                raise FlowsparkCompileError(msg)

    def ref(stream: str) -> tuple[int, int]:
        b = loc[stream]
        return (b.stage_id, b.ports.index(stream))

    def value_only(stream: str) -> bool:
        return stream in loc[stream].key_for and stream not in plain

    plans: list[StagePlan] = []
    for b in stages:
        spec = StageSpec(
            stage_id=b.stage_id,
            source=b.source,
            entry=b.entry,
            chain=tuple(b.chain),
            ops=tuple(b.ops),
            ports=tuple(Port(s, b.key_for.get(s), value_only(s)) for s in b.ports),
            source_step=b.source_step,
            source_index=b.source_index,
            input_value_only=b.kind == "keyed" and value_only(b.inputs[0][0]),
        )
        inputs = tuple((*ref(u), pad) for u, pad in b.inputs)
        plans.append(StagePlan(spec, b.kind, inputs, tuple(b.steps), b.source_obj))
    return Plan(
        flow_id=graph.flow_id,
        stages=tuple(plans),
        sinks=tuple(SinkPlan(sid, sink, where, ref(up)) for sid, sink, where, up in sinks),
        inspects=tuple(InspectPlan(sid, fn, ref(side), i) for i, (sid, fn, side) in enumerate(inspects)),
    )
