"""The user guide: the operator reference covers every public operator and is up to date; links resolve."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import flowspark.operators as op

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_operators", DOCS / "gen_operators.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _modules():
    mods = [("op", op)]
    try:
        import flowspark.operators.windowing as win
    except ImportError:
        return mods
    return [*mods, ("win", win)]


def _sections(text):
    """`{heading: body}` for every `### ` entry of operators.md."""
    parts = re.split(r"^### `([^`]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_public_name_has_an_entry():
    sections = _sections((DOCS / "operators.md").read_text())
    missing = [
        f"{prefix}.{name}" for prefix, mod in _modules() for name in mod.__all__ if f"{prefix}.{name}" not in sections
    ]
    assert missing == []
    extra = set(sections) - {f"{p}.{n}" for p, m in _modules() for n in m.__all__}
    assert extra == set()


def test_every_operator_has_an_example():
    sections = _sections((DOCS / "operators.md").read_text())
    for prefix, mod in _modules():
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj) and "step_id" in inspect.signature(obj).parameters:
                body = sections[f"{prefix}.{name}"]
                assert "**Example:**" in body, f"{prefix}.{name} has no example"
                assert f"{prefix}.{name}(" in body.split("**Example:**")[1], (
                    f"{prefix}.{name}: example does not call it"
                )


def test_operator_reference_is_generated_from_current_docstrings():
    assert (DOCS / "operators.md").read_text() == _gen().render(), "run `python docs/gen_operators.py`"


def test_generator_documents_a_new_operator(monkeypatch):
    """The reference test can fail: an operator added to __all__ without docs is reported."""
    gen = _gen()

    def brand_new(step_id, up):
        """Do something new.

        Example:
            >>> 1 + 1
            2
        """

    monkeypatch.setattr(op, "brand_new", brand_new, raising=False)
    monkeypatch.setattr(op, "__all__", [*op.__all__, "brand_new"])
    text = gen.render()
    assert "### `op.brand_new`" in text
    assert text != (DOCS / "operators.md").read_text()


@pytest.mark.parametrize(
    "page", ["README.md", "concepts.md", "differences.md", "deployment.md", "operators.md", "porting.md"]
)
def test_links_between_pages_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", text):
        if target in ("streaming.md", "spark.md"):
            continue  # written with the Spark runtimes
        assert (DOCS / target).is_file(), f"{page} links to missing {target}"


def test_operator_anchors_resolve():
    text = (DOCS / "operators.md").read_text()
    anchors = {re.sub(r"[^\w-]", "", h.lower()) for h in re.findall(r"^### `([^`]+)`", text, flags=re.M)}
    for link in re.findall(r"\]\(#([\w-]+)\)", text):
        assert link in anchors, link


# -- docs/deployment.md: the command line ------------------------------------------------------------

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: Flags docs/deployment.md shows for other programs' commands: spark-class's Master and Worker
#: (`--host`, `--port`, `--cores`, `--memory`), start-connect-server.sh (`--wait`), spark-submit (`--class`).
_FOREIGN_FLAGS = {"--host", "--port", "--cores", "--memory", "--wait", "--class"}


def _cli_flags():
    """`{command: {long flag, ...}}` of every `flowspark` subcommand, and `""` for the global flags."""
    import argparse

    from flowspark.cli import build_parser

    def longs(parser):
        return {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}

    parser = build_parser()
    out = {"": longs(parser)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update({name: longs(sub) for name, sub in action.choices.items()})
    return out


def _flag_problems(text, commands):
    """What docs/deployment.md's `text` gets wrong about the flags of `commands` (empty: nothing)."""
    from flowspark.run import build_parser as run_parser

    problems = []
    sections = dict(re.findall(r"^### `flowspark (\w+)[^`]*`\n(.*?)(?=^#)", text, flags=re.M | re.S))
    for command, flags in commands.items():
        if not command:
            continue
        if command not in sections:
            problems.append(f"no section `### flowspark {command} ...`")
            continue
        documented = set(_FLAG.findall(sections[command]))
        problems += [f"{command} {f}: not in its section" for f in sorted(flags - documented)]
        problems += [f"{command} {f}: documented, but {command} has no such flag" for f in sorted(documented - flags)]
    known = set().union(*commands.values(), _FOREIGN_FLAGS)
    known |= {o for a in run_parser()._actions for o in a.option_strings}  # python -m flowspark.run
    problems += [f"{f}: mentioned, but no command has it" for f in sorted(set(_FLAG.findall(text)) - known)]
    return problems


def test_every_cli_flag_is_documented():
    assert _flag_problems((DOCS / "deployment.md").read_text(), _cli_flags()) == []


def test_flag_check_finds_a_missing_and_an_unknown_flag():
    text = (DOCS / "deployment.md").read_text()
    commands = _cli_flags()
    more = {**commands, "state": commands["state"] | {"--since"}}
    assert _flag_problems(text, more) == ["state --since: not in its section"]
    wrong = text.replace("| `--batch-id N` |", "| `--batch N` |")
    assert _flag_problems(wrong, commands) == [
        "state --batch-id: not in its section",
        "state --batch: documented, but state has no such flag",
        "--batch: mentioned, but no command has it",
    ]


def test_plan_excerpt_matches_the_command(capsys, monkeypatch):
    """docs/deployment.md shows what `flowspark plan examples/running_total.py --spark` prints before Spark's plans."""
    pytest.importorskip("pyspark")
    import sys

    from flowspark.cli import main

    text = (DOCS / "deployment.md").read_text()
    excerpt = text.split("`flowspark plan examples/running_total.py --spark` prints (abridged):\n\n```\n")[1]
    shown = excerpt.split("\n== stage")[0].splitlines()
    monkeypatch.chdir(DOCS.parent)
    monkeypatch.delitem(sys.modules, "running_total", raising=False)  # restored afterwards
    assert main(["plan", "examples/running_total.py", "--spark", "--no-physical"]) == 0
    assert capsys.readouterr().out.splitlines() == shown


@pytest.mark.parametrize("page", ["concepts.md"])
def test_python_examples_run(page):
    """Every ```python block of the page runs as written (each is self-contained, with its asserts)."""
    blocks = re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(), flags=re.M | re.S)
    assert blocks
    for i, code in enumerate(blocks):
        exec(compile(code, f"{page} python block {i + 1}", "exec"), {"__name__": f"docs_{i}"})


def test_the_rules_table_is_current():
    """docs/architecture.md lists every optimizer rule as `describe_rules()` gives it."""
    from flowspark.spark.rules.optimizer import RULES
    from flowspark.spark.rules.switches import describe_rules

    text = (DOCS / "architecture.md").read_text()
    table = text.split("<!-- rules table -->\n")[1].split("\n<!-- end rules table -->")[0]
    assert table == describe_rules()
    assert all(f"| `{r.name}` |" in table for r in RULES)
