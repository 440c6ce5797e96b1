"""`flowspark.spark.run` refuses an option the chosen runtime does not take, before Spark starts."""

from __future__ import annotations

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkTypeError
from flowspark.inputs import SimplePollingSource
from flowspark.spark import run
from flowspark.testing import TestingSink, TestingSource


class _Forever(SimplePollingSource):
    def next_item(self):
        return 1


def _flow(bounded: bool) -> Dataflow:
    from datetime import timedelta

    flow = Dataflow("opts")
    src = TestingSource([1]) if bounded else _Forever(timedelta(seconds=1))
    op.output("out", op.input("inp", flow, src), TestingSink([]))
    return flow


@pytest.mark.parametrize(
    ("bounded", "option", "needle"),
    [
        (True, "buckets", "runs as a batch job, and it applies only to streaming queries"),
        (False, "float_reductions", "runs as a streaming query, and it applies only to batch jobs"),
        (True, "bogus", "flowspark.spark.run has no such option"),
        (False, "bogus", "flowspark.spark.run has no such option"),
    ],
)
def test_an_option_of_the_other_runtime_is_a_clear_error(bounded: bool, option: str, needle: str) -> None:
    # A source that never says it ends runs as a stream with a checkpoint (without one: a batch job).
    given = {} if bounded else {"checkpoint": "/nonexistent/flowspark-ck"}
    with pytest.raises(FlowsparkTypeError, match=needle) as info:
        run(_flow(bounded), **given, **{option: 4})
    assert f"option {option}=4" in str(info.value)
