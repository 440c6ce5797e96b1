"""The user guide: the site builds with `mkdocs build --strict`, its generated reference is complete, and every
code example runs.

The site (mkdocs.yml, docs/) is built once per test session into a temporary directory: a broken link or anchor,
a reference to a name that does not exist, or a page left out of the navigation fails the build. The reference pages
(operators, classes, the command line, the optimizer rules, the configuration keys) are generated from the code at
build time (mkdocstrings, docs/_hooks/generated.py), so they cannot go stale.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flowspark.operators as op

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        cwd=config.parent,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The site, built with `mkdocs build --strict` (once per session)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr
    return out


def _text(site, page):
    html = (site / page / "index.html").read_text()
    return re.sub(r"<[^>]+>", "", html)


def test_the_site_builds_strict(site):
    assert (site / "index.html").is_file()
    for page in ["getting-started", "concepts", "streaming", "howto/kafka", "reference/operators", "reference/cli"]:
        assert (site / page / "index.html").is_file(), page


def test_the_pictures_are_images_and_diagrams(site):
    """Every ```mermaid block becomes a diagram Material draws (`<pre class="mermaid">`, not highlighted code), and
    every image a page shows is a PNG file of the site (the performance charts)."""
    for page in DOCS.rglob("*.md"):
        blocks = page.read_text().count("```mermaid")
        rel = page.relative_to(DOCS).with_suffix("")
        html = (site / (rel.parent if rel.name == "index" else rel) / "index.html").read_text()
        assert html.count('<pre class="mermaid">') == blocks, page
    images = [
        (html, src)
        for html in site.rglob("*.html")
        for src in re.findall(r'<img [^>]*src="([^"]+)"', html.read_text())
        if not src.startswith(("http", "data:"))
    ]
    assert len(images) >= 2
    for html, src in images:
        assert (html.parent / src).resolve().read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", (html, src)


def test_a_broken_link_fails_the_build(tmp_path):
    """The strict build can fail: the same site with one link to a missing page does not build."""
    pytest.importorskip("mkdocs")
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("img"))
    (tmp_path / "docs" / "img").mkdir()
    for png in (DOCS / "img").glob("*.png"):
        shutil.copy(png, tmp_path / "docs" / "img")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(ROOT / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    text = (ROOT / "mkdocs.yml").read_text().replace("paths: [.]", f"paths: [{ROOT}]")
    (tmp_path / "mkdocs.yml").write_text(text)
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the old notes](notes.md).\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "notes.md" in done.stderr


def _public(mod):
    return [getattr(mod, name) for name in mod.__all__]


def _modules():
    import flowspark.operators.windowing as win

    return [op, win]


def test_the_operator_reference_shows_every_public_name(site):
    html = (site / "reference" / "operators" / "index.html").read_text()
    missing = [
        f"{mod.__name__}.{name}"
        for mod in _modules()
        for name in mod.__all__
        if f'id="{mod.__name__}.{name}"' not in html
    ]
    assert missing == []


def test_every_operator_docstring_has_an_example_that_calls_it():
    """The reference shows each operator's `Example:`; the doctests run them (`--doctest-modules`)."""
    for mod in _modules():
        prefix = "op" if mod is op else "win"
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj) and "step_id" in inspect.signature(obj).parameters:
                doc = inspect.getdoc(obj) or ""
                assert "Example:" in doc, f"{prefix}.{name} has no example"
                assert f"{prefix}.{name}(" in doc.split("Example:")[1], f"{prefix}.{name}: its example does not call it"


def test_the_generated_pages_are_current(site):
    """The command line, the rules and the configuration pages are made from the code when the site is built."""
    from flowspark.cli import build_parser
    from flowspark.spark.rules.optimizer import RULES

    cli = _text(site, "reference/cli")
    for action in build_parser()._actions:
        for name in getattr(action, "choices", None) or {}:
            assert f"usage: flowspark {name}" in cli, name
    rules = _text(site, "reference/rules")
    assert [r.name for r in RULES if r.name not in rules] == []
    config = _text(site, "reference/config")
    for var in re.findall(r"\"(FLOWSPARK_[A-Z_]+)\"", (ROOT / "flowspark" / "run.py").read_text()):
        assert var in config, var


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


# -- the guide's code examples --------------------------------------------------------------------

#: How each page's ```python blocks are checked, block by block: "run" executes the block (after the page's
#: earlier run blocks, in one namespace); "spark" runs it in test_spark_examples_run, with `spark` the tests'
#: session and its `/data/` paths under a temporary directory; "streaming-quick-start" is docs/streaming.md's
#: first block (tests/spark/quiet_driver.py runs it on Spark); "connect" needs a Spark Connect server:
#: tests/spark/test_connect.py runs it through one (the scenario `docs_connect` of connect_driver.py).
EXAMPLES = {
    "concepts.md": ["run", "run", "run", "run"],
    "getting-started.md": ["run", "spark", "streaming-quick-start"],
    "howto/dead-letters.md": ["run"],
    "howto/kafka.md": ["run-pyspark"],
    "howto/delta.md": ["run-pyspark"],
    "howto/tuning.md": ["spark"],
    "howto/connect.md": ["connect"],
    "spark.md": ["spark", "spark"],
    "streaming.md": ["streaming-quick-start", "spark"],
    "reference/operators.md": ["run"],
}


def _readme_blocks():
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.M | re.S)


def _blocks(page):
    return re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(), flags=re.M | re.S)


def test_every_page_with_code_is_checked():
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if _blocks(p.relative_to(DOCS))}
    assert pages == set(EXAMPLES)
    assert {page: len(_blocks(page)) for page in EXAMPLES} == {page: len(kinds) for page, kinds in EXAMPLES.items()}


@pytest.mark.parametrize("page", sorted(EXAMPLES))
def test_python_examples_run(page):
    """Every ```python block of the page compiles, and the ones that need no Spark session run (with their asserts)."""
    namespace = {"__name__": f"docs_{page}"}
    for i, (code, kind) in enumerate(zip(_blocks(page), EXAMPLES[page], strict=True)):
        compiled = compile(code, f"{page} python block {i + 1}", "exec")
        if kind == "run-pyspark":
            pytest.importorskip("pyspark")
        if kind in ("run", "run-pyspark"):
            exec(compiled, namespace)


def test_the_readme_example_runs():
    """README.md's short example runs in memory (its Spark block: test_spark_examples_run)."""
    blocks = _readme_blocks()
    assert len(blocks) == 2
    exec(compile(blocks[0], "README.md python block 1", "exec"), {"__name__": "docs_readme"})


def test_the_streaming_quick_start_is_the_one_the_spark_tests_run():
    first = _blocks("streaming.md")[0]
    assert _blocks("getting-started.md")[EXAMPLES["getting-started.md"].index("streaming-quick-start")] == first


def test_the_flow_graph_shown_is_what_visualize_draws():
    from flowspark.visualize import to_mermaid

    namespace = {"__name__": "docs_getting_started"}
    exec(_blocks("getting-started.md")[0], namespace)
    text = (DOCS / "getting-started.md").read_text()
    shown = re.search(r"^```mermaid\n(.*?)^```", text, flags=re.M | re.S).group(1)
    assert shown.strip() == to_mermaid(namespace["flow"]).strip()


_NUMBER = re.compile(r"\d+(\.\d+)?( (B|KiB|MiB|GiB)\b)?")


def _shape(line):
    """A progress line with its figures left out: what the product prints, whatever the run's numbers."""
    return _NUMBER.sub("N", line)


def _shown_progress(page):
    """The `[flowspark]` progress lines a page shows."""
    return [ln for ln in (DOCS / page).read_text().splitlines() if ln.startswith("[flowspark] batch ")]


def test_the_progress_lines_shown_are_the_ones_the_product_prints():
    """docs/streaming.md's and getting-started's progress lines have the shape `progress_line` gives them."""
    from flowspark.spark.streaming.listen import progress_line

    state = {"numRowsTotal": 3, "memoryUsedBytes": 13_700, "customMetrics": {"rocksdbSstFileSize": 3300}}
    p = {"batchId": 3, "numInputRows": 20, "processedRowsPerSecond": 4.2, "stateOperators": [state]}
    printed = _shape(progress_line(p, counts=(3, 3)))
    shown = _shown_progress("streaming.md") + _shown_progress("getting-started.md")
    assert len(shown) >= 7
    assert {_shape(line) for line in shown} == {printed}


def _spark_blocks(page):
    return [code for code, kind in zip(_blocks(page), EXAMPLES[page], strict=True) if kind == "spark"]


@pytest.mark.slow
def test_spark_examples_run(spark, tmp_path):
    """Every "spark" block of the guide, on the tests' session (README's Spark block too).

    getting-started's and README's: the first block's flow, run on Spark by the second; docs/spark.md,
    docs/streaming.md's own stream (whose progress lines must look like the one the page shows) and
    docs/howto/tuning.md with their `/data/` paths under `tmp_path`.
    """
    namespace = {"__name__": "docs_getting_started"}
    for code, kind in zip(_blocks("getting-started.md"), EXAMPLES["getting-started.md"], strict=True):
        if kind in ("run", "spark"):
            exec(compile(code, "getting-started.md", "exec"), namespace)
    namespace = {"__name__": "docs_readme"}
    for i, code in enumerate(_readme_blocks()):
        exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    assert sorted(namespace["out"]) == [("ann", 5), ("ann", 12), ("bob", 3)]

    (tmp_path / "visits").mkdir()
    visits = [{"user": "ann", "url": "/a"}, {"user": "bob", "url": "/b"}, {"user": "ann", "url": None}]
    (tmp_path / "visits" / "1.json").write_text("".join(json.dumps(v) + "\n" for v in visits))
    spaces = {}
    for page in ("spark.md", "streaming.md", "howto/tuning.md"):
        spaces[page] = namespace = {"__name__": f"docs_{page}", "spark": spark}
        for i, code in enumerate(_spark_blocks(page)):
            code = code.replace('"/data/', f'"{tmp_path}/')  # also in f"/data/..."
            exec(compile(code, f"{page} python block {i + 1}", "exec"), namespace)
    counts = spark.read.parquet(str(tmp_path / "visit_counts")).select("user", "visits").collect()
    assert sorted(counts) == [("ann", 1), ("bob", 1)]  # ann's visit without a url is filtered out
    lines = spaces["streaming.md"]["lines"]
    assert lines
    assert {_shape(line) for line in lines} == {_shape(line) for line in _shown_progress("streaming.md")}
