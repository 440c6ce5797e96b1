"""`python -m flowspark.run IMPORT_STR`: run a dataflow, by default with the in-memory executor.

Flags and environment variables follow `python -m bytewax.run`; each flag
also reads a `FLOWSPARK_*` variable, then the `BYTEWAX_*` one, so a Bytewax
deployment's environment keeps working:

- `-s/--snapshot-interval SECS`: epoch length (default 10 s).
  Env: `FLOWSPARK_SNAPSHOT_INTERVAL`, `BYTEWAX_SNAPSHOT_INTERVAL`.
- `-r/--recovery-directory DIR`: resume from / snapshot to this store.
  Env: `FLOWSPARK_RECOVERY_DIRECTORY`, `BYTEWAX_RECOVERY_DIRECTORY`.
- `-b/--backup-interval SECS`: `RecoveryConfig.backup_interval` (older snapshots kept this long).
  Env: `FLOWSPARK_RECOVERY_BACKUP_INTERVAL`, `BYTEWAX_RECOVERY_BACKUP_INTERVAL`.
- `-w/--workers-per-process N`: workers in this process (see below).
  Env: `FLOWSPARK_WORKERS_PER_PROCESS`, `BYTEWAX_WORKERS_PER_PROCESS`.
- `-i/--process-id N`: this process's index in `-a`.
  Env: `FLOWSPARK_PROCESS_ID`, `BYTEWAX_PROCESS_ID`, or `BYTEWAX_POD_NAME`
  minus the prefix `"$BYTEWAX_STATEFULSET_NAME-"` (Bytewax's Helm chart).
- `-a/--addresses "host:port;host:port"`: every process of the cluster.
  Env: `FLOWSPARK_ADDRESSES`, `BYTEWAX_ADDRESSES`, or (with `-i`) the lines of
  the file `BYTEWAX_HOSTFILE_PATH`.
- `--runtime local|spark`: the in-memory executor (default) or Apache Spark
  on this machine.

A flag wins over the environment; of the variables the first one set wins.

`IMPORT_STR` is `module[:attr]` or `path/file.py[:attr]`; `attr` defaults to
`flow` and may be a factory call with literal arguments, e.g.
`python -m flowspark.run "flows/wc.py:get_flow('in.txt', n=2)"`. Create a
recovery store first with `python -m flowspark.recovery DIR 1`.

Workers: `-w N` runs N workers in this process, as Bytewax does: the in-memory
executor gives each worker its source partitions and keys as Bytewax assigns
them (see `flowspark.runtime.workers`; the workers take turns in one thread).
`-a` with a single address (with `-i 0`) describes this one process. A cluster
of several processes (`-a` with more than one address) cannot be joined in
memory: it is Spark's job, `flowspark submit IMPORT_STR --master
spark://HOST:PORT`. `python -m flowspark.testing` takes Bytewax's `-p P` too and
runs P x W workers in this process, numbered as Bytewax numbers the workers of
its P processes. With `--runtime spark`, `-w N` runs the flow on local Spark
with N cores (master `local[N]`; without `-w`, `local[*]`). Recovery flags
(`-r/-s/-b`) belong to the in-memory executor; on Spark, state lives in a
streaming checkpoint (`flowspark run IMPORT_STR --runtime spark --checkpoint DIR`).
Unlike Bytewax, `-s` and `-b` are optional with `-r` (the in-memory executor
needs no backup coordination).

Bytewax 0.21.1's `bytewax.run` reads no other environment variables (there is
no `BYTEWAX_EPOCH_INTERVAL` or `BYTEWAX_DATAFLOW`), and neither does this
module.

Problems with the command line itself (a bad import string, a missing module,
file or attribute, an object that is not a Dataflow, a flow without input or
output, a missing recovery store, a cluster of several processes)
print one line on stderr and exit with 1; a value that does not parse is a
usage error (exit 2). An exception raised by the dataflow's own code shows its
traceback.

Ctrl-C (SIGINT), as in Bytewax: `KeyboardInterrupt` is raised out of the run
(a traceback; the process ends as interrupted), after every source and sink
partition of the in-memory executor is closed, so what the sinks wrote is kept.
No snapshot is taken: with recovery the next run resumes from the last epoch.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

from flowspark._args import IMPORT_HELP
from flowspark.errors import FlowsparkTypeError, SingleProcessError

__all__ = ["cli_main", "main"]

ENV_SNAPSHOT_INTERVAL = "FLOWSPARK_SNAPSHOT_INTERVAL"
ENV_RECOVERY_DIRECTORY = "FLOWSPARK_RECOVERY_DIRECTORY"
ENV_BACKUP_INTERVAL = "FLOWSPARK_RECOVERY_BACKUP_INTERVAL"
ENV_WORKERS_PER_PROCESS = "FLOWSPARK_WORKERS_PER_PROCESS"
ENV_PROCESS_ID = "FLOWSPARK_PROCESS_ID"
ENV_ADDRESSES = "FLOWSPARK_ADDRESSES"

_PROG = "python -m flowspark.run"
_log = logging.getLogger(__name__)
_CLUSTER_HINT = "run a cluster of machines on Spark with `flowspark submit IMPORT_STR --master spark://HOST:PORT`"


def _seconds(text: str) -> timedelta:
    try:
        secs = float(text)
    except ValueError:
        msg = f"{text!r} is not a number of seconds"
        raise argparse.ArgumentTypeError(msg) from None
    if not secs >= 0 or secs == float("inf"):
        msg = f"{text!r} must be a finite number of seconds >= 0"
        raise argparse.ArgumentTypeError(msg)
    return timedelta(seconds=secs)


def _count(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            msg = f"{text!r} is not a whole number"
            raise argparse.ArgumentTypeError(msg) from None
        if n < least:
            msg = f"{text!r} must be >= {least}"
            raise argparse.ArgumentTypeError(msg)
        return n

    return parse


def _addresses(text: str) -> list[str]:
    addrs = [a.strip() for a in text.split(";") if a.strip()]
    if not addrs:
        msg = f"{text!r} lists no addresses; give 'host:port;host:port'"
        raise argparse.ArgumentTypeError(msg)
    return addrs


# dest -> (flag, environment variables in order, parser)
_ENV: dict[str, tuple[str, tuple[str, ...], Callable[[str], Any]]] = {
    "snapshot_interval": ("-s/--snapshot-interval", (ENV_SNAPSHOT_INTERVAL, "BYTEWAX_SNAPSHOT_INTERVAL"), _seconds),
    "backup_interval": (
        "-b/--backup-interval",
        (ENV_BACKUP_INTERVAL, "BYTEWAX_RECOVERY_BACKUP_INTERVAL"),
        _seconds,
    ),
    "recovery_directory": ("-r/--recovery-directory", (ENV_RECOVERY_DIRECTORY, "BYTEWAX_RECOVERY_DIRECTORY"), Path),
    "processes": ("-p/--processes", ("FLOWSPARK_PROCESSES", "BYTEWAX_PROCESSES"), _count(1)),
    "workers_per_process": (
        "-w/--workers-per-process",
        (ENV_WORKERS_PER_PROCESS, "BYTEWAX_WORKERS_PER_PROCESS"),
        _count(1),
    ),
    "process_id": ("-i/--process-id", (ENV_PROCESS_ID, "BYTEWAX_PROCESS_ID"), _count(0)),
    "addresses": ("-a/--addresses", (ENV_ADDRESSES, "BYTEWAX_ADDRESSES"), _addresses),
}


def build_parser(prog: str = _PROG, *, processes: bool = False) -> argparse.ArgumentParser:
    """Return the argument parser (shared with the `flowspark` console script).

    Args:
        prog: The program name in usage and error lines.
        processes: Add `-p/--processes` (`python -m flowspark.testing`, as Bytewax's
            `python -m bytewax.testing`).

    Returns:
        The parser.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a flowspark dataflow in this process with the in-memory executor (or on local Spark).",
    )
    parser.add_argument("import_str", metavar="IMPORT_STR", help=IMPORT_HELP)

    def env(dest: str) -> str:
        return f"[env: {', '.join(_ENV[dest][1])}]"

    parser.add_argument(
        "-s",
        "--snapshot-interval",
        type=_seconds,
        metavar="SECS",
        help=f"seconds between epochs (snapshots when recovering); default 10 {env('snapshot_interval')}",
    )
    parser.add_argument(
        "--runtime",
        choices=["local", "spark"],
        default="local",
        help="local: the in-memory executor (default); spark: Apache Spark on this machine",
    )
    rec = parser.add_argument_group("Recovery", "Create the store first with `python -m flowspark.recovery DIR 1`.")
    rec.add_argument(
        "-r",
        "--recovery-directory",
        type=Path,
        metavar="DIR",
        help=f"recovery store to resume from and snapshot to {env('recovery_directory')}",
    )
    rec.add_argument(
        "-b",
        "--backup-interval",
        type=_seconds,
        metavar="SECS",
        help=f"seconds to keep older snapshots (RecoveryConfig.backup_interval) {env('backup_interval')}",
    )
    scale = parser.add_argument_group(
        "Scaling",
        "The in-memory executor runs N workers in this process (-w N); with --runtime spark, -w N runs on "
        "local Spark with N cores. Clusters of several processes run with `flowspark submit`.",
    )
    scale.add_argument(
        "-w",
        "--workers-per-process",
        type=_count(1),
        metavar="N",
        help=f"workers in this process (default 1); N local Spark cores with --runtime spark "
        f"{env('workers_per_process')}",
    )
    if processes:
        scale.add_argument(
            "-p",
            "--processes",
            type=_count(1),
            metavar="N",
            help=f"processes (default 1); in memory, P x W workers run in this one process {env('processes')}",
        )
    scale.add_argument(
        "-i",
        "--process-id",
        type=_count(0),
        metavar="N",
        help=f"this process's index in -a (only 0 of a single address here) {env('process_id')}",
    )
    scale.add_argument(
        "-a",
        "--addresses",
        type=_addresses,
        metavar="'HOST:PORT;...'",
        help=f"addresses of the processes (a single one here; clusters: flowspark submit) {env('addresses')}",
    )
    return parser


def _env_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """Fill unset flags from the environment; return the variable each such value came from."""
    env = os.environ
    origin: dict[str, str] = {}
    for dest, (_flag, names, conv) in _ENV.items():
        if getattr(args, dest, 0) is not None:  # set by a flag, or not a flag of this parser
            continue
        for var in names:
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                setattr(args, dest, conv(raw))
            except argparse.ArgumentTypeError as e:
                parser.error(f"environment variable {var}: {e}")
            origin[dest] = var
            break
    # Bytewax's Helm chart names the process by its pod: "<statefulset>-<index>".
    pod, sts = env.get("BYTEWAX_POD_NAME"), env.get("BYTEWAX_STATEFULSET_NAME")
    if args.process_id is None and pod and sts:
        index = pod.replace(f"{sts}-", "")
        try:
            args.process_id = _count(0)(index)
        except argparse.ArgumentTypeError:
            parser.error(
                f"environment variables BYTEWAX_POD_NAME={pod!r} and BYTEWAX_STATEFULSET_NAME={sts!r}: "
                f"the pod name must be '<statefulset name>-<index>'"
            )
        origin["process_id"] = "BYTEWAX_POD_NAME"
    hostfile = env.get("BYTEWAX_HOSTFILE_PATH")
    if args.process_id is not None and args.addresses is None and hostfile:
        try:
            text = Path(hostfile).read_text()
        except OSError as e:
            parser.error(f"environment variable BYTEWAX_HOSTFILE_PATH: cannot read {hostfile!r}: {e.strerror}")
        args.addresses = [line.strip() for line in text.splitlines() if line.strip()]
        origin["addresses"] = f"BYTEWAX_HOSTFILE_PATH={hostfile}"
    return origin


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _check_int(fn: str, name: str, value: Any, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        msg = f"{fn}: {name} must be an int; received {value!r} of type {type(value).__name__}"
        raise FlowsparkTypeError(msg)
    if value < least:
        msg = f"{fn}: {name} must be >= {least}; received {value!r}"
        raise ValueError(msg)
    return value


def workers_of(fn: str, *, workers: Any, workers_name: str, process_id: Any, pid_name: str, addresses: Any) -> int:
    """Check a Bytewax worker layout the in-memory executor can run: workers of this one process.

    Shared by `cli_main` and `flowspark.testing.cluster_main`.

    Args:
        fn: The caller's name, for messages.
        workers: Workers per process.
        workers_name: That argument's name.
        process_id: This process's index in `addresses`, or `None`.
        pid_name: That argument's name.
        addresses: The processes' addresses, or `None`.

    Returns:
        The number of workers to run.

    Raises:
        SingleProcessError: More than one process.
        FlowsparkTypeError: A value of the wrong type.
        ValueError: A count out of range, or `process_id` without `addresses` or not an index of them.
    """
    workers = _check_int(fn, workers_name, workers, 1)
    if addresses is not None:
        if isinstance(addresses, str) or not all(isinstance(a, str) for a in addresses):
            msg = f"{fn}: addresses must be a list of 'host:port' strings; received {addresses!r}"
            raise FlowsparkTypeError(msg)
        addresses = list(addresses)
    procs = len(addresses) if addresses else 1
    if process_id is not None:
        process_id = _check_int(fn, pid_name, process_id, 0)
        if addresses is None:
            msg = f"{fn}: {pid_name}={process_id} needs addresses (the list of every process's 'host:port')"
            raise ValueError(msg)
        if process_id >= procs:
            msg = f"{fn}: process id {process_id} is not an index of the {procs} address(es) {addresses!r}"
            raise ValueError(msg)
    if procs > 1:
        msg = (
            f"{fn}: the in-memory executor runs its workers in this one process and cannot join a cluster; "
            f"received {procs} addresses {addresses!r}; run {procs * workers} workers here with "
            f"{workers_name}={procs * workers} and no addresses, or {_CLUSTER_HINT}"
        )
        raise SingleProcessError(msg)
    return workers


def cli_main(
    flow: Any,
    *,
    workers_per_process: int = 1,
    process_id: Optional[int] = None,
    addresses: Optional[list[str]] = None,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Any = None,
) -> None:
    """Run a dataflow as `python -m flowspark.run` does (Bytewax's `bytewax.run.cli_main`).

    Runs `workers_per_process` workers in this thread with the in-memory executor
    (one worker: `flowspark.testing.run_main`; more: source partitions and keys are
    assigned to workers as Bytewax assigns them, see `flowspark.runtime.workers`).
    `addresses` may name this one process (a single address, `process_id` 0 or
    `None`); a cluster of several processes raises `SingleProcessError`: run it on
    Spark (`flowspark submit`).

    Args:
        flow: The `Dataflow`.
        workers_per_process: Workers in this process.
        process_id: This process's index in `addresses`.
        addresses: Every process's `"host:port"`; at most one.
        epoch_interval: Time between epochs (snapshots); default 10 s.
        recovery_config: A `flowspark.recovery.RecoveryConfig`, or `None`.

    Raises:
        SingleProcessError: More than one process was asked for (a `ValueError`).
        ValueError: `process_id` without `addresses`, or not an index of them.
        FlowsparkTypeError: An argument of the wrong type.
        FlowsparkRuntimeError: A step failed (as for `run_main`).

    Example:
        >>> import flowspark.operators as op
        >>> from flowspark.dataflow import Dataflow
        >>> from flowspark.testing import TestingSource
        >>> flow = Dataflow("eg")
        >>> _ = op.inspect("show", op.input("inp", flow, TestingSource([1, 2])))
        >>> cli_main(flow)
        eg.show: 1
        eg.show: 2
        >>> cli_main(flow, workers_per_process=2)
        eg.show: 1
        eg.show: 2
        >>> cli_main(flow, addresses=["localhost:2101", "localhost:2102"], process_id=0)
        Traceback (most recent call last):
        ...
        flowspark.errors.SingleProcessError: cli_main: the in-memory executor runs its workers ...
    """
    from flowspark.runtime.workers import run_workers

    n = workers_of(
        "cli_main",
        workers=workers_per_process,
        workers_name="workers_per_process",
        process_id=process_id,
        pid_name="process_id",
        addresses=addresses,
    )
    flow_id = getattr(flow, "flow_id", flow)
    _log.info("running dataflow %r with the in-memory executor (%d worker%s)", flow_id, n, "s"[: n - 1])
    run_workers("cli_main", flow, n, epoch_interval=epoch_interval, recovery_config=recovery_config)


class _CliError(Exception):
    """A problem with the command line, reported on one line (exit code 1)."""


def _source(args: argparse.Namespace, origin: dict[str, str], dest: str) -> str:
    """The flag and its value as given, e.g. `-w/--workers-per-process 4 (from BYTEWAX_WORKERS_PER_PROCESS)`."""
    value = getattr(args, dest)
    if isinstance(value, list):
        text = ";".join(value)
    elif isinstance(value, timedelta):
        text = f"{value.total_seconds():g}"
    else:
        text = str(value)
    var = origin.get(dest)
    return f"{_ENV[dest][0]} {text}" + (f" (from {var})" if var else "")


def _check_scaling(args: argparse.Namespace, origin: dict[str, str]) -> int:
    """Check the scaling flags; return the number of in-memory workers to run."""

    def src(dest: str) -> str:
        return _source(args, origin, dest)

    submit = f"`flowspark submit {args.import_str} --master spark://HOST:PORT`"
    if args.runtime == "spark":
        cluster = [src(d) for d in ("process_id", "addresses") if getattr(args, d) is not None]
        if (getattr(args, "processes", None) or 1) > 1:
            cluster.insert(0, src("processes"))
        if cluster:
            msg = (
                f"{' and '.join(cluster)}: on Spark the cluster is Spark's; run a cluster with {submit}, "
                "or use -w N for N local cores"
            )
            raise _CliError(msg)
        recovery = [
            src(d)
            for d in ("recovery_directory", "snapshot_interval", "backup_interval")
            if getattr(args, d) is not None
        ]
        if recovery:
            msg = (
                f"{' and '.join(recovery)}: recovery flags are for the in-memory executor; on Spark, state is kept "
                f"in a streaming checkpoint: `flowspark run {args.import_str} --runtime spark --checkpoint DIR`"
            )
            raise _CliError(msg)
        return 0
    workers = args.workers_per_process or 1
    procs = getattr(args, "processes", None) or 1
    addresses = args.addresses
    if procs > 1 and (addresses is not None or args.process_id is not None):
        given = " and ".join(src(d) for d in ("process_id", "addresses") if getattr(args, d) is not None)
        msg = (
            f"{src('processes')} with {given}: -p runs {procs} x {workers} workers in this process and "
            "numbers them itself; drop -i/-a"
        )
        raise _CliError(msg)
    if args.process_id is not None and addresses is None:
        msg = (
            f"{src('process_id')} needs -a/--addresses (as in Bytewax); the in-memory executor runs its "
            f"workers in this one process: drop -i (use -w N for N workers), or run a cluster with {submit}"
        )
        raise _CliError(msg)
    if addresses is not None and len(addresses) > 1:
        n = len(addresses) * workers
        msg = (
            f"{src('addresses')} lists {len(addresses)} processes; the in-memory executor runs its workers "
            f"in this one process and cannot join a cluster: drop -a/-i and use -w {n} for {n} workers here, "
            f"or run a cluster on Spark with {submit}"
        )
        raise _CliError(msg)
    if args.process_id not in (None, 0):
        msg = f"{src('process_id')} is not an index of the single address {addresses[0]!r} (use 0)"
        raise _CliError(msg)
    return procs * workers


def _run_spark(args: argparse.Namespace, prog: str = _PROG) -> int:
    """Run on local Spark through the `flowspark run` command (same plan, progress and error lines)."""
    from flowspark import cli

    argv = ["run", args.import_str, "--runtime", "spark"]
    if args.workers_per_process is not None:
        argv += ["--master", f"local[{args.workers_per_process}]"]
    cargs = cli.build_parser().parse_args(argv)
    _log.info("running %s on local Spark, master %s", args.import_str, cargs.master or "local[*]")
    try:
        return cli._cmd_run(cargs)
    except Exception as e:
        line = cli._error_line(e)
        if line is None:
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        return 1


def main(argv: Optional[list[str]] = None, *, prog: str = _PROG, processes: bool = False) -> int:
    """Run the command line.

    Args:
        argv: Arguments (default: `sys.argv[1:]`).
        prog: The program name in usage and error lines.
        processes: Accept `-p/--processes` (P x W workers in this process), for `python -m flowspark.testing`.

    Returns:
        The exit code: 0 on success, 1 for a bad command line or flow setup.
    """
    from flowspark._importstr import locate_dataflow
    from flowspark.errors import FlowsparkBuildError, ImportStrError, RecoveryError
    from flowspark.recovery import RecoveryConfig

    parser = build_parser(prog, processes=processes)
    args = parser.parse_args(argv)
    origin = _env_defaults(parser, args)

    def fail(err: BaseException) -> int:
        print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
        return 1

    try:
        workers = _check_scaling(args, origin)
    except _CliError as e:
        return fail(e)
    if args.runtime == "spark":
        return _run_spark(args, prog)
    try:
        flow = locate_dataflow(args.import_str)
        flow.validate()
    except (ImportStrError, FlowsparkBuildError) as e:
        return fail(e)
    recovery = None
    if args.recovery_directory is not None:
        recovery = RecoveryConfig(args.recovery_directory, args.backup_interval)
    try:
        cli_main(
            flow,
            workers_per_process=workers,
            process_id=args.process_id,
            addresses=args.addresses,
            epoch_interval=args.snapshot_interval,
            recovery_config=recovery,
        )
    except (RecoveryError, SingleProcessError) as e:
        return fail(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
