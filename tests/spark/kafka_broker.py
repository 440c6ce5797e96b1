"""A one-node Apache Kafka broker (KRaft) for the tests, started with `java` from Maven's jars.

`scripts/fetch_jars.py` fetches the broker's jars into the cache (`.ci/run` calls it before
pytest). `broker()` formats a temporary log directory, starts `kafka.Kafka` on two free loopback
ports, waits until a client can list topics, and stops the process by its pid. When Java or the
jars are missing the test fails with one line naming the command to run (never a skip).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
_FETCH = f"{sys.executable} {_SCRIPTS / 'fetch_jars.py'}"


def _fetch_jars():
    sys.path.insert(0, str(_SCRIPTS))
    try:
        import fetch_jars
    finally:
        sys.path.remove(str(_SCRIPTS))
    return fetch_jars


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PROPERTIES = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={logs}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
"""


def classpath() -> str:
    """The broker's classpath, or fail the test with the command that fetches it."""
    if shutil.which("java") is None:
        pytest.fail("Kafka tests need Java 17 on PATH (`java` not found); install a JDK 17", pytrace=False)
    jars = _fetch_jars().broker_dir()
    if not (jars / ".complete").exists():
        pytest.fail(f"Kafka broker jars missing in {jars}; run: {_FETCH} broker", pytrace=False)
    return str(jars / "*")


def _ready(bootstrap: str, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    from kafka.admin import KafkaAdminClient

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"Kafka broker exited with {proc.returncode}; its log: {log}", pytrace=False)
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        except Exception:
            if time.monotonic() > deadline:
                pytest.fail(f"Kafka broker not ready after {timeout:.0f} s; its log: {log}", pytrace=False)
            time.sleep(0.3)
            continue
        admin.list_topics()
        admin.close()
        return


class Broker:
    """A running broker: its bootstrap address, its process id and a helper to create topics."""

    def __init__(self, bootstrap: str, pid: int) -> None:
        """Remember the address and the broker's process (a test may kill it)."""
        self.bootstrap = bootstrap
        self.pid = pid

    def create_topic(self, name: str, partitions: int = 1) -> str:
        """Create `name` with `partitions` partitions (replication 1) and return it."""
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            admin.close()
        return name

    def read_topic(self, topic: str, timeout: float = 60.0) -> list:
        """Every record `topic` holds now, each partition's in offset order (partition by partition).

        Reads up to the partitions' end offsets, taken first: no idle wait for records that
        will not come (a consumer's `consumer_timeout_ms` costs its whole wait on every read).
        """
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        try:
            parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            consumer.assign(parts)
            consumer.seek_to_beginning(*parts)
            end = consumer.end_offsets(parts)
            got: dict = {tp: [] for tp in parts}
            deadline = time.monotonic() + timeout
            while any(consumer.position(tp) < end[tp] for tp in parts):
                if time.monotonic() > deadline:
                    have = {tp.partition: len(got[tp]) for tp in parts}
                    raise AssertionError(f"{topic}: read {have} of {end} records in {timeout} s")
                for tp, records in consumer.poll(timeout_ms=500).items():
                    got[tp] += records
        finally:
            consumer.close()
        return [m for tp in parts for m in got[tp]]


@contextlib.contextmanager
def broker(workdir: Path) -> Iterator[Broker]:
    """Run a one-node KRaft broker in `workdir` for the duration of the block."""
    cp = classpath()
    port, controller = _free_port(), _free_port()
    while controller == port:
        controller = _free_port()
    logs = workdir / "logs"
    props = workdir / "server.properties"
    props.write_text(_PROPERTIES.format(port=port, controller=controller, logs=logs))
    cluster = "-"
    while cluster.startswith("-"):  # StorageTool would read an id starting with "-" as an option
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    fmt = subprocess.run(
        ["java", "-cp", cp, "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(props)],
        capture_output=True,
        text=True,
        check=False,
    )
    if fmt.returncode != 0:
        pytest.fail(f"kafka.tools.StorageTool format failed: {fmt.stdout}{fmt.stderr}".strip(), pytrace=False)
    log = workdir / "broker.log"
    env = {**os.environ, "KAFKA_HEAP_OPTS": "-Xmx256m"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:+UseSerialGC", "-cp", cp, "kafka.Kafka", str(props)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        bootstrap = f"127.0.0.1:{port}"
        _ready(bootstrap, proc, log)
        yield Broker(bootstrap, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
