"""The spread of a ratio over separate runs: one benchmark command run N times, each in a process of its own.

A single run's ratio depends on the machine's load during that run; a target such as
">= 0.9x in every run" is about the worst of several. This script runs the command `--runs`
times (default 5), one after the other, reads each run's line `PATTERN: <ratio>x` and prints
every ratio with the minimum, median and maximum.

Usage: python benchmarks/spread.py [--runs 5] [--pattern TEXT] -- COMMAND...

Default (no command): the whole batch job, parquet -> running count -> parquet, flowspark
against the hand-written job of the same shape:
    python benchmarks/spread.py
runs `python benchmarks/spark_bounded.py --only whole` five times and reads its
"flowspark / hand-written whole job" ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_COMMAND = [sys.executable, os.path.join(HERE, "spark_bounded.py"), "--only", "whole"]
DEFAULT_PATTERN = "flowspark / hand-written whole job"


def ratio_of(output: str, pattern: str) -> float:
    """The number before `x` after `pattern:` in a benchmark's output (its last such line)."""
    found = re.findall(re.escape(pattern) + r":\s*([0-9.]+)x", output)
    if not found:
        msg = f"no line '{pattern}: <ratio>x' in the command's output; pass --pattern with the text before the ratio"
        raise SystemExit(msg)
    return float(found[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pattern", default=None, help="the text before ': <ratio>x' in the command's output")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    args = ap.parse_args()
    command = [c for c in args.command if c != "--"] or DEFAULT_COMMAND
    pattern = args.pattern or DEFAULT_PATTERN
    ratios = []
    for i in range(args.runs):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-2000:] + done.stderr[-2000:])
            raise SystemExit(f"run {i + 1} failed (exit {done.returncode}): {' '.join(command)}")
        ratios.append(ratio_of(done.stdout, pattern))
        print(f"run {i + 1}: {ratios[-1]:.2f}x", flush=True)
    print(
        f"{pattern}, {len(ratios)} separate runs: "
        f"min {min(ratios):.2f}x  median {statistics.median(ratios):.2f}x  max {max(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
