"""The command line: `python -m flowspark.run` and `python -m flowspark.visualize`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from flowspark._importstr import locate_dataflow, parse_import_str
from flowspark.dataflow import Dataflow
from flowspark.errors import ImportStrError

FLOW_FILE = textwrap.dedent(
    """
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.inputs import FileSource
    from flowspark.outputs import FileSink

    def get_flow(inp="in.txt", out="out.txt", n=1, sep="-"):
        flow = Dataflow("wc")
        s = op.input("inp", flow, FileSource(inp))
        s = op.map("fmt", s, lambda line: ("k", sep.join([line.upper()] * n)))
        op.output("out", s, FileSink(out))
        return flow

    flow = get_flow()
    other = get_flow(out="other.txt")
    not_a_flow = [1, 2]

    def returns_none():
        return None

    def _private():
        pass
    """
)


def _cli(tmp_path, module, *args, env=None, cwd=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWSPARK_", "BYTEWAX_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _run(tmp_path, *args, **kw):
    return _cli(tmp_path, "flowspark.run", *args, **kw)


@pytest.fixture
def proj(tmp_path):
    (tmp_path / "flows.py").write_text(FLOW_FILE)
    (tmp_path / "in.txt").write_text("a\nb\n")
    return tmp_path


def _assert_one_line_error(res, *needles):
    assert res.returncode == 1, res
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("python -m flowspark.")
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# -- running ------------------------------------------------------------------


def test_run_file_path_writes_file_sink(proj):
    res = _run(proj, "flows.py")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert (proj / "out.txt").read_text() == "A\nB\n"


def test_run_module_name_and_attribute(proj):
    res = _run(proj, "flows:other")
    assert res.returncode == 0, res.stderr
    assert (proj / "other.txt").read_text() == "A\nB\n"
    assert not (proj / "out.txt").exists()


@pytest.mark.parametrize(
    ("module", "import_str"),
    [
        ("flowspark.run", "examples.1brc"),
        ("flowspark.run", "examples/1brc.py"),
        ("flowspark.run", "2nd_flow:other"),
        ("flowspark", "examples.1brc"),
    ],
)
def test_run_a_module_whose_name_is_no_identifier_as_bytewax_does(proj, module, import_str):
    """Any name importlib imports (`examples.1brc`, as in Bytewax's own examples), by module name or path."""
    (proj / "examples").mkdir()
    (proj / "examples" / "__init__.py").write_text("")
    (proj / "examples" / "1brc.py").write_text(FLOW_FILE)
    (proj / "2nd_flow.py").write_text(FLOW_FILE)
    args = ["run", import_str] if module == "flowspark" else [import_str]
    res = _cli(proj, module, *args)
    assert res.returncode == 0, res.stderr
    out = "other.txt" if import_str.endswith(":other") else "out.txt"
    assert (proj / out).read_text() == "A\nB\n"


def test_run_absolute_path_from_another_directory(proj, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "in.txt").write_text("z\n")
    res = _run(proj, str(proj / "flows.py"), cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    assert (elsewhere / "out.txt").read_text() == "Z\n"  # paths in the flow resolve against the cwd


def test_run_factory_call_with_literal_args(proj):
    res = _run(proj, "flows.py:get_flow('in.txt', 'f.txt', n=2, sep='+')")
    assert res.returncode == 0, res.stderr
    assert (proj / "f.txt").read_text() == "A+A\nB+B\n"


def test_run_module_in_package_with_relative_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "consts.py").write_text("PREFIX = '>'\n")
    (pkg / "job.py").write_text(
        textwrap.dedent(
            """
            from .consts import PREFIX
            import flowspark.operators as op
            from flowspark.dataflow import Dataflow
            from flowspark.outputs import StdOutSink
            from flowspark.testing import TestingSource
            flow = Dataflow("p")
            op.output("out", op.input("inp", flow, TestingSource([PREFIX + "x"])), StdOutSink())
            """
        )
    )
    for import_str in ["pkg/job.py", "pkg.job", "pkg.job:flow"]:
        res = _run(tmp_path, import_str)
        assert (res.returncode, res.stdout) == (0, ">x\n"), res.stderr


def test_run_with_recovery_continues_without_duplicates(proj):
    db = proj / "rec"
    init = _cli(proj, "flowspark.recovery", str(db), "2")
    assert init.returncode == 0, init.stderr
    res = _run(proj, "flows.py", "-r", "rec", "-s", "30", "-b", "60")
    assert res.returncode == 0, res.stderr
    assert (proj / "out.txt").read_text() == "A\nB\n"
    with (proj / "in.txt").open("a") as f:
        f.write("c\n")
    # Same store through the environment variable this time.
    res = _run(proj, "flows.py", env={"FLOWSPARK_RECOVERY_DIRECTORY": str(db), "FLOWSPARK_SNAPSHOT_INTERVAL": "5"})
    assert res.returncode == 0, res.stderr
    assert (proj / "out.txt").read_text() == "A\nB\nC\n"


def test_run_without_recovery_starts_over(proj):
    assert _run(proj, "flows.py").returncode == 0
    with (proj / "in.txt").open("a") as f:
        f.write("c\n")
    assert _run(proj, "flows.py").returncode == 0
    assert (proj / "out.txt").read_text() == "A\nB\nC\n"


def test_run_missing_recovery_store_is_one_line(proj):
    res = _run(proj, "flows.py", "-r", "nostore")
    _assert_one_line_error(res, "nostore", "holds no partitions", "python -m flowspark.recovery")


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["-s", "soon"], {}, "'soon' is not a number of seconds"),
        (["-s", "-1"], {}, ">= 0"),
        ([], {"FLOWSPARK_SNAPSHOT_INTERVAL": "x"}, "environment variable FLOWSPARK_SNAPSHOT_INTERVAL"),
    ],
)
def test_run_bad_interval_is_a_usage_error(proj, args, env, needle):
    res = _run(proj, "flows.py", *args, env=env)
    assert res.returncode == 2
    assert needle in res.stderr
    assert not (proj / "out.txt").exists()


def test_run_help_lists_bytewax_flags(proj):
    res = _run(proj, "--help")
    assert res.returncode == 0
    for flag in ["--snapshot-interval", "--recovery-directory", "--backup-interval", "FLOWSPARK_SNAPSHOT_INTERVAL"]:
        assert flag in res.stdout


# -- errors: one line, exit 1 ----------------------------------------------------


@pytest.mark.parametrize(
    ("import_str", "needles"),
    [
        ("nosuchmodule", ["module 'nosuchmodule'", "not found", "give a file path"]),
        ("nosuchpkg.flows", ["package 'nosuchpkg'", "not found"]),
        ("missing.py", ["file 'missing.py' does not exist", "check the path"]),
        ("flows.py:nope", ["module 'flows' has no attribute 'nope'", "`flows.py:flow`", "`flows.py:other`"]),
        ("flows:not_a_flow", ["`flows:not_a_flow` gave [1, 2] of type builtins.list, not a flowspark Dataflow"]),
        ("flows.py:returns_none", ["gave None", "not a flowspark Dataflow"]),
        ("flows.py:get_flow(1, 2, 3, 4, 5)", ["cannot call factory", "too many positional", "get_flow(inp="]),
        ("flows.py:get_flow(bogus=1)", ["cannot call factory", "bogus", "its signature is"]),
        ("flows.py:get_flow(x)", ["argument `x`", "not a literal", "quote strings"]),
        ("flows.py:get_flow(", ["cannot parse 'get_flow('", "after ':'"]),
        ("flows.py:a.b", ["neither a name nor a simple function call"]),
        ("flows.py:flow()", ["is not a function", "drop the parentheses"]),
        ("flows.py:", ["nothing after ':'"]),
        ("bad-name", ["module 'bad-name'", "not found"]),
        ("a b", ["neither a module name", "nor a path"]),
        ("", ["empty import string"]),
        (".", ["neither a module name"]),
    ],
)
def test_run_import_errors_are_one_line(proj, import_str, needles):
    res = _run(proj, import_str)
    _assert_one_line_error(res, *needles)
    assert not (proj / "out.txt").exists()


def test_run_module_shadowed_by_an_imported_name(proj):
    (proj / "os.py").write_text("flow = None\n")
    _assert_one_line_error(_run(proj, "os.py"), "module 'os'", "already taken", "rename your file")


def test_run_bytewax_dataflow_is_explained(proj):
    pytest.importorskip("bytewax")
    (proj / "bw.py").write_text("from bytewax.dataflow import Dataflow\nflow = Dataflow('bw')\n")
    _assert_one_line_error(_run(proj, "bw.py"), "is a Bytewax Dataflow", "build it with flowspark")


def test_run_flow_without_output_is_one_line(proj):
    (proj / "noout.py").write_text(
        "import flowspark.operators as op\nfrom flowspark.dataflow import Dataflow\n"
        "from flowspark.testing import TestingSource\n"
        "flow = Dataflow('n')\nop.input('inp', flow, TestingSource([1]))\n"
    )
    _assert_one_line_error(_run(proj, "noout.py"), "dataflow 'n' has no output or inspect step")


def test_run_error_in_user_module_keeps_its_traceback(proj):
    (proj / "broken.py").write_text("raise ValueError('boom in module')\n")
    res = _run(proj, "broken.py")
    assert res.returncode == 1
    assert "Traceback" in res.stderr
    assert "broken.py" in res.stderr
    assert "ValueError: boom in module" in res.stderr


def test_run_error_in_flow_names_the_step(proj):
    (proj / "bad.txt").write_text("x\n")
    (proj / "failing.py").write_text(
        "import flowspark.operators as op\nfrom flowspark.dataflow import Dataflow\n"
        "from flowspark.testing import TestingSource, TestingSink\n"
        "flow = Dataflow('b')\ns = op.input('inp', flow, TestingSource([0]))\n"
        "op.output('out', op.map('div', s, lambda x: 1 / x), TestingSink([]))\n"
    )
    res = _run(proj, "failing.py")
    assert res.returncode == 1
    assert "error in step 'b.div.flat_map_batch': ZeroDivisionError" in res.stderr


# -- visualize ----------------------------------------------------------------

VIS_FLOW = textwrap.dedent(
    """
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.testing import TestingSource, TestingSink

    def build(name):
        flow = Dataflow(name)
        s = op.input("inp", flow, TestingSource([("a", 1)]))
        s = op.map("m", s, lambda x: x)
        counts = op.stateful_map("count", s, lambda st, v: (st, v))
        b = op.branch("br", counts, lambda kv: True)
        m = op.merge("mg", b.trues, b.falses)
        op.output("out", m, TestingSink([]))
        return flow

    flow = build("vis")
    """
)


@pytest.fixture
def vis(tmp_path):
    (tmp_path / "vis.py").write_text(VIS_FLOW)
    return tmp_path


def _vis(tmp_path, *args):
    return _cli(tmp_path, "flowspark.visualize", *args)


def _plan(tmp_path, *args):
    """flowspark's own views (`python -m flowspark.visualize` prints Bytewax's formats)."""
    return _cli(tmp_path, "flowspark", "plan", *args)


def test_visualize_mermaid_top_level(vis):
    res = _plan(vis, "vis.py", "--format", "mermaid")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("flowchart TD\n")
    for step_id, op_name in [
        ("vis.inp", "input"),
        ("vis.m", "map"),
        ("vis.count", "stateful_map"),
        ("vis.br", "branch"),
        ("vis.mg", "merge"),
        ("vis.out", "output"),
    ]:
        assert f'["{step_id} ({op_name})"]' in out
    assert "flat_map_batch" not in out  # inner core steps only with -r
    # Branch's two ports both reach the merge.
    node = {line.split("[")[0].strip(): line for line in out.splitlines() if '["vis.' in line}
    ids = {v.split('["')[1].split(" ")[0]: k for k, v in node.items()}
    assert f"{ids['vis.br']} -->|trues| {ids['vis.mg']}" in out
    assert f"{ids['vis.br']} -->|falses| {ids['vis.mg']}" in out
    assert out.count("-->") == 6


def test_visualize_mermaid_recursive_shows_core_steps_in_subgraphs(vis):
    res = _plan(vis, "vis.py", "--format", "mermaid", "-r")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert 'subgraph g0["vis.m (map)"]' in out
    assert '["vis.m.flat_map_batch (flat_map_batch)"]' in out
    assert '["vis.count.stateful_batch (stateful_batch)"]' in out
    lines = [line.strip() for line in out.splitlines()]
    assert lines.count("end") == sum(line.startswith("subgraph ") for line in lines) == 3  # flow, map, stateful_map


def test_visualize_json_top_level(vis):
    res = _plan(vis, "vis.py", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["flow_id"] == "vis"
    assert doc["recursive"] is False
    steps = {s["step_id"]: s for s in doc["steps"]}
    assert list(steps) == ["vis.inp", "vis.m", "vis.count", "vis.br", "vis.mg", "vis.out"]
    assert steps["vis.count"]["op"] == "stateful_map"
    assert steps["vis.count"]["core"] is None
    assert steps["vis.br"]["core"] == "Branch"
    assert "substeps" not in steps["vis.m"]
    edges = {(e["from"], tuple(e["to"])) for e in doc["streams"]}
    assert edges == {
        ("vis.inp", ("vis.m",)),
        ("vis.m", ("vis.count",)),
        ("vis.count", ("vis.br",)),
        ("vis.br", ("vis.mg",)),
        ("vis.mg", ("vis.out",)),
    }
    assert {e["stream_id"] for e in doc["streams"] if e["from"] == "vis.br"} == {"vis.br.trues", "vis.br.falses"}


def test_visualize_json_recursive_nests_substeps_and_links_core_steps(vis):
    res = _plan(vis, "vis.py", "--format", "json", "--recursive")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["recursive"] is True
    m = next(s for s in doc["steps"] if s["step_id"] == "vis.m")
    assert [(s["step_id"], s["core"]) for s in m["substeps"]] == [("vis.m.flat_map_batch", "FlatMapBatch")]
    edges = {(e["from"], tuple(e["to"])) for e in doc["streams"]}
    assert ("vis.inp", ("vis.m.flat_map_batch",)) in edges
    assert ("vis.m.flat_map_batch", ("vis.count.stateful_batch",)) in edges


def test_visualize_factory_and_error(vis):
    res = _vis(vis, "vis.py:build('other')", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["flow_id"] == "other"
    _assert_one_line_error(_vis(vis, "vis.py:nope"), "python -m flowspark.visualize: error:", "no attribute 'nope'")


# -- the resolver in-process ------------------------------------------------------


def test_parse_import_str_forms():
    spec = parse_import_str("a.b:get_flow('x', (1, 2), n=2, d={'k': None})")
    assert (spec.target, spec.is_file, spec.attr, spec.call) == ("a.b", False, "get_flow", True)
    assert spec.args == ("x", (1, 2))
    assert spec.kwargs == {"n": 2, "d": {"k": None}}
    assert parse_import_str("dir/f.py").is_file
    assert parse_import_str("f.py").attr == "flow"
    assert parse_import_str(" mod ").target == "mod"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("m:f(*xs)", "`*xs`"),
        ("m:f(**kw)", "`**kw`"),
        ("m:f(open('x'))", "argument `open('x')`"),
        ("m:f().g", "neither a name nor a simple function call"),
        (":flow", "names no module or file"),
    ],
)
def test_parse_import_str_rejects(text, needle):
    with pytest.raises(ImportStrError) as ei:
        parse_import_str(text)
    assert needle in str(ei.value)
    assert "\n" not in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_locate_dataflow_in_process(tmp_path, monkeypatch):
    name = f"cli_inproc_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(FLOW_FILE)
    (tmp_path / "in.txt").write_text("a\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        flow = locate_dataflow(f"{name}.py:get_flow(out='x.txt')")
        assert isinstance(flow, Dataflow)
        assert flow.flow_id == "wc"
        assert locate_dataflow(f"{name}:flow") is sys.modules[name].flow
    finally:
        sys.modules.pop(name, None)
