"""`flowspark submit`: run a dataflow on a Spark cluster with pyspark's own `spark-submit`.

What it does:

1. resolves the import string here (so a bad one fails at once, with one line),
   checks the flow and compiles it for Spark;
2. packages the code into one zip for `--py-files`: the user's top-level
   package (or single module), or with `--project DIR` every `.py` file under
   `DIR`, plus the `flowspark` package itself, so workers need only pyspark,
   cloudpickle, pandas and pyarrow;
3. writes a small driver program that calls `flowspark run --runtime spark`
   with the module-form import string;
4. runs `PYSPARK/bin/spark-submit --master URL --py-files flow.zip ... driver.py`
   (`--dry-run` prints that exact command instead, one shell-quoted line);
   a flow that reads or writes Kafka gets `--packages` with Spark's Kafka
   connector (`KAFKA_PACKAGE`), one that reads or writes Delta Lake the Delta
   build for this pyspark (`flowspark.spark.io.delta.delta_package()`) and
   Delta's two settings, unless `--conf spark.jars.packages=...` is given.

The driver and the executors use this Python (`sys.executable`) unless
`--archives env.tar.gz#environment` ships a packed environment, in which case
executors use `./environment/bin/python` (set `--conf spark.pyspark.python=...`
to choose another). `spark-submit`'s own log goes to `spark-submit.log` in the
work directory; only the flow's output, `flowspark:` lines (progress, errors)
and Python tracebacks of the driver reach the terminal.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Optional

from flowspark.errors import FlowsparkError

__all__ = [
    "SubmitError",
    "add_submit_arguments",
    "build_package",
    "spark_submit_path",
    "submit",
]

_SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules", "site-packages"}


class SubmitError(FlowsparkError, ValueError):
    """`flowspark submit` cannot package or submit the flow."""


def spark_submit_path() -> Path:
    """Return pyspark's own `bin/spark-submit`.

    Returns:
        The path.

    Raises:
        SubmitError: pyspark is not installed.
    """
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        msg = "flowspark submit needs pyspark (it runs pyspark's spark-submit); pip install 'flowspark[spark]'"
        raise SubmitError(msg)
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "spark-submit"
    if not path.is_file():
        msg = f"pyspark has no {path}; reinstall pyspark (pip install --force-reinstall pyspark)"
        raise SubmitError(msg)
    return path


def add_submit_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `flowspark submit` to `parser`.

    Args:
        parser: The sub-command's parser.
    """
    from flowspark._args import conf_pair, positive_int, trigger_arg, ttl_seconds

    parser.add_argument("--master", required=True, metavar="URL", help="Spark master, e.g. spark://HOST:7077")
    parser.add_argument(
        "--archives",
        action="append",
        default=[],
        metavar="ARCHIVE[#ALIAS]",
        help="archive unpacked on every node, e.g. a packed venv env.tar.gz#environment (repeatable)",
    )
    parser.add_argument(
        "--py-files", action="append", default=[], metavar="FILES", help="extra .zip/.py files (repeatable)"
    )
    parser.add_argument(
        "--conf", type=conf_pair, action="append", default=[], metavar="KEY=VALUE", help="Spark setting (repeatable)"
    )
    parser.add_argument(
        "--project",
        metavar="DIR",
        help="package every .py file under DIR (default: the flow's top-level package or module)",
    )
    parser.add_argument("--name", help="application name (default: flowspark <flow id>)")
    parser.add_argument("--checkpoint", metavar="DIR", help="streaming checkpoint directory (passed to the driver)")
    parser.add_argument("--trigger", type=trigger_arg, metavar="T", help="streaming trigger (passed to the driver)")
    parser.add_argument("--timeout", type=float, metavar="SECS", help="streaming: stop after SECS seconds")
    parser.add_argument(
        "--buckets", type=positive_int, metavar="B", help="streaming: state buckets (passed to the driver)"
    )
    parser.add_argument(
        "--state-layout",
        choices=["chunk", "bucket", "key"],
        help="streaming: state layout of a new checkpoint (passed to the driver; see docs/streaming.md)",
    )
    parser.add_argument(
        "--state-ttl",
        type=ttl_seconds,
        metavar="SECS",
        help="drop a stateful step's state for a key that got no value for SECS seconds (passed to the driver)",
    )
    parser.add_argument(
        "--work-dir", metavar="DIR", help="where to write the zip, driver and log (default: a new temp dir)"
    )
    parser.add_argument("--dry-run", action="store_true", help="write the files and print the spark-submit command")


# -- packaging ------------------------------------------------------------------------------------


def _module_origin(spec_text: str) -> tuple[str, Path, Path]:
    """`(module name, sys.path root, what to package)` of an import string's module (already imported)."""
    from flowspark._importstr import module_for_file, parse_import_str

    spec = parse_import_str(spec_text)
    if spec.is_file:
        name, root, _path = module_for_file(spec)
    else:
        name = spec.target
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if module is None or file is None:
            msg = f"module {name!r} has no source file to package; give a .py file or a package with files"
            raise SubmitError(msg)
        path = Path(file).resolve()
        depth = name.count(".") + (1 if path.name == "__init__.py" else 0)
        root = path.parent
        for _ in range(depth):
            root = root.parent
    top = name.split(".")[0]
    pkg = root / top
    target = pkg if (pkg / "__init__.py").is_file() else root / f"{top}.py"
    return name, root, target


def _is_env_dir(d: Path) -> bool:
    return (d / "pyvenv.cfg").is_file() or (d / "conda-meta").is_dir()


def _py_files_under(base: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        d = Path(dirpath)
        dirnames[:] = sorted(
            n for n in dirnames if not n.startswith(".") and n not in _SKIP_DIRS and not _is_env_dir(d / n)
        )
        out += [d / f for f in sorted(filenames) if f.endswith(".py")]
    return out


def build_package(import_str: str, zip_path: Path, project: Optional[Path] = None) -> tuple[str, list[str]]:
    """Zip the flow's code and the flowspark package for `--py-files`.

    The flow's module must be importable here (`locate_dataflow` imported it).

    Args:
        import_str: The import string as given (module or file form).
        zip_path: The zip to write.
        project: Package every `.py` file under this directory instead of the
            flow's top-level package or module.

    Returns:
        The module-form import string the driver uses, and the archive names written.

    Raises:
        SubmitError: The flow's module is not inside `project`, or has no file.
    """
    from flowspark._importstr import parse_import_str

    spec = parse_import_str(import_str)
    name, root, target = _module_origin(import_str)
    entries: dict[str, Path] = {}
    if project is not None:
        base = project.resolve()
        mod_file = (root / Path(*name.split("."))).with_suffix(".py")
        pkg_init = root / Path(*name.split(".")) / "__init__.py"
        inside = [p for p in (mod_file, pkg_init) if p.is_file()]
        if not inside or base not in (inside[0].parents):
            msg = f"the flow's module {name!r} ({inside[0] if inside else root}) is not under --project {str(base)!r}"
            raise SubmitError(msg)
        rel = inside[0].relative_to(base)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        # The module name inside the zip is relative to the project root, whatever sys.path said.
        name = ".".join(parts)
        for f in _py_files_under(base):
            entries[f.relative_to(base).as_posix()] = f
    elif target.is_dir():
        for f in _py_files_under(target):
            entries[(Path(target.name) / f.relative_to(target)).as_posix()] = f
    else:
        entries[target.name] = target
    import flowspark

    fs_dir = Path(flowspark.__file__).resolve().parent
    for f in _py_files_under(fs_dir):
        entries.setdefault((Path("flowspark") / f.relative_to(fs_dir)).as_posix(), f)
    typed = fs_dir / "py.typed"
    if typed.is_file():
        entries.setdefault("flowspark/py.typed", typed)
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, f in sorted(entries.items()):
            zf.write(f, arc)
    attr = import_str.strip().partition(":")[2] if ":" in import_str else spec.attr
    return f"{name}:{attr.strip()}", sorted(entries)


_DRIVER = '''"""Driver written by `flowspark submit`; runs under spark-submit."""

import sys

from flowspark.cli import main

sys.exit(main({argv!r}))
'''


def _archive_alias(archives: list[str]) -> Optional[str]:
    for a in archives:
        for item in a.split(","):
            if "#" in item:
                return item.rsplit("#", 1)[1]
    return None


def _packages(flow: Any, plan: Any, conf: dict[str, str]) -> list[str]:
    """The Maven packages `flow` needs on the cluster; Delta's two settings go into `conf` (unless given).

    Raises:
        SubmitError: The flow reads or writes Delta and no Delta release is built for this pyspark.
    """
    from flowspark.spark.io.classpath import delta_steps
    from flowspark.spark.io.delta import DELTA_CONF, delta_package

    packages = []
    if _reads_or_writes_kafka(flow):
        from flowspark.spark.io.kafka import KAFKA_PACKAGE

        packages.append(KAFKA_PACKAGE)
    steps = delta_steps(plan)
    if steps:
        package = delta_package()
        if package is None and "spark.jars.packages" not in conf:
            msg = (
                f"step {steps[0]!r} uses Delta Lake, and no Delta Lake release is built for the installed "
                "pyspark; submit Delta flows from pyspark 4.2, or pass --conf spark.jars.packages=... with a "
                "Delta Lake built for the cluster's Spark"
            )
            raise SubmitError(msg)
        if package is not None:
            packages.append(package)
        for k, v in DELTA_CONF.items():
            conf.setdefault(k, v)
    return packages


def _reads_or_writes_kafka(flow: Any) -> bool:
    """Tell whether a step of `flow` reads or writes Kafka (Spark's connector must then be shipped)."""
    from flowspark import ir
    from flowspark.spark.io.kafka import KafkaSink, KafkaSource

    for node in ir.walk(flow.validate()):
        if isinstance(node, ir.Input) and isinstance(node.source, KafkaSource):
            return True
        if isinstance(node, ir.Output) and isinstance(node.sink, KafkaSink):
            return True
    return False


def submit(args: argparse.Namespace) -> int:
    """Package the flow, write the driver and run (or print) the spark-submit command.

    Args:
        args: Parsed `flowspark submit` arguments.

    Returns:
        spark-submit's exit code (0 with `--dry-run`).

    Raises:
        SubmitError: The flow cannot be packaged or spark-submit is missing.
        MasterUnreachableError: The master cannot be reached (not checked with `--dry-run`).
    """
    from flowspark._importstr import locate_dataflow

    flow = locate_dataflow(args.import_str)
    from flowspark.spark.batch.job import check_bounded
    from flowspark.spark.plan.compiler import compile_flow
    from flowspark.spark.streaming import compile_streaming

    plan = compile_flow(flow.validate())
    if plan.bounded:
        check_bounded(plan)
        streaming = {"--checkpoint": args.checkpoint, "--trigger": args.trigger, "--timeout": args.timeout}
        streaming.update({"--buckets": args.buckets, "--state-layout": args.state_layout})
        given = [flag for flag, value in streaming.items() if value is not None]
        if given:
            msg = (
                f"{'/'.join(given)} apply to flows with an unbounded source; every source of "
                f"{flow.flow_id!r} is bounded, so it runs as a Spark batch job: drop {' '.join(given)}"
            )
            raise SubmitError(msg)
    else:
        compile_streaming(plan)
    exe = spark_submit_path()
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="flowspark-submit-"))
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    zip_path = work / "flow.zip"
    project = Path(args.project) if args.project else None
    if project is not None and not project.is_dir():
        msg = f"--project {args.project!r} is not a directory"
        raise SubmitError(msg)
    module_str, _ = build_package(args.import_str, zip_path, project)
    conf = dict(args.conf)
    driver_argv = ["run", "--runtime", "spark", "--master", args.master, module_str]
    for k, v in conf.items():
        driver_argv += ["--conf", f"{k}={v}"]
    if args.checkpoint is not None:
        driver_argv += ["--checkpoint", str(Path(args.checkpoint).resolve())]
    if args.trigger is not None:
        driver_argv += ["--trigger", args.trigger]
    if args.timeout is not None:
        driver_argv += ["--timeout", str(args.timeout)]
    if args.buckets is not None:
        driver_argv += ["--buckets", str(args.buckets)]
    if args.state_layout is not None:
        driver_argv += ["--state-layout", args.state_layout]
    if args.state_ttl is not None:
        driver_argv += ["--state-ttl", repr(args.state_ttl.total_seconds())]
    driver = work / "flowspark_driver.py"
    driver.write_text(_DRIVER.format(argv=driver_argv))
    alias = _archive_alias(args.archives)
    conf.setdefault("spark.pyspark.driver.python", sys.executable)
    conf.setdefault("spark.pyspark.python", f"./{alias}/bin/python" if alias else sys.executable)
    py_files = ",".join([str(zip_path), *args.py_files])
    cmd = [str(exe), "--master", args.master, "--name", args.name or f"flowspark {flow.flow_id}"]
    cmd += ["--py-files", py_files]
    for a in args.archives:
        cmd += ["--archives", a]
    packages = _packages(flow, plan, conf)
    if packages and "spark.jars.packages" not in conf:
        cmd += ["--packages", ",".join(packages)]  # Kafka's connector, Delta Lake: not in Spark's distribution
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    cmd.append(str(driver))
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    from flowspark.spark.session import check_master

    check_master(args.master)
    return _run_spark_submit(cmd, work / "spark-submit.log")


_PASS = re.compile(r"^(Traceback |  File |    |\w+(Error|Exception|Interrupt)\b)")
_LOG4J = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (ERROR|WARN|INFO)|^\s+at |^Caused by:")


def _run_spark_submit(cmd: list[str], log_path: Path) -> int:
    """Run spark-submit; keep its log in `log_path`, show the flow's output and `flowspark:` lines.

    spark-submit merges the Python driver's stderr into its stdout, so `flowspark:`
    lines (progress, errors) arrive on stdout: they go to our stderr, the rest of
    stdout (the flow's own output) to our stdout. spark-submit's stderr (the JVM's
    log) goes to the log file; only Python tracebacks in it are shown.
    """
    import threading

    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    state = {"shown_error": False, "last_error": ""}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        assert proc.stderr is not None
        lock = threading.Lock()

        def pump_err() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                with lock:
                    log.write(line)
                if _LOG4J.match(line):
                    if " ERROR " in line[:30]:
                        state["last_error"] = line.strip()
                    continue
                if _PASS.match(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()

        t = threading.Thread(target=pump_err, daemon=True)
        t.start()
        try:
            for line in proc.stdout:
                if line.startswith("flowspark:"):
                    state["shown_error"] = state["shown_error"] or line.startswith("flowspark: error")
                    with lock:
                        log.write(line)
                    sys.stderr.write(line)
                    sys.stderr.flush()
                else:
                    sys.stdout.write(line)
                    sys.stdout.flush()
            code = proc.wait()
            t.join(timeout=30)
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if code != 0 and not state["shown_error"]:
        why = " ".join(str(state["last_error"]).split()[4:]) or "see the log"
        print(
            f"flowspark: error: spark-submit failed (exit code {code}): {why[:300]}; full log: {log_path}",
            file=sys.stderr,
        )
    return 1 if code != 0 else 0
