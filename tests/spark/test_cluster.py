"""`flowspark submit` against a real Spark standalone cluster (one master, one worker, on 127.0.0.1).

The master and the worker are started with pyspark's own `bin/spark-class`, on free
ports chosen at run time, and stopped by pid when the module's tests are done.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pyspark = pytest.importorskip("pyspark")

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
START_TIMEOUT = 180  # seconds; the machine is shared, a JVM may take a while
SUBMIT_TIMEOUT = 600

FLOW = textwrap.dedent(
    """
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.inputs import DirSource
    from flowspark.outputs import FileSink
    from {pkg}.parse import parse_line

    def add(total, amount):
        total = (total or 0) + amount
        return total, total

    def get_flow(in_dir, out_path):
        flow = Dataflow("cluster_totals")
        lines = op.input("inp", flow, DirSource(in_dir))
        keyed = op.filter_map("parse", lines, parse_line)
        totals = op.stateful_map("total", keyed, add)
        op.output("out", op.map("fmt", totals, lambda kv: (kv[0], f"{{kv[0]}},{{kv[1]}}")), FileSink(out_path))
        return flow
    """
)

PARSE = textwrap.dedent(
    """
    def parse_line(line):
        user, _, amount = line.partition(",")
        if not amount:
            return None
        return user, int(amount)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout: float, what: str, procs) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p, log in procs:
            if p.poll() is not None:
                raise RuntimeError(
                    f"{what}: process {p.pid} exited with {p.returncode}; log:\n{log.read_text()[-3000:]}"
                )
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not ready after {timeout} s")


def _can_connect(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Start a standalone master and one worker (1 core, 1 GB); yield (master URL, worker dir); stop both by pid."""
    base = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(base / "work")}
    env.pop("SPARK_CONF_DIR", None)
    mport, mweb, wport, wweb = (_free_port() for _ in range(4))
    started: list[tuple[subprocess.Popen, Path]] = []
    files = []
    try:
        mlog = base / "master.log"
        f = open(mlog, "w")  # noqa: SIM115
        files.append(f)
        master = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
            + ["--port", str(mport), "--webui-port", str(mweb)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
        started.append((master, mlog))
        t0 = time.monotonic()
        _wait_for(lambda: _can_connect(mport), START_TIMEOUT, "spark master", started)
        master_up = time.monotonic() - t0
        url = f"spark://127.0.0.1:{mport}"
        wlog = base / "worker.log"
        f = open(wlog, "w")  # noqa: SIM115
        files.append(f)
        worker = subprocess.Popen(
            [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1"]
            + ["--port", str(wport), "--webui-port", str(wweb), "--cores", "1", "--memory", "1g"]
            + ["--work-dir", str(base / "work"), url],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
        started.append((worker, wlog))
        t0 = time.monotonic()
        _wait_for(
            lambda: "Successfully registered with master" in wlog.read_text(), START_TIMEOUT, "spark worker", started
        )
        worker_up = time.monotonic() - t0
        print(f"\nstandalone master up in {master_up:.1f} s, worker registered in {worker_up:.1f} s")
        yield url, base / "work"
    finally:
        for proc, _log in reversed(started):
            _stop(proc)
        for f in files:
            f.close()


@pytest.fixture
def project(tmp_path):
    pkg = "clusterflows"
    d = tmp_path / "proj" / pkg
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("")
    (d / "parse.py").write_text(PARSE)
    (d / "flows.py").write_text(FLOW.format(pkg=pkg))
    data = tmp_path / "in"
    data.mkdir()
    users = ["ann", "bob", "cy", "dee", "eve"]
    for part in range(3):
        rows = [f"{users[(part * 7 + i) % 5]},{(part + 1) * 10 + i}" for i in range(40)]
        (data / f"part{part}.csv").write_text("\n".join(rows) + "\n")
    return tmp_path / "proj", pkg, data


def _by_key(lines):
    out = defaultdict(list)
    for ln in lines:
        k, _, v = ln.partition(",")
        out[k].append(int(v))
    return dict(out)


def test_submit_to_standalone_cluster(cluster, project, tmp_path):
    cluster, work = cluster
    cwd, pkg, data = project
    out = tmp_path / "out.csv"
    import_str = f"{pkg}/flows.py:get_flow({str(data)!r}, {str(out)!r})"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYTHONPATH", None)  # the workers must get the flow from the shipped zip
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "flowspark", "submit", import_str, "--master", cluster]
        + ["--conf", "spark.executor.memory=512m", "--conf", "spark.sql.shuffle.partitions=2"]
        + ["--work-dir", str(tmp_path / "submit")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT,
    )
    took = time.monotonic() - t0
    print(f"flowspark submit took {took:.1f} s")
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    assert "\tat " not in res.stderr
    # the same flow on the in-memory executor
    sys.path.insert(0, str(cwd))
    try:
        from flowspark._importstr import locate_dataflow
        from flowspark.runtime.local import run_main

        expected_path = tmp_path / "expected.csv"
        run_main(locate_dataflow(f"{cwd / pkg}/flows.py:get_flow({str(data)!r}, {str(expected_path)!r})"))
    finally:
        sys.path.remove(str(cwd))
    got = out.read_text().splitlines()
    want = expected_path.read_text().splitlines()
    assert len(want) == 120
    assert sorted(got) == sorted(want)
    assert _by_key(got) == _by_key(want)  # per key in input order
    # the application ran on the cluster: the worker launched an executor for it
    assert any(work.glob("app-*/*/stderr")), list(work.iterdir())


def test_submit_reports_user_error_in_one_line(cluster, project, tmp_path):
    cluster, _work = cluster
    cwd, pkg, data = project
    (data / "bad.csv").write_text("zed,notanumber\n")
    out = tmp_path / "out.csv"
    res = subprocess.run(
        [sys.executable, "-m", "flowspark", "submit", f"{pkg}/flows.py:get_flow({str(data)!r}, {str(out)!r})"]
        + ["--master", cluster, "--conf", "spark.executor.memory=512m", "--conf", "spark.task.maxFailures=1"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT,
    )
    assert res.returncode == 1
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("flowspark: error:")]
    assert len(errors) == 1, res.stderr
    assert "step 'cluster_totals.parse" in errors[0]
    assert "ValueError" in errors[0]
    assert "notanumber" in errors[0]
    assert "\tat " not in res.stderr
