"""Dataflow, Stream and KeyedStream, and the `operator` decorator.

A `Dataflow` is built by calling operators (`flowspark.operators`). Each
operator is a function decorated with `operator`: the decorator checks the
step id, gives the call a fully qualified id (`"flow.parent.step"`) and
records it in the operator tree. Only the *core* operators add steps to the
graph runtimes execute; every other operator is a composite of them.

```python
from flowspark.dataflow import Dataflow, operator
import flowspark.operators as op

@operator
def add_one(step_id, up):
    return op.map("add", up, lambda x: x + 1)
```
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Generic, Optional, TypeVar

from typing_extensions import TypeAlias

from flowspark.errors import (
    DuplicateStepError,
    FlowsparkBuildError,
    FlowsparkTypeError,
    IncompleteDataflowError,
    StreamScopeError,
)
from flowspark.ir import Composite, Graph, Input, InspectDebug, Node, Output

X = TypeVar("X")
X_co = TypeVar("X_co", covariant=True)
V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Dataflow", "KeyedStream", "Operator", "Stream", "operator"]


def _check_id(kind: str, value: Any) -> str:
    if not isinstance(value, str):
        msg = f"{kind} must be a `str`; received {value!r} of type {type(value).__name__}"
        raise FlowsparkTypeError(msg)
    if value == "":
        msg = f"{kind} must not be empty; give it a name like 'counts'"
        raise FlowsparkBuildError(msg)
    if "." in value:
        msg = (
            f"{kind} {value!r} contains a '.': it can't contain any periods '.', which separate "
            f"nested step ids; use '_' instead (e.g. {value.replace('.', '_')!r})"
        )
        raise FlowsparkBuildError(msg)
    return value


@dataclass
class _Scope:
    scope_id: str
    children: set[str] = field(default_factory=set)
    substeps: list[str] = field(default_factory=list)
    # Streams passed to this scope's operator as `Stream` arguments (or in `*ups` / `**kwargs`):
    # with the streams its own steps produce, the only ones its sub-operators may use.
    ups: frozenset[str] = frozenset()

    def sees(self, stream: Stream[Any]) -> bool:
        """Whether an operator called inside this scope may use `stream` (Bytewax's scoping rule)."""
        return stream.stream_id.startswith(self.scope_id + ".") or stream.stream_id in self.ups


class Dataflow:
    """A dataflow: a graph of steps that turn sources into sinks.

    Args:
        flow_id: Name of the dataflow; must be a non-empty `str` with no `.`.

    Example:
        >>> from flowspark.dataflow import Dataflow
        >>> import flowspark.operators as op
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> flow = Dataflow("example")
        >>> s = op.input("inp", flow, TestingSource([1, 2, 3]))
        >>> out = []
        >>> op.output("out", op.map("double", s, lambda x: x * 2), TestingSink(out))
        >>> run_main(flow)
        >>> out
        [2, 4, 6]
    """

    def __init__(self, flow_id: str) -> None:
        """Create an empty dataflow named `flow_id`."""
        self.flow_id = _check_id("flow_id", flow_id)
        self._nodes: list[Node] = []
        self._composites: list[Composite] = []
        self._scopes: list[_Scope] = [_Scope(flow_id)]

    def __repr__(self) -> str:
        """Short description."""
        return f"Dataflow({self.flow_id!r}, {len(self._nodes)} core steps)"

    # -- building ---------------------------------------------------------
    def _add_node(self, node: Node) -> None:
        self._nodes.append(node)

    def _refine(self, stream_id: str, **facts: Any) -> None:
        """Set IR facts (fields) of the core step producing `stream_id` (for the operator that built it)."""
        for i in range(len(self._nodes) - 1, -1, -1):
            if stream_id in self._nodes[i].downs:
                self._nodes[i] = dataclasses.replace(self._nodes[i], **facts)
                return
        raise AssertionError(stream_id)

    def graph(self) -> Graph:
        """Return the core-step graph runtimes execute.

        Returns:
            A frozen `Graph` of the steps added so far.
        """
        return Graph(self.flow_id, tuple(self._nodes), tuple(self._composites))

    def validate(self) -> Graph:
        """Check that the flow can run and return its graph.

        Returns:
            The graph.

        Raises:
            IncompleteDataflowError: The flow has no input, or no output or inspect step
                (a `ValueError` and a `FlowsparkRuntimeError`, alias `BytewaxRuntimeError`).
        """
        graph = self.graph()
        if not any(isinstance(n, Input) for n in graph.nodes):
            msg = (
                f"dataflow {self.flow_id!r} has no input step (a dataflow needs at least one input step); "
                "add one with `op.input(step_id, flow, source)`"
            )
            raise IncompleteDataflowError(self.flow_id, msg)
        if not any(isinstance(n, (Output, InspectDebug)) for n in graph.nodes):
            msg = (
                f"dataflow {self.flow_id!r} has no output or inspect step (a dataflow needs at least one "
                "output or inspect step), so it would produce nothing; add "
                "`op.output(step_id, stream, sink)` or `op.inspect(...)`"
            )
            raise IncompleteDataflowError(self.flow_id, msg)
        return graph

    @property
    def substeps(self) -> list[Operator]:
        """The operator calls at the top of the dataflow, in the order they were made.

        Like Bytewax's `Dataflow.substeps`: each `Operator` has `step_id` (fully
        qualified), `step_name` (the id given to the call), `substeps` (the calls
        it made, recursively) and its operator's name as `type(step).__name__`
        (also `step.op_type`). Composite operators may be built from other
        sub-steps than in Bytewax (see docs/porting.md).

        Returns:
            A new list of `Operator` records (changing it does not change the flow).

        Example:
            >>> import flowspark.operators as op
            >>> from flowspark.testing import TestingSource
            >>> flow = Dataflow("eg")
            >>> s = op.map("double", op.input("inp", flow, TestingSource([1])), lambda x: 2 * x)
            >>> [(st.step_id, st.step_name, type(st).__name__) for st in flow.substeps]
            [('eg.inp', 'inp', 'input'), ('eg.double', 'double', 'map')]
            >>> [st.step_id for st in flow.substeps[1].substeps]
            ['eg.double.flat_map_batch']
        """
        comps = {c.step_id: c for c in self._composites}

        def build(step_id: str) -> Operator:
            comp = comps[step_id]
            cls = _operator_class(comp.name)
            subs = [build(s) for s in comp.substeps if s in comps]
            return cls(step_id.rsplit(".", 1)[-1], step_id, subs, comp.ups, comp.downs)

        return [build(s) for s in self._scopes[0].substeps if s in comps]


@dataclass(frozen=True)
class Operator:
    """One operator call in a dataflow's operator tree (see `Dataflow.substeps`).

    Each operator name has its own subclass, so `type(step).__name__` is the
    operator's name (`"map"`, `"stateful_map"` ...) as in Bytewax.

    Attributes:
        step_name: The id given to the call (`"double"`).
        step_id: The fully qualified id (`"flow.double"`).
        substeps: The operator calls this one made.
        ups: Ids of the streams it reads.
        downs: Ids of the streams it returns.
    """

    step_name: str
    step_id: str
    substeps: list[Operator]
    ups: tuple[str, ...]
    downs: tuple[str, ...]

    @property
    def op_type(self) -> str:
        """The operator's name (`type(self).__name__`)."""
        return type(self).__name__


_OPERATOR_CLASSES: dict[str, type[Operator]] = {}


def _operator_class(name: str) -> type[Operator]:
    cls = _OPERATOR_CLASSES.get(name)
    if cls is None:
        doc = f"A call of the `{name}` operator."
        cls = type(name, (Operator,), {"__doc__": doc, "__module__": __name__, "__qualname__": name})
        _OPERATOR_CLASSES[name] = cls
    return cls


class Stream(Generic[X_co]):
    """A handle to the items flowing out of one step's port.

    Streams are created by operators, never directly by users.
    """

    __slots__ = ("_flow", "stream_id")

    def __init__(self, stream_id: str, flow: Dataflow) -> None:
        """Name a stream of `flow`."""
        self.stream_id = stream_id
        self._flow = flow

    def __repr__(self) -> str:
        """Short description."""
        return f"Stream({self.stream_id!r})"

    def flow(self) -> Dataflow:
        """Return the dataflow this stream belongs to.

        Returns:
            The `Dataflow`.
        """
        return self._flow

    def then(self, op_fn: Callable[..., X], step_id: str, *args: Any, **kwargs: Any) -> X:
        """Chain an operator: `s.then(op.map, "double", f)` is `op.map("double", s, f)`.

        Args:
            op_fn: An operator function.
            step_id: The new step's id.
            *args: More positional arguments after the stream.
            **kwargs: Keyword arguments.

        Returns:
            Whatever the operator returns.
        """
        return op_fn(step_id, self, *args, **kwargs)


KeyedStream: TypeAlias = Stream[tuple[str, V]]
"""A stream of `(key, value)` 2-tuples; keys must be `str`.

As in Bytewax it is a generic alias of `Stream`, usable at run time:
`KeyedStream[int]` is `Stream[tuple[str, int]]`, so annotations such as
`up: op.KeyedStream[int]` work in modules without
`from __future__ import annotations` and with `typing.get_type_hints`.
"""


def _streams_in(value: Any) -> list[Stream[Any]]:
    if isinstance(value, Stream):
        return [value]
    if isinstance(value, (list, tuple)):
        out: list[Stream[Any]] = []
        for v in value:
            out.extend(_streams_in(v))
        return out
    if isinstance(value, dict):
        out = []
        for v in value.values():
            out.extend(_streams_in(v))
        return out
    if is_dataclass(value) and not isinstance(value, type):
        out = []
        for f in fields(value):
            out.extend(_streams_in(getattr(value, f.name)))
        return out
    return []


_STREAM_ANNOTATION = re.compile(r"(?:\w+\.)*(?:Stream|KeyedStream)(?:\[.*\])?")


def _is_stream_annotation(anno: Any) -> bool:
    """Whether a parameter annotation names `Stream` / `KeyedStream` (object or postponed string)."""
    if isinstance(anno, str):
        return _STREAM_ANNOTATION.fullmatch(anno.strip()) is not None
    if inspect.isclass(anno):
        return issubclass(anno, Stream)
    origin = typing.get_origin(anno)
    return inspect.isclass(origin) and issubclass(origin, Stream)


def _check_stream_args(name: str, raw_id: Any, params: list[inspect.Parameter], arguments: dict[str, Any]) -> None:
    """Bytewax's check: every argument of a parameter annotated `Stream` is a `Stream`."""
    for p in params:
        if p.name not in arguments:
            continue
        val = arguments[p.name]
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            vals, desc = list(val), f"{p.name!r} *args all"
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            vals, desc = list(val.values()), f"{p.name!r} **kwargs all"
        else:
            vals, desc = [val], f"{p.name!r} argument"
        for v in vals:
            if not isinstance(v, Stream):
                msg = (
                    f"operator {name!r} (step {raw_id!r}): {desc} must be a `Stream`; received {v!r} of type "
                    f"{type(v).__name__}; pass a stream an operator returned (did you forget to unpack the "
                    "result of an operator that returns several streams, such as `branch`?)"
                )
                raise FlowsparkTypeError(msg)


def _direct_streams(sig: inspect.Signature, arguments: dict[str, Any]) -> list[Stream[Any]]:
    """The streams passed as arguments themselves, or in `*args` / `**kwargs` (not nested deeper)."""
    out: list[Stream[Any]] = []
    for name, val in arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            out.extend(v for v in val if isinstance(v, Stream))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            out.extend(v for v in val.values() if isinstance(v, Stream))
        elif isinstance(val, Stream):
            out.append(val)
    return out


def _up_ports(sig: inspect.Signature, arguments: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Input ports as Bytewax names them: each `Stream` parameter; `*args` / `**kwargs` of streams."""
    out = []
    for name, val in arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            ids = tuple(v.stream_id for v in val if isinstance(v, Stream))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            ids = tuple(v.stream_id for v in val.values() if isinstance(v, Stream))
        elif isinstance(val, Stream):
            ids = (val.stream_id,)
        else:
            continue
        if ids or kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            out.append((name, ids))
    return tuple(out)


def _down_ports(result: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Output ports as Bytewax names them: `down` for a returned stream, else the dataclass's stream fields."""
    if isinstance(result, Stream):
        return (("down", (result.stream_id,)),)
    if is_dataclass(result) and not isinstance(result, type):
        return tuple(
            (f.name, (v.stream_id,)) for f in fields(result) if isinstance(v := getattr(result, f.name), Stream)
        )
    return ()


def _find_flow(values: list[Any]) -> Optional[Dataflow]:
    for v in values:
        if isinstance(v, Dataflow):
            return v
    for v in values:
        streams = _streams_in(v)
        if streams:
            return streams[0].flow()
    return None


def operator(fn: Optional[F] = None, *, _core: bool = False) -> Any:
    """Turn a function into a dataflow operator.

    The function's first parameter must be `step_id`. It receives the fully
    qualified id; steps it creates are nested under it. Stream arguments
    (also inside lists and tuples, as for `*ups`) locate the dataflow.

    Args:
        fn: The operator function.
        _core: Internal: marks the operators that add core steps.

    Returns:
        The wrapped operator.

    Raises:
        TypeError: `fn` has no `step_id` parameter.

    Example:
        >>> from flowspark.dataflow import Dataflow, operator
        >>> from flowspark.testing import TestingSource, TestingSink, run_main
        >>> import flowspark.operators as op
        >>> @operator
        ... def add_one(step_id, up):
        ...     return op.map("add", up, lambda x: x + 1)
        >>> flow = Dataflow("eg")
        >>> s = add_one("plus", op.input("inp", flow, TestingSource([1])))
        >>> out = []; op.output("out", s, TestingSink(out)); run_main(flow); out
        [2]
    """
    if fn is None:
        return functools.partial(operator, _core=_core)
    sig = inspect.signature(fn)
    if "step_id" not in sig.parameters:
        msg = f"operator function {fn.__name__!r} requires a 'step_id' parameter"
        raise TypeError(msg)

    stream_params = [p for p in sig.parameters.values() if p.name != "step_id" and _is_stream_annotation(p.annotation)]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as ex:
            msg = f"operator {fn.__name__!r}: {ex}"
            raise FlowsparkTypeError(msg) from None
        raw_id = bound.arguments["step_id"]
        _check_stream_args(fn.__name__, raw_id, stream_params, bound.arguments)
        values = list(bound.arguments.values())
        flow = _find_flow(values)
        if flow is None:
            msg = (
                f"operator {fn.__name__!r} (step {raw_id!r}) received no Dataflow or Stream; "
                f"pass the flow (for `input`) or an upstream stream"
            )
            raise FlowsparkTypeError(msg)
        parent = flow._scopes[-1]
        full_id = f"{parent.scope_id}.{raw_id}"
        step_id = _check_id(f"step {full_id!r} (operator {fn.__name__!r}): step_id", raw_id)
        fq = f"{parent.scope_id}.{step_id}"
        for s in _streams_in(values):
            if s.flow() is not flow:
                msg = (
                    f"step {fq!r}: stream {s.stream_id!r} belongs to another dataflow "
                    f"({s.flow().flow_id!r}); streams cannot cross dataflows"
                )
                raise FlowsparkBuildError(msg)
        direct = _direct_streams(sig, bound.arguments)
        for s in direct:
            if not parent.sees(s):
                msg = (
                    f"step {fq!r}: inconsistent stream scoping; stream {s.stream_id!r} was not passed to the "
                    f"enclosing operator {parent.scope_id!r} as a `Stream` argument (a stream nested in a list "
                    "or dict argument, or captured from outside, is not); inside a custom operator use only "
                    "its `Stream` arguments and the streams its own steps return"
                )
                raise StreamScopeError(msg)
        if step_id in parent.children:
            msg = f"step {fq!r} already exists; step ids must be unique within a dataflow"
            raise DuplicateStepError(msg)
        parent.children.add(step_id)
        parent.substeps.append(fq)
        scope = _Scope(fq, ups=frozenset(s.stream_id for s in direct))
        flow._scopes.append(scope)
        try:
            bound.arguments["step_id"] = fq
            result = fn(*bound.args, **bound.kwargs)
        finally:
            flow._scopes.pop()
        flow._composites.append(
            Composite(
                step_id=fq,
                name=fn.__name__,
                ups=tuple(s.stream_id for s in _streams_in(values)),
                downs=tuple(s.stream_id for s in _streams_in(result)),
                substeps=tuple(scope.substeps),
                up_ports=_up_ports(sig, bound.arguments),
                down_ports=_down_ports(result),
            )
        )
        return result

    wrapper._flowspark_core = _core  # type: ignore[attr-defined]
    return wrapper
