"""Fetch the jars flowspark's Kafka path needs, with Maven, into a cache directory (once).

Two sets, each in its own directory under ``$FLOWSPARK_JARS_DIR`` (default
``~/.cache/flowspark/jars``):

* ``kafka-<pyspark version>/``: Spark's Kafka connector
  (``org.apache.spark:spark-sql-kafka-0-10_<scala>:<pyspark version>``, the Scala version of
  the installed pyspark's own jars: 2.13 for Spark 4, 2.12 for Spark 3.5) with its runtime
  dependencies. Sessions flowspark creates for a flow that reads or writes Kafka put them
  in ``spark.jars``.
* ``kafka-broker-<kafka version>/``: an Apache Kafka broker (``org.apache.kafka:kafka_2.13``)
  with its dependencies, for the tests' one-node KRaft broker (``tests/spark/kafka_broker.py``).
* ``delta-<pyspark version>/``: Delta Lake built for the installed pyspark's line (the coordinate
  ``flowspark.spark.io.delta.delta_package()`` picks from its table of pairings) with its runtime
  dependencies. Sessions flowspark creates for a flow that reads or writes Delta put them in
  ``spark.jars``. No Delta release is built for every line (none for Spark 4.3).

A directory holding a ``.complete`` marker is not fetched again. Maven resolves into a local
repository of its own, ``m2/`` under the same cache, not ``~/.m2``: resolving leaves the poms
of versions it did not pick there without their jars, and spark-submit's ``--packages`` (Ivy,
whose default chain reads ``~/.m2/repository`` first) then fails on such a pom ("FAILED
DOWNLOADS ... local-m2-cache"). Usage::

    python scripts/fetch_jars.py            # Kafka's connector and broker (Delta is asked for by name)
    python scripts/fetch_jars.py connector  # only Spark's connector
    python scripts/fetch_jars.py delta      # only Delta Lake
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from flowspark.spark.io.jars import jars_root
from flowspark.spark.io.kafka import connector_dir

BROKER_VERSION = "3.9.1"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>flowspark.jars</groupId>
  <artifactId>fetch</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def pyspark_version() -> str:
    """The installed pyspark's version."""
    from importlib.metadata import version

    return version("pyspark")


def scala_version() -> str:
    """The Scala version the installed pyspark's jars are built for (``spark-core_<scala>-*.jar``)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    jars = Path(spec.origin).parent / "jars" if spec is not None and spec.origin else None
    found = sorted(jars.glob("spark-core_*.jar")) if jars is not None and jars.is_dir() else []
    return found[0].name.split("_")[1].split("-")[0] if found else "2.13"


def broker_dir() -> Path:
    """Where the test broker's jars are kept."""
    return jars_root() / f"kafka-broker-{BROKER_VERSION}"


class Refused(Exception):
    """Maven did not serve a coordinate (the message is Maven's own refusal)."""


def _artifact(jar: str) -> str:
    """A copied jar's artifact name: ``zstd-jni-1.5.7-3.jar`` -> ``zstd-jni``."""
    m = re.match(r"(.+?)-\d", jar)
    return m.group(1) if m else jar


def pyspark_artifacts() -> set[str]:
    """The artifacts the installed pyspark ships in its own ``jars/`` directory."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    jars = Path(spec.origin).parent / "jars" if spec is not None and spec.origin else None
    return {_artifact(j.name) for j in jars.glob("*.jar")} if jars is not None and jars.is_dir() else set()


def fetch(coordinate: str, dest: Path, keep_spark_own: bool = False) -> Path:
    """Copy `coordinate` (group:artifact:version) and its runtime dependencies into `dest`, once.

    With `keep_spark_own`, a dependency pyspark ships itself (another version of Jackson,
    Hadoop, Parquet, Scala ...) is left out: Spark's own version is the one its classes use.

    Raises:
        Refused: Maven could not resolve it (its error lines in the message).
    """
    if (dest / ".complete").exists():
        return dest
    if shutil.which("mvn") is None:
        sys.exit("fetch_jars: `mvn` is not installed; install Maven, then run python scripts/fetch_jars.py")
    group, artifact, version = coordinate.split(":")
    tmp = Path(tempfile.mkdtemp(prefix="flowspark-jars-"))
    try:
        (tmp / "pom.xml").write_text(_POM.format(group=group, artifact=artifact, version=version))
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        cmd = [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(tmp / "pom.xml"),
            "dependency:copy-dependencies",
            f"-Dmaven.repo.local={jars_root() / 'm2'}",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={partial}",
        ]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in (done.stdout + done.stderr).splitlines() if "[ERROR]" in line]
            first = errors[0] if errors else done.stdout + done.stderr
            raise Refused(re.sub(r"\x1b\[[0-9;]*m|\[ERROR\] ", "", first).strip())
        if keep_spark_own:
            shipped = pyspark_artifacts()
            for jar in partial.glob("*.jar"):
                if _artifact(jar.name) in shipped:
                    jar.unlink()
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
        (dest / ".complete").write_text(coordinate + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def fetch_delta() -> int:
    """Fetch Delta Lake's jars for the installed pyspark; 1 (and one line) without a pairing or when Maven refuses."""
    from flowspark.spark.io.delta import delta_dir, delta_package

    coordinate = delta_package()
    if coordinate is None:
        print(f"fetch_jars: no Delta Lake release is built for pyspark {pyspark_version()}", file=sys.stderr)
        return 1
    try:
        print(fetch(coordinate, delta_dir(), keep_spark_own=True))
    except Refused as e:
        print(f"fetch_jars: Delta Lake {coordinate} not fetched: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    """Fetch the sets named in `argv` (default: Kafka's connector and broker).

    With no argument (as `.ci/run` calls it) a connector Maven does not serve for the installed
    pyspark is reported in one line and is not an error (no test needs it yet); naming
    `connector` makes it one. The broker's jars are always required; Delta's when named.
    """
    unknown = set(argv) - {"connector", "broker", "delta"}
    if unknown:
        print(f"fetch_jars: unknown set(s) {sorted(unknown)}; name connector, broker or delta", file=sys.stderr)
        return 2
    which = set(argv) or {"connector", "broker"}
    code = fetch_delta() if "delta" in which else 0
    if "broker" in which:
        try:
            print(fetch(f"org.apache.kafka:kafka_2.13:{BROKER_VERSION}", broker_dir()))
        except Refused as e:
            print(f"fetch_jars: the Kafka broker's jars: {e}", file=sys.stderr)
            code = 1
    if "connector" in which:
        coordinate = f"org.apache.spark:spark-sql-kafka-0-10_{scala_version()}:{pyspark_version()}"
        try:
            print(fetch(coordinate, connector_dir()))
        except Refused as e:
            print(f"fetch_jars: Spark's Kafka connector {coordinate} not fetched: {e}", file=sys.stderr)
            if argv:
                code = 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
