"""The `runtime` fixture: every conformance test runs on the in-memory executor and on Spark."""

from __future__ import annotations

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


@pytest.fixture(params=["local", pytest.param("spark", marks=pytest.mark.spark)])
def runtime(request):
    if request.param == "local":

        def run_local(flow, start_time):
            # roundtrip_state: every key resumes from its pickled snapshot after each source
            # batch, as on Spark streaming, and must behave as the live logic would.
            if start_time is None:
                run_main(flow, roundtrip_state=True)
            else:
                run_main(flow, clock="fixed", start_time=start_time, roundtrip_state=True)

        return Runtime("local", run_local)
    spark = request.getfixturevalue("spark")
    from flowspark.spark import run

    def run_spark(flow, start_time):
        run(flow, spark=spark, start_time=start_time)

    return Runtime("spark", run_spark)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """`@pytest.mark.notimpl(["spark"], raises=Exc, reason=..., match=...)`, as in ibis's backend suite.

    On a runtime the marker names, the test must raise `raises` (with `match` in
    its message when given): it passes then, and fails if it raises nothing (the
    runtime learned the feature: drop the marker) or something else.
    """
    callspec = getattr(pyfuncitem, "callspec", None)
    name = callspec.params.get("runtime") if callspec is not None else None
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
