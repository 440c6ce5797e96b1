"""Every use of pyspark's and Py4J's private APIs, each in one small function.

flowspark reaches a few things pyspark offers no public API for: on a classic session,
the JVM (Hadoop's file systems for a checkpoint given as a URI, Spark's status store for
the progress line, a DataFrame's physical plan as text) and the Java side of a streaming
query listener; through Spark Connect, a DataFrame's plan text; the session this process
instantiated; and which copy of cloudpickle rebuilt a class by value. A pyspark upgrade
that renames one of them is a change to this module alone: `tests/spark/test_compat.py`
runs each function on a session, and `tests/unit/test_architecture.py` keeps these names
out of every other module.

Importing this module imports nothing of pyspark (the workers import it through
`flowspark.spark.worker.codec`).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "JavaQueryListener",
    "default_session",
    "executed_plan",
    "explain_string",
    "from_arrow",
    "hadoop_configuration",
    "hadoop_path",
    "inferred_schema",
    "lean_listener",
    "read_utf8",
    "rebuilt_by_value",
    "arrow_type",
    "stage_list",
    "to_arrow",
]


# --------------------------------------------------------------------------- sessions
def default_session() -> Optional[Any]:
    """The active SparkSession of this thread, else the one this process instantiated, else `None`.

    Returns:
        A SparkSession, or `None`.
    """
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession._instantiatedSession


# --------------------------------------------------------------------------- plans
def explain_string(spark: Any, df: Any, mode: str) -> str:
    """Spark's `explain(mode)` text of `df` as a string, on a classic or a Spark Connect session.

    Args:
        spark: The session `df` belongs to.
        df: A DataFrame.
        mode: `explain`'s mode (`"simple"`, `"formatted"`, ...).

    Returns:
        The text, without trailing whitespace.
    """
    from flowspark.spark.session import is_connect

    if is_connect(spark):
        return str(df._explain_string(mode=mode)).rstrip()
    jvm = spark.sparkContext._jvm
    return str(jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), mode)).rstrip()


def executed_plan(df: Any) -> Optional[Any]:
    """The JVM physical plan (`SparkPlan`) of a classic session's DataFrame, planned at the driver (no job).

    Args:
        df: A DataFrame.

    Returns:
        The plan's py4j object, or `None` for a Spark Connect DataFrame (its plan is on the server).
    """
    jdf = getattr(df, "_jdf", None)
    return None if jdf is None else jdf.queryExecution().executedPlan()


def inferred_schema(spark: Any, rows: list[Any]) -> Any:
    """The StructType Spark infers for `rows` (dicts), as `createDataFrame(rows).schema` does.

    A classic session infers in Python (what `createDataFrame` does first), without shipping
    the rows to the JVM (2-7 ms against about 20 ms, measured); elsewhere `createDataFrame`
    (a Spark Connect session has a `_inferSchemaFromList` too, of another signature).

    Args:
        spark: The session.
        rows: The rows.

    Returns:
        A `pyspark.sql.types.StructType`.
    """
    from flowspark.spark.session import is_connect

    infer = None if is_connect(spark) else getattr(spark, "_inferSchemaFromList", None)
    return infer(rows) if infer is not None else spark.createDataFrame(rows).schema


def to_arrow(df: Any) -> Any:
    """Collect `df` to the driver as one `pyarrow.Table` (`DataFrame.toArrow`, Spark 4.0+).

    Spark 3.5 has no public `toArrow`: its classic DataFrame collects Arrow record batches
    with the private `_collect_as_arrow` (what its own `toPandas` uses; an empty result
    gives no batch, so the table takes its schema from `df.schema`), its Spark Connect
    DataFrame asks its client for the plan's table (what its own `collect` does).

    Args:
        df: A DataFrame.

    Returns:
        A `pyarrow.Table` with `df`'s columns.
    """
    to_arrow_method = getattr(df, "toArrow", None)
    if to_arrow_method is not None:
        return to_arrow_method()
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    if type(df).__module__.startswith("pyspark.sql.connect"):
        client = df._session.client
        table, _schema = client.to_table(df._plan.to_proto(client))
        return table
    batches = df._collect_as_arrow()
    return pa.Table.from_batches(batches, schema=None if batches else to_arrow_schema(df.schema))


def from_arrow(spark: Any, table: Any, schema: Any) -> Any:
    """A DataFrame of a `pyarrow.Table`'s rows with `schema` (`createDataFrame(table)`, Spark 4.0+).

    Spark 3.5's `createDataFrame` takes no Arrow table: it gets the table's rows as dicts
    (each Python value as Arrow gives it: `None` for a null, `datetime` for a timestamp).

    Args:
        spark: The session.
        table: A `pyarrow.Table` whose columns are `schema`'s.
        schema: The `StructType`.

    Returns:
        The DataFrame.
    """
    from pyspark.sql import DataFrame

    if hasattr(DataFrame, "toArrow"):  # the API of Spark 4.0, whose createDataFrame takes a table too
        return spark.createDataFrame(table, schema)
    return spark.createDataFrame(table.to_pylist(), schema)


def arrow_type(data_type: Any, timezone: Optional[str]) -> Any:
    """The Arrow type pyspark gives a Spark `data_type`, its TIMESTAMPs in `timezone`.

    Spark 4 takes the zone (`to_arrow_type(..., timezone=)`); Spark 3.5's `to_arrow_type`
    has no such argument and gives a TIMESTAMP column UTC, replaced here by `timezone`.

    Args:
        data_type: A `pyspark.sql.types.DataType`.
        timezone: The Arrow time zone of TIMESTAMP values, or `None`.

    Returns:
        A `pyarrow.DataType`.
    """
    import inspect

    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    if "timezone" in inspect.signature(to_arrow_type).parameters:
        return to_arrow_type(data_type, timezone=timezone)
    typ = to_arrow_type(data_type)
    if pa.types.is_timestamp(typ) and typ.tz is not None:
        return pa.timestamp(typ.unit, tz=timezone)
    return typ


# --------------------------------------------------------------------------- status store
def stage_list(spark: Any) -> list[Any]:
    """Every stage in the status store of a classic session's SparkContext.

    Args:
        spark: A classic SparkSession.

    Returns:
        Spark's `StageData` of each stage (Java objects: `stageId()`, `status()`, `numTasks()`...).
    """
    sc = spark.sparkContext
    store = sc._jsc.sc().statusStore()
    jvm = sc._jvm
    seq = store.stageList(None, False, False, sc._gateway.new_array(jvm.double, 0), jvm.java.util.ArrayList())
    return [seq.apply(i) for i in range(seq.size())]


# --------------------------------------------------------------------------- Hadoop file systems
def hadoop_configuration(spark: Any) -> Any:
    """The Hadoop `Configuration` of a classic session (the one Spark opens its files with).

    Args:
        spark: A classic SparkSession.

    Returns:
        The Java `org.apache.hadoop.conf.Configuration`.
    """
    return spark._jsc.hadoopConfiguration()


def hadoop_path(spark: Any, path: str) -> Any:
    """A Hadoop `Path` of `path`, in a classic session's JVM.

    Args:
        spark: A classic SparkSession.
        path: A path or URI.

    Returns:
        The Java `org.apache.hadoop.fs.Path`.
    """
    return spark._jvm.org.apache.hadoop.fs.Path(path)


def read_utf8(spark: Any, stream: Any) -> str:
    """The rest of a Java `InputStream` as UTF-8 text (commons-io, in a classic session's JVM).

    Args:
        spark: A classic SparkSession.
        stream: The stream (not closed here).

    Returns:
        The text.
    """
    return str(spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))


# --------------------------------------------------------------------------- streaming listener
class JavaQueryListener:
    """The Java side of a streaming query listener on a classic session (a Py4J callback), reading each event lean.

    pyspark's own bridge turns every progress event into a Python object field by field (a
    JVM round trip each). Here an event costs two calls: its progress as JSON, handed to
    `progress_json`, or its run id, handed to `terminated`. Subclasses define both.
    """

    def progress_json(self, text: str) -> None:
        """Take a progress event's JSON (`StreamingQueryProgress.json`)."""
        raise NotImplementedError

    def terminated(self, run_id: str) -> None:
        """Take the run id of a query run that terminated."""
        raise NotImplementedError

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802
        """Nothing to do."""

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        """Hand the progress over as JSON."""
        self.progress_json(jevent.progress().json())

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        """Nothing to do."""

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        """Hand the run id over."""
        self.terminated(str(jevent.runId().toString()))

    class Java:
        """The Java interface Py4J implements."""

        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]  # noqa: RUF012


def lean_listener(spark: Any, base: type, java: JavaQueryListener) -> Any:
    """A listener of class `base` (a `StreamingQueryListener`) whose Java side on a classic session is `java`.

    pyspark asks a listener for its Java side when it is added (`streams.addListener`); this
    one answers with `java` wrapped as Spark's Python listener (built once, on first use).
    Through Spark Connect the Java side is never asked for: `base`'s Python methods get the
    events.

    Args:
        spark: The session the listener will be added to.
        base: The listener's class (its methods receive the events through Spark Connect).
        java: The Java side.

    Returns:
        The listener (an instance of a subclass of `base`).
    """

    class Lean(base):  # type: ignore[misc,valid-type]  # a class given at run time
        @property
        def _jlistener(self) -> Any:
            jl = self.__dict__.get("_lean")
            if jl is None:
                jvm = spark.sparkContext._jvm
                jl = self.__dict__["_lean"] = jvm.PythonStreamingQueryListenerWrapper(java)
            return jl

    return Lean()


# --------------------------------------------------------------------------- cloudpickle
def rebuilt_by_value(cp: Any, cls: type) -> bool:
    """Whether the copy `cp` of cloudpickle (pyspark's or the package) rebuilt class `cls` by value.

    Reads cloudpickle's table of the classes it rebuilt by value (private; a version that
    lacks it rebuilt none, as far as this tells).

    Args:
        cp: The `cloudpickle` module (`pyspark.cloudpickle` or `cloudpickle`).
        cls: The class.

    Returns:
        Whether `cls` is in that copy's table.
    """
    import sys

    table = getattr(sys.modules.get(cp.__name__ + ".cloudpickle"), "_DYNAMIC_CLASS_TRACKER_BY_CLASS", {})
    return cls in table
