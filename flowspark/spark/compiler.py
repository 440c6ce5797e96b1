"""Compile a dataflow's core-step graph into a Spark plan (pure: no SparkSession needed).

The plan's shape is described in `flowspark.spark.plan`. Every run of stateless
steps (`flat_map_batch`, `branch`, `inspect_debug`, `redistribute`, and `merge`
of streams of the same stage) fuses into the stage that produces its input, so
each stage is one Python pass. A stream
leaving its stage (to another stage, a sink or the driver) is a *port*.

`compile_flow(graph)` returns a `Plan` (the same for the batch and the streaming
lowering); `print(plan)` shows the stages, the core steps fused into each and
what each lowers to in a batch job. Sequence lengths follow one rule (see
`flowspark.spark.codec`): a source stamps `SOURCE_LEN` (20) bytes; a `flat_map_batch` adds 4
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
from flowspark.runtime.driver import SOURCE_LEN, idx
from flowspark.spark.inputs import SparkSource
from flowspark.spark.outputs import ForeachBatchSink, SparkSink
from flowspark.spark.plan import InspectPlan, KeyedStep, Op, Plan, Port, SinkPlan, StagePlan, StageSpec

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
        "DynamicSource or flowspark.spark.inputs.SparkSource"
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
        "DynamicSink, flowspark.spark.outputs.SparkSink or ForeachBatchSink"
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
    consumers = graph.consumers()
    producers = graph.producers()
    stages: list[_Builder] = []
    loc: dict[str, _Builder] = {}
    depth: dict[str, int] = {}
    level: dict[str, int] = {}  # stateful steps on the longest path from a source
    sinks: list[tuple[str, Any, str, str]] = []
    inspects: list[tuple[str, Any, str]] = []
    n_inputs = 0

    def port(stream: str, key_for: Optional[str] = None) -> None:
        b = loc[stream]
        if stream not in b.ports:
            b.ports.append(stream)
        if key_for is not None and stream not in b.key_for:
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
                b.bounded = _bounded(node)
                n_inputs += 1
                b.steps.append(node.step_id)
                loc[node.down] = b
                depth[node.down] = SOURCE_LEN
            case ir.FlatMapBatch():
                _check_pickle(node.step_id, "mapper", node.mapper)
                b = loc[node.up]
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
                    )
                )
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
                    b.depth_in = depth[up]
                b.chain.append(
                    KeyedStep(
                        node.step_id,
                        node.builder,
                        level[node.down],
                        node.notifies,
                        eof_only=node.eof_only,
                        batch_fn=node.batch_fn,
                    )
                )
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

    def chain_of(b: _Builder) -> tuple[KeyedStep, ...]:
        # Inside a chain the next step has the same key, so only the last step's emits may need
        # the key in their sequences (see `KeyedStep.regroup`; the rule `unordered_emits`).
        last = len(b.chain) - 1
        return tuple(replace(ks, regroup=i == last) for i, ks in enumerate(b.chain))

    plans: list[StagePlan] = []
    for b in stages:
        spec = StageSpec(
            stage_id=b.stage_id,
            source=b.source,
            entry=b.entry,
            chain=chain_of(b),
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
        flow_id=graph.flow_id,
        stages=tuple(plans),
        sinks=tuple(SinkPlan(sid, sink, where, ref(up)) for sid, sink, where, up in sinks),
        inspects=tuple(InspectPlan(sid, fn, ref(side), i) for i, (sid, fn, side) in enumerate(inspects)),
    )


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
