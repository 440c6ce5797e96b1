"""The `runtime` fixture: every conformance test runs on the in-memory executor and on Spark."""

from __future__ import annotations

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
            if start_time is None:
                run_main(flow)
            else:
                run_main(flow, clock="fixed", start_time=start_time)

        return Runtime("local", run_local)
    spark = request.getfixturevalue("spark")
    from flowspark.spark import run

    def run_spark(flow, start_time):
        run(flow, spark=spark, start_time=start_time)

    return Runtime("spark", run_spark)


def only_on(runtime: Runtime, name: str, reason: str) -> None:
    if runtime.name != name:
        pytest.skip(reason)
