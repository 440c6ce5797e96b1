"""The `runtime` fixture: every conformance test runs on the in-memory executor, Spark batch and Spark streaming.

Spark streaming reads each case's `TestingSource`s as unbounded sources through the Python data
source, in two runs of an `available_now` query on one fresh checkpoint: an end-of-input marker
is put in the middle of each source's items, so the first run reads the first half and the
restart continues with the rest from the checkpoint. Streaming has no end of input: what only
end of input emits (`*_final` operators, windows and `collect` closing at EOF, `on_eof`,
`join(emit_mode="final")`) is marked on the case with `notimpl(["spark-streaming"], ...)`.

"spark-streaming" runs on a new checkpoint's default state layout ("chunk");
"spark-streaming-key" and "spark-streaming-bucket" run the streaming cases on the key and bucket
state layouts, which must give the same results; a case whose plan has no keyed stage keeps no
keyed state, runs the same query on every layout, and is skipped there (saying so).

A case marked `notimpl` on spark-streaming for output only end of input emits (`at_eof_only`,
marker argument `end_of_input=True`) runs there, and must fail there as marked; every other
streaming runtime (the layouts, rules off, Spark Connect) skips it, saying so: a stream never
reaches end of input on any of them, so such a run could only prove that failure again.

"spark-rules-none" and "spark-streaming-rules-none" run the same lowerings with every
optimizer rule switched off (`rules="none"`, the reference lowering): each rule's fast path must
give the results the reference does (`flowspark.spark.rules.optimizer`). They behave as "spark" and
"spark-streaming" for `notimpl` markers. A case to which no rule applies runs the same lowering
either way, and is skipped there (saying so).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Optional

import pytest

from flowspark.testing import run_main


@dataclass
class Runtime:
    """A way to run a dataflow to completion.

    `run(flow, start_time=...)`: with a `start_time`, time is logical and fixed at
    it (local: `run_main(clock="fixed")`; Spark: `run(start_time=...)`).
    """

    name: str
    _run: Callable[..., None]

    def run(self, flow: Any, *, start_time: Optional[datetime] = None) -> None:
        self._run(flow, start_time)


def _split_in_two_runs(flow: Any) -> None:
    """Put `TestingSource.EOF()` in the middle of every TestingSource of `flow` (see the module doc)."""
    from flowspark import ir
    from flowspark.testing import TestingSource

    for node in flow.graph().nodes:
        src = getattr(node, "source", None)
        if isinstance(node, ir.Input) and isinstance(src, TestingSource):
            items = list(src.items)
            if len(items) > 1 and not any(isinstance(x, (TestingSource.EOF, TestingSource.ABORT)) for x in items):
                half = len(items) // 2
                src._ib = [*items[:half], TestingSource.EOF(), *items[half:]]  # noqa: SLF001


#: `sc://HOST:PORT`: the suite runs through that Spark Connect server instead, on the runtimes
#: "spark-connect" (batch) and "spark-connect-streaming" (tests/spark/test_connect.py sets it in a
#: process of its own: a Connect session switches pyspark to Connect mode for the whole process).
_CONNECT = os.environ.get("FLOWSPARK_TEST_CONNECT")

#: Runtimes that behave as another one (the `notimpl` markers name the latter).
_SAME_AS = {
    "spark-connect": "spark",
    "spark-connect-streaming": "spark-streaming",
    "spark-rules-none": "spark",
    "spark-streaming-rules-none": "spark-streaming",
    "spark-streaming-key": "spark-streaming",
    "spark-streaming-bucket": "spark-streaming",
}

#: Streaming runtimes on an explicit state layout (the others run on a new checkpoint's default).
_LAYOUT = {"spark-streaming-key": "key", "spark-streaming-bucket": "bucket"}

#: Runtimes that run with every optimizer rule switched off.
_RULES_NONE = {"spark-rules-none", "spark-streaming-rules-none"}

_PARAMS = (
    [
        "local",
        pytest.param("spark", marks=pytest.mark.spark),
        pytest.param("spark-streaming", marks=[pytest.mark.spark, pytest.mark.slow]),
        pytest.param("spark-rules-none", marks=pytest.mark.spark),
        pytest.param("spark-streaming-rules-none", marks=[pytest.mark.spark, pytest.mark.slow]),
        pytest.param("spark-streaming-key", marks=[pytest.mark.spark, pytest.mark.slow]),
        pytest.param("spark-streaming-bucket", marks=[pytest.mark.spark, pytest.mark.slow]),
    ]
    if not _CONNECT
    else [
        pytest.param("spark-connect", marks=pytest.mark.spark),
        pytest.param("spark-connect-streaming", marks=[pytest.mark.spark, pytest.mark.slow]),
    ]
)


@pytest.fixture(scope="session")
def connect_spark():
    """A Spark Connect session on the server `FLOWSPARK_TEST_CONNECT` names."""
    from pyspark.sql import SparkSession  # noqa: TID251

    session = SparkSession.builder.remote(_CONNECT).getOrCreate()
    yield session
    session.stop()


@pytest.fixture(params=_PARAMS)
def runtime(request, tmp_path):
    if request.param == "local":

        def run_local(flow, start_time):
            # roundtrip_state: every key resumes from its pickled snapshot after each source
            # batch, as on Spark streaming, and must behave as the live logic would.
            if start_time is None:
                run_main(flow, roundtrip_state=True)
            else:
                run_main(flow, clock="fixed", start_time=start_time, roundtrip_state=True)

        return Runtime("local", run_local)
    spark = request.getfixturevalue("connect_spark" if _CONNECT else "spark")
    rules = "none" if request.param in _RULES_NONE else None  # None: FLOWSPARK_RULES, else all
    if _SAME_AS.get(request.param, request.param) == "spark-streaming":
        from flowspark.spark.streaming import run_streaming

        def run_stream(flow, start_time):
            from flowspark.spark.versions import PYTHON_STREAM_SOURCE, lacks

            why = lacks(PYTHON_STREAM_SOURCE)
            if why is not None:  # tests/spark/test_versions.py checks the error such a run gives
                pytest.skip(f"the cases stream TestingSources: {why}")
            if request.param != "spark-streaming" and _ends_at_end_of_input(request.node):
                pytest.skip(
                    "expects what only end of input emits, which a stream never reaches: the case fails as "
                    "marked on spark-streaming, and a state layout, rules off or Spark Connect cannot change that"
                )
            if request.param in _LAYOUT and not _has_keyed_stage(flow):
                pytest.skip("no keyed stage, so no keyed state: the same query as on spark-streaming")
            if rules == "none" and not _a_rule_applies(flow, streaming=True):
                pytest.skip("no optimizer rule applies to this flow: the same lowering as on spark-streaming")
            _split_in_two_runs(flow)
            clock = None if start_time is None else _Fixed(start_time)
            for _ in range(2):
                run_streaming(
                    flow,
                    spark=spark,
                    checkpoint=str(tmp_path / "chk"),
                    trigger="available_now",
                    progress=False,
                    clock=clock,
                    max_items=1000,
                    rules=rules,
                    state_layout=_LAYOUT.get(request.param),
                )

        return Runtime(request.param, run_stream)
    from flowspark.spark import run

    def run_spark(flow, start_time):
        if rules == "none" and not _a_rule_applies(flow, streaming=False):
            pytest.skip("no optimizer rule applies to this flow: the same lowering as on spark")
        run(flow, spark=spark, start_time=start_time, rules=rules)

    return Runtime(request.param, run_spark)


def _ends_at_end_of_input(node: Any) -> bool:
    """Whether the case is marked `notimpl` on spark-streaming for output that only end of input emits."""
    return any(m.kwargs.get("end_of_input") for m in node.iter_markers("notimpl"))


def _plan_or_none(flow: Any) -> Any:
    """The flow's Spark plan, or `None` when compiling fails (the run itself raises that, as the case expects)."""
    from flowspark.spark import compile_flow

    try:
        return compile_flow(flow.validate())
    except Exception:  # noqa: BLE001
        return None


def _has_keyed_stage(flow: Any) -> bool:
    """Whether the flow's Spark plan has a keyed stage: the only stages whose query a state layout changes."""
    plan = _plan_or_none(flow)
    return plan is None or any(st.kind == "keyed" for st in plan.stages)


def _a_rule_applies(flow: Any, *, streaming: bool) -> bool:
    """Whether some optimizer rule applies to a stage or sink of the flow's physical plan.

    Decided without a session (as `flowspark plan --no-physical`), which for a flow of
    `TestingSource`s and `TestingSink`s decides every stage and sink rule as a run does (those
    rules read a session only for a `SparkSource`'s or `SparkSink`'s columns). When none applies,
    `rules="none"` runs the same stages and sinks: only the query rule `lean_listener`, how the
    progress listener reads events, differs (the Spark Connect runs take the other path).
    """
    from flowspark.spark import SparkSink, SparkSource
    from flowspark.spark.rules.optimizer import Env, optimize
    from flowspark.spark.rules.switches import rules_arg
    from flowspark.spark.streaming.lowering import offline_env

    plan = _plan_or_none(flow)
    if plan is None:
        return True  # run both: the run raises the compile error
    if any(isinstance(st.source, SparkSource) for st in plan.stages) or any(
        isinstance(sk.sink, SparkSink) for sk in plan.sinks
    ):
        return True  # their rules read the session: run both
    chosen = rules_arg("all")
    env = offline_env(plan, chosen) if streaming else Env("batch", chosen[0], chosen[1], session=False)
    return any(d.applied for d in optimize(plan, env).decisions)


@dataclass(frozen=True)
class _Fixed:
    """A clock standing still at `t` (picklable: workers read it)."""

    t: datetime

    def __call__(self) -> datetime:
        return self.t


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """`@pytest.mark.notimpl(["spark"], raises=Exc, reason=..., match=...)`, as in ibis's backend suite.

    On a runtime the marker names, the test must raise `raises` (with `match` in
    its message when given): it passes then, and fails if it raises nothing (the
    runtime learned the feature: drop the marker) or something else.
    """
    callspec = getattr(pyfuncitem, "callspec", None)
    name = callspec.params.get("runtime") if callspec is not None else None
    name = _SAME_AS.get(name, name)
    marker = next(
        (m for m in pyfuncitem.iter_markers("notimpl") if name is not None and name in m.args[0]),
        None,
    )
    if marker is None:
        return (yield)
    raises = marker.kwargs["raises"]
    match = marker.kwargs.get("match")
    try:
        yield
    except raises as e:
        if match is not None and not re.search(match, str(e)):
            raise
        return True
    pytest.fail(
        f"marked notimpl on {name!r} ({marker.kwargs['reason']}) but it raised no {raises.__name__}; drop the marker"
    )
