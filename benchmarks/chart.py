"""The benchmarks' `--chart PNG` and `--record FILE` options: a bar chart of the figures a run printed, and a
line per run appended to a JSON-lines history file.

    ap = argparse.ArgumentParser(...)
    chart.add_arguments(ap)
    ...
    chart.write(args, "local executor, 1M events", {"flowspark bs=1": 812_000, ...}, unit="events/s")

The chart shows one bar per runner and names the command that measured it (`sys.argv`), so a
picture is never shown without the command that produces it. matplotlib is imported only when
`--chart` is given (`pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import textwrap
import time
from pathlib import Path


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--chart", type=Path, metavar="PNG", help="also draw the figures printed as a bar chart")
    ap.add_argument("--record", type=Path, metavar="FILE", help="append the figures and command to a JSON-lines file")


def command() -> str:
    return "python " + shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def write(args: argparse.Namespace, title: str, figures: dict[str, float], unit: str = "events/s") -> None:
    """Draw `figures` ({label: value}) to `args.chart` and append them to `args.record` (each when given)."""
    cmd = command()
    if getattr(args, "record", None):
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": cmd,
            "title": title,
            "unit": unit,
            "figures": figures,
            "python": platform.python_version(),
            "machine": platform.machine(),
        }
        with args.record.open("a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"recorded in {args.record}")
    if getattr(args, "chart", None):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, MaxNLocator

        labels = list(figures)
        fig, ax = plt.subplots(figsize=(9, 1.0 + 0.45 * len(labels)))
        bars = ax.barh(labels, [figures[k] for k in labels], color="#4c72b0")
        ax.bar_label(bars, labels=[f"{figures[k]:,.0f}" for k in labels], padding=3, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(unit)
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / 1000:,.0f}k" if x >= 1000 else f"{x:,.0f}"))
        ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=10)
        ax.margins(x=0.2)
        fig.text(0.01, 0.005, "\n".join(textwrap.wrap(cmd, 100)), fontsize=7, family="monospace", color="#555555")
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        fig.savefig(args.chart, dpi=110)
        plt.close(fig)
        print(f"chart written to {args.chart}")
