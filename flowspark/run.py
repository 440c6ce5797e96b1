"""`python -m flowspark.run IMPORT_STR`: run a dataflow with the in-memory executor.

Flags follow `python -m bytewax.run`:

| flag | env var | meaning |
| --- | --- | --- |
| `-s/--snapshot-interval SECS` | `FLOWSPARK_SNAPSHOT_INTERVAL` | epoch length (default 10 s) |
| `-r/--recovery-directory DIR` | `FLOWSPARK_RECOVERY_DIRECTORY` | resume from / snapshot to this store |
| `-b/--backup-interval SECS` | `FLOWSPARK_RECOVERY_BACKUP_INTERVAL` | kept in `RecoveryConfig` |

`IMPORT_STR` is `module[:attr]` or `path/file.py[:attr]`; `attr` defaults to
`flow` and may be a factory call with literal arguments, e.g.
`python -m flowspark.run "flows/wc.py:get_flow('in.txt', n=2)"`. Create a
recovery store first with `python -m flowspark.recovery DIR 1`.

Unlike Bytewax, `-s` and `-b` are optional with `-r` (the in-memory executor
needs no backup coordination); the local executor has one worker, so Bytewax's
`-w/-i/-a` scaling flags do not exist here.

Problems with the command line itself (a bad import string, a missing module,
file or attribute, an object that is not a Dataflow, a flow without input or
output, a missing recovery store) print one line on stderr and exit with 1.
An exception raised by the dataflow's own code shows its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Optional

__all__ = ["main"]

ENV_SNAPSHOT_INTERVAL = "FLOWSPARK_SNAPSHOT_INTERVAL"
ENV_RECOVERY_DIRECTORY = "FLOWSPARK_RECOVERY_DIRECTORY"
ENV_BACKUP_INTERVAL = "FLOWSPARK_RECOVERY_BACKUP_INTERVAL"

_PROG = "python -m flowspark.run"
_IMPORT_HELP = (
    "dataflow import string: <module>[:<variable or factory call>] or <path/file.py>[:...]; "
    "the attribute defaults to `flow`. Examples: src.dataflow, src.dataflow:flow, "
    "flows/wc.py:get_flow('in.txt', n=2)"
)


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


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser (shared with the `flowspark` console script).

    Returns:
        The parser.
    """
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Run a flowspark dataflow in this process with the in-memory executor.",
    )
    parser.add_argument("import_str", metavar="IMPORT_STR", help=_IMPORT_HELP)
    parser.add_argument(
        "-s",
        "--snapshot-interval",
        type=_seconds,
        metavar="SECS",
        help=f"seconds between epochs (snapshots when recovering); default 10 [env: {ENV_SNAPSHOT_INTERVAL}]",
    )
    rec = parser.add_argument_group("Recovery", "Create the store first with `python -m flowspark.recovery DIR 1`.")
    rec.add_argument(
        "-r",
        "--recovery-directory",
        type=Path,
        metavar="DIR",
        help=f"recovery store to resume from and snapshot to [env: {ENV_RECOVERY_DIRECTORY}]",
    )
    rec.add_argument(
        "-b",
        "--backup-interval",
        type=_seconds,
        metavar="SECS",
        help=f"seconds to keep older snapshots (recorded in the RecoveryConfig) [env: {ENV_BACKUP_INTERVAL}]",
    )
    return parser


def _env_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    env = os.environ
    for dest, var, conv in (
        ("snapshot_interval", ENV_SNAPSHOT_INTERVAL, _seconds),
        ("backup_interval", ENV_BACKUP_INTERVAL, _seconds),
        ("recovery_directory", ENV_RECOVERY_DIRECTORY, Path),
    ):
        raw = env.get(var)
        if getattr(args, dest) is not None or raw is None or raw == "":
            continue
        try:
            setattr(args, dest, conv(raw))
        except argparse.ArgumentTypeError as e:
            parser.error(f"environment variable {var}: {e}")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments (default: `sys.argv[1:]`).

    Returns:
        The exit code: 0 on success, 1 for a bad command line or flow setup.
    """
    from flowspark._importstr import locate_dataflow
    from flowspark.errors import FlowsparkBuildError, ImportStrError, RecoveryError
    from flowspark.recovery import RecoveryConfig
    from flowspark.runtime.local import run_main

    parser = build_parser()
    args = parser.parse_args(argv)
    _env_defaults(parser, args)

    def fail(err: BaseException) -> int:
        print(f"{_PROG}: error: {_one_line(err)}", file=sys.stderr)
        return 1

    try:
        flow = locate_dataflow(args.import_str)
        flow.validate()
    except (ImportStrError, FlowsparkBuildError) as e:
        return fail(e)
    recovery = None
    if args.recovery_directory is not None:
        recovery = RecoveryConfig(args.recovery_directory, args.backup_interval)
    try:
        run_main(flow, epoch_interval=args.snapshot_interval, recovery_config=recovery)
    except RecoveryError as e:
        return fail(e)
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
