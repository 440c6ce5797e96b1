"""The Spark version matrix: the compatibility suite on each supported pyspark line, each in its own virtualenv.

The full suite (`python -m pytest`, README) runs on the newest line, the one `pip install -e ".[test]"`
installs. The compatibility suite runs what differs between Spark versions on every other line:

    python -m nox -s compat            # every other line: 3.5, 4.0, 4.1, 4.2
    python -m nox -s "compat(line='3.5')"   # one line (CI runs the oldest)
    python -m nox -s kafka             # Kafka and Delta Lake end to end on 4.2, local and on a cluster (CI runs it)
    python -m nox -s delta             # Delta Lake end to end on 3.5, 4.0 and 4.1 (see `delta`)

Each session installs with `session.run_install`, so `--install-only` prepares its virtualenv and
jars without running tests (`.ci/run` does that while the full suite runs).

Each line pins its newest release, but 4.2 pins 4.2.0, the newest whose Kafka connector Maven serves
(`scripts/fetch_jars.py`; the Kafka tests run there) and the newest Delta Lake is built for (Delta 4.4.0).
On 4.0, 4.0.1's applyInPandasWithState fails with pandas 2.3 and pyarrow 26 (a TypeError in
pyspark's serializer); 4.0.5 runs.
Spark 3.5 also needs numpy < 2 (its declared range) and so a pyarrow built for numpy 1.
The Connect case runs this line's client against a server of the newest line (the pyspark of
the interpreter running nox), the version pair `docs/` documents.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

#: Each supported line but the newest: the pyspark release the matrix installs (see the docstring).
LINES = {"3.5": "3.5.9", "4.0": "4.0.5", "4.1": "4.1.4", "4.2": "4.2.0"}

#: What a line's pyspark changes, as pytest runs: the conformance suite on batch and streaming (the
#: default layout, and the bucket layout that applyInPandasWithState runs); the version checks, the
#: streaming examples, kill -9 and restart, a client of this line against a server of the newest;
#: and Spark Connect on the line itself (`CONNECT_RUNS`).
RUNS = [
    ["tests/conformance", "-k", "not rules-none and not spark-streaming-key"],
    [
        "tests/unit/test_versions.py",
        "tests/spark/test_streaming_examples.py",
        "tests/spark/test_streaming.py::test_kill_9_then_restart_equals_uninterrupted_run",
        "tests/spark/test_connect_versions.py",
    ],
]
#: Spark Connect on the line itself, on lines whose wheel ships a Connect server (not 3.5): a batch
#: job, and on lines that stream Python sources (4.2+) two streams.
CONNECT_RUNS = {
    "4.0": ["tests/spark/test_connect.py", "-k", "two_spark_sinks"],
    "4.1": ["tests/spark/test_connect.py", "-k", "two_spark_sinks"],
    "4.2": ["tests/spark/test_connect.py", "-k", "two_spark_sinks or stream_with_a_sink or user_error_in_a_stream"],
}


def _newest_pyspark_home() -> str:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return ""
    return str(Path(spec.origin).parent)


def _venv(session: nox.Session, name: str, line: str, *pins: str) -> str:
    """The interpreter of `.nox/NAME`, made if missing, with flowspark's test extra, pyspark `line` and `pins`."""
    venv = Path(".nox") / name
    python = venv / "bin" / "python"
    if not python.exists():
        session.run_install("python", "-m", "venv", str(venv), external=True)
    more = ["numpy<2", "pyarrow>=15,<21"] if line == "3.5" else []
    pyspark = f"pyspark[connect]=={LINES[line]}"
    session.run_install(
        str(python), "-m", "pip", "install", "-q", "-e", ".[test]", pyspark, *pins, *more, external=True
    )
    return str(python)


@nox.session(python=False)
@nox.parametrize("line", list(LINES))
def compat(session: nox.Session, line: str) -> None:
    """The compatibility suite on pyspark `line` (a virtualenv of its own under .nox/)."""
    python = _venv(session, f"compat-{line}", line)
    env = {"FLOWSPARK_TEST_SERVER_HOME": os.environ.get("FLOWSPARK_TEST_SERVER_HOME", _newest_pyspark_home())}
    runs = [*RUNS, CONNECT_RUNS[line]] if line in CONNECT_RUNS else RUNS
    for args in runs:
        pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, *session.posargs]
        session.run(*pytest, env=env, external=True)


#: The Kafka and Delta tests: a real broker, Spark's Kafka connector (none is published for the newest
#: line's pyspark), Delta Lake (none is built for it).
#: The flows through Kafka and Delta Lake, in a local session and submitted to a standalone cluster
#: (`--packages`: spark-submit resolves the connector and Delta with Ivy). The broker's own test,
#: which needs no Spark, runs in the full suite.
KAFKA_RUNS = ["tests/spark/test_kafka_e2e.py", "tests/spark/test_delta_e2e.py", "tests/spark/test_kafka_cluster.py"]
#: The Delta Lake release built for each line (`flowspark.spark.io.delta.DELTA_RELEASES`; none for 4.3).
DELTA_FOR = {"3.5": "3.3.2", "4.0": "4.4.0", "4.1": "4.4.0", "4.2": "4.4.0"}
#: The Delta Lake release paired with pyspark 4.2.0, the line `kafka` runs.
DELTA = DELTA_FOR["4.2"]


def _kafka_venv(session: nox.Session) -> str:
    """The interpreter of `compat(line='4.2')`'s virtualenv with Delta Lake and the jars Kafka and Delta need."""
    python = _venv(session, "compat-4.2", "4.2", f"delta-spark=={DELTA}")
    session.run_install(python, "scripts/fetch_jars.py", "connector", "broker", "delta", external=True)
    return python


@nox.session(python=False)
def kafka(session: nox.Session) -> None:
    """Kafka and Delta Lake end to end on pyspark 4.2.0, in the virtualenv of `compat(line='4.2')` (.nox/compat-4.2)."""
    python = _kafka_venv(session)
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KAFKA_RUNS, *session.posargs, external=True)


@nox.session(python=False)
@nox.parametrize("line", [line for line in LINES if line != "4.2"])
def delta(session: nox.Session, line: str) -> None:
    """Delta Lake end to end on pyspark `line` with the Delta release built for it (`kafka` runs 4.2).

    A virtualenv of its own (.nox/delta-LINE: the compat suite's stays without Delta), the jars
    `scripts/fetch_jars.py delta` caches for that pyspark, then `tests/spark/test_delta_e2e.py`.
    """
    python = _venv(session, f"delta-{line}", line, f"delta-spark=={DELTA_FOR[line]}")
    session.run_install(python, "scripts/fetch_jars.py", "delta", external=True)
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/spark/test_delta_e2e.py"]
    session.run(*pytest, *session.posargs, external=True)
