"""The SparkSession the runtime uses when the caller gives none."""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from flowspark.errors import FlowsparkError

__all__ = [
    "DEFAULT_CONF",
    "MasterUnreachableError",
    "check_master",
    "connect_session",
    "default_parallelism",
    "ensure_workers",
    "get_session",
    "is_connect",
    "open_session",
    "quiet_logs",
    "quiet_query_context",
    "ship_user_modules",
    "streaming_carry",
]

#: Settings of the session `get_session` creates.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "2g",
}


def _installed_roots() -> list[str]:
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(name)
        if p:
            roots.add(p)
    import site

    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the flowspark package
    roots.add(here)
    return [os.path.realpath(r) + os.sep for r in roots if r]


def ship_user_modules() -> list[str]:
    """Pickle the user's own modules by value, so Spark workers need not import them.

    A flow's callables are pickled by reference to their module when that module
    is importable. Modules the driver imported from a script's folder, a test
    folder or a path added at run time are often not importable by the Python
    workers (the session may have started before, or the workers run elsewhere).
    Every loaded module whose file lies outside the Python installation, the
    site-packages and flowspark itself is therefore registered with cloudpickle
    (ours and pyspark's) to travel by value, like `__main__` does.

    Returns:
        The names of the modules registered.
    """
    import cloudpickle
    from pyspark import cloudpickle as spark_cloudpickle

    roots = _installed_roots()
    done = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name == "__main__" or name in _BY_VALUE:
            continue
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py") or _INSTALLED.get(name) == f:
            continue
        real = os.path.realpath(f)
        if any(real.startswith(r) for r in roots):
            _INSTALLED[name] = f  # resolving every module's path took ~60 ms per run (measured)
            continue
        for cp in (cloudpickle, spark_cloudpickle):
            try:
                cp.register_pickle_by_value(mod)
            except (ValueError, TypeError):
                break
        else:
            _BY_VALUE.add(name)
            done.append(name)
    return done


_BY_VALUE: set[str] = set()
#: Modules found installed (name -> file), not looked at again by `ship_user_modules`.
_INSTALLED: dict[str, str] = {}

#: Sessions (SparkContext ids, Connect session ids) whose Python workers were seen to import this flowspark.
_READY: set[Any] = set()
#: Sessions flowspark was shipped to (their workers lack it, or run another version): the workers' interpreter.
_SHIPPED: dict[Any, str] = {}


def streaming_carry(spark: Any) -> Optional[bytes]:
    """The flowspark zip a streaming query's Python data sources must carry, or `None`.

    When flowspark ships itself (`ensure_workers`: `addPyFile` on a classic session, a
    Python artifact through Spark Connect), Spark hands the zip to the tasks of batch
    jobs and streaming queries, but not to the Python process that plans a Python data
    source (Spark 4.3, both kinds of session: `No module named 'flowspark'` while
    Spark builds the query's plan). The data sources are then registered in carriers
    holding the zip (`flowspark.spark.carrier`). Call after `ensure_workers`.

    Args:
        spark: The SparkSession.

    Returns:
        The zip's bytes, or `None`.
    """
    if _SHIPPED.get(_session_key(spark)) is None:
        return None
    from flowspark.spark import carrier

    carrier.register_by_value()
    return Path(_package_zip()).read_bytes()


# The probe is compiled from source in a module of its own name, so it travels to the
# workers by value: it must run where flowspark cannot be imported.
_PROBE_SRC = """
def probe(_):
    import importlib
    import sys
    try:
        import flowspark
        for name in ("flowspark.spark.worker.stage", "flowspark.spark.streaming.state"):
            importlib.import_module(name)
    except ImportError as e:
        return ("missing", getattr(e, "name", None) or str(e), sys.executable)
    return ("ok", flowspark.__version__, sys.executable)
"""


# The same probe as a `mapInArrow` function, for sessions without a SparkContext (Spark Connect).
_PROBE_ARROW_SRC = """
def probe_batches(batches):
    import pyarrow as pa
    for _ in batches:
        pass
    status, what, exe = probe(0)
    yield pa.RecordBatch.from_pydict({"status": [status], "what": [what], "exe": [exe]})
"""


def is_connect(spark: Any) -> bool:
    """Tell whether `spark` is a Spark Connect session (`SparkSession.builder.remote("sc://...")`).

    Such a session has no `sparkContext`: jobs are sent to a server, whose Python
    workers run flowspark's functions; flowspark reaches them through Connect's
    artifact upload.

    Args:
        spark: A SparkSession.

    Returns:
        True for a Spark Connect session.
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _session_key(spark: Any) -> Any:
    return ("connect", spark.session_id) if is_connect(spark) else id(spark.sparkContext)


_PARALLELISM: dict[Any, int] = {}


def default_parallelism(spark: Any) -> int:
    """The session's default parallelism (`SparkContext.defaultParallelism`), also through Spark Connect.

    A Connect session has no SparkContext: the figure is read once per session as the
    number of partitions Spark gives `spark.range` (which uses the default parallelism).

    Args:
        spark: A SparkSession.

    Returns:
        At least 1.
    """
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    key = _session_key(spark)
    if key not in _PARALLELISM:
        from pyspark.sql import functions as F  # noqa: N812

        top = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p").alias("p")).first()
        _PARALLELISM[key] = max(1, int(top["p"]) + 1)
    return _PARALLELISM[key]


def _probe(spark: Any) -> tuple[str, str, str]:
    ns: dict[str, Any] = {"__name__": "flowspark_worker_probe"}
    exec(compile(_PROBE_SRC, "<flowspark worker probe>", "exec"), ns)  # noqa: S102
    if not is_connect(spark):
        return tuple(spark.sparkContext.parallelize([0], 1).map(ns["probe"]).collect()[0])  # type: ignore[return-value]
    exec(compile(_PROBE_ARROW_SRC, "<flowspark worker probe>", "exec"), ns)  # noqa: S102
    row = spark.range(0, 1, 1, 1).mapInArrow(ns["probe_batches"], "status string, what string, exe string").first()
    return (row["status"], row["what"], row["exe"])


def _ship_package(spark: Any) -> None:
    """Ship flowspark to the session's Python workers: `addPyFile` (classic) or an artifact upload (Connect)."""
    if is_connect(spark):
        spark.addArtifacts(_package_zip(), pyfile=True)
    else:
        spark.sparkContext.addPyFile(_package_zip())


def _package_zip() -> str:
    """A zip of this flowspark package (what `addPyFile` ships), built once per version and process."""
    import zipfile

    import flowspark

    root = Path(flowspark.__file__).parent
    target = Path(tempfile.gettempdir()) / f"flowspark-{flowspark.__version__}-{os.getpid()}.zip"
    if not target.exists():
        tmp = target.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(root.rglob("*")):
                if f.suffix in (".py", ".typed") and "__pycache__" not in f.parts:
                    z.write(f, str(Path("flowspark") / f.relative_to(root)))
        os.replace(tmp, target)
    return str(target)


def ensure_workers(spark: Any) -> None:
    """Make sure the session's Python workers run this flowspark, before any job.

    A session the user built may start its workers with another interpreter (PySpark
    runs the first `python3` on PATH unless `PYSPARK_PYTHON` is set), one without
    flowspark or with another version. One small probe job per SparkContext checks;
    when flowspark is missing or differs, flowspark ships itself (`addPyFile` of a zip
    of the package, as it ships the user's modules) and checks again. A Spark Connect
    session is checked the same way (one probe per Connect session); the zip travels as
    a Python artifact (`spark.addArtifacts(..., pyfile=True)`).

    Args:
        spark: The SparkSession.

    Raises:
        WorkerEnvironmentError: The workers still cannot import flowspark or a module
            it needs (e.g. pyarrow): one line with the interpreter, what is missing and
            what to set.
    """
    import flowspark
    from flowspark.errors import WorkerEnvironmentError

    key = _session_key(spark)
    if key in _READY:
        return
    want = flowspark.__version__
    try:
        status, what, exe = _probe(spark)
        if status != "ok" or what != want:
            _ship_package(spark)
            _SHIPPED[key] = exe
            status, what, exe = _probe(spark)
    except WorkerEnvironmentError:
        raise
    except Exception as e:
        msg = (
            f"Spark's Python workers failed to start a probe job ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}); set PYSPARK_PYTHON to {sys.executable} (the interpreter "
            "running flowspark) before the session starts"
        )
        raise WorkerEnvironmentError(msg) from None
    if status != "ok":
        msg = (
            f"Spark's Python workers ({exe}) cannot import {what!r}, which flowspark needs; install "
            f"flowspark[spark] for that interpreter, or set PYSPARK_PYTHON={sys.executable} before the session starts"
        )
        raise WorkerEnvironmentError(msg)
    if what != want:
        msg = (
            f"Spark's Python workers ({exe}) run flowspark {what}, this driver runs {want}, and the shipped "
            f"package did not take precedence; install flowspark {want} there or set PYSPARK_PYTHON={sys.executable}"
        )
        raise WorkerEnvironmentError(msg)
    _READY.add(key)


#: pyspark's driver-side worker of `transformWithStateInPandas` (`worker_python`).
TWS_DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"


def worker_python() -> str:
    """The interpreter a local session flowspark creates gives its Python workers.

    This interpreter, through a small `sh` script that changes two things of a worker's start
    and `exec`s the interpreter:

    - Spark puts its copies of pyspark and py4j as zip files first on every worker's
      `PYTHONPATH` (`<pyspark>/python/lib/pyspark.zip`, `py4j-*-src.zip`); Python compiles
      a module imported from a zip every time a process imports it (zips hold no bytecode
      cache). The script drops those two entries when they belong to the pyspark this
      interpreter imports (the same files, installed, with their compiled bytecode), so a
      new worker process imports pyspark in about 0.3 s of CPU instead of 0.65 s (measured
      on this project's VM). Spark starts such processes per query and more (the Python data
      source's runner, transformWithStateInPandas's driver-side worker, the daemons).
    - pyspark's driver-side worker of `transformWithStateInPandas` (started once per query to
      learn the state variables) prints five debug lines on its standard output ("Starting
      Streaming TransformWithStateInPandas Python worker." ...), which Spark copies to stderr:
      the script drops that one worker's standard output. It talks to Spark over a socket and
      reports errors there and on its stderr, which stays as it is.

    Not on Windows (no `sh`), nor when pyspark itself runs from a zip: this interpreter itself.

    Returns:
        The script's path (in the temporary directory, one per interpreter, pyspark and
        user), or `sys.executable`.
    """
    import shlex
    import zlib

    import py4j
    import pyspark

    if os.name != "posix" or ".zip" in pyspark.__file__ or ".zip" in py4j.__file__:
        return sys.executable
    exe = shlex.quote(sys.executable)
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(z) for z in [lib / "pyspark.zip", *lib.glob("py4j-*-src.zip")] if z.is_file())
    cases = "|".join(shlex.quote(z) for z in zips)
    strip = (
        ""
        if not zips
        else (
            "# pyspark and py4j from the installed packages (compiled once), not from Spark's zips of them\n"
            "set -f; IFS=:; kept=\n"
            'for e in $PYTHONPATH; do case "$e" in ' + cases + ') ;; *) kept="${kept:+$kept:}$e" ;; esac; done\n'
            'unset IFS; set +f; PYTHONPATH="$kept"; export PYTHONPATH\n'
        )
    )
    text = (
        "#!/bin/sh\n"
        "# flowspark: Spark's Python workers run this interpreter (flowspark.spark.session.worker_python).\n"
        + strip
        + "# the stdout of pyspark's driver-side transformWithStateInPandas worker (debug prints)\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "{TWS_DRIVER_WORKER}" ]; then exec {exe} "$@" >/dev/null; fi\n'
        f'exec {exe} "$@"\n'
    )
    uid = os.getuid() if hasattr(os, "getuid") else 0
    path = Path(tempfile.gettempdir()) / f"flowspark-python-{uid}-{zlib.crc32(text.encode()):08x}"
    if not (path.exists() and path.read_text() == text):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)  # noqa: S103 - an interpreter others may run, as the interpreter itself
        os.replace(tmp, path)
    return str(path)


def get_session(
    master: str = "local[*]",
    conf: Optional[dict[str, str]] = None,
    new_conf: Optional[Callable[[], dict[str, str]]] = None,
) -> Any:
    """Return the active SparkSession, or create a local one with sensible defaults.

    With `SPARK_REMOTE=sc://...` in the environment (pyspark's switch to Spark
    Connect), a Connect session on that server instead.

    A session flowspark creates keeps Spark's own log quiet: flowspark reports a
    failed step itself (step id, original type and message, the item), so Spark's
    ERROR lines, Java traces and task-error markers would only repeat it. Set
    `FLOWSPARK_SPARK_LOG_LEVEL` (`warn`, `error`, `info` ...; default `off`) to see
    Spark's log, or `SPARK_CONF_DIR` to use your own `log4j2.properties`.

    Args:
        master: Spark master for a new session.
        conf: Extra settings for a new session (over `DEFAULT_CONF`).
        new_conf: Called only when a new classic session is created (not for an active
            session nor Spark Connect), for settings that must be there before the JVM
            starts and whose lookup may fail (a Kafka or Delta flow's `spark.jars` and
            Delta's settings: `flowspark.spark.io.classpath.session_conf`).

    Returns:
        The session.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    remote = os.environ.get("SPARK_REMOTE")
    if remote:  # pyspark's own switch to Spark Connect (also set by Databricks Connect set-ups)
        return connect_session(remote, conf)
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Workers of a local session import the user's modules like the driver does.
        path = [p for p in sys.path if p and os.path.isdir(p)]
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*(old.split(os.pathsep) if old else []), *path]))
    conf = {**(conf or {}), **(new_conf() if new_conf is not None else {})}
    level = os.environ.get("FLOWSPARK_SPARK_LOG_LEVEL", "off").strip().lower() or "off"
    quiet_logs(level)
    builder = SparkSession.builder.master(master).appName("flowspark")
    for k, v in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(level.upper())
    return spark


class MasterUnreachableError(FlowsparkError, ConnectionError):
    """A `spark://` master did not accept a connection."""


def check_master(master: str, timeout: float = 3.0) -> None:
    """Check that a host of a `spark://h1:p1[,h2:p2]` master URL accepts TCP connections.

    Other masters (`local[...]`, `yarn`, `k8s://...`) are not checked.

    Args:
        master: The master URL.
        timeout: Seconds to wait for each connection.

    Raises:
        MasterUnreachableError: No listed host accepted a connection.

    Example:
        >>> check_master("local[2]")
    """
    if not master.startswith("spark://"):
        return
    errors = []
    for hp in master[len("spark://") :].split(","):
        try:
            parsed = urlparse(f"spark://{hp}")
            host, port = parsed.hostname, parsed.port
        except ValueError:
            host, port = None, None
        if not host or port is None:
            msg = f"master URL {master!r} has no valid HOST:PORT in {hp!r}; write it as spark://HOST:PORT (often 7077)"
            raise MasterUnreachableError(msg)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as e:
            errors.append(f"{host}:{port}: {e.strerror or e}")
    msg = (
        f"cannot reach the Spark master {master} ({'; '.join(errors)}); start it "
        "(`spark-class org.apache.spark.deploy.master.Master`) or fix --master"
    )
    raise MasterUnreachableError(msg)


def open_session(
    master: str,
    conf: Optional[dict[str, str]] = None,
    app_name: str = "flowspark",
    remote: Optional[str] = None,
    new_conf: Optional[Callable[[], dict[str, str]]] = None,
) -> Any:
    """Return a SparkSession on `master` (checked first when it is `spark://`), quiet as `get_session` makes it.

    Args:
        master: The master URL.
        conf: Extra settings (over `flowspark.spark.session.DEFAULT_CONF`).
        app_name: The application name.
        remote: A Spark Connect URL (`sc://HOST:PORT[/;params]`): a Connect session
            instead (then `master` is ignored; `conf` is set on the session).
        new_conf: As `get_session`'s (a classic session only).

    Returns:
        The session.

    Raises:
        MasterUnreachableError: A `spark://` master or the Connect server cannot be reached.
    """
    if remote is not None:
        return connect_session(remote, conf)
    check_master(master)
    return get_session(master, {"spark.app.name": app_name, **(conf or {})}, new_conf)


def connect_session(url: str, conf: Optional[dict[str, str]] = None) -> Any:
    """A Spark Connect session on `url`, its server checked first.

    Args:
        url: `sc://HOST:PORT[/;params]` (port default 15002).
        conf: Settings to set on the session (runtime settings only, as Connect allows).

    Returns:
        The session.

    Raises:
        MasterUnreachableError: The URL is malformed, the server does not accept a
            connection, or a setting is refused.
    """
    try:
        parsed = urlparse(url)
        host, port, scheme = parsed.hostname, parsed.port or 15002, parsed.scheme
    except ValueError:
        host, port, scheme = None, 15002, ""
    if scheme != "sc" or not host:
        msg = f"Spark Connect URL {url!r} is not sc://HOST[:PORT]; e.g. sc://localhost:15002"
        raise MasterUnreachableError(msg)
    try:
        with socket.create_connection((host, port), timeout=3.0):
            pass
    except OSError as e:
        msg = (
            f"cannot reach the Spark Connect server {url} ({host}:{port}: {e.strerror or e}); start it "
            "(`$SPARK_HOME/sbin/start-connect-server.sh`) or fix --remote"
        )
        raise MasterUnreachableError(msg) from None
    try:
        import pyspark.sql.connect.session  # noqa: F401 - fails without the Connect client's dependencies
    except ImportError as e:
        msg = f"a Spark Connect session needs pyspark's Connect client ({e}); install flowspark[connect]"
        raise MasterUnreachableError(msg) from None
    from pyspark.sql import SparkSession

    # Through pyspark.sql's builder, which also switches pyspark's functions to Connect mode.
    spark = SparkSession.builder.remote(url).getOrCreate()
    for k, v in (conf or {}).items():
        try:
            spark.conf.set(k, v)
        except Exception as e:  # noqa: BLE001
            msg = f"the Spark Connect server refused the setting {k}={v} ({' '.join(str(e).split())[:200]})"
            raise MasterUnreachableError(msg) from None
    return spark


_LOG4J2 = """# Written by flowspark: keep Spark's console quiet (the flowspark CLI reports errors itself).
rootLogger.level = {level}
# Spark gives an interpreter's driver (pyspark's is PythonGatewayServer) the level of its logger,
# and prints two lines ("Setting default log level ...") at the JVM's start when it differs from
# the root's: the same level, no lines.
logger.pygateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygateway.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def quiet_logs(level: str = "off") -> Optional[Path]:
    """Point `SPARK_CONF_DIR` at a directory whose `log4j2.properties` sets Spark's log level.

    Does nothing when `SPARK_CONF_DIR` is already set (the user's configuration wins)
    or a JVM is already running in this process.

    Args:
        level: log4j level (`off`, `error`, `warn`, `info`).

    Returns:
        The directory, or None when nothing was changed.
    """
    if os.environ.get("SPARK_CONF_DIR"):
        return None
    d = Path(tempfile.gettempdir()) / f"flowspark-spark-conf-{level}-{os.getuid() if hasattr(os, 'getuid') else 0}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "log4j2.properties").write_text(_LOG4J2.format(level=level))
    os.environ["SPARK_CONF_DIR"] = str(d)
    return d


#: pyspark's loggers that write an ERROR line with a stack trace for every analysis error it raises.
_QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


@contextmanager
def quiet_query_context() -> Iterator[None]:
    """Silence pyspark's query-context loggers while flowspark drives Spark.

    pyspark 4 logs every `AnalysisException` (and the other captured Spark errors that carry
    a query context) as a JSON ERROR line with the Python stack on stderr when it *raises*
    it, before anyone could catch it. flowspark turns the errors it can name into its own
    one-line error (or raises pyspark's, which carries the same text), so inside a flowspark
    run those lines only repeat it; outside, the user's own pyspark calls log as before.

    Yields:
        Nothing; the loggers' `disabled` flags are restored on exit.
    """
    loggers = [logging.getLogger(name) for name in _QUERY_CONTEXT_LOGGERS]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was
