"""Spark Connect: flows run through a local Connect server started from the pyspark wheel.

Each case runs in a process of its own (`connect_driver.py`, or pytest on the conformance
suite): a Connect session switches pyspark to Connect mode for its whole process, and this
process holds the classic test session.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from connect_server import client_env as _env
from connect_server import scenario as _scenario
from connect_server import start_server, stop_server

from flowspark.testing import per_key

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    url, proc = start_server(tmp_path_factory.mktemp("connect-server"))
    yield url
    stop_server(proc)


# Every batch case, and one streaming case for each way an output or an error reaches the caller
# through Connect (every streaming case through Connect takes about 16 minutes: too long for CI's
# budget). What a case computes is the workers' business, the same as in a classic session: the
# classic conformance runs prove it. So one inspector run at the caller (a custom one; `stdout` and
# `inspect_debug` print there), one stateful_map, one timer flow (tumbling windows), a stream read by
# a sink and a stateful step, a join, and the user errors: wording, cause, a local class as the cause.
# Two tests, so that each stays well within the per-test timeout on a slow CI machine.
_SELECT = {
    "batch": "spark-connect]",
    "streaming": (
        "spark-connect-streaming and (inspect_custom or stdout or inspect_debug or running_sum "
        "or keyed_stream_read or join_complete or tumbling or user_error_is_the_cause "
        "or class_defined_in_a_function or stateless_step_names_the_item)"
    ),
}


@pytest.mark.parametrize("part", sorted(_SELECT))
def test_conformance_suite_through_connect(server, tmp_path, part):
    """The conformance suite through the Connect server: batch, and a selection of the streaming cases."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5"]
    # A case that hangs fails on its own (with its threads' stacks) and the others go on.
    cmd += ["-o", "timeout=240", "-k", _SELECT[part], str(ROOT / "tests" / "conformance")]
    env = {**_env(), "FLOWSPARK_TEST_CONNECT": server}
    try:
        # Below pytest's per-test timeout, so that a slow run still shows its output.
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=840, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        pytest.fail(f"conformance through Connect ({part}) took over 840 s:\n{out[-4000:]}\n{err[-3000:]}")
    tail = r.stdout[-4000:]
    print(tail[-1500:])  # the slowest cases (shown with -rA)
    assert r.returncode == 0, f"conformance through Connect failed:\n{tail}\n{r.stderr[-3000:]}"
    assert " passed" in tail
    assert "spark-connect" not in r.stderr


def test_stream_with_a_sink_at_the_caller_restarts_from_its_checkpoint(server, tmp_path):
    res = _scenario("stream", server, tmp_path)
    expected = [tuple(x) for x in res["expected"]]
    got = [tuple(x) for x in res["first"] + res["second"]]
    # Per key, the in-memory executor's order; nothing lost or repeated across the restart.
    assert sorted(got) == sorted(expected)
    for key in {k for k, _ in expected}:
        assert [n for k, n in got if k == key] == [n for k, n in expected if k == key]
    assert ("u0", 6) in [tuple(x) for x in res["second"]]
    assert ("u5", 1) in [tuple(x) for x in res["second"]]
    assert res["outbox"]
    assert any(line.startswith("[flowspark] batch 0: 11 input rows") for line in res["lines"]), res["lines"]


def test_a_sink_failing_at_the_caller_stops_the_stream_and_loses_nothing(server, tmp_path):
    res = _scenario("sink_down", server, tmp_path)
    err = res["error"]
    assert err is not None
    assert err["type"] == "FlowsparkRuntimeError"
    assert err["step_id"] == "connect_count.out"
    assert "ConnectionError: the sink is down" in err["message"]
    assert res["during"] == []
    assert sorted(tuple(x) for x in res["after"]) == [("u1", 1), ("u1", 2), ("u2", 1)]


def test_a_user_error_in_a_stream_names_the_step(server, tmp_path):
    res = _scenario("stream_user_error", server, tmp_path)
    assert res["type"] == "FlowsparkRuntimeError"
    assert res["step_id"] == "connect_count.key.flat_map_batch"
    assert "KeyError: 'user'" in res["message"]
    assert res["cause"] == "KeyError('user')"  # the worker's exception, through the Connect client


def test_a_stream_to_a_spark_sink_through_connect(server, tmp_path):
    res = _scenario("parquet_sink", server, tmp_path)
    assert [tuple(x) for x in res["rows"]] == [
        ("u0", 1),
        ("u0", 2),
        ("u1", 1),
        ("u1", 2),
        ("u1", 3),
        ("u1", 4),
        ("u2", 1),
    ]


def test_a_batch_jobs_two_spark_sinks_are_written_at_once_through_connect(server, tmp_path):
    res = _scenario("two_sinks", server, tmp_path, quiet=True)
    assert res["decision"].startswith("rule concurrent_sinks: applied (the writes share the Spark aggregate")
    assert res["rows"] == {
        "counts": [[10, "u0"], [10, "u1"], [10, "u2"]],  # inferred: a dict's keys by name, as createDataFrame
        "totals": [["u0", 135], ["u1", 145], ["u2", 155]],
    }


def test_available_now_through_connect_processes_every_file_there_at_its_start(server, tmp_path):
    res = _scenario("complete", server, tmp_path, quiet=True)
    assert res["streamed"] == res["expected"]


def test_the_guides_connect_example_runs(server, tmp_path):
    """docs/howto/connect.md's Python block: a batch job and a stream through the server, each run_main's per key."""
    res = _scenario("docs_connect", server, tmp_path)
    expected = per_key(tuple(x) for x in res["expected"])
    assert per_key(tuple(x) for x in res["batch"]) == expected
    assert per_key(tuple(x) for x in res["streamed"]) == expected


def test_cli_run_remote(server, tmp_path):
    flow = tmp_path / "cliflow.py"
    flow.write_text(
        "import flowspark.operators as op\n"
        "from flowspark.dataflow import Dataflow\n"
        "from flowspark.outputs import StdOutSink\n"
        "from flowspark.testing import TestingSource\n"
        "flow = Dataflow('cli')\n"
        "s = op.input('inp', flow, TestingSource([('a', 1), ('b', 2), ('a', 3)]))\n"
        "op.output('out', op.stateful_map('sum', s, lambda st, v: ((st or 0) + v, (st or 0) + v)), StdOutSink())\n"
    )
    cmd = [sys.executable, "-m", "flowspark", "run", str(flow), "--remote", server]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(r.stdout.splitlines()) == ["('a', 1)", "('a', 4)", "('b', 2)"]
    bad = subprocess.run(
        [*cmd[:-1], "sc://localhost:1"], capture_output=True, text=True, env=_env(), timeout=120, cwd=tmp_path
    )
    assert bad.returncode == 1
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith("flowspark: error: cannot reach the Spark Connect server sc://localhost:1")
    )


def test_workers_without_flowspark_get_it_for_batch_and_streams(tmp_path):
    """The server's workers run a Python that cannot import flowspark (no site processing)."""
    wrapper = tmp_path / "worker-python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    # `-S` skips the editable install's .pth: the workers see site-packages (pyarrow, pandas) only.
    # No Python worker reuse: a worker that ran one carried function has flowspark on its
    # path, so reuse would hide a function or class that is not carried.
    url, proc = start_server(
        tmp_path / "server",
        worker_python=str(wrapper),
        env={"PYTHONPATH": os.pathsep.join(site.getsitepackages())},
        conf={"spark.python.worker.reuse": "false"},
    )
    try:
        res = _scenario("no_flowspark", url, tmp_path)
    finally:
        stop_server(proc)
    assert [tuple(x) for x in res["batch"]] == [("a", 1), ("a", 4), ("b", 2)]
    assert res["carried"]  # flowspark had to ship itself
    # The stream's tasks and its data source get flowspark from the carriers: the same
    # per-key results as in memory, across a restart from the checkpoint.
    got = [tuple(x) for x in res["first"] + res["second"]]
    assert res["first"]
    assert res["second"]
    assert per_key(got) == per_key([tuple(x) for x in res["expected"]])
    assert per_key([tuple(x) for x in res["key_layout"]]) == per_key([tuple(x) for x in res["expected"]])
    assert res["lines"]
