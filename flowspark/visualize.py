"""`python -m flowspark.visualize IMPORT_STR [-o mermaid|json|plantuml] [-r]`: print a dataflow's structure.

`to_json`, `to_mermaid` and `to_rendered` give Bytewax 0.21's formats, and the
command line prints them as `python -m bytewax.visualize` does: `json` is the
`RenderedDataflow` (every nested operator, with ports resolved to the ports
that feed them), `mermaid` a flowchart of the top-level operators whose edges
are labelled `"<from port> → <to port>"` (`-r` does not apply to either, as in
Bytewax). `plantuml` prints a PlantUML component diagram (`plantuml -tsvg`),
nested with `-r`.

flowspark's own views, used by `flowspark plan --format json|mermaid [-r]`:
`to_steps_json` (steps with their operator and core step type, and the streams
between them) and `to_flowchart` (a Mermaid flowchart that can nest core steps).
The steps-and-streams JSON document:

```
{"flow_id": str, "recursive": bool,
 "steps": [{"step_id", "name", "op", "core", "ups", "downs"[, "substeps": [...]]}],
 "streams": [{"stream_id", "from", "to": [step_id, ...]}]}
```

`op` is the operator function's name (`map`, `stateful_map` ...), `core` the
core step type (`FlatMapBatch` ...) when the step is one, else `null`.
`substeps` (only with `recursive`) nests the same objects. `streams` connect the
listed top-level steps (default) or the core steps (`recursive`).

Composite operators may be built from other sub-steps than in Bytewax, so the
nested levels of `to_json` can differ from Bytewax's; the top level is the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from flowspark import ir
from flowspark.dataflow import Dataflow

__all__ = [
    "RenderedDataflow",
    "RenderedOperator",
    "RenderedPort",
    "main",
    "to_flowchart",
    "to_json",
    "to_mermaid",
    "to_plantuml",
    "to_rendered",
    "to_steps_json",
]

_PROG = "python -m flowspark.visualize"


@dataclass
class _Step:
    step_id: str
    op: str
    core: Optional[str]
    ups: tuple[str, ...]
    downs: tuple[str, ...]
    substeps: list[_Step] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.step_id.rsplit(".", 1)[-1]


@dataclass
class _Edge:
    stream_id: str
    src: str
    dsts: list[str]

    @property
    def port(self) -> str:
        return self.stream_id.rsplit(".", 1)[-1]


class RenderModel:
    """The operator tree and the streams of one dataflow, at one level of detail."""

    def __init__(self, flow: Dataflow, recursive: bool) -> None:
        graph = flow.graph()
        self.flow_id = graph.flow_id
        self.recursive = recursive
        cores = {n.step_id: n for n in graph.nodes}
        comps = {c.step_id: c for c in graph.composites}

        def build(step_id: str) -> _Step:
            comp = comps.get(step_id)
            node = cores.get(step_id)
            if comp is None:
                assert node is not None
                return _Step(step_id, type(node).__name__, type(node).__name__, node.ups, node.downs)
            core = type(node).__name__ if node is not None else None
            step = _Step(step_id, comp.name, core, comp.ups, comp.downs)
            if recursive:
                step.substeps = [build(s) for s in comp.substeps]
            return step

        top_ids = [c.step_id for c in graph.composites if c.step_id.count(".") == 1]
        # Core steps not recorded in any composite (none today) are still shown.
        covered = {c.step_id for c in graph.composites}
        top_ids += [n.step_id for n in graph.nodes if n.step_id not in covered and n.step_id.count(".") == 1]
        self.steps = [build(s) for s in top_ids]
        self.edges = self._edges(graph, {s.step_id: s for s in self.steps})

    def _top(self, step_id: str) -> str:
        return ".".join(step_id.split(".")[:2])

    def _edges(self, graph: ir.Graph, tops: dict[str, _Step]) -> list[_Edge]:
        consumers = graph.consumers()
        out: list[_Edge] = []
        for node in graph.nodes:
            for stream in node.downs:
                users = [c.step_id for c in consumers.get(stream, [])]
                if self.recursive:
                    out.append(_Edge(stream, node.step_id, users))
                    continue
                src = self._top(node.step_id)
                dsts = list(dict.fromkeys(u for u in map(self._top, users) if u != src))
                top = tops.get(src)
                if dsts or (top is not None and stream in top.downs):
                    out.append(_Edge(stream, src, dsts))
        return out


def _step_json(step: _Step, recursive: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "step_id": step.step_id,
        "name": step.name,
        "op": step.op,
        "core": step.core,
        "ups": list(step.ups),
        "downs": list(step.downs),
    }
    if recursive:
        d["substeps"] = [_step_json(s, recursive) for s in step.substeps]
    return d


def to_steps_json(flow: Dataflow, recursive: bool = False) -> str:
    """Describe a dataflow's steps and streams as JSON (flowspark's view; `flowspark plan --format json`).

    Args:
        flow: The dataflow.
        recursive: Nest the sub-steps of composite operators and connect core steps.

    Returns:
        An indented JSON document (see the module docstring).

    Example:
        >>> import json
        >>> import flowspark.operators as op
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> doc = json.loads(to_steps_json(flow))
        >>> [(st["step_id"], st["op"]) for st in doc["steps"]]
        [('eg.inp', 'input'), ('eg.double', 'map'), ('eg.out', 'output')]
        >>> [(e["from"], e["to"]) for e in doc["streams"]]
        [('eg.inp', ['eg.double']), ('eg.double', ['eg.out'])]
    """
    model = RenderModel(flow, recursive)
    doc = {
        "flow_id": model.flow_id,
        "recursive": recursive,
        "steps": [_step_json(s, recursive) for s in model.steps],
        "streams": [{"stream_id": e.stream_id, "from": e.src, "to": e.dsts} for e in model.edges],
    }
    return json.dumps(doc, indent=2)


def _label(text: str) -> str:
    return '["' + text.replace('"', "#quot;") + '"]'


def to_flowchart(flow: Dataflow, recursive: bool = False) -> str:
    """Draw a dataflow as a Mermaid flowchart (flowspark's view; `flowspark plan --format mermaid`).

    Node ids are `s0`, `s1` ...; each node's label is its full step id and
    operator (`"eg.double (map)"`); edges are labelled with the port name.

    Args:
        flow: The dataflow.
        recursive: Show core steps inside subgraphs for their composite operators.

    Returns:
        Mermaid source.

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> print(to_flowchart(flow))
        flowchart TD
        subgraph flow_eg["eg (Dataflow)"]
          s0["eg.inp (input)"]
          s1["eg.double (map)"]
          s2["eg.out (output)"]
        end
        s0 -->|down| s1
        s1 -->|down| s2
    """
    model = RenderModel(flow, recursive)
    lines = ["flowchart TD", f"subgraph flow_{_safe(model.flow_id)}{_label(model.flow_id + ' (Dataflow)')}"]
    ids = _nest(
        model,
        recursive,
        1,
        lines,
        lambda step, gid: f"subgraph {gid}{_label(f'{step.step_id} ({step.op})')}",
        lambda step, sid: f"{sid}{_label(f'{step.step_id} ({step.op})')}",
        "end",
    )
    lines.append("end")
    for edge in model.edges:
        for dst in edge.dsts:
            if edge.src in ids and dst in ids:
                lines.append(f"{ids[edge.src]} -->|{edge.port}| {ids[dst]}")
    return "\n".join(lines)


def _puml_label(text: str) -> str:
    return '"' + text.replace('"', "'") + '"'


def to_plantuml(flow: Dataflow, recursive: bool = False) -> str:
    """Draw a dataflow as a PlantUML component diagram.

    Each step is a component aliased `s0`, `s1` ... and labelled with its full
    step id and operator (`"eg.double (map)"`); arrows are streams, labelled
    with the port name. With `recursive`, composite operators become
    components that contain their sub-steps, and the arrows connect core steps.

    Args:
        flow: The dataflow.
        recursive: Nest the sub-steps of composite operators.

    Returns:
        PlantUML source (`@startuml` ... `@enduml`).

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> print(to_plantuml(flow))
        @startuml
        title eg (Dataflow)
        component "eg.inp (input)" as s0
        component "eg.double (map)" as s1
        component "eg.out (output)" as s2
        s0 --> s1 : down
        s1 --> s2 : down
        @enduml
    """
    model = RenderModel(flow, recursive)
    lines = ["@startuml", f"title {model.flow_id} (Dataflow)"]
    ids = _nest(
        model,
        recursive,
        0,
        lines,
        lambda step, gid: f"component {_puml_label(f'{step.step_id} ({step.op})')} as {gid} {{",
        lambda step, sid: f"component {_puml_label(f'{step.step_id} ({step.op})')} as {sid}",
        "}",
    )
    for edge in model.edges:
        for dst in edge.dsts:
            if edge.src in ids and dst in ids:
                lines.append(f"{ids[edge.src]} --> {ids[dst]} : {edge.port}")
    lines.append("@enduml")
    return "\n".join(lines)


def _nest(
    model: RenderModel,
    recursive: bool,
    depth: int,
    lines: list[str],
    group: Callable[[_Step, str], str],
    leaf: Callable[[_Step, str], str],
    close: str,
) -> dict[str, str]:
    """Append the step tree to `lines` (groups for composites when `recursive`); return step id -> node id."""
    ids: dict[str, str] = {}
    groups = 0

    def emit(step: _Step, depth: int) -> None:
        nonlocal groups
        pad = "  " * depth
        if recursive and step.substeps:
            gid = f"g{groups}"
            groups += 1
            lines.append(pad + group(step, gid))
            for sub in step.substeps:
                emit(sub, depth + 1)
            lines.append(pad + close)
            return
        sid = f"s{len(ids)}"
        ids[step.step_id] = sid
        lines.append(pad + leaf(step, sid))

    for step in model.steps:
        emit(step, depth)
    return ids


@dataclass(frozen=True)
class RenderedPort:
    """A port with its streams resolved to globally unique ids (Bytewax's `RenderedPort`).

    Attributes:
        port_name: `"up"`, `"down"`, `"ups"`, `"trues"` ...
        port_id: `"<step id>.<port name>"`.
        from_port_ids: The ports the streams come from, at this port's level of nesting.
        from_stream_ids: The streams' ids.
    """

    port_name: str
    port_id: str
    from_port_ids: list[str]
    from_stream_ids: list[str]


@dataclass(frozen=True)
class RenderedOperator:
    """An operator call with its ports resolved (Bytewax's `RenderedOperator`).

    Attributes:
        op_type: The operator's name (`"map"`).
        step_name: The id given to the call (`"double"`).
        step_id: The full step id (`"eg.double"`).
        inp_ports: Input ports.
        out_ports: Output ports (linked to the inner ports only when it has sub-steps).
        substeps: The operator calls it made.
    """

    op_type: str
    step_name: str
    step_id: str
    inp_ports: list[RenderedPort]
    out_ports: list[RenderedPort]
    substeps: list[RenderedOperator]


@dataclass(frozen=True)
class RenderedDataflow:
    """A dataflow with streams and ports resolved (Bytewax's `RenderedDataflow`).

    Attributes:
        flow_id: The dataflow's id.
        substeps: The top-level operator calls.
    """

    flow_id: str
    substeps: list[RenderedOperator]


def _render(comp: ir.Composite, comps: dict[str, ir.Composite], origin: ChainMap[str, str]) -> RenderedOperator:
    """Bytewax's resolution: a stream comes from the port that produced it, seen from this level."""
    inp = [
        RenderedPort(name, f"{comp.step_id}.{name}", [origin[sid] for sid in sids], list(sids))
        for name, sids in comp.up_ports
    ]
    origin.update({sid: f"{comp.step_id}.{name}" for name, sids in comp.down_ports for sid in sids})
    # Inside the operator, its input streams come from its own input ports.
    inner = origin.new_child({sid: f"{comp.step_id}.{name}" for name, sids in comp.up_ports for sid in sids})
    subs = [_render(comps[s], comps, inner) for s in comp.substeps if s in comps]
    out = [
        RenderedPort(
            name,
            f"{comp.step_id}.{name}",
            [inner[sid] for sid in sids] if subs else [],
            list(sids) if subs else [],
        )
        for name, sids in comp.down_ports
    ]
    return RenderedOperator(comp.name, comp.step_id.rsplit(".", 1)[-1], comp.step_id, inp, out, subs)


def to_rendered(flow: Dataflow) -> RenderedDataflow:
    """Resolve a dataflow's operator tree and port links, as Bytewax's `to_rendered` does.

    Args:
        flow: The dataflow.

    Returns:
        The rendered dataflow: connect each `RenderedPort.port_id` to its `from_port_ids`.

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> r = to_rendered(flow)
        >>> [(st.step_id, st.op_type) for st in r.substeps]
        [('eg.inp', 'input'), ('eg.double', 'map'), ('eg.out', 'output')]
        >>> r.substeps[2].inp_ports[0].from_port_ids
        ['eg.double.down']
    """
    graph = flow.graph()
    comps = {c.step_id: c for c in graph.composites}
    origin: ChainMap[str, str] = ChainMap()
    tops = [s for s in flow._scopes[0].substeps if s in comps]
    return RenderedDataflow(graph.flow_id, [_render(comps[s], comps, origin) for s in tops])


def _rendered_json(obj: Any) -> Any:
    if isinstance(obj, RenderedDataflow):
        return {"typ": "RenderedDataflow", "flow_id": obj.flow_id, "substeps": obj.substeps}
    if isinstance(obj, RenderedOperator):
        return {
            "typ": "RenderedOperator",
            "op_type": obj.op_type,
            "step_name": obj.step_name,
            "step_id": obj.step_id,
            "inp_ports": obj.inp_ports,
            "out_ports": obj.out_ports,
            "substeps": obj.substeps,
        }
    if isinstance(obj, RenderedPort):
        return {
            "typ": "RenderedPort",
            "port_name": obj.port_name,
            "port_id": obj.port_id,
            "from_port_ids": obj.from_port_ids,
            "from_stream_ids": obj.from_stream_ids,
        }
    msg = f"Object of type {type(obj).__name__} is not JSON serializable"
    raise TypeError(msg)


def to_json(flow: Dataflow) -> str:
    """Encode a dataflow as JSON in Bytewax's format (the `RenderedDataflow`, indented by 2).

    Args:
        flow: The dataflow.

    Returns:
        JSON text: objects carry `"typ"` (`RenderedDataflow`, `RenderedOperator`, `RenderedPort`).

    Example:
        >>> import json
        >>> import flowspark.operators as op
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> doc = json.loads(to_json(flow))
        >>> [(st["step_id"], st["op_type"]) for st in doc["substeps"]]
        [('eg.inp', 'input'), ('eg.double', 'map'), ('eg.out', 'output')]
    """
    return json.dumps(to_rendered(flow), default=_rendered_json, indent=2)


def to_mermaid(flow: Dataflow) -> str:
    """Draw a dataflow's top-level operators as a Mermaid flowchart, in Bytewax's format.

    Args:
        flow: The dataflow.

    Returns:
        Mermaid source; nodes are step ids, edges are labelled `"<from port> → <to port>"`.

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.testing import TestingSource, TestingSink
        >>> flow = Dataflow("eg")
        >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
        >>> op.output("out", s, TestingSink([]))
        >>> print(to_mermaid(flow))
        flowchart TD
        subgraph "eg (Dataflow)"
        eg.inp["inp (input)"]
        eg.double["double (map)"]
        eg.inp -- "down → up" --> eg.double
        eg.out["out (output)"]
        eg.double -- "down → up" --> eg.out
        end
    """
    rflow = to_rendered(flow)
    lines = ["flowchart TD", f'subgraph "{rflow.flow_id} (Dataflow)"']
    ports = {p.port_id: (st, p) for st in rflow.substeps for p in st.inp_ports + st.out_ports}
    for step in rflow.substeps:
        lines.append(f'{step.step_id}["{step.step_name} ({step.op_type})"]')
        for port in step.inp_ports:
            for from_id in port.from_port_ids:
                from_step, from_port = ports[from_id]
                lines.append(f'{from_step.step_id} -- "{from_port.port_name} → {port.port_name}" --> {step.step_id}')
    lines.append("end")
    return "\n".join(lines)


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in text)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (shared with the `flowspark` console script).

    Returns:
        The parser.
    """
    from flowspark._args import IMPORT_HELP

    parser = argparse.ArgumentParser(prog=_PROG, description="Print the structure of a flowspark dataflow.")
    parser.add_argument("import_str", metavar="IMPORT_STR", help=IMPORT_HELP)
    parser.add_argument(
        "-o",
        "--output-format",
        choices=["mermaid", "json", "plantuml"],
        default="mermaid",
        help="Mermaid flowchart (default), Bytewax's RenderedDataflow JSON, or a PlantUML component diagram",
    )
    parser.add_argument(
        "-r",
        "--recursive",
        action="store_true",
        help="PlantUML: show the steps inside composite operators (Mermaid: never; JSON: always)",
    )
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments (default: `sys.argv[1:]`).

    Returns:
        0 on success, 1 when the import string does not resolve to a Dataflow.
    """
    from flowspark._importstr import locate_dataflow
    from flowspark.errors import ImportStrError

    args = build_parser().parse_args(argv)
    try:
        flow = locate_dataflow(args.import_str)
    except ImportStrError as e:
        print(f"{_PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    if args.output_format == "json":
        print(to_json(flow))
    elif args.output_format == "plantuml":
        print(to_plantuml(flow, args.recursive))
    else:
        print(to_mermaid(flow))
    return 0


if __name__ == "__main__":
    sys.exit(main())
