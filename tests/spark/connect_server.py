"""Start and stop a local Spark Connect server from the pyspark wheel (for tests/spark/test_connect.py)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    log_dir: Path,
    worker_python: Optional[str] = None,
    env: Optional[dict[str, str]] = None,
    conf: Optional[dict[str, str]] = None,
    home: Optional[str] = None,
) -> tuple:
    """Start `SparkConnectServer` on a free port with `local[2]`; return `(url, process)`.

    Skips the test only when Java is missing. `worker_python` is the server's
    PYSPARK_PYTHON (default this interpreter); `conf`: more Spark settings; `home`: the
    pyspark installation whose Spark runs the server (default this interpreter's).
    """
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is missing: a Spark Connect server needs it")
    if home is None:
        import pyspark  # noqa: TID251

        home = os.path.dirname(pyspark.__file__)
    assert glob.glob(os.path.join(home, "jars", "spark-connect_*.jar")), "the pyspark wheel ships no spark-connect jar"
    port = _free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    conf_dir = log_dir / "conf"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / "log4j2.properties").write_text(
        "rootLogger.level = warn\nrootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\nappender.console.name = console\nappender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\nappender.console.layout.pattern = %p %c{1}: %m%n\n"
    )
    full_env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    full_env.update(
        {"SPARK_HOME": home, "PYSPARK_PYTHON": worker_python or sys.executable, "SPARK_CONF_DIR": str(conf_dir)}
    )
    full_env.update(env or {})
    cmd = [
        os.path.join(home, "bin", "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.default.parallelism=2",
        "--conf",
        "spark.driver.memory=1g",
    ]
    for k, v in (conf or {}).items():
        cmd += ["--conf", f"{k}={v}"]
    cmd.append("spark-internal")
    log = open(log_dir / "server.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.close()
            pytest.fail(f"the Spark Connect server exited ({proc.returncode}):\n{_tail(log_dir / 'server.log')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return f"sc://localhost:{port}", proc
        except OSError:
            time.sleep(0.5)
    stop_server(proc)
    pytest.fail(f"the Spark Connect server did not listen on {port} within 180 s:\n{_tail(log_dir / 'server.log')}")


def stop_server(proc: subprocess.Popen) -> None:
    """Stop the server by its pid (its whole process group: the JVM and its Python workers)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def client_env() -> dict[str, str]:
    # No classic-session settings leak in; the client must not inherit a Connect mode either.
    drop = ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_DRIVER_PYTHON")
    return {k: v for k, v in os.environ.items() if k not in drop}


def scenario(name: str, url: str, d: Path, timeout: float = 600, quiet: bool = False) -> dict:
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / "connect_driver.py"), name, url, str(d)],
        capture_output=True,
        text=True,
        env=client_env(),
        timeout=timeout,
        cwd=d,
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0, f"{name} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert lines, f"{name} printed no RESULT line:\n{r.stdout[-3000:]}"
    if quiet:  # a successful run prints nothing on stderr
        assert r.stderr.strip() == "", r.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])
