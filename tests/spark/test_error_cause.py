"""On Spark, an exception the worker cannot pickle: the error of today, without a cause.

(A step's exception that pickles is the `__cause__` on every runtime: the conformance suite's
`test_a_user_error_*_cause*` cases.)
"""

from __future__ import annotations

import pickle

import pytest
from error_helpers import LockedBoom, locked_boom_on_2

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.testing import TestingSink, TestingSource

pytestmark = pytest.mark.spark


def _flow() -> Dataflow:
    flow = Dataflow("t")
    s = op.map("m", op.input("inp", flow, TestingSource([1, 2, 3])), locked_boom_on_2)
    op.output("out", s, TestingSink([]))
    return flow


@pytest.mark.parametrize("mode", ["batch", pytest.param("streaming", marks=pytest.mark.slow)])
def test_an_exception_the_worker_cannot_pickle_keeps_its_type_and_message(spark, tmp_path, mode):
    with pytest.raises(TypeError):  # why it travels without a cause: it holds a lock
        pickle.dumps(LockedBoom("x"))
    if mode == "batch":
        from flowspark.spark import run

        def go() -> None:
            run(_flow(), spark=spark)
    else:
        from flowspark.spark.streaming import run_streaming

        def go() -> None:
            run_streaming(
                _flow(), spark=spark, checkpoint=str(tmp_path / "chk"), trigger="available_now", progress=False
            )

    with pytest.raises(FlowsparkRuntimeError) as info:
        go()
    err = info.value
    assert str(err) == "error in step 't.m.flat_map_batch': LockedBoom: kaboom on 2 (item: 2)"
    assert (err.step_id, err.exc_type, err.exc_message) == ("t.m.flat_map_batch", "LockedBoom", "kaboom on 2")
    assert err.__cause__ is None
