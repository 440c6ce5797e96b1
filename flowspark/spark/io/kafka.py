"""Kafka through Spark's `kafka` format (streaming source and sink).

Spark's Kafka connector is not part of pyspark: the session needs the jar
`KAFKA_PACKAGE` in `spark.jars.packages` (or `--packages` for spark-submit), e.g.

    SparkSession.builder.config("spark.jars.packages", KAFKA_PACKAGE)

Without it, `flowspark.spark.run` fails with a `FlowsparkCompileError` naming
the coordinate.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from flowspark.errors import FlowsparkCompileError, FlowsparkTypeError
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.outputs import SparkSink

__all__ = ["KAFKA_PACKAGE", "KafkaSink", "KafkaSource"]


def _kafka_package() -> str:
    import pyspark

    from flowspark.spark.versions import installed

    release = str(pyspark.__version__)
    scala = "2.12" if installed(release) < (4, 0) else "2.13"  # PyPI's pyspark 3.5 is built for Scala 2.12
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{release}"


#: The Maven coordinate of Spark's Kafka connector for the installed pyspark (its version and Scala's).
KAFKA_PACKAGE = _kafka_package()


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
            f"spark.jars.packages={KAFKA_PACKAGE} (or spark-submit --packages {KAFKA_PACKAGE})"
        )
        return FlowsparkCompileError(msg)
    return None


class KafkaSource(SparkSource):
    """Read Kafka topics as a stream; one dict item per record.

    Items: `{"key": bytes, "value": bytes, "topic": str, "partition": int,
    "offset": int, "timestamp": datetime, "timestampType": int}`. Offsets are
    Spark's (kept in the query's checkpoint).

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
            return spark.readStream.format("kafka").options(**self.options).load()
        except Exception as e:
            err = missing_jar(e)
            if err is not None:
                raise err from e
            raise

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
