"""`flowspark run` makes every check that needs no JVM before a SparkSession starts (no Spark here)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

pytest.importorskip("pyspark")

from flowspark.cli import main
from flowspark.spark.streaming.checkpoint import META_FILE, check_layout, check_meta, check_untimed
from flowspark.spark.streaming.state import LAYOUTS

FLOWS = textwrap.dedent(
    """
    from datetime import timedelta

    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.inputs import SimplePollingSource
    from flowspark.operators import StatefulLogic
    from flowspark.testing import TestingSink, TestingSource


    class Tick(SimplePollingSource):
        def next_item(self):
            return "a"


    def counts(flow_id="tick"):
        flow = Dataflow(flow_id)
        s = op.key_on("key", op.input("inp", flow, Tick(timedelta(seconds=1))), str)
        op.output("out", op.stateful_map("count", s, lambda n, x: ((n or 0) + 1, n)), TestingSink([]))
        return flow


    class Sum(StatefulLogic):  # may ask for a notification: the query needs timers
        def __init__(self, resume):
            self.n = resume or 0

        def on_item(self, value):
            self.n += 1
            return [], False

        def on_notify(self):
            return [self.n], True

        def notify_at(self):
            return None

        def snapshot(self):
            return self.n


    def timed():
        flow = Dataflow("timed")
        s = op.key_on("key", op.input("inp", flow, Tick(timedelta(seconds=1))), str)
        op.output("out", op.stateful("sum", s, Sum), TestingSink([]))
        return flow


    bounded = Dataflow("bounded")
    op.output("out", op.input("inp", bounded, TestingSource([1])), TestingSink([]))
    """
)
COUNT_STEPS = ["tick.count.stateful_batch"]


class SessionStarted(Exception):
    """Raised by the patched session functions: the CLI got as far as starting Spark."""


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """A directory with `flows.py`; any attempt to start a SparkSession raises `SessionStarted`."""
    (tmp_path / "flows.py").write_text(FLOWS)
    monkeypatch.chdir(tmp_path)
    _BEFORE[0] = _context()

    def started(*args, **kwargs):
        raise SessionStarted

    import flowspark.spark.session as session

    for name in ("get_session", "open_session", "connect_session"):
        monkeypatch.setattr(session, name, started)
    yield tmp_path
    sys.modules.pop("flows", None)  # the next test imports its own flows.py


def _context() -> object:
    from pyspark import SparkContext  # noqa: TID251

    return SparkContext._active_spark_context


#: The SparkContext when the test started (`cwd`): none in a run of the fast loop, the shared
#: session's when the Spark tests ran first (the full suite); a run of the CLI must not change it.
_BEFORE: list[object] = [None]


def _no_spark():
    assert _context() is _BEFORE[0]


def _refused(capsys, argv):
    """Run the CLI; return its one error line (exit 1, no session started)."""
    assert main(argv) == 1
    _no_spark()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("flowspark: error: ")
    return err[0]


def _checkpoint(path, flow_id="tick", buckets=64, steps=COUNT_STEPS, timers=False, layout="bucket", ran=True):
    """A checkpoint directory as a streaming run leaves it: `flowspark.json` written by the code's own functions."""
    path.mkdir()
    check_meta(str(path), flow_id, buckets, steps, timers)
    check_layout(str(path), layout, LAYOUTS)
    if ran:
        (path / "query").mkdir()  # Spark's checkpoint of the query: the layout is now fixed
    return str(path)


def test_another_bucket_count_is_refused_before_spark(cwd, capsys):
    ck = _checkpoint(cwd / "ck", buckets=8)
    line = _refused(capsys, ["run", "flows.py:counts()", "--checkpoint", ck, "--buckets", "16"])
    assert "was written with buckets=8; received buckets=16" in line


def test_without_buckets_a_run_takes_the_checkpoints(cwd, capsys):
    from flowspark.spark.streaming.checkpoint import recorded_buckets

    ck = _checkpoint(cwd / "ck", buckets=8)
    assert recorded_buckets(ck) == 8
    assert recorded_buckets(str(cwd / "new")) is None
    with pytest.raises(SessionStarted):  # no --buckets: the recorded 8 is the run's, nothing refused
        main(["run", "flows.py:counts()", "--checkpoint", ck])
    line = _refused(capsys, ["run", "flows.py:counts()", "--checkpoint", ck, "--buckets", "64"])
    assert "was written with buckets=8; received buckets=64" in line


def test_a_checkpoint_of_another_flow_is_refused_before_spark(cwd, capsys):
    ck = _checkpoint(cwd / "ck", flow_id="other", steps=["other.count.stateful_batch"])
    line = _refused(capsys, ["run", "flows.py:counts()", "--checkpoint", ck])
    assert "belongs to dataflow 'other'" in line
    assert "this is dataflow 'tick'" in line


def test_another_state_layout_is_refused_before_spark(cwd, capsys):
    ck = _checkpoint(cwd / "ck", layout="bucket")
    line = _refused(capsys, ["run", "flows.py:counts()", "--checkpoint", ck, "--state-layout", "key"])
    assert "keeps its state in the 'bucket' layout; received state_layout='key'" in line


def test_a_state_ttl_on_an_untimed_checkpoint_is_refused_before_spark(cwd, capsys):
    path = cwd / "ck"
    _checkpoint(path, layout="chunk", ran=False)
    check_untimed(str(path), "chunk", False, False)  # what run_streaming records before the query starts
    (path / "query").mkdir()
    line = _refused(capsys, ["run", "flows.py:counts()", "--checkpoint", str(path), "--state-ttl", "3600"])
    assert "was written by a query without state_ttl, whose state rows carry no TTL; received a state_ttl" in line


def test_timers_on_a_timerless_checkpoint_are_refused_before_spark(cwd, capsys):
    ck = _checkpoint(cwd / "ck", flow_id="timed", steps=["timed.sum.stateful_batch"], timers=False)
    line = _refused(capsys, ["run", "flows.py:timed()", "--checkpoint", ck])
    assert "written by a query without timers" in line


def test_float_reductions_on_a_streaming_run_is_refused_before_spark(cwd, capsys):
    line = _refused(capsys, ["run", "flows.py:counts()", "--checkpoint", str(cwd / "ck"), "--float-reductions"])
    assert "--float-reductions applies to batch runs" in line
    assert "drop --float-reductions" in line


def test_a_bounded_flow_with_streaming_flags_is_refused_before_spark(cwd, capsys):
    line = _refused(capsys, ["run", "flows.py:bounded", "--checkpoint", str(cwd / "ck"), "--buckets", "4"])
    assert "every source of this flow is bounded" in line


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--buckets", "0", "argument --buckets: expected a positive integer; received '0'"),
        ("--buckets", "many", "argument --buckets: expected a positive integer; received 'many'"),
        ("--trigger", "soon", "argument --trigger: trigger 'soon' is neither available_now"),
    ],
)
def test_bad_values_are_usage_errors_before_spark(cwd, capsys, flag, value, said):
    with pytest.raises(SystemExit) as exc:
        main(["run", "flows.py:counts()", "--checkpoint", str(cwd / "ck"), flag, value])
    assert exc.value.code == 2
    _no_spark()
    assert said in capsys.readouterr().err


def test_a_fitting_checkpoint_passes_and_is_not_written(cwd):
    """The checks pass a checkpoint the run fits (then the session starts) and write nothing."""
    ck = _checkpoint(cwd / "ck", buckets=8, layout="key")
    before = (cwd / "ck" / META_FILE).read_text()
    with pytest.raises(SessionStarted):
        main(["run", "flows.py:counts()", "--checkpoint", ck, "--buckets", "8"])
    assert (cwd / "ck" / META_FILE).read_text() == before
    assert json.loads(before)["state_layout"] == "key"
    with pytest.raises(SessionStarted):  # a new checkpoint: nothing to check against, nothing written yet
        main(["run", "flows.py:counts()", "--checkpoint", str(cwd / "new"), "--state-layout", "key"])
    assert not (cwd / "new" / META_FILE).exists()
