"""Bytewax's API, tracing and command line: the same code on bytewax 0.21.1 and on flowspark.

Each test runs one piece of user code against both libraries (an `Api` bundles each one's
modules) and compares what a user sees: outputs, exception classes a ported test catches,
command-line behaviour. Tests that need bytewax carry `@differential`.

This module deliberately has no `from __future__ import annotations`: annotations such as
`op.KeyedStream[int]` must evaluate when a function is defined, as in user code.
"""

import asyncio
import importlib
import importlib.util
import inspect
import logging
import os
import pickle
import queue
import subprocess
import sys
import textwrap
import typing
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

import flowspark.dataflow
import flowspark.errors
import flowspark.inputs
import flowspark.operators
import flowspark.operators.helpers
import flowspark.recovery
import flowspark.run
import flowspark.testing
import flowspark.visualize
from flowspark.errors import (
    BytewaxRuntimeError,
    FlowsparkRuntimeError,
    FlowsparkRuntimeTypeError,
    FlowsparkTypeError,
    IncompleteDataflowError,
    MissingPartitionsError,
    NoPartitionsError,
    SingleProcessError,
    SingleWorkerError,
    routing_error,
    step_error,
)

HAVE_BYTEWAX = importlib.util.find_spec("bytewax") is not None


def differential(fn: Callable[..., Any]) -> Any:
    """Mark a test that runs bytewax 0.21.1 too."""
    fn = pytest.mark.skipif(not HAVE_BYTEWAX, reason="bytewax 0.21.1 is not installed")(fn)
    return pytest.mark.bytewax(fn)


@dataclass(frozen=True)
class Api:
    name: str
    op: ModuleType
    dataflow: ModuleType
    testing: ModuleType
    inputs: ModuleType
    recovery: ModuleType
    run: ModuleType
    visualize: ModuleType
    helpers: ModuleType
    BytewaxRuntimeError: type

    @property
    def Dataflow(self) -> Any:  # noqa: N802
        return self.dataflow.Dataflow


def _api(name: str) -> Api:
    if name == "flowspark":
        return Api(
            "flowspark",
            flowspark.operators,
            flowspark.dataflow,
            flowspark.testing,
            flowspark.inputs,
            flowspark.recovery,
            flowspark.run,
            flowspark.visualize,
            flowspark.operators.helpers,
            BytewaxRuntimeError,
        )
    mods = [
        importlib.import_module(f"bytewax.{m}")
        for m in ("operators", "dataflow", "testing", "inputs", "recovery", "run", "visualize", "operators.helpers")
    ]
    errors = importlib.import_module("bytewax.errors")
    op, dataflow, testing, inputs, recovery, run, visualize, helpers = mods
    return Api("bytewax", op, dataflow, testing, inputs, recovery, run, visualize, helpers, errors.BytewaxRuntimeError)


APIS = ["bytewax", "flowspark"]


@pytest.fixture(params=APIS)
def api(request: Any) -> Api:
    if request.param == "bytewax" and not HAVE_BYTEWAX:
        pytest.skip("bytewax 0.21.1 is not installed")
    return _api(request.param)


def _run_flow(api: Api, items: list[Any], build: Callable[[Api, Any], Any]) -> list[Any]:
    flow = api.Dataflow("fid")
    s = api.op.input("inp", flow, api.testing.TestingSource(items))
    out: list[Any] = []
    api.op.output("out", build(api, s), api.testing.TestingSink(out))
    api.testing.run_main(flow)
    return out


def _both(items: list[Any], build: Callable[[Api, Any], Any]) -> tuple[list[Any], list[Any]]:
    return _run_flow(_api("bytewax"), items, build), _run_flow(_api("flowspark"), items, build)


def _causes(err: BaseException) -> list[BaseException]:
    out = []
    cur: Any = err
    while cur is not None:
        out.append(cur)
        cur = cur.__cause__
    return out


# =====================================================================================
# Point 2: KeyedStream[...] at run time; @operator on functions annotated with it
# =====================================================================================


def test_keyed_stream_is_a_subscriptable_alias_of_stream(api: Api) -> None:
    alias = api.op.KeyedStream[int]
    assert typing.get_origin(alias) is api.dataflow.Stream
    (pair,) = typing.get_args(alias)
    assert typing.get_args(pair) == (str, int)


def _add_op(api: Api) -> Any:
    # The annotations are evaluated right here (no postponed evaluation in this module).
    @api.dataflow.operator
    def add_to_value(step_id: str, up: api.op.KeyedStream[int], n: int) -> api.op.KeyedStream[int]:  # type: ignore[name-defined]
        return api.op.map_value("add", up, lambda v: v + n)

    return add_to_value


_POSTPONED_OP = '''
from __future__ import annotations

@operator
def double_value(step_id: str, up: op.KeyedStream[int]) -> op.KeyedStream[int]:
    """Annotations are strings here; Bytewax's decorator resolves them with get_type_hints."""
    return op.map_value("dbl", up, lambda v: 2 * v)
'''


def _postponed_op(api: Api) -> Any:
    ns: dict[str, Any] = {"operator": api.dataflow.operator, "op": api.op}
    exec(compile(_POSTPONED_OP, f"<{api.name} postponed>", "exec"), ns)  # noqa: S102
    return ns["double_value"]


@differential
def test_operator_annotated_with_keyed_stream_runs_like_bytewax() -> None:
    def build(api: Api, s: Any) -> Any:
        s = _add_op(api)("plus", s, 10)
        return _postponed_op(api)("twice", s)

    bw, fs = _both([("a", 1), ("b", 2), ("a", 3)], build)
    assert fs == bw == [("a", 22), ("b", 24), ("a", 26)]


def test_get_type_hints_resolve_keyed_stream_annotations() -> None:
    api = _api("flowspark")
    hints = typing.get_type_hints(_postponed_op(api))
    assert hints["up"] == flowspark.dataflow.Stream[tuple[str, int]]
    assert hints["return"] == api.op.KeyedStream[int]


# =====================================================================================
# Point 3: missing public API
# =====================================================================================

# -- inputs.batch_getter / batch_getter_ex / batch_async --------------------------------


def _take(it: Any, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out


def _getter_cases(inputs: ModuleType) -> dict[str, Any]:
    res: dict[str, Any] = {}
    feed = iter([1, 2, None, 3, 4, 5, None, None, 6])
    res["none_ends_a_batch"] = _take(inputs.batch_getter(lambda: next(feed), 2), 20)
    feed2 = iter([1, 0, 3, 0, 0])
    res["custom_yield_on"] = _take(inputs.batch_getter(lambda: next(feed2), 5, yield_on=0), 20)
    feed3: Any = iter([])
    res["empty_source"] = _take(inputs.batch_getter(lambda: next(feed3), 3), 20)
    q: queue.Queue[Any] = queue.Queue()
    for x in (1, None, 3):
        q.put(x)
    res["queue_empty"] = _take(inputs.batch_getter_ex(q.get_nowait, 2), 4)

    class NotYet(Exception):
        pass

    script = iter([1, NotYet, 2, 3, NotYet])

    def getter() -> Any:
        x = next(script)
        if x is NotYet:
            raise NotYet
        return x

    res["custom_exception"] = _take(inputs.batch_getter_ex(getter, 5, yield_ex=NotYet), 20)
    return res


@differential
def test_batch_getters_batch_like_bytewax() -> None:
    bw = _getter_cases(_api("bytewax").inputs)
    fs = _getter_cases(flowspark.inputs)
    assert fs == bw
    assert fs["none_ends_a_batch"] == [[1, 2], [], [3, 4], [5], [], [6]]


def _async_cases(inputs: ModuleType) -> dict[str, Any]:
    res: dict[str, Any] = {}

    async def numbers() -> Any:
        for i in range(7):
            yield i

    res["ready_items"] = list(inputs.batch_async(numbers(), timedelta(seconds=5), 3))
    # Items arrive only when the test puts them in the queue, between batches: a batch
    # waits the (short) timeout and returns what came, possibly nothing.
    loop = asyncio.new_event_loop()
    q: asyncio.Queue[Any] = asyncio.Queue()

    async def from_queue() -> Any:
        while True:
            x = await q.get()
            if x is None:
                return
            yield x

    it = inputs.batch_async(from_queue(), timedelta(milliseconds=20), 3, loop=loop)
    got = [next(it)]
    q.put_nowait(1)
    q.put_nowait(2)
    got.append(next(it))
    for x in (3, 4, 5, 6):
        q.put_nowait(x)
    got += [next(it), next(it)]
    q.put_nowait(7)
    q.put_nowait(None)
    got += list(it)
    loop.close()
    res["timeouts"] = got
    return res


@differential
def test_batch_async_batches_like_bytewax() -> None:
    bw = _async_cases(_api("bytewax").inputs)
    fs = _async_cases(flowspark.inputs)
    assert fs == bw
    assert fs == {"ready_items": [[0, 1, 2], [3, 4, 5], [6]], "timeouts": [[], [1, 2], [3, 4, 5], [6], [7]]}


def _async_source(api: Api) -> Any:
    """A user DynamicSource whose partition reads an async generator through batch_async."""

    class Part(api.inputs.StatelessSourcePartition):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            async def gen() -> Any:
                for i in range(5):
                    await asyncio.sleep(0)
                    yield i * 10

            self._batches = api.inputs.batch_async(gen(), timedelta(seconds=5), 2)

        def next_batch(self) -> list[Any]:
            return next(self._batches)

    class Source(api.inputs.DynamicSource):  # type: ignore[name-defined,misc]
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
            return Part()

    return Source()


@differential
def test_batch_async_in_a_source_partition_like_bytewax() -> None:
    outs = []
    for api in (_api("bytewax"), _api("flowspark")):
        flow = api.Dataflow("asrc")
        out: list[Any] = []
        api.op.output("out", api.op.input("inp", flow, _async_source(api)), api.testing.TestingSink(out))
        api.testing.run_main(flow)
        outs.append(out)
    assert outs[1] == outs[0] == [0, 10, 20, 30, 40]


@pytest.mark.parametrize(
    ("call", "err", "needle"),
    [
        (lambda: flowspark.inputs.batch_getter(lambda: 1, 0), ValueError, "batch_size must be an int >= 1; received 0"),
        (lambda: flowspark.inputs.batch_getter("x", 2), TypeError, "getter must be a function"),  # type: ignore[arg-type]
        (lambda: flowspark.inputs.batch_getter_ex(lambda: 1, 2, yield_ex=3), TypeError, "exception class"),  # type: ignore[arg-type]
        (lambda: flowspark.inputs.batch_async([1], timedelta(1), 2), TypeError, "async iterable"),  # type: ignore[arg-type]
        (lambda: flowspark.inputs.batch_async(_agen(), 5, 2), TypeError, "timeout must be a timedelta"),  # type: ignore[arg-type]
        (lambda: flowspark.inputs.batch_async(_agen(), timedelta(-1), 2), ValueError, "must not be negative"),
    ],
)
def test_batch_helpers_reject_bad_arguments_when_called(call: Any, err: type, needle: str) -> None:
    with pytest.raises(err, match=needle):
        call()


async def _agen() -> Any:
    yield 1


# -- operators.helpers.map_dict_value ---------------------------------------------------


@differential
def test_map_dict_value_like_bytewax() -> None:
    def build(api: Api, s: Any) -> Any:
        return api.op.map("norm", s, api.helpers.map_dict_value("name", str.upper))

    items = [{"name": "ann", "id": 1}, {"name": "bo", "id": 2}]
    bw, fs = _both([dict(d) for d in items], build)
    assert fs == bw == [{"name": "ANN", "id": 1}, {"name": "BO", "id": 2}]
    # Both change the dict in place and return it.
    d = {"name": "x"}
    assert flowspark.operators.helpers.map_dict_value("name", str.upper)(d) is d
    with pytest.raises(TypeError, match="mapper must be callable"):
        flowspark.operators.helpers.map_dict_value("name", "upper")  # type: ignore[arg-type]


# -- testing.cluster_main and run.cli_main ------------------------------------------------


def _counting_flow(api: Api, out: list[Any]) -> Any:
    flow = api.Dataflow("cl")
    s = api.op.input("inp", flow, api.testing.TestingSource(["a", "b", "a", "c", "a"]))
    counts = api.op.count_final("count", s, lambda w: w)
    api.op.output("out", counts, api.testing.TestingSink(out))
    return flow


@differential
def test_cluster_main_one_worker_runs_like_bytewax() -> None:
    outs = []
    for api in (_api("bytewax"), _api("flowspark")):
        out: list[Any] = []
        api.testing.cluster_main(_counting_flow(api, out), [], 0)
        outs.append(sorted(out))
    assert outs[1] == outs[0] == [("a", 3), ("b", 1), ("c", 1)]
    out = []
    flowspark.testing.cluster_main(_counting_flow(_api("flowspark"), out), ["localhost:2101"], 0)
    assert sorted(out) == outs[0]


@differential
@pytest.mark.parametrize("workers", [2, 3])
def test_cluster_main_runs_worker_threads_like_bytewax(workers: int) -> None:
    outs = []
    for api in (_api("bytewax"), _api("flowspark")):
        out: list[Any] = []
        api.testing.cluster_main(_counting_flow(api, out), [], 0, worker_count_per_proc=workers)
        outs.append(sorted(out))
    assert outs[1] == outs[0] == [("a", 3), ("b", 1), ("c", 1)]


def test_cluster_main_refuses_a_cluster_of_processes_on_one_line() -> None:
    out: list[Any] = []
    with pytest.raises(SingleProcessError) as info:
        flowspark.testing.cluster_main(_counting_flow(_api("flowspark"), out), ["h:1", "h:2"], 1)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert SingleWorkerError is SingleProcessError  # the old name still catches it
    assert "\n" not in msg
    for needle in ("cluster_main", "received 2 addresses", "worker_count_per_proc=2 and no addresses", "submit"):
        assert needle in msg
    assert out == []


@pytest.mark.parametrize(
    ("addresses", "proc_id", "kwargs", "err", "needle"),
    [
        (["h:1", "h:2"], 0, {}, SingleProcessError, "runs its workers in this one process"),
        (["h:1"], 1, {}, ValueError, "process id 1 is not an index of the 1 address(es)"),
        ([], 0, {"worker_count_per_proc": 0}, ValueError, "worker_count_per_proc must be >= 1; received 0"),
        ([], "0", {}, TypeError, "proc_id must be an int; received '0'"),
        ("h:1", 0, {}, TypeError, "addresses must be a list of 'host:port' strings"),
    ],
)
def test_cluster_main_rejects_what_it_cannot_run(
    addresses: Any, proc_id: Any, kwargs: Any, err: type, needle: str
) -> None:
    out: list[Any] = []
    with pytest.raises(err) as info:
        flowspark.testing.cluster_main(_counting_flow(_api("flowspark"), out), addresses, proc_id, **kwargs)
    assert needle in str(info.value)
    assert out == []


@differential
def test_cli_main_like_bytewax() -> None:
    outs = []
    for api in (_api("bytewax"), _api("flowspark")):
        out: list[Any] = []
        api.run.cli_main(_counting_flow(api, out), workers_per_process=1, epoch_interval=timedelta(seconds=1))
        outs.append(sorted(out))
    assert outs[1] == outs[0]
    assert list(inspect.signature(flowspark.run.cli_main).parameters) == [
        "flow",
        "workers_per_process",
        "process_id",
        "addresses",
        "epoch_interval",
        "recovery_config",
    ]
    outs = []
    for api in (_api("bytewax"), _api("flowspark")):
        out = []
        api.run.cli_main(_counting_flow(api, out), workers_per_process=3, epoch_interval=timedelta(seconds=1))
        outs.append(sorted(out))
    assert outs[1] == outs[0]
    with pytest.raises(SingleProcessError, match=r"cli_main: .*cannot join a cluster.*workers_per_process=6"):
        flowspark.run.cli_main(_counting_flow(_api("flowspark"), []), workers_per_process=3, addresses=["h:1", "h:2"])
    with pytest.raises(ValueError, match="process_id=0 needs addresses"):
        flowspark.run.cli_main(_counting_flow(_api("flowspark"), []), process_id=0)


# -- Dataflow.substeps -----------------------------------------------------------------------


def _tree(steps: list[Any]) -> list[Any]:
    return [(type(s).__name__, s.step_id, s.step_name, _tree(s.substeps)) for s in steps]


def _substep_flow(api: Api) -> Any:
    flow = api.Dataflow("eg")
    s = api.op.input("inp", flow, api.testing.TestingSource([1, 2]))
    m = api.op.map("dbl", s, lambda x: 2 * x)
    fm = api.op.flat_map("fm", m, lambda x: [x])
    b = api.op.branch("br", fm, lambda x: x > 2)
    mg = api.op.merge("mg", b.trues, b.falses)
    api.op.inspect("insp", mg)
    k = api.op.key_on("key", mg, str)
    sm = api.op.stateful_map("sm", k, lambda st, v: (st, v))
    api.op.output("out", sm, api.testing.TestingSink([]))
    return flow


@differential
def test_substeps_top_level_like_bytewax() -> None:
    bw = _tree(_substep_flow(_api("bytewax")).substeps)
    fs = _tree(_substep_flow(_api("flowspark")).substeps)
    assert [t[:3] for t in fs] == [t[:3] for t in bw]
    assert [t[:3] for t in fs][:3] == [
        ("input", "eg.inp", "inp"),
        ("map", "eg.dbl", "dbl"),
        ("flat_map", "eg.fm", "fm"),
    ]
    # Operators built the same way have the same sub-steps (ids, names, operator names).
    same = {"eg.inp", "eg.dbl", "eg.fm", "eg.br", "eg.mg", "eg.insp", "eg.out"}
    assert [t for t in fs if t[1] in same] == [t for t in bw if t[1] in same]
    # Composites flowspark builds from fewer layers differ inside (docs/porting.md).
    assert dict((t[1], t) for t in fs)["eg.sm"][3] == [("stateful_batch", "eg.sm.stateful_batch", "stateful_batch", [])]


def test_substeps_is_a_fresh_list_of_the_operator_tree() -> None:
    flow = _substep_flow(_api("flowspark"))
    steps = flow.substeps
    steps.clear()
    assert len(flow.substeps) == 9
    top = flow.substeps[1]
    assert isinstance(top, flowspark.dataflow.Operator)
    assert (top.op_type, top.ups, top.downs) == ("map", ("eg.inp.down",), ("eg.dbl.flat_map_batch.down",))


# -- visualize.to_plantuml ------------------------------------------------------------------


def _vis_flow(api: Api) -> Any:
    flow = api.Dataflow("eg")
    s = api.op.input("inp", flow, api.testing.TestingSource([1, 2]))
    b = api.op.branch("br", s, lambda x: x > 1)
    m = api.op.merge("mg", b.trues, api.op.map("dbl", b.falses, lambda x: 2 * x))
    api.op.output("out", m, api.testing.TestingSink([]))
    return flow


def _bytewax_puml(text: str) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Top-level (step id, operator) pairs and step-to-step edges of bytewax's PlantUML."""
    lines = text.splitlines()
    nodes = set()
    for i, line in enumerate(lines):
        if line.startswith("component ") and line.endswith(" ["):
            step_id, op = lines[i + 1].strip().rstrip(")").split(" (")
            nodes.add((step_id, op))
    edges = set()
    for line in lines:
        if line.startswith("    ") and not line.startswith("     ") and " --> " in line:
            src, dst = line.strip().split(" : ")[0].split(" --> ")
            edges.add((src.rsplit(".", 1)[0], dst.rsplit(".", 1)[0]))
    return nodes, edges


def _flowspark_puml(text: str) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    alias, nodes, edges = {}, set(), set()
    for line in text.splitlines():
        if line.startswith("component "):
            label, name = line[len('component "') :].split('" as ')
            step_id, op = label.rstrip(")").split(" (")
            alias[name.rstrip(" {")] = step_id
            nodes.add((step_id, op))
    for line in text.splitlines():
        if " --> " in line:
            src, dst = line.split(" : ")[0].split(" --> ")
            edges.add((alias[src], alias[dst]))
    return nodes, edges


@differential
def test_to_plantuml_draws_the_same_steps_and_streams_as_bytewax() -> None:
    bw_text = _api("bytewax").visualize.to_plantuml(_vis_flow(_api("bytewax")))
    fs_text = flowspark.visualize.to_plantuml(_vis_flow(_api("flowspark")))
    assert fs_text.startswith("@startuml\n")
    assert fs_text.endswith("\n@enduml")
    assert _flowspark_puml(fs_text) == _bytewax_puml(bw_text)
    nodes, edges = _flowspark_puml(fs_text)
    assert ("eg.dbl", "map") in nodes
    assert ("eg.br", "eg.dbl") in edges
    # Recursive: the map's core step is nested inside it, as in bytewax.
    rec = flowspark.visualize.to_plantuml(_vis_flow(_api("flowspark")), recursive=True)
    assert 'component "eg.dbl (map)" as g0 {\n  component "eg.dbl.flat_map_batch (flat_map_batch)"' in rec
    assert "component eg.dbl.flat_map_batch [" in _api("bytewax").visualize.to_plantuml(
        _vis_flow(_api("bytewax")), recursive=True
    )


def test_visualize_cli_prints_plantuml(tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(
        "import flowspark.operators as op\nfrom flowspark.dataflow import Dataflow\n"
        "from flowspark.testing import TestingSource, TestingSink\n"
        "flow = Dataflow('eg')\nop.output('out', op.input('inp', flow, TestingSource([1])), TestingSink([]))\n"
    )
    res = _cli(tmp_path, "flowspark.visualize", "flows.py", "-o", "plantuml")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        '@startuml\ntitle eg (Dataflow)\ncomponent "eg.inp (input)" as s0\n'
        'component "eg.out (output)" as s1\ns0 --> s1 : down\n@enduml\n'
    )


# -- tracing ---------------------------------------------------------------------------------


def _bytewax_tracing_call(code: str) -> subprocess.CompletedProcess[str]:
    # bytewax's tracer is process-global (a second setup_tracing call hangs): one process per call.
    prog = f"from bytewax.tracing import *\nguard = {code}\nprint(type(guard).__name__)\n"
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120, env=env)


TRACING_CALLS = [
    "setup_tracing()",
    "setup_tracing(JaegerConfig('svc'), log_level='DEBUG')",
    "setup_tracing(tracing_config=OtlpTracingConfig('svc', url='grpc://127.0.0.1:4317', sampling_ratio=0.5), "
    "log_level='info')",
]


@pytest.fixture
def fresh_tracing() -> Any:
    import flowspark.tracing

    yield flowspark.tracing
    if flowspark.tracing._ACTIVE is not None:
        flowspark.tracing._ACTIVE.close()


@differential
@pytest.mark.parametrize("code", TRACING_CALLS)
def test_setup_tracing_calls_that_work_on_bytewax_work(code: str, fresh_tracing: Any) -> None:
    res = _bytewax_tracing_call(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "BytewaxTracer"
    ns: dict[str, Any] = {}
    exec("from flowspark.tracing import *", ns)  # noqa: S102
    otel = importlib.util.find_spec("opentelemetry") is not None
    if "Config(" in code and not otel:
        with pytest.warns(RuntimeWarning, match="opentelemetry-sdk is not installed, so traces are not exported"):
            guard = eval(code, ns)  # noqa: S307
    else:
        guard = eval(code, ns)  # noqa: S307
    assert isinstance(guard, fresh_tracing.TracingGuard)
    want = {"setup_tracing()": logging.ERROR}.get(code, logging.DEBUG if "DEBUG" in code else logging.INFO)
    assert logging.getLogger("flowspark.any.child").getEffectiveLevel() == want


@differential
def test_tracing_configs_like_bytewax() -> None:
    bw = importlib.import_module("bytewax.tracing")
    for mod in (bw, importlib.import_module("flowspark.tracing")):
        j = mod.JaegerConfig("svc")
        o = mod.OtlpTracingConfig("svc", url="grpc://h:4317", sampling_ratio=0.25)
        assert isinstance(j, mod.TracingConfig)
        assert isinstance(o, mod.TracingConfig)
        assert (j.service_name, j.endpoint, j.sampling_ratio) == ("svc", None, 1.0)
        assert (o.service_name, o.url, o.sampling_ratio) == ("svc", "grpc://h:4317", 0.25)
        with pytest.raises(TypeError):
            mod.JaegerConfig()


def test_setup_tracing_logs_flowspark_records_at_the_level(fresh_tracing: Any, capsys: Any) -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()  # logging not configured by the application
    try:
        guard = fresh_tracing.setup_tracing(log_level="INFO")
        log = logging.getLogger("flowspark.user")
        log.info("shown %d", 1)
        log.debug("hidden")
        logging.getLogger("other").error("not ours")
        again = fresh_tracing.setup_tracing(log_level="WARN")
        log.info("hidden after reconfiguring")
        log.warning("shown %d", 2)
        assert len(logging.getLogger("flowspark").handlers) == 1
        assert repr(guard) == "<TracingGuard closed level=INFO>"
        again.close()
        assert logging.getLogger("flowspark").handlers == []
        assert logging.getLogger("flowspark").level == logging.NOTSET
    finally:
        root.handlers[:] = saved
    err = capsys.readouterr().err
    assert "INFO flowspark.user: shown 1" in err
    assert "WARNING flowspark.user: shown 2" in err
    assert "hidden" not in err
    assert "other: not ours" not in err  # our handler formats only the flowspark logger


def test_setup_tracing_leaves_configured_logging_to_the_application(fresh_tracing: Any, caplog: Any) -> None:
    with fresh_tracing.setup_tracing(log_level="debug") as guard:
        assert guard.handler is None  # caplog's root handler is there: records propagate to it
        logging.getLogger("flowspark.x").debug("to the root handler")
    assert ("flowspark.x", logging.DEBUG, "to the root handler") in caplog.record_tuples


def test_setup_tracing_level_shows_what_flowspark_logs(fresh_tracing: Any, caplog: Any) -> None:
    want = ("flowspark.run", logging.INFO, "running dataflow 'cl' with the in-memory executor (1 worker)")
    flowspark.run.cli_main(_counting_flow(_api("flowspark"), []))
    assert want not in caplog.record_tuples  # below the default level
    fresh_tracing.setup_tracing(log_level="INFO")
    flowspark.run.cli_main(_counting_flow(_api("flowspark"), []))
    assert want in caplog.record_tuples


@pytest.mark.parametrize(
    ("kwargs", "err", "needle"),
    [
        ({"log_level": "LOUD"}, ValueError, "unknown log_level 'LOUD'; use one of ERROR, WARN"),
        ({"log_level": 10}, TypeError, "log_level must be a str"),
        ({"tracing_config": "jaeger"}, TypeError, "tracing_config must be a TracingConfig"),
    ],
)
def test_setup_tracing_rejects_bad_arguments(fresh_tracing: Any, kwargs: Any, err: type, needle: str) -> None:
    with pytest.raises(err, match=needle):
        fresh_tracing.setup_tracing(**kwargs)


def test_tracing_config_rejects_bad_arguments() -> None:
    import flowspark.tracing as tr

    with pytest.raises(ValueError, match="sampling_ratio must be between 0.0 and 1.0; received 1.5"):
        tr.OtlpTracingConfig("svc", sampling_ratio=1.5)
    with pytest.raises(TypeError, match="service_name must be a non-empty str"):
        tr.JaegerConfig(3)  # type: ignore[arg-type]


_OTLP_EXPORT = textwrap.dedent(
    """
    from concurrent import futures
    import grpc
    from opentelemetry import trace
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    from flowspark.tracing import OtlpTracingConfig, setup_tracing

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        requests = []

        def Export(self, request, context):
            self.requests.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    guard = setup_tracing(OtlpTracingConfig("fid-svc", url=f"grpc://127.0.0.1:{port}"), log_level="INFO")
    with trace.get_tracer("user").start_as_current_span("user-span"):
        pass
    guard.close()  # flushes the exporter
    server.stop(None)
    for req in Collector.requests:
        for rs in req.resource_spans:
            service = [a.value.string_value for a in rs.resource.attributes if a.key == "service.name"]
            for ss in rs.scope_spans:
                for span in ss.spans:
                    print(service[0], span.name)
    """
)


def test_otlp_config_exports_user_spans_when_opentelemetry_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    (tmp_path / "otlp.py").write_text(_OTLP_EXPORT)
    res = subprocess.run([sys.executable, "otlp.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[0] == "fid-svc user-span"


# =====================================================================================
# Point 4: python -m flowspark.run takes bytewax's flags and environment
# =====================================================================================

CLI_FLOW = textwrap.dedent(
    """
    import {lib}.operators as op
    from {lib}.dataflow import Dataflow
    from {lib}.connectors.files import FileSource, FileSink

    flow = Dataflow("wc")
    s = op.input("inp", flow, FileSource("in.txt"))
    s = op.flat_map("words", s, str.split)
    s = op.count_final("count", s, lambda w: w)
    s = op.map("fmt", s, lambda kv: (kv[0], f"{{kv[0]}}={{kv[1]}}"))
    op.output("out", s, FileSink("out.txt"))
    """
)

LINES_FLOW = textwrap.dedent(
    """
    import {lib}.operators as op
    from {lib}.dataflow import Dataflow
    from {lib}.connectors.files import FileSource, FileSink

    flow = Dataflow("lines")
    s = op.input("inp", flow, FileSource("in.txt"))
    op.output("out", op.map("up", s, lambda line: ("k", line.upper())), FileSink("out.txt"))
    """
)


def _cli(cwd: Path, module: str, *args: str, env: Any = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSPARK_", "BYTEWAX_"))}
    full.update(env or {})
    full["RUST_BACKTRACE"] = "0"
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def projects(tmp_path: Path) -> dict[str, Path]:
    """One directory per library with the same flows (`flows.py`, `lines.py`) and input."""
    out = {}
    for lib in APIS:
        d = tmp_path / lib
        d.mkdir()
        (d / "flows.py").write_text(CLI_FLOW.format(lib=lib))
        (d / "lines.py").write_text(LINES_FLOW.format(lib=lib))
        (d / "in.txt").write_text("a b a\nc a b\n")
        out[lib] = d
    return out


def _run_cli(projects: dict[str, Path], lib: str, *args: str, env: Any = None) -> subprocess.CompletedProcess[str]:
    return _cli(projects[lib], f"{lib}.run", *args, env=env)


def _out(d: Path) -> Counter[str]:
    return Counter((d / "out.txt").read_text().splitlines())


def _assert_one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("python -m flowspark.run: error: ")
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


WANT_COUNTS = Counter(["a=3", "b=2", "c=1"])


@differential
@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["-w", "1"], {}),
        (["--workers-per-process", "1", "-s", "5"], {}),
        ([], {"BYTEWAX_WORKERS_PER_PROCESS": "1", "BYTEWAX_SNAPSHOT_INTERVAL": "5"}),
    ],
)
def test_run_one_worker_flags_and_env_like_bytewax(projects: dict[str, Path], args: list[str], env: Any) -> None:
    for lib in APIS:
        res = _run_cli(projects, lib, "flows.py", *args, env=env)
        assert res.returncode == 0, (lib, res.stderr)
        assert _out(projects[lib]) == WANT_COUNTS, lib


@differential
@pytest.mark.parametrize(("args", "env"), [(["-w", "2"], {}), ([], {"BYTEWAX_WORKERS_PER_PROCESS": "4"})])
def test_run_more_workers_like_bytewax(projects: dict[str, Path], args: list[str], env: Any) -> None:
    for lib in APIS:
        res = _run_cli(projects, lib, "flows.py", *args, env=env)
        assert res.returncode == 0, (lib, res.stderr)
        assert _out(projects[lib]) == WANT_COUNTS, lib


@differential
def test_run_process_id_without_addresses_fails_on_both(projects: dict[str, Path]) -> None:
    bw = _run_cli(projects, "bytewax", "flows.py", "-i", "0")
    assert bw.returncode == 2
    assert "the addresses option is required" in bw.stderr
    res = _run_cli(projects, "flowspark", "flows.py", "-i", "0")
    _assert_one_line_error(res, "-i/--process-id 0 needs -a/--addresses", "flowspark submit flows.py")
    for lib in APIS:
        assert not (projects[lib] / "out.txt").exists()


@pytest.mark.parametrize(
    ("args", "env", "needles"),
    [
        (["-a", "h:1;h:2", "-i", "0"], {}, ["-a/--addresses h:1;h:2 lists 2 processes", "-w 2", "flowspark submit"]),
        ([], {"BYTEWAX_ADDRESSES": "h:1;h:2", "BYTEWAX_PROCESS_ID": "1"}, ["(from BYTEWAX_ADDRESSES) lists 2"]),
        (["-a", "h:1", "-i", "1"], {}, ["-i/--process-id 1 is not an index of the single address 'h:1'"]),
        (
            [],
            {"BYTEWAX_POD_NAME": "wc-1", "BYTEWAX_STATEFULSET_NAME": "wc", "BYTEWAX_HOSTFILE_PATH": "hosts.txt"},
            ["-a/--addresses h:1;h:2 (from BYTEWAX_HOSTFILE_PATH=hosts.txt) lists 2 processes"],
        ),
        (["--runtime", "spark", "-a", "h:1"], {}, ["-a/--addresses h:1: on Spark the cluster is Spark's", "submit"]),
        (
            ["--runtime", "spark"],
            {"BYTEWAX_RECOVERY_DIRECTORY": "rec"},
            ["-r/--recovery-directory rec (from BYTEWAX_RECOVERY_DIRECTORY)", "--checkpoint DIR"],
        ),
    ],
)
def test_run_cluster_flags_are_one_line_errors(
    projects: dict[str, Path], args: list[str], env: Any, needles: list[str]
) -> None:
    (projects["flowspark"] / "hosts.txt").write_text("h:1\nh:2\n")
    res = _run_cli(projects, "flowspark", "flows.py", *args, env=env)
    _assert_one_line_error(res, *needles)
    assert not (projects["flowspark"] / "out.txt").exists()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["-a", "h:1"], {}),
        (["-a", "h:1", "-i", "0"], {}),
        ([], {"BYTEWAX_POD_NAME": "wc-0", "BYTEWAX_STATEFULSET_NAME": "wc", "BYTEWAX_HOSTFILE_PATH": "hosts.txt"}),
        ([], {"FLOWSPARK_WORKERS_PER_PROCESS": "1", "BYTEWAX_WORKERS_PER_PROCESS": "8"}),
    ],
)
def test_run_a_single_worker_layout_runs(projects: dict[str, Path], args: list[str], env: Any) -> None:
    (projects["flowspark"] / "hosts.txt").write_text("h:1\n")
    res = _run_cli(projects, "flowspark", "flows.py", *args, env=env)
    assert res.returncode == 0, res.stderr
    assert _out(projects["flowspark"]) == WANT_COUNTS


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"BYTEWAX_WORKERS_PER_PROCESS": "two"}, "environment variable BYTEWAX_WORKERS_PER_PROCESS: 'two'"),
        ({"BYTEWAX_POD_NAME": "wc-x", "BYTEWAX_STATEFULSET_NAME": "wc"}, "'<statefulset name>-<index>'"),
    ],
)
def test_run_bad_bytewax_environment_is_a_usage_error(projects: dict[str, Path], env: Any, needle: str) -> None:
    res = _run_cli(projects, "flowspark", "flows.py", env=env)
    assert res.returncode == 2
    assert needle in res.stderr


@differential
def test_run_recovery_from_bytewax_environment_like_bytewax(projects: dict[str, Path]) -> None:
    env = {
        "BYTEWAX_RECOVERY_DIRECTORY": "rec",
        "BYTEWAX_SNAPSHOT_INTERVAL": "30",
        "BYTEWAX_RECOVERY_BACKUP_INTERVAL": "60",
    }
    for lib in APIS:
        d = projects[lib]
        (d / "in.txt").write_text("a\nb\n")
        (d / "rec").mkdir()  # bytewax.recovery needs the directory to exist
        init = _cli(d, f"{lib}.recovery", "rec", "1")
        assert init.returncode == 0, init.stderr
        assert _run_cli(projects, lib, "lines.py", env=env).returncode == 0
        with (d / "in.txt").open("a") as f:
            f.write("c\n")
        res = _run_cli(projects, lib, "lines.py", env=env)
        assert res.returncode == 0, (lib, res.stderr)
        # The second run continues after the first one: nothing is written twice.
        assert (d / "out.txt").read_text() == "A\nB\nC\n", lib


def test_run_recovery_directory_from_bytewax_environment_must_exist(projects: dict[str, Path]) -> None:
    res = _run_cli(projects, "flowspark", "flows.py", env={"BYTEWAX_RECOVERY_DIRECTORY": "nostore"})
    _assert_one_line_error(res, "'nostore' holds no partitions")


def test_run_help_lists_the_bytewax_scaling_flags_and_variables(projects: dict[str, Path]) -> None:
    res = _run_cli(projects, "flowspark", "--help")
    assert res.returncode == 0
    for needle in ("--workers-per-process", "--process-id", "--addresses", "--runtime", "BYTEWAX_PROCESS_ID"):
        assert needle in res.stdout


_MASTER_WRAPPER = textwrap.dedent(
    """
    import sys
    from flowspark.run import main

    rc = main(sys.argv[1:])
    from pyspark.sql import SparkSession

    print("MASTER", SparkSession.getActiveSession().sparkContext.master)
    sys.exit(rc)
    """
)


@pytest.mark.spark
@pytest.mark.slow
@differential
def test_run_workers_on_spark_use_that_many_local_cores(projects: dict[str, Path]) -> None:
    pytest.importorskip("pyspark")
    bw = _run_cli(projects, "bytewax", "flows.py", "-w", "2")
    assert bw.returncode == 0, bw.stderr
    d = projects["flowspark"]
    (d / "wrap.py").write_text(_MASTER_WRAPPER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSPARK_", "BYTEWAX_"))}
    res = subprocess.run(
        [sys.executable, "wrap.py", "flows.py", "--runtime", "spark", "-w", "2"],
        cwd=d,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert "MASTER local[2]" in res.stdout
    assert _out(d) == _out(projects["bytewax"]) == WANT_COUNTS


# =====================================================================================
# Point 5: exception types a ported test catches
# =====================================================================================


def _no_output_flow(api: Api) -> Any:
    flow = api.Dataflow("noout")
    api.op.map("m", api.op.input("inp", flow, api.testing.TestingSource([1])), lambda x: x)
    return flow


@differential
@pytest.mark.parametrize("make", ["no_output", "no_input"])
def test_incomplete_flow_fails_at_run_with_bytewax_runtime_error(api: Api, make: str) -> None:
    flow = _no_output_flow(api) if make == "no_output" else api.Dataflow("empty")
    with pytest.raises(api.BytewaxRuntimeError) as info:
        api.testing.run_main(flow)
    assert isinstance(info.value, RuntimeError)
    # bytewax chains a ValueError; flowspark's error is one itself.
    assert any(isinstance(e, ValueError) for e in _causes(info.value))
    needle = "output or inspect step" if make == "no_output" else "input step"
    assert any(needle in str(e) for e in _causes(info.value))


def test_incomplete_flow_error_is_also_a_build_error() -> None:
    with pytest.raises(IncompleteDataflowError) as info:
        _no_output_flow(_api("flowspark")).validate()
    assert isinstance(info.value, flowspark.errors.FlowsparkBuildError)
    assert info.value.step_id == "noout"


@differential
def test_failing_step_raises_bytewax_runtime_error_chained_to_the_cause(api: Api) -> None:
    flow = api.Dataflow("div")
    s = api.op.map("inv", api.op.input("inp", flow, api.testing.TestingSource([0])), lambda x: 1 / x)
    api.op.output("out", s, api.testing.TestingSink([]))
    with pytest.raises(api.BytewaxRuntimeError) as info:
        api.testing.run_main(flow)
    assert isinstance(_causes(info.value)[-1], ZeroDivisionError)
    assert "div.inv" in str(info.value)


def test_bytewax_runtime_error_is_the_class_run_main_raises() -> None:
    assert BytewaxRuntimeError is FlowsparkRuntimeError
    assert issubclass(BytewaxRuntimeError, RuntimeError)


@differential
@pytest.mark.parametrize("missing", ["all", "one"])
def test_recovery_partition_errors_are_file_not_found_like_bytewax(
    api: Api, missing: str, tmp_path_factory: Any
) -> None:
    db = tmp_path_factory.mktemp(f"rec_{api.name}")
    if missing == "one":
        api.recovery.init_db_dir(db, 2)
        (db / "part-1.sqlite3").unlink()
    flow = api.Dataflow("rec")
    api.op.output("out", api.op.input("inp", flow, api.testing.TestingSource([1])), api.testing.TestingSink([]))
    want = api.recovery.NoPartitionsError if missing == "all" else api.recovery.MissingPartitionsError
    with pytest.raises(FileNotFoundError) as info:
        api.testing.run_main(flow, recovery_config=api.recovery.RecoveryConfig(db))
    assert isinstance(info.value, want)


def test_flowspark_partition_errors_keep_their_value_error_base() -> None:
    for cls in (NoPartitionsError, MissingPartitionsError):
        assert issubclass(cls, FileNotFoundError)
        assert issubclass(cls, flowspark.errors.RecoveryError)
        assert issubclass(cls, ValueError)
        err = pickle.loads(pickle.dumps(cls("recovery directory 'x' holds no partitions")))
        assert (type(err), str(err)) == (cls, "recovery directory 'x' holds no partitions")


# -- non-str keys and non-pair items before a stateful step ------------------------------------

BAD_ITEMS: dict[str, list[Any]] = {"int_key": [(1, 2)], "not_a_pair": [5], "triple": [("a", 1, 2)]}


def _bad_key_flow(api: Api, items: list[Any]) -> Any:
    flow = api.Dataflow("bad")
    s = api.op.input("inp", flow, api.testing.TestingSource(items))
    s = api.op.stateful_map("sm", s, lambda st, v: (st, v))
    api.op.output("out", s, api.testing.TestingSink([]))
    return flow


@differential
@pytest.mark.parametrize("case", sorted(BAD_ITEMS))
@pytest.mark.parametrize(
    "lib",
    ["bytewax", "flowspark"],
)
def test_bad_key_before_stateful_step_is_a_type_error(lib: str, case: str) -> None:
    api = _api(lib)
    with pytest.raises(TypeError) as info:
        api.testing.run_main(_bad_key_flow(api, BAD_ITEMS[case]))
    assert "sm" in str(info.value)


# -- step_error -----------------------------------------------------------------------------------


def test_step_error_keeps_a_type_error_the_cause_of_a_runtime_error_only() -> None:
    """As Bytewax's BytewaxRuntimeError: a TypeError in a step is the cause, not the error's class."""
    cause = TypeError("unsupported operand type(s) for +: 'int' and 'str'")
    err = step_error("f.add", cause)
    assert type(err) is FlowsparkRuntimeError
    assert not isinstance(err, TypeError)
    assert isinstance(err, RuntimeError)
    assert isinstance(err, flowspark.errors.FlowsparkError)
    assert (err.step_id, err.__cause__) == ("f.add", cause)
    assert str(err) == "error in step 'f.add': TypeError: unsupported operand type(s) for +: 'int' and 'str'"
    sub = step_error("f.k", FlowsparkTypeError("key must be str"))
    assert type(sub) is FlowsparkRuntimeError  # flowspark's own check of a return value, as Bytewax's
    custom = step_error("f.div", ZeroDivisionError("division by zero"), message="custom")
    assert (type(custom), str(custom)) == (FlowsparkRuntimeError, "custom")


def test_routing_error_is_a_type_error_and_a_runtime_error() -> None:
    cause = FlowsparkTypeError("keys must be str")
    err = routing_error("f.sm.stateful_batch", cause)
    assert type(err) is FlowsparkRuntimeTypeError
    assert isinstance(err, TypeError)
    assert isinstance(err, RuntimeError)
    assert (err.step_id, err.__cause__) == ("f.sm.stateful_batch", cause)
    assert str(err) == "error in step 'f.sm.stateful_batch': FlowsparkTypeError: keys must be str"


def test_step_error_returns_an_already_wrapped_error_unchanged() -> None:
    inner = step_error("f.inner", TypeError("x"))
    assert step_error("f.outer", inner) is inner


@pytest.mark.parametrize(
    ("args", "needle"),
    [(("f.s", "not an exception"), "exc must be an exception"), ((3, ValueError()), "step_id must be a str")],
)
def test_step_error_rejects_bad_arguments(args: Any, needle: str) -> None:
    with pytest.raises(FlowsparkTypeError, match=needle):
        step_error(*args)


def test_runtime_errors_pickle_with_their_step_id() -> None:
    for err in (step_error("f.m", TypeError("bad")), routing_error("f.sm", FlowsparkTypeError("bad key"))):
        back = pickle.loads(pickle.dumps(err))
        assert (type(back), back.step_id, str(back)) == (type(err), err.step_id, str(err))
