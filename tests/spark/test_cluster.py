"""`flowspark submit` against a real Spark standalone cluster (one master, two workers, on 127.0.0.1).

The master and the workers (one core each, so each application gets one executor JVM per
worker) are started once per module with pyspark's own `bin/spark-class`, on free ports
chosen at run time, and stopped by pid when the module's tests are done. A batch flow, a
user error, and a streaming flow with keyed state and timers that loses an executor and
then its driver run on it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional
from urllib.parse import unquote, urlparse

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

pyspark = pytest.importorskip("pyspark")

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
# The cluster's JVMs and the drivers run small jobs on a shared 2-core machine: the client compiler
# only (no C2 compiler threads competing for the cores) and the serial collector.
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
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


@dataclass
class Cluster:
    """A running standalone cluster: the master's URL and each worker's process and work directory."""

    url: str
    workers: list[tuple[subprocess.Popen, Path]]


def _start(cmd: list[str], log: Path, env: dict, started: list, files: list) -> subprocess.Popen:
    f = open(log, "w")  # noqa: SIM115
    files.append(f)
    proc = subprocess.Popen([str(SPARK_CLASS), *cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
    started.append((proc, log))
    return proc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Start a standalone master and two workers (1 core, 1 GB each); yield a `Cluster`; stop them by pid."""
    base = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS}
    env.pop("SPARK_CONF_DIR", None)
    mport, mweb = _free_port(), _free_port()
    started: list[tuple[subprocess.Popen, Path]] = []
    files: list = []
    try:
        _start(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(mport)]
            + ["--webui-port", str(mweb)],
            base / "master.log",
            env,
            started,
            files,
        )
        t0 = time.monotonic()
        _wait_for(lambda: _can_connect(mport), START_TIMEOUT, "spark master", started)
        master_up = time.monotonic() - t0
        url = f"spark://127.0.0.1:{mport}"
        workers = []
        t0 = time.monotonic()
        for n in (1, 2):
            work = base / f"work{n}"
            proc = _start(
                ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(_free_port())]
                + ["--webui-port", str(_free_port()), "--cores", "1", "--memory", "1g", "--work-dir", str(work), url],
                base / f"worker{n}.log",
                {**env, "SPARK_WORKER_DIR": str(work), "SPARK_LOCAL_DIRS": str(base / f"local{n}")},
                started,
                files,
            )
            workers.append((proc, work))
        logs = [log for _proc, log in started[1:]]
        _wait_for(
            lambda: all("Successfully registered with master" in log.read_text() for log in logs),
            START_TIMEOUT,
            "spark workers",
            started,
        )
        workers_up = time.monotonic() - t0
        print(f"\nstandalone master up in {master_up:.1f} s, two workers registered in {workers_up:.1f} s")
        yield Cluster(url, workers)
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


def _submit(cluster: Cluster, cwd: Path, import_str: str, *extra: str, log: Optional[Path] = None) -> subprocess.Popen:
    """Start `flowspark submit IMPORT_STR --master URL ...extra` (512m executors) in `cwd`.

    Its output is captured, or with `log` written to that file, and it runs in a session of
    its own (its process group is the driver: submit, spark-submit's JVM, the Python driver).
    """
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYTHONPATH", None)  # the workers must get the flow from the shipped zip
    out = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "flowspark", "submit", import_str, "--master", cluster.url]
            + ["--conf", "spark.executor.memory=512m", "--conf", f"spark.executor.extraJavaOptions={JVM_OPTS}"]
            + ["--conf", f"spark.driver.extraJavaOptions={JVM_OPTS}", *extra],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    finally:
        if log is not None:
            out.close()


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=SUBMIT_TIMEOUT)
    return proc.returncode, stdout, stderr


def test_submit_to_standalone_cluster(cluster, project, tmp_path):
    cwd, pkg, data = project
    out = tmp_path / "out.csv"
    import_str = f"{pkg}/flows.py:get_flow({str(data)!r}, {str(out)!r})"
    t0 = time.monotonic()
    proc = _submit(cluster, cwd, import_str, "--conf", "spark.sql.shuffle.partitions=2", "--work-dir", str(tmp_path))
    code, stdout, stderr = _finish(proc)
    took = time.monotonic() - t0
    print(f"flowspark submit took {took:.1f} s")
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert "\tat " not in stderr
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
    # the application ran on the cluster: each worker launched an executor for it
    for _proc, work in cluster.workers:
        assert any(work.glob("app-*/*/stderr")), list(work.iterdir())


def test_submit_reports_user_error_in_one_line(cluster, project, tmp_path):
    cwd, pkg, data = project
    (data / "bad.csv").write_text("zed,notanumber\n")
    out = tmp_path / "out.csv"
    import_str = f"{pkg}/flows.py:get_flow({str(data)!r}, {str(out)!r})"
    code, _stdout, stderr = _finish(_submit(cluster, cwd, import_str, "--conf", "spark.task.maxFailures=1"))
    assert code == 1
    errors = [ln for ln in stderr.splitlines() if ln.startswith("flowspark: error:")]
    assert len(errors) == 1, stderr
    assert "step 'cluster_totals.parse" in errors[0]
    assert "ValueError" in errors[0]
    assert "notanumber" in errors[0]
    assert "\tat " not in stderr


# -- a streaming flow with keyed state and timers on both executors ------------------------------

CARTS = textwrap.dedent(
    """
    import time
    from datetime import timedelta

    import flowspark.operators as op
    from flowspark._time import utc_now
    from flowspark.dataflow import Dataflow
    from flowspark.spark import SparkSink, SparkSource

    IN_SCHEMA = "user STRING, action STRING, amount LONG, after DOUBLE"
    OUT_SCHEMA = "user STRING, outcome STRING, items LONG, total LONG"
    BUSY_SCALE = 1.0  # the in-memory reference sets 0: a busy event changes no state


    class CartLogic(op.StatefulLogic):
        \"\"\"A user's cart: paid, or abandoned `after` seconds (processing time) after the user left.\"\"\"

        def __init__(self, resume):
            self.cart = resume  # (user, items, total, abandoned at) or None

        def on_item(self, event):
            if event["action"] == "busy":  # the user's code takes a while; the cart is unchanged
                time.sleep(event["after"] * BUSY_SCALE)
                return [], self.RETAIN if self.cart is not None else self.DISCARD
            user, items, total, _ = self.cart or (event["user"], 0, 0, None)
            if event["action"] == "pay":
                self.cart = None
                return [{"user": user, "outcome": "paid", "items": items, "total": total}], self.DISCARD
            if event["action"] == "leave":
                self.cart = (user, items, total, utc_now() + timedelta(seconds=event["after"]))
            else:
                self.cart = (user, items + 1, total + event["amount"], None)
            return [], self.RETAIN

        def notify_at(self):
            return self.cart[3] if self.cart is not None else None

        def on_notify(self):
            user, items, total, _ = self.cart
            self.cart = None
            return [{"user": user, "outcome": "abandoned", "items": items, "total": total}], self.DISCARD

        def snapshot(self):
            return self.cart


    def pipeline(events):
        keyed = op.key_on("by_user", events, lambda e: e["user"])
        return op.key_rm("rows", op.stateful("carts", keyed, CartLogic))


    def get_flow(in_dir, out_dir):
        flow = Dataflow("cluster_carts")
        source = SparkSource("json", in_dir, schema=IN_SCHEMA, options={"maxFilesPerTrigger": 1}, streaming=True)
        sink = SparkSink("parquet", out_dir, schema=OUT_SCHEMA)
        op.output("out", pipeline(op.input("events", flow, source)), sink)
        return flow
    """
)

PARTITIONS = 4  # spark.sql.shuffle.partitions: the stateful stage's tasks (the sources' stage has 2)
LONG = 8.0  # seconds: the timeout of the carts left just before the driver is killed
BUSY = 0.5  # seconds each key's logic sleeps in the second file, so its stateful tasks run for seconds


def _ev(user: str, action: str, amount: Optional[int] = None, after: Optional[float] = None) -> dict[str, Any]:
    return {"user": user, "action": action, "amount": amount, "after": after}


FILES = [
    # sixteen carts; four users leave, and their carts time out
    [_ev(f"u{i:02d}", "add", 10 + i) for i in range(16)]
    + [_ev(f"u{i:02d}", "add", 1) for i in range(0, 16, 3)]
    + [_ev(f"u{i:02d}", "leave", after=1.0) for i in range(4)],
    # every key's task is busy for a while first (so the executor is killed mid-task);
    # u00 is back (a new cart); four pay; two leave
    [_ev(f"u{i:02d}", "busy", after=BUSY) for i in range(16)]
    + [_ev("u00", "add", 5), _ev("u00", "add", 6), *(_ev(f"u{i:02d}", "pay") for i in range(4, 8))]
    + [_ev("u08", "leave", after=1.0), _ev("u09", "leave", after=1.0), _ev("u10", "add", 7)],
    # two pay; two leave with a longer timeout, still pending when the driver is killed
    [_ev("u10", "pay"), _ev("u11", "pay"), _ev("u12", "leave", after=LONG), _ev("u13", "leave", after=LONG)]
    + [_ev("u00", "add", 8)],
    # for the resubmitted driver: carts from before the driver loss are paid
    [_ev("u00", "pay"), _ev("u14", "pay"), _ev("u15", "pay"), _ev("u01", "add", 9), _ev("u01", "pay")],
]
ROWS_AFTER = [4, 10, 12, 18]  # output rows once each file is processed and its short timeouts fired


def _stage(in_dir: Path, n: int) -> float:
    """Write FILES[n - 1] as `in_dir/000n.json` (atomically); return the time it was staged."""
    tmp = in_dir / f".{n:04d}.json.tmp"
    tmp.write_text("".join(json.dumps(e) + "\n" for e in FILES[n - 1]))
    os.replace(tmp, in_dir / f"{n:04d}.json")
    return time.time()


def _committed_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of the micro-batches Spark's file sink committed (its `_spark_metadata` log), in batch order.

    Files of a task attempt that died with its executor are in the directory but not in the log.
    """
    import pyarrow.parquet as pq

    log = out / "_spark_metadata"
    entries = {
        int(f.name.removesuffix(".compact")): f for f in log.glob("*") if f.name.removesuffix(".compact").isdigit()
    }
    start = max((n for n, f in entries.items() if f.name.endswith(".compact")), default=0)
    rows: list[dict[str, Any]] = []
    for n in sorted(n for n in entries if n >= start):
        for line in entries[n].read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry["action"] == "add":
                rows += pq.read_table(unquote(urlparse(entry["path"]).path)).to_pylist()
    return rows


def _wait_rows(out: Path, n: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _committed_rows(out)
        if len(rows) >= n:
            return rows
        if proc.poll() is not None:
            raise AssertionError(f"the driver exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{len(_committed_rows(out))} rows committed after {timeout} s, not {n}")


def _rest(port: int, path: str) -> Any:
    """GET Spark's REST API on the driver's UI port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=10) as r:
        return json.load(r)


def _executor_pids(worker: subprocess.Popen) -> dict[str, int]:
    """The executor JVMs a worker launched (its child processes): {executor id: pid}."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == worker.pid and b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd:
            found[cmd[cmd.index(b"--executor-id") + 1].decode()] = int(d.name)
    return found


def _stateful_tasks(ui: int, app: str, status: str) -> list[dict[str, Any]]:
    """The tasks of the stateful stages (PARTITIONS tasks each) of the app's stages in `status`."""
    stages = _rest(ui, f"applications/{app}/stages?status={status}&details=true")
    return [
        {**t, "stage": (st["stageId"], st["attemptId"])}
        for st in stages
        if st["numTasks"] == PARTITIONS
        for t in st.get("tasks", {}).values()
    ]


def _running_for(task: dict[str, Any]) -> float:
    """Seconds since the task was launched (its `launchTime`, e.g. `2026-01-01T00:00:00.123GMT`)."""
    launched = datetime.strptime(task["launchTime"].replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return time.time() - launched.timestamp()


def _kill_executor_running_a_stateful_task(cluster: Cluster, ui: int, app: str, timeout: float = 120):
    """Find a stateful task busy with the second file, kill -9 its executor's JVM (that pid only); return (task, pid).

    The trigger's no-data micro-batches (for the timers) run stateful tasks too, done in
    milliseconds: a task running for longer than half a busy key's sleep is the second file's.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in _stateful_tasks(ui, app, "active"):
            if task["status"] != "RUNNING" or _running_for(task) < BUSY / 2:
                continue
            pids = {eid: pid for worker, _work in cluster.workers for eid, pid in _executor_pids(worker).items()}
            if task["executorId"] in pids:
                os.kill(pids[task["executorId"]], signal.SIGKILL)
                return task, pids[task["executorId"]]
        time.sleep(0.05)
    raise AssertionError(f"no stateful task seen running in {timeout} s")


def _per_key(rows: list[dict[str, Any]]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = defaultdict(list)
    for r in rows:
        out[r["user"]].append((r["outcome"], r["items"], r["total"]))
    return dict(out)


def _in_memory(cwd: Path, pkg: str) -> list[dict[str, Any]]:
    """The flow's pipeline on the in-memory executor over the same events, the timeouts in logical time."""
    from flowspark.dataflow import Dataflow
    from flowspark.operators import input as op_input
    from flowspark.operators import output as op_output
    from flowspark.testing import TestingSink, TestingSource, run_main

    spec = importlib.util.spec_from_file_location("cluster_carts_local", cwd / pkg / "carts.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.BUSY_SCALE = 0.0
    events: list[Any] = []
    for batch in FILES:  # each file, then more than the longest timeout of idle input
        events += [*batch, TestingSource.PAUSE(timedelta(minutes=1))]
    events.append(TestingSource.ABORT())  # a stream has no end of input
    got: list[dict[str, Any]] = []
    flow = Dataflow("cluster_carts")
    op_output("out", mod.pipeline(op_input("events", flow, TestingSource(events))), TestingSink(got))
    run_main(flow, clock="logical", start_time=datetime(2026, 1, 1, tzinfo=timezone.utc), roundtrip_state=True)
    return got


def test_streaming_on_two_executors_survives_executor_and_driver_loss(cluster, project, tmp_path):
    """A stream with keyed state and timers, its state on both executors; kill -9 an executor, then the driver.

    Run A (`--trigger "1 second"`) processes three files, one at a time: after the first, the
    stateful stage's tasks ran on both executors (Spark's REST API), one on each worker; while the
    second is processed, the JVM of an executor running a stateful task is killed with SIGKILL;
    after the third, the driver's process group is. Run B, submitted again on the checkpoint with
    a fourth file, fires the timers pending at the driver's loss and ends (`available_now`). The
    rows the file sink committed equal the in-memory executor's, per key in order.
    """
    cwd, pkg, _data = project
    (cwd / pkg / "carts.py").write_text(CARTS)
    in_dir, out, chk = tmp_path / "events", tmp_path / "out", tmp_path / "chk"
    in_dir.mkdir()
    import_str = f"{pkg}/carts.py:get_flow({str(in_dir)!r}, {str(out)!r})"
    ui = _free_port()
    conf = ["--checkpoint", str(chk), "--conf", f"spark.sql.shuffle.partitions={PARTITIONS}"]
    conf += ["--conf", "spark.cores.max=2", "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0"]
    conf += ["--conf", "spark.ui.enabled=true", "--conf", f"spark.ui.port={ui}"]
    log_a = tmp_path / "run_a.log"
    t0 = time.monotonic()
    _stage(in_dir, 1)
    run_a = _submit(
        cluster, cwd, import_str, *conf, "--trigger", "1 second", "--work-dir", str(tmp_path / "a"), log=log_a
    )
    try:
        _wait_rows(out, ROWS_AFTER[0], run_a, log_a, timeout=240)
        print(f"run A: first file's timeouts committed after {time.monotonic() - t0:.1f} s")
        app = _rest(ui, "applications")[0]["id"]
        # State spread: the stateful stage's tasks (one per state partition) ran on both executors,
        # and each executor is a JVM of another worker (its directory in that worker's work dir).
        partitions: dict[str, set[int]] = defaultdict(set)
        for task in _stateful_tasks(ui, app, "complete"):
            if task["status"] == "SUCCESS":
                partitions[task["executorId"]].add(task["index"])
        print(f"state partitions per executor: {dict(partitions)}")
        assert len(partitions) == 2, partitions
        hosts = {
            eid: [n for n, (_p, work) in enumerate(cluster.workers) if (work / app / eid).is_dir()]
            for eid in partitions
        }
        assert sorted(hosts.values()) == [[0], [1]], hosts
        # kill -9 of one executor JVM while it runs a stateful task
        _stage(in_dir, 2)
        task, pid = _kill_executor_running_a_stateful_task(cluster, ui, app)
        dead = task["executorId"]
        print(
            f"killed executor {dead} (pid {pid}) running task {task['taskId']} "
            f"(partition {task['index']}) of stage {task['stage']}"
        )
        _wait_rows(out, ROWS_AFTER[1], run_a, log_a)
        executors = {e["id"]: e for e in _rest(ui, f"applications/{app}/allexecutors")}
        assert not executors[dead]["isActive"], executors[dead]
        attempts = _rest(ui, f"applications/{app}/stages/{task['stage'][0]}?details=true")
        tries = [t for st in attempts for t in st.get("tasks", {}).values() if t["index"] == task["index"]]
        killed = next(t for t in tries if t["taskId"] == task["taskId"])
        print(f"the killed attempt: {killed['status']} {killed.get('errorMessage', '')[:200]!r}")
        assert killed["status"] == "FAILED", killed
        assert any(t["status"] == "SUCCESS" and t["executorId"] != dead for t in tries), tries
        # the master started a new executor for the application on the worker that lost one
        home = next(work / app for _proc, work in cluster.workers if (work / app / dead).is_dir())
        _wait_for(lambda: len(list(home.iterdir())) >= 2, 60, "a new executor on the worker", [])
        # kill -9 of the driver once the third file is committed, its long timeouts pending
        staged = _stage(in_dir, 3)
        rows = _wait_rows(out, ROWS_AFTER[2], run_a, log_a)
        os.killpg(run_a.pid, signal.SIGKILL)
        run_a.wait(timeout=60)
        assert not [r for r in rows if r["user"] in ("u12", "u13")], "the long timeouts fired before the kill"
        assert len(_committed_rows(out)) == ROWS_AFTER[2]
    finally:
        if run_a.poll() is None:
            os.killpg(run_a.pid, signal.SIGKILL)
            run_a.wait(timeout=60)
    # Resubmit on the checkpoint with a fourth file, once the pending timeouts are due.
    _stage(in_dir, 4)
    while time.time() < staged + LONG:
        time.sleep(0.2)
    t1 = time.monotonic()
    log_b = tmp_path / "run_b.log"
    run_b = _submit(
        cluster, cwd, import_str, *conf, "--trigger", "available_now", "--work-dir", str(tmp_path / "b"), log=log_b
    )
    code = run_b.wait(timeout=SUBMIT_TIMEOUT)
    print(f"run B (resubmitted) took {time.monotonic() - t1:.1f} s; whole test {time.monotonic() - t0:.1f} s")
    assert code == 0, log_b.read_text()[-3000:]
    got = _committed_rows(out)
    assert len(got) == ROWS_AFTER[3], got
    assert _per_key(got) == _per_key(_in_memory(cwd, pkg))
