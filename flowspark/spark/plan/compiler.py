"""Compile a dataflow's core-step graph into a Spark plan (pure: no SparkSession needed).

The plan's shape is described in `flowspark.spark.plan.types`. Every run of stateless
steps (`flat_map_batch`, `branch`, `inspect_debug`, `redistribute`, and `merge`
of streams of the same stage) fuses into the stage that produces its input, so
each stage is one Python pass. A stream
leaving its stage (to another stage, a sink or the driver) is a *port*.

`compile_flow(graph)` returns a `Plan` (the same for the batch and the streaming
lowering); `print(plan)` shows the stages, the core steps fused into each and
what each lowers to in a batch job. Sequence lengths follow one rule (see
`flowspark.spark.worker.codec`): a source stamps `SOURCE_LEN` (20) bytes; a `flat_map_batch` adds 4
unless the IR marks it `one_to_one`; a stateful step adds 4 (plus its key, whose
prefix-free encoding decides every comparison inside it); a merge pads to its
longest upstream and adds 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

import cloudpickle

from flowspark import ir
from flowspark.errors import FlowsparkCompileError, FlowsparkTypeError
from flowspark.inputs import DriverItems, DynamicSource, FixedPartitionedSource
from flowspark.outputs import DriverSink, DynamicSink, FixedPartitionedSink
from flowspark.runtime.tags import SOURCE_LEN, idx
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.outputs import ForeachBatchSink, SparkSink
from flowspark.spark.plan.types import InspectPlan, KeyedStep, Op, Plan, Port, SinkPlan, StagePlan, StageSpec

__all__ = ["as_graph", "compile_flow"]

_COMPONENT_LEN = 4


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
    bounded: bool = True
    depth_in: int = 0


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
    """How a batch job reads the source: `native` (a Spark DataFrame), `chunks` (items at the driver) or `parts`."""
    src = node.source
    if isinstance(src, SparkSource):
        return "native"
    if isinstance(src, DriverItems) and _bounded(node):
        return "chunks"
    if isinstance(src, (FixedPartitionedSource, DynamicSource)):
        _check_pickle(node.step_id, f"source {type(src).__name__}", src)
        return "parts"
    msg = (
        f"step {node.step_id!r}: source {type(src).__name__} must subclass FixedPartitionedSource, "
        "DynamicSource or flowspark.spark.io.inputs.SparkSource"
    )
    raise FlowsparkCompileError(msg)


def _bounded(node: ir.Input) -> bool:
    src = node.source
    return bool(src.is_bounded()) if hasattr(src, "is_bounded") else False


def _sink_where(node: ir.Output) -> str:
    sink = node.sink
    if isinstance(sink, DriverSink):
        return "driver"
    if isinstance(sink, (SparkSink, ForeachBatchSink)):
        return "native"
    if isinstance(sink, FixedPartitionedSink):
        _check_pickle(node.step_id, f"sink {type(sink).__name__}", sink)
        return "fixed"
    if isinstance(sink, DynamicSink):
        _check_pickle(node.step_id, f"sink {type(sink).__name__}", sink)
        return "dynamic"
    msg = (
        f"step {node.step_id!r}: sink {type(sink).__name__} must subclass FixedPartitionedSink, "
        "DynamicSink, flowspark.spark.io.outputs.SparkSink or ForeachBatchSink"
    )
    raise FlowsparkCompileError(msg)


def compile_flow(graph: Any) -> Plan:
    """Compile a dataflow's graph into a Spark plan.

    Args:
        graph: An `ir.Graph` (what `Dataflow.validate()` returns); a `Dataflow` is
            validated first.

    Returns:
        The plan.

    Raises:
        FlowsparkTypeError: `graph` is neither a graph nor a Dataflow.
        FlowsparkBuildError: The flow is malformed (no input, no output...).
        FlowsparkCompileError: A step cannot run on Spark (unpicklable callable,
            unknown source, sink or core step).

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1, 2])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> print(compile_flow(flow.validate()))  # doctest: +ELLIPSIS
        plan for dataflow 'eg': 1 stage(s)
        stage 0 [source]: a source
            eg.inp
            eg.double.flat_map_batch
            port0 <- eg.double.flat_map_batch.down
        sink eg.out: TestingSink (driver) <- stage0.port0
    """
    graph = as_graph(graph)
    c = _Compiler(graph)
    for node in ir.walk(graph):
        c.step(node)
    return c.plan()


class _Compiler:
    """`compile_flow`'s state while it walks the graph: the stages built so far and where each stream is."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self.consumers = graph.consumers()
        self.producers = graph.producers()
        self.stages: list[_Builder] = []
        self.loc: dict[str, _Builder] = {}
        self.depth: dict[str, int] = {}
        self.level: dict[str, int] = {}  # stateful steps on the longest path from a source
        self.sinks: list[tuple[str, Any, str, str]] = []
        self.inspects: list[tuple[str, Any, str]] = []
        self.n_inputs = 0

    def port(self, stream: str, key_for: Optional[str] = None) -> None:
        b = self.loc[stream]
        if stream not in b.ports:
            b.ports.append(stream)
        if key_for is not None and stream not in b.key_for:
            b.key_for[stream] = key_for

    def new_stage(self, kind: str, source: str, entry: str) -> _Builder:
        b = _Builder(len(self.stages), kind, source, entry)
        self.stages.append(b)
        return b

    def step(self, node: Any) -> None:
        """Add one core step (in graph order): the one dispatch on the core step's type."""
        level = self.level
        up_level = max((level[u] for u in node.ups), default=0)
        for d in node.downs:
            level[d] = up_level + (1 if isinstance(node, ir.StatefulBatch) else 0)
        if isinstance(node, ir.InspectDebug):
            level[f"{node.step_id}.__inspected__"] = up_level
        match node:
            case ir.Input():
                self.input(node)
            case ir.FlatMapBatch():
                self.flat_map_batch(node)
            case ir.Branch():
                self.branch(node)
            case ir.InspectDebug():
                self.inspect_debug(node)
            case ir.Redistribute():
                self.redistribute(node)
            case ir.Merge():
                self.merge(node)
            case ir.StatefulBatch():
                self.stateful_batch(node)
            case ir.Output():
                self.output(node)
            case _:
                sid = getattr(node, "step_id", node)
                msg = f"step {sid!r}: the Spark runtime has no core step {type(node).__name__}"
                raise FlowsparkCompileError(msg)

    def input(self, node: ir.Input) -> None:
        kind = _source_kind(node)
        b = self.new_stage("source", kind, node.down)
        b.source_obj = node.source
        b.source_step = node.step_id
        b.source_index = self.n_inputs
        b.bounded = _bounded(node)
        self.n_inputs += 1
        b.steps.append(node.step_id)
        self.loc[node.down] = b
        self.depth[node.down] = SOURCE_LEN

    def flat_map_batch(self, node: ir.FlatMapBatch) -> None:
        _check_pickle(node.step_id, "mapper", node.mapper)
        b = self.loc[node.up]
        one = node.one_to_one
        b.ops.append(
            Op(
                "map",
                node.step_id,
                (node.up,),
                (node.down,),
                node.mapper,
                one_to_one=one,
                keeps=node.keeps,
                key_column=node.key_column,
                value_fn=node.value_mapper,
                value_column=node.value_column,
                value_constant=node.value_constant,
                pair_row=node.pair_row,
            )
        )
        b.steps.append(node.step_id)
        self.loc[node.down] = b
        self.depth[node.down] = self.depth[node.up] + (0 if one else _COMPONENT_LEN)

    def branch(self, node: ir.Branch) -> None:
        _check_pickle(node.step_id, "predicate", node.predicate)
        b = self.loc[node.up]
        b.ops.append(Op("branch", node.step_id, (node.up,), (node.trues, node.falses), node.predicate))
        b.steps.append(node.step_id)
        for d in node.downs:
            self.loc[d] = b
            self.depth[d] = self.depth[node.up]

    def inspect_debug(self, node: ir.InspectDebug) -> None:
        b = self.loc[node.up]
        side = f"{node.step_id}.__inspected__"
        b.ops.append(Op("inspect", node.step_id, (node.up,), (node.down, side)))
        b.steps.append(node.step_id)
        for d in (node.down, side):
            self.loc[d] = b
            self.depth[d] = self.depth[node.up]
        self.port(side)
        self.inspects.append((node.step_id, node.inspector, side))

    def redistribute(self, node: ir.Redistribute) -> None:
        b = self.loc[node.up]
        b.ops.append(Op("pass", node.step_id, (node.up,), (node.down,)))
        b.steps.append(node.step_id)
        self.loc[node.down] = b
        self.depth[node.down] = self.depth[node.up]

    def merge(self, node: ir.Merge) -> None:
        loc, depth = self.loc, self.depth
        ups = node.ups
        maxd = max(depth[u] for u in ups)
        pads = tuple(idx(i) + b"\0" * (maxd - depth[u]) for i, u in enumerate(ups))
        homes = {loc[u].stage_id for u in ups}
        if len(homes) == 1:
            b = loc[ups[0]]
            b.ops.append(Op("merge", node.step_id, tuple(ups), (node.down,), None, pads))
        else:
            b = self.new_stage("map", "rows", node.down)
            for u, pad in zip(ups, pads, strict=True):
                self.port(u)
                b.inputs.append((u, pad))
        b.steps.append(node.step_id)
        loc[node.down] = b
        depth[node.down] = maxd + _COMPONENT_LEN

    def stateful_batch(self, node: ir.StatefulBatch) -> None:
        _check_pickle(node.step_id, "builder", node.builder)
        up = node.up
        prod = self.producers.get(up)
        home = self.loc[up]
        if (
            isinstance(prod, ir.StatefulBatch)
            and home.kind == "keyed"
            and home.entry == up
            and home.chain
            and home.chain[-1].step_id == prod.step_id
            and not home.ops
            and len(self.consumers.get(up, [])) == 1
        ):
            b = home
        else:
            self.port(up, key_for=node.step_id)
            b = self.new_stage("keyed", "rows", node.down)
            b.inputs.append((up, b""))
            b.depth_in = self.depth[up]
        b.chain.append(
            KeyedStep(
                node.step_id,
                node.builder,
                self.level[node.down],
                node.notifies,
                eof_only=node.eof_only,
                batch_fn=node.batch_fn,
                reduction=node.reduction,
                window_count=node.window_count,
            )
        )
        b.entry = node.down
        b.steps.append(node.step_id)
        self.loc[node.down] = b
        self.depth[node.down] = self.depth[up] + _COMPONENT_LEN

    def output(self, node: ir.Output) -> None:
        where = _sink_where(node)
        self.port(node.up)
        self.sinks.append((node.step_id, node.sink, where, node.up))

    def ref(self, stream: str) -> tuple[int, int]:
        b = self.loc[stream]
        return (b.stage_id, b.ports.index(stream))

    def plan(self) -> Plan:
        """The plan of every step added."""
        ref = self.ref
        plans: list[StagePlan] = []
        for b in self.stages:
            spec = StageSpec(
                stage_id=b.stage_id,
                source=b.source,
                entry=b.entry,
                chain=_chain_of(b),
                ops=tuple(b.ops),
                ports=tuple(Port(s, b.key_for.get(s)) for s in b.ports),
                source_step=b.source_step,
                source_index=b.source_index,
                depth_in=b.depth_in,
                per_batch=b.source_obj.driver_batch_size() if b.source == "chunks" else 1,
            )
            inputs = tuple((*ref(u), pad) for u, pad in b.inputs)
            plans.append(StagePlan(spec, b.kind, inputs, tuple(b.steps), b.source_obj, b.bounded))
        return Plan(
            flow_id=self.graph.flow_id,
            stages=tuple(plans),
            sinks=tuple(SinkPlan(sid, sink, where, ref(up)) for sid, sink, where, up in self.sinks),
            inspects=tuple(InspectPlan(sid, fn, ref(side), i) for i, (sid, fn, side) in enumerate(self.inspects)),
        )


def _chain_of(b: _Builder) -> tuple[KeyedStep, ...]:
    # Inside a chain the next step has the same key, so only the last step's emits may need
    # the key in their sequences (see `KeyedStep.regroup`; the rule `unordered_emits`).
    last = len(b.chain) - 1
    return tuple(replace(ks, regroup=i == last) for i, ks in enumerate(b.chain))


def as_graph(flow: Any) -> ir.Graph:
    """The validated graph of a `Dataflow`, or `flow` itself when it is a graph.

    Args:
        flow: A `Dataflow` or an `ir.Graph`.

    Returns:
        The graph.

    Raises:
        FlowsparkTypeError: `flow` is neither.
    """
    if isinstance(flow, ir.Graph):
        return flow
    from flowspark.dataflow import Dataflow

    if not isinstance(flow, Dataflow):
        msg = f"flowspark.spark needs a Dataflow; received {flow!r} of type {type(flow).__name__}"
        raise FlowsparkTypeError(msg)
    return flow.validate()
