"""Kafka through Spark's `kafka` format (streaming source and sink).

Spark's Kafka connector is not part of pyspark. A session flowspark creates for a flow
that reads or writes Kafka puts the connector's jars that `python scripts/fetch_jars.py`
caches (`connector_jars`) in `spark.jars` (`session_conf`); your own session or a cluster
takes the coordinate `KAFKA_PACKAGE` (`spark.jars.packages`, spark-submit's `--packages`):

    SparkSession.builder.config("spark.jars.packages", KAFKA_PACKAGE)

Without the connector, `flowspark.spark.run` fails with a one-line
`FlowsparkCompileError` naming what to run or set.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional, Union

from flowspark.errors import FlowsparkCompileError, FlowsparkRuntimeError, FlowsparkTypeError
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.jars import cached_jars, set_dir
from flowspark.spark.io.outputs import SparkSink

__all__ = [
    "CONNECTOR_NEWEST",
    "FETCH_JARS",
    "KAFKA_PACKAGE",
    "KafkaSink",
    "KafkaSource",
    "broker_unreachable",
    "connector_dir",
    "connector_published",
    "connector_jars",
    "kafka_steps",
    "session_conf",
]

#: The command that caches Spark's Kafka connector for the installed pyspark (from a flowspark checkout).
FETCH_JARS = "python scripts/fetch_jars.py connector"


def _kafka_package() -> str:
    import pyspark

    from flowspark.spark.versions import installed

    release = str(pyspark.__version__)
    scala = "2.12" if installed(release) < (4, 0) else "2.13"  # PyPI's pyspark 3.5 is built for Scala 2.12
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{release}"


#: The Maven coordinate of Spark's Kafka connector for the installed pyspark (its version and Scala's).
KAFKA_PACKAGE = _kafka_package()


#: The newest pyspark line whose Kafka connector Maven serves (none is published for 4.3.0).
CONNECTOR_NEWEST = (4, 2)


def connector_published(version: Optional[str] = None) -> bool:
    """Tell whether Maven serves Spark's Kafka connector for the installed pyspark (or `version`).

    Args:
        version: A pyspark version; default the installed one.

    Returns:
        True up to the line `CONNECTOR_NEWEST`.

    Example:
        >>> connector_published("4.2.0"), connector_published("4.3.0")
        (True, False)
    """
    from flowspark.spark.versions import installed

    return installed(version) <= CONNECTOR_NEWEST


def connector_dir() -> Path:
    """Where `scripts/fetch_jars.py` caches Spark's Kafka connector for the installed pyspark.

    `$FLOWSPARK_JARS_DIR/kafka-<pyspark version>` (default root `~/.cache/flowspark/jars`).

    Returns:
        The directory (it may not exist).
    """
    return set_dir("kafka")


def connector_jars() -> Optional[list[str]]:
    """The cached connector's jars (the connector and its dependencies), or `None` when not fetched.

    A directory counts once `scripts/fetch_jars.py` finished it (its `.complete` marker).

    Returns:
        The jar paths, sorted, or `None`.
    """
    return cached_jars(connector_dir())


def kafka_steps(plan: Any) -> list[str]:
    """The ids of the steps of `plan` that read or write Kafka (`KafkaSource` inputs, `KafkaSink` outputs).

    Args:
        plan: A `flowspark.spark.plan.types.Plan`.

    Returns:
        The step ids, inputs first.
    """
    steps = [st.steps[0] for st in plan.stages if isinstance(st.source, KafkaSource) and st.steps]
    return steps + [sk.step_id for sk in plan.sinks if isinstance(sk.sink, KafkaSink)]


def session_conf(plan: Any) -> dict[str, str]:
    """What a session flowspark creates for `plan` needs: the cached connector in `spark.jars` for a Kafka flow.

    Args:
        plan: A `flowspark.spark.plan.types.Plan`.

    Returns:
        `{"spark.jars": ...}` for a flow that reads or writes Kafka, else `{}`.

    Raises:
        FlowsparkCompileError: The flow reads or writes Kafka and the connector is not cached:
            one line naming the step, the directory and the command that fetches it.
    """
    steps = kafka_steps(plan)
    if not steps:
        return {}
    jars = connector_jars()
    if jars is None and not connector_published():
        import pyspark

        msg = (
            f"step {steps[0]!r} uses Kafka, and Maven serves no Spark Kafka connector for pyspark "
            f"{pyspark.__version__} ({KAFKA_PACKAGE}); run Kafka flows with pyspark "
            f"{CONNECTOR_NEWEST[0]}.{CONNECTOR_NEWEST[1]} (then `{FETCH_JARS}`), or pass a session whose "
            "classpath has a connector matching its Spark"
        )
        raise FlowsparkCompileError(msg)
    if jars is None:
        msg = (
            f"step {steps[0]!r} uses Kafka, and Spark's Kafka connector ({KAFKA_PACKAGE}) is not in "
            f"{connector_dir()}; run `{FETCH_JARS}` (from a flowspark checkout) once, or pass a session "
            f"started with spark.jars.packages={KAFKA_PACKAGE}"
        )
        raise FlowsparkCompileError(msg)
    return {"spark.jars": ",".join(jars)}


def _names(what: str, x: Union[str, list[str]]) -> str:
    if isinstance(x, str) and x:
        return x
    if isinstance(x, (list, tuple)) and x and all(isinstance(s, str) and s for s in x):
        return ",".join(x)
    msg = f"{what} must be a non-empty str or list of str; received {x!r}"
    raise FlowsparkTypeError(msg)


def missing_jar(e: Exception) -> Optional[FlowsparkCompileError]:
    """The one-line error for Spark's missing kafka format in `e`, or `None` when `e` is another error."""
    text = str(e)
    if "kafka" in text.lower() and ("Failed to find data source" in text or "DATA_SOURCE_NOT_FOUND" in text):
        msg = (
            f"Spark's kafka format is not on this session's classpath; start the session with "
            f"spark.jars.packages={KAFKA_PACKAGE} (or spark-submit --packages {KAFKA_PACKAGE}), or let "
            f"flowspark create it (it takes the jars `{FETCH_JARS}` caches)"
        )
        return FlowsparkCompileError(msg)
    return None


# A Kafka client's timeout: the broker did not answer (Kafka's own TimeoutException, or the one
# Spark's consumer raises when a poll returns nothing before `kafkaConsumer.pollTimeoutMs`).
_TIMEOUT = re.compile(
    r"(?:org\.apache\.kafka\.common\.errors\.TimeoutException|java\.util\.concurrent\.TimeoutException"
    r"(?=: Cannot fetch record))(?::\s*([^\n]*))?"
)
# Where in Spark's Kafka connector the timeout came from: the producer (a sink) or the source.
_PRODUCER = ("KafkaDataWriter", "KafkaWriteTask", "KafkaProducer", "producer.")


def broker_unreachable(plan: Any, e: BaseException) -> Optional[FlowsparkRuntimeError]:
    """The one-line error for a query that stopped because a Kafka broker did not answer, or `None`.

    Spark's Kafka source and sink wait for the broker, retry, then fail the query with Kafka's
    `TimeoutException` (and a Java stack trace). This names the step instead: the source's (or,
    when the producer timed out, the sink's), its bootstrap servers and what to do.

    Args:
        plan: The query's `flowspark.spark.plan.types.Plan`.
        e: The query's exception (or the error a micro-batch raised).

    Returns:
        The error, or `None` when `e` is not a Kafka client's timeout or the plan uses no Kafka.
    """
    text = str(e)
    found = _TIMEOUT.search(text)
    if found is None:
        return None
    sources: list[tuple[str, Union[KafkaSource, KafkaSink]]] = [
        (st.steps[0], st.source) for st in plan.stages if isinstance(st.source, KafkaSource) and st.steps
    ]
    sinks: list[tuple[str, Union[KafkaSource, KafkaSink]]] = [
        (sk.step_id, sk.sink) for sk in plan.sinks if isinstance(sk.sink, KafkaSink)
    ]
    ends = [*sinks, *sources] if any(p in text for p in _PRODUCER) else [*sources, *sinks]
    if not ends:
        return None
    step, end = ends[0]
    servers = end.options["kafka.bootstrap.servers"]
    why = re.sub(r"\s*SQLSTATE: \w+\s*$", "", found.group(1) or "").strip() or "the broker did not answer"
    msg = (
        f"step {step!r} ({end!r}): the Kafka broker at {servers} is unreachable (TimeoutException: {why}); "
        "start it (or fix the bootstrap servers) and run the flow again: it resumes from the checkpoint's "
        "last committed micro-batch"
    )
    return FlowsparkRuntimeError(step, msg, exc_type="TimeoutException", exc_message=why)


_FIRST = ("topic", "partition", "offset")


class KafkaSource(SparkSource):
    """Read Kafka topics as a stream; one dict item per record.

    Items: `{"topic": str, "partition": int, "offset": int, "key": bytes,
    "value": bytes, "timestamp": datetime, "timestampType": int}` (and `"headers"`, a
    list of `{"key": str, "value": bytes}`, with `options={"includeHeaders": "true"}`).
    Offsets are Spark's (kept in the query's checkpoint). A step that fails on a record
    names its topic, partition and offset (they come first in the item's `repr`); with a
    dead letter the record lands there whole (its `item`: the dict's `repr`, raw bytes
    included).

    Args:
        brokers: Bootstrap servers (`"host:9092"` or a list).
        topics: Topic names to subscribe to.
        starting_offsets: `"earliest"` or `"latest"` (for a new checkpoint).
        options: More options of Spark's kafka source (e.g. `{"maxOffsetsPerTrigger": "10000"}`).

    Example:
        >>> src = KafkaSource("localhost:9092", ["clicks"])
        >>> src.options["subscribe"]
        'clicks'
    """

    def __init__(
        self,
        brokers: Union[str, list[str]],
        topics: Union[str, list[str]],
        starting_offsets: str = "earliest",
        options: Optional[dict[str, Any]] = None,
    ) -> None:
        """Describe the topics to read."""
        opts = {
            "kafka.bootstrap.servers": _names("KafkaSource brokers", brokers),
            "subscribe": _names("KafkaSource topics", topics),
            "startingOffsets": starting_offsets,
            **(options or {}),
        }
        super().__init__("rate", streaming=True, options=opts)
        self.format = "kafka"

    def load(self, spark: Any) -> Any:
        """Build the streaming DataFrame of records.

        Args:
            spark: The SparkSession.

        Returns:
            The DataFrame.

        Raises:
            FlowsparkCompileError: Spark's kafka connector is not on the classpath.
        """
        try:
            df = spark.readStream.format("kafka").options(**self.options).load()
        except Exception as e:
            err = missing_jar(e)
            if err is not None:
                raise err from e
            raise
        # Where a record comes from first: an error's shortened item then names its topic, partition, offset.
        return df.select(*_FIRST, *(c for c in df.columns if c not in _FIRST))

    def __repr__(self) -> str:
        """Show the topics."""
        return f"KafkaSource({self.options['kafka.bootstrap.servers']!r}, {self.options['subscribe']!r})"


class KafkaSink(SparkSink):
    """Write dict items `{"key": str | None, "value": str}` to a Kafka topic (Spark's kafka sink).

    As the only output of a streaming flow it is Spark's kafka sink (at-least-once,
    as Spark documents for Kafka).

    Args:
        brokers: Bootstrap servers.
        topic: The topic to write to.
        schema: Row schema; default `"key STRING, value STRING"` (`BINARY` also works).
        options: More options of Spark's kafka sink.

    Example:
        >>> sink = KafkaSink("localhost:9092", "counts")
        >>> sink.options["topic"]
        'counts'
    """

    def __init__(
        self,
        brokers: Union[str, list[str]],
        topic: str,
        schema: Any = "key STRING, value STRING",
        options: Optional[dict[str, Any]] = None,
    ) -> None:
        """Describe the topic to write to."""
        opts = {
            "kafka.bootstrap.servers": _names("KafkaSink brokers", brokers),
            "topic": _names("KafkaSink topic", topic),
            **(options or {}),
        }
        super().__init__("json", topic, schema=schema, mode="append", options=opts)
        self.format = "kafka"

    def _save(self, df: Any, mode: str) -> None:  # noqa: ARG002
        """Write a batch DataFrame of rows to the topic (Kafka has no save modes).

        Raises:
            FlowsparkCompileError: Spark's kafka connector is not on the classpath.
        """
        try:
            df.write.format("kafka").options(**self.options).save()
        except Exception as e:
            err = missing_jar(e)
            if err is not None:
                raise err from e
            raise

    def __repr__(self) -> str:
        """Show the topic."""
        return f"KafkaSink({self.options['kafka.bootstrap.servers']!r}, {self.options['topic']!r})"
