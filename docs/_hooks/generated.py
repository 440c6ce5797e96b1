"""mkdocs hook: the reference pages generated from the code at build time (never stored, never stale).

- `reference/cli.md`: `flowspark --help` and every subcommand's `--help`, from `flowspark.cli.build_parser`.
- `reference/rules.md`: the optimizer's rules, from `flowspark.spark.rules.optimizer.RULES`.
- `reference/config.md`: the environment variables and Spark settings flowspark reads, from the constants
  that hold them.
- `changelog.md`: CHANGELOG.md as it is.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def cli_page() -> str:
    """The command line's help, every subcommand's, as one page."""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; fix it so the page is stable
    from flowspark.cli import build_parser
    from flowspark.run import build_parser as run_parser

    parser = build_parser()
    parts = [
        "# Command line\n",
        "Generated from the parser at build time: this is exactly what `--help` prints.\n",
        "## `flowspark`\n",
        f"```text\n{parser.format_help()}```\n",
    ]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parts += [f"## `flowspark {name}`\n", f"```text\n{sub.format_help()}```\n"]
    parts += [
        "## `python -m flowspark.run` (Bytewax's command line)\n",
        f"```text\n{run_parser().format_help()}```\n",
    ]
    return "\n".join(parts)


def rules_page() -> str:
    """The optimizer's rules, from RULES."""
    from flowspark.spark.rules.switches import describe_rules

    return "\n".join(
        [
            "# Optimizer rules\n",
            "Generated from `flowspark.spark.rules.optimizer.RULES` at build time. Every rule can be switched off "
            "(`rules=` of `flowspark.spark.run`, `flowspark run --rules`, or `FLOWSPARK_RULES`); "
            "see [Tuning with rules](../howto/tuning.md).\n",
            describe_rules(),
            "",
        ]
    )


def read_variables() -> list[str]:
    """Every `FLOWSPARK_*` environment variable the package reads (`environ.get("...")`, `ENV... = "..."`)."""
    names = []
    for path in sorted((ROOT / "flowspark").rglob("*.py")):
        text = path.read_text()
        names += re.findall(r"environ(?:\.get\(|\[)\s*\"(FLOWSPARK_[A-Z_]+)\"", text)
        names += re.findall(r"^\s*ENV\w*\s*=\s*\"(FLOWSPARK_[A-Z_]+)\"", text, flags=re.M)
        names += re.findall(r"\(\"(FLOWSPARK_[A-Z_]+)\", \"BYTEWAX_", text)
    return sorted(set(names))


def config_page() -> str:
    """The configuration keys, from the code's own tables."""
    from flowspark.run import _ENV
    from flowspark.spark.rules.switches import ENV_VAR as RULES_ENV
    from flowspark.spark.session import DEFAULT_CONF

    LOG_LEVEL_ENV, JARS_ENV = "FLOWSPARK_SPARK_LOG_LEVEL", "FLOWSPARK_JARS_DIR"

    rows = [
        "| variable | what it sets |",
        "| --- | --- |",
        f"| `{RULES_ENV}` | the optimizer rules switched on when `rules=` / `--rules` is not given: `all` (default), "
        "`none`, `-NAME,-NAME` (all but those), `NAME,NAME` (only those); [the rules](rules.md) |",
        f"| `{LOG_LEVEL_ENV}` | Spark's log level in sessions flowspark creates (`off` by default; `warn`, `error`, "
        "`info`); your own session's level is left alone |",
        f"| `{JARS_ENV}` | where `scripts/fetch_jars.py` puts, and sessions flowspark creates find, the Kafka "
        "connector's jars (default `~/.cache/flowspark/jars`) |",
    ]
    for dest, (flag, names, _parse) in _ENV.items():
        rows.append(f"| `{'`, `'.join(names)}` | `python -m flowspark.run {flag}` ({dest.replace('_', ' ')}) |")
    documented = "\n".join(rows)
    missing = sorted(set(read_variables()) - set(re.findall(r"FLOWSPARK_[A-Z_]+", documented)))
    if missing:
        msg = f"reference/config.md: flowspark reads {', '.join(missing)}, which the page does not describe"
        raise PluginError(msg)
    conf = ["| setting | value |", "| --- | --- |"] + [
        f"| `{k}` | {'the number of cores, at least 2' if k == 'spark.sql.shuffle.partitions' else f'`{v}`'} |"
        for k, v in DEFAULT_CONF.items()
    ]
    return "\n".join(
        [
            "# Configuration\n",
            "Generated from the code at build time.\n",
            "## Environment variables\n",
            "Run options are arguments of `run_main` / `flowspark.spark.run` and flags of the "
            "[command line](cli.md); these variables are read besides them.\n",
            *rows,
            "",
            "## Spark settings\n",
            "A session flowspark creates (`flowspark.spark.run` without `spark=`, `flowspark run --runtime spark`) "
            "starts with these settings (`--conf KEY=VALUE` and your own session override them):\n",
            *conf,
            "",
            "flowspark also reads `spark.sql.shuffle.partitions` (a new streaming checkpoint's bucket count), "
            "`spark.sql.session.timeZone` (how timestamps become `datetime`s), "
            "`spark.sql.columnNameOfCorruptRecord` (malformed JSON/CSV rows) and sets "
            "`spark.sql.streaming.stateStore.providerClass` to RocksDB for the chunk and key state layouts "
            "([State layouts](../howto/state.md)).",
            "",
        ]
    )


PAGES = {
    "reference/config.md": config_page,
    "reference/cli.md": cli_page,
    "reference/rules.md": rules_page,
    "changelog.md": lambda: (ROOT / "CHANGELOG.md").read_text(),
}


def on_files(files: Files, config, **kwargs) -> Files:
    """Add the generated pages."""
    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files
