"""The `flowspark` command line: run / plan / submit --dry-run, and its one-line errors (no Spark started)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from flowspark._args import parse_trigger
from flowspark.cli import main, to_text
from flowspark.spark.session import DEFAULT_CONF, check_master

FLOW = textwrap.dedent(
    """
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.inputs import FileSource
    from flowspark.outputs import FileSink
    from {pkg}.helpers import shout

    def get_flow(inp="in.txt", out="out.txt"):
        flow = Dataflow("wc")
        s = op.input("inp", flow, FileSource(inp))
        s = op.map("fmt", s, lambda line: ("k", shout(line)))
        counted = op.stateful_map("count", s, lambda n, x: ((n or 0) + 1, f"{{n or 0}}:{{x}}"))
        op.output("out", counted, FileSink(out))
        return flow

    flow = get_flow()
    not_a_flow = [1, 2]
    """
)


@pytest.fixture
def project(tmp_path):
    """A project dir with a package `<pkg>` holding a flow module that imports a sibling module."""
    pkg = f"cliflows_{tmp_path.name.replace('-', '_')}"
    d = tmp_path / "proj" / pkg
    d.mkdir(parents=True)
    (d / "__init__.py").write_text("")
    (d / "helpers.py").write_text("def shout(s):\n    return s.upper()\n")
    (d / "flows.py").write_text(FLOW.format(pkg=pkg))
    (tmp_path / "proj" / "in.txt").write_text("a\nb\nc\n")
    return tmp_path / "proj", pkg


def _cli(cwd, *args, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWSPARK_")}
    return subprocess.run(
        [sys.executable, "-m", "flowspark", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_error_line(res):
    assert res.returncode == 1, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("flowspark: error: ")
    assert "Traceback" not in res.stderr
    assert "\tat " not in res.stderr
    return lines[0]


# -- run --------------------------------------------------------------------------------------------


def test_run_local_writes_output(project):
    cwd, pkg = project
    res = _cli(cwd, "run", f"{pkg}/flows.py:get_flow('in.txt', 'out.txt')")
    assert res.returncode == 0, res.stderr
    assert (cwd / "out.txt").read_text().splitlines() == ["0:A", "1:B", "2:C"]


def test_run_state_options(project):
    cwd, pkg = project
    flow = f"{pkg}/flows.py:get_flow('in.txt', 'out.txt')"
    res = _cli(cwd, "run", flow, "--state-ttl", "3600")  # accepted by the in-memory executor
    assert res.returncode == 0, res.stderr
    res = _cli(cwd, "run", flow, "--state-ttl", "soon")
    assert res.returncode != 0
    assert "--state-ttl: expected a positive number of seconds (e.g. 3600); received 'soon'" in res.stderr
    res = _cli(cwd, "run", "--runtime", "local", flow, "--state-layout", "key")
    assert res.returncode != 0
    assert "--state-layout: only for --runtime spark" in res.stderr


def test_run_module_form_and_explicit_local(project):
    cwd, pkg = project
    res = _cli(cwd, "run", "--runtime", "local", f"{pkg}.flows:get_flow(out='o2.txt')")
    assert res.returncode == 0, res.stderr
    assert (cwd / "o2.txt").read_text().splitlines() == ["0:A", "1:B", "2:C"]


@pytest.mark.parametrize(
    ("import_str", "expect"),
    [
        ("nope.py", "does not exist"),
        ("no_such_module_xyz", "not found"),
        ("{pkg}/flows.py:nah", "has no attribute 'nah'"),
        ("{pkg}/flows.py:not_a_flow", "not a flowspark Dataflow"),
        ("{pkg}/flows.py:get_flow(1, 2, 3)", "cannot call factory"),
        ("{pkg}/flows.py:get_flow(x)", "not a literal"),
    ],
)
def test_bad_import_strings_give_one_line(project, import_str, expect):
    cwd, pkg = project
    line = _one_error_line(_cli(cwd, "run", import_str.format(pkg=pkg)))
    assert expect in line


def test_spark_flags_with_local_runtime_rejected(project):
    cwd, pkg = project
    line = _one_error_line(_cli(cwd, "run", "--runtime", "local", "--checkpoint", "ck", f"{pkg}/flows.py"))
    assert "--checkpoint" in line
    assert "--runtime spark" in line


def test_unreachable_master_one_line_no_java(project):
    cwd, pkg = project
    port = _closed_port()
    res = _cli(cwd, "run", "--master", f"spark://127.0.0.1:{port}", f"{pkg}/flows.py")
    line = _one_error_line(res)
    assert f"cannot reach the Spark master spark://127.0.0.1:{port}" in line
    assert "fix --master" in line


def test_bad_conf_and_trigger_are_usage_errors(project):
    cwd, pkg = project
    res = _cli(cwd, "run", "--conf", "novalue", f"{pkg}/flows.py")
    assert res.returncode == 2
    assert "not key=value" in res.stderr
    res = _cli(cwd, "run", "--trigger", "soon", f"{pkg}/flows.py")
    assert res.returncode == 2
    assert "neither available_now nor an interval" in res.stderr


def test_user_error_on_local_runtime_propagates(tmp_path):
    (tmp_path / "boomflow.py").write_text(
        textwrap.dedent(
            """
            import flowspark.operators as op
            from flowspark.dataflow import Dataflow
            from flowspark.testing import TestingSource, TestingSink
            def boom(x):
                raise ValueError("three is bad")
            flow = Dataflow("bad")
            op.output("out", op.map("boom", op.input("inp", flow, TestingSource([1])), boom), TestingSink([]))
            """
        )
    )
    res = _cli(tmp_path, "run", "boomflow.py")
    assert res.returncode == 1
    assert "three is bad" in res.stderr


def test_master_check():
    check_master("local[*]")
    check_master("yarn")
    port = _closed_port()
    with pytest.raises(ConnectionError, match="cannot reach the Spark master"):
        check_master(f"spark://127.0.0.1:{port}", timeout=1)
    with pytest.raises(ConnectionError, match="HOST:PORT"):
        check_master("spark://hostonly")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        check_master(f"spark://127.0.0.1:{_closed_port()},127.0.0.1:{srv.getsockname()[1]}", timeout=1)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("available_now", ("available_now", None)),
        ("10 seconds", ("processing_time", 10.0)),
        ("1 second", ("processing_time", 1.0)),
        ("250ms", ("processing_time", 0.25)),
        ("2 minutes", ("processing_time", 120.0)),
    ],
)
def test_parse_trigger(text, want):
    assert parse_trigger(text) == want


@pytest.mark.parametrize("text", ["", "now", "10", "ten seconds", "5 hours"])
def test_parse_trigger_rejects(text):
    with pytest.raises(ValueError, match="available_now"):
        parse_trigger(text)


# -- plan -------------------------------------------------------------------------------------------


def test_plan_text_mermaid_json(project, capsys, monkeypatch):
    cwd, pkg = project
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    assert main(["plan", f"{pkg}.flows"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines() == [
        "dataflow 'wc': 4 steps",
        "  wc.inp (input)",
        "  wc.fmt (map) <- wc.inp",
        "  wc.count (stateful_map) <- wc.fmt",
        "  wc.out (output) <- wc.count",
    ]
    assert main(["plan", f"{pkg}.flows", "-r"]) == 0
    rec = capsys.readouterr().out
    assert "    wc.count.stateful_batch (stateful_batch, core StatefulBatch) <- wc.fmt.flat_map_batch" in rec
    assert main(["plan", f"{pkg}.flows", "--format", "mermaid"]) == 0
    mer = capsys.readouterr().out
    assert mer.startswith("flowchart TD")
    assert 's2["wc.count (stateful_map)"]' in mer
    assert main(["plan", f"{pkg}.flows", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["op"] for s in doc["steps"]] == ["input", "map", "stateful_map", "output"]


def test_plan_spark_compiled_only(project, capsys, monkeypatch):
    pytest.importorskip("pyspark")
    cwd, pkg = project
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    assert main(["plan", f"{pkg}.flows", "--spark", "--no-physical"]) == 0
    out = capsys.readouterr().out
    assert "plan for dataflow 'wc': 2 stage(s)" in out
    assert "stage 0 [source]" in out
    assert "stage 1 [keyed]: (stage0.port0) -> repartition(k) -> sortWithinPartitions(k, seq) -> mapInArrow" in out
    assert "Physical Plan" not in out
    assert main(["plan", f"{pkg}.flows", "--spark", "--no-physical", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    stages = doc["spark"]["stages"]
    assert [s["kind"] for s in stages] == ["source", "keyed"]
    assert stages[0]["steps"] == ["wc.inp", "wc.fmt.flat_map_batch"]
    assert stages[1]["steps"] == ["wc.count.stateful_batch"]
    assert doc["spark"]["sinks"] == [{"step_id": "wc.out", "sink": "FileSink", "where": "fixed", "from": [1, 0]}]


def test_plan_spark_mermaid_rejected(project, capsys, monkeypatch):
    cwd, pkg = project
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    assert main(["plan", f"{pkg}.flows", "--spark", "--format", "mermaid"]) == 1
    assert "use --format text or --format json" in capsys.readouterr().err


def test_plan_spark_compile_error_one_line(tmp_path):
    pytest.importorskip("pyspark")
    (tmp_path / "lockflow.py").write_text(
        textwrap.dedent(
            """
            import threading
            import flowspark.operators as op
            from flowspark.dataflow import Dataflow
            from flowspark.testing import TestingSource, TestingSink
            lock = threading.Lock()
            flow = Dataflow("locky")
            s = op.input("inp", flow, TestingSource([1]))
            op.output("out", op.map("guard", s, lambda x: (lock, x)[1]), TestingSink([]))
            """
        )
    )
    line = _one_error_line(_cli(tmp_path, "plan", "lockflow.py", "--spark", "--no-physical"))
    assert "step 'locky.guard.flat_map_batch'" in line
    assert "cannot be pickled" in line


def test_plan_spark_streaming_shows_buckets_and_state_layout(tmp_path):
    pytest.importorskip("pyspark")
    (tmp_path / "tickflow.py").write_text(UNBOUNDED)
    res = _cli(
        tmp_path, "plan", "tickflow.py:keyed", "--spark", "--no-physical", "--buckets", "8", "--state-layout", "bucket"
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "runs as a Structured Streaming query" in out
    assert "stage 0 [source]: readStream.format('flowspark_source')" in out
    # stateful_map cannot notify: the query runs without timers (no tick stream, NoTimeout)
    assert "stage 1 [keyed]: (stage0.port0) -> groupBy(pmod(hash(k), 8)).applyInPandasWithState(NoTimeout)" in out
    assert "state: layout 'bucket': one row per bucket: pickle of {key: (snapshots, notify_at, run)}" in out
    res = _cli(tmp_path, "plan", "tickflow.py:keyed", "--spark", "--no-physical", "--state-layout", "key")
    assert res.returncode == 0, res.stderr
    assert "transformWithStateInPandas(timeMode=None (ProcessingTime with a state_ttl); " in res.stdout
    assert "providerClass to RocksDBStateStoreProvider" in res.stdout  # the run changes the session: said
    assert "a MapState row per other key is read only when the key is touched" in res.stdout
    # a new checkpoint's default (without drain_sources: as with --checkpoint)
    res = _cli(tmp_path, "plan", "tickflow.py:keyed", "--spark", "--no-physical", "--rules=-drain_sources")
    assert res.returncode == 0, res.stderr
    assert "transformWithStateInPandas(timeMode=None (ProcessingTime with a state_ttl); " in res.stdout
    assert "the other keys sit in MapState chunks (crc32(key) % chunks, the count doubling past 512" in res.stdout
    res = _cli(tmp_path, "plan", "tickflow.py:keyed", "--spark", "--no-physical", "--format", "json")
    assert json.loads(res.stdout)["spark"]["mode"] == "batch"  # drain_sources: as run without --checkpoint
    res = _cli(
        tmp_path, "plan", "tickflow.py:keyed", "--spark", "--no-physical", "--format", "json", "--rules=-drain_sources"
    )
    doc = json.loads(res.stdout)["spark"]
    assert doc["mode"] == "streaming"
    # a new chunk-layout checkpoint: 8 buckets per shuffle partition of the session `flowspark run` opens, >= 16
    partitions = int(DEFAULT_CONF["spark.sql.shuffle.partitions"])
    assert doc["keyed_state"][0]["buckets"] == max(16, 8 * partitions)
    res = _cli(
        tmp_path,
        "plan",
        "tickflow.py:keyed",
        "--spark",
        "--no-physical",
        "--format",
        "json",
        "--state-layout",
        "bucket",
    )
    assert json.loads(res.stdout)["spark"]["keyed_state"][0]["buckets"] == 64
    assert doc["keyed_state"][0]["steps"] == ["tick.count.stateful_batch"]


def test_to_text_names_ports(capsys):
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.testing import TestingSink, TestingSource

    flow = Dataflow("br")
    b = op.branch("split", op.input("inp", flow, TestingSource([1, 2])), lambda x: x % 2 == 0)
    op.output("evens", b.trues, TestingSink([]))
    op.output("odds", b.falses, TestingSink([]))
    lines = to_text(flow).splitlines()
    assert "  br.evens (output) <- br.split.trues" in lines
    assert "  br.odds (output) <- br.split.falses" in lines


# -- progress and Spark error lines (pure parts) ------------------------------------------------


class _Status:
    def __init__(self, s):
        self.s = s

    def toString(self):  # noqa: N802
        return self.s


class _Stage:
    def __init__(self, sid, status, tasks, done, inp=0, shr=0, out=0, shw=0):
        self.v = (sid, status, tasks, done, inp, shr, out, shw)

    def stageId(self):  # noqa: N802
        return self.v[0]

    def status(self):
        return _Status(self.v[1])

    def numTasks(self):  # noqa: N802
        return self.v[2]

    def numCompleteTasks(self):  # noqa: N802
        return self.v[3]

    def inputRecords(self):  # noqa: N802
        return self.v[4]

    def shuffleReadRecords(self):  # noqa: N802
        return self.v[5]

    def outputRecords(self):  # noqa: N802
        return self.v[6]

    def shuffleWriteRecords(self):  # noqa: N802
        return self.v[7]


def test_progress_counts_only_stages_of_this_run(monkeypatch):
    pytest.importorskip("pyspark")
    import io

    from flowspark.spark.tools import Progress

    p = Progress(None, stream=io.StringIO())
    p._first_stage = 3
    stages = [
        _Stage(1, "COMPLETE", 4, 4, inp=999),  # before this run
        _Stage(3, "COMPLETE", 2, 2, inp=100, shw=100),
        _Stage(4, "SKIPPED", 2, 0),
        _Stage(5, "ACTIVE", 2, 1, shr=40, out=40),
        _Stage(6, "PENDING", 3, 0),
    ]
    monkeypatch.setattr(p, "_stages", lambda: stages)
    counts = p.snapshot()
    assert counts == {
        "stages": 3,
        "done": 1,
        "running": 1,
        "tasks": 7,
        "tasks_done": 3,
        "rows_read": 140,
        "rows_written": 140,
    }
    p._start = 0.0
    p._emit()
    p._emit()  # unchanged counts off a terminal: not repeated
    lines = p.stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "stages 1/3 done (1 running, tasks 3/7) rows read 140 written 140" in lines[0]


def test_spark_error_line_drops_java_frames():
    pytest.importorskip("pyspark")
    from flowspark.spark.tools import spark_error_line

    err = RuntimeError(
        "An error occurred while calling o42.save.\n: org.apache.spark.SparkException: Job aborted due to "
        "stage failure: boom\n\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages"
        "(DAGScheduler.scala:2856)\n\tat scala.Option.foreach(Option.scala:437)"
    )
    assert spark_error_line(err) == "SparkException: Job aborted due to stage failure: boom"


# -- submit --dry-run ----------------------------------------------------------------------------


def test_submit_dry_run_prints_command_and_packages(project):
    cwd, pkg = project
    work = cwd / "work"
    res = _cli(
        cwd,
        "submit",
        f"{pkg}/flows.py:get_flow('in.txt', out='/data/out.txt')",
        "--master",
        "spark://10.0.0.1:7077",
        "--conf",
        "spark.executor.memory=1g",
        "--archives",
        "env.tar.gz#environment",
        "--work-dir",
        str(work),
        "--dry-run",
    )
    assert res.returncode == 0, res.stderr
    cmd = shlex.split(res.stdout.strip())
    assert Path(cmd[0]).name == "spark-submit"
    assert Path(cmd[0]).is_file()
    assert cmd[cmd.index("--master") + 1] == "spark://10.0.0.1:7077"
    assert cmd[cmd.index("--py-files") + 1] == str(work / "flow.zip")
    assert cmd[cmd.index("--archives") + 1] == "env.tar.gz#environment"
    confs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"]
    assert "spark.executor.memory=1g" in confs
    assert "spark.pyspark.python=./environment/bin/python" in confs
    assert f"spark.pyspark.driver.python={sys.executable}" in confs
    assert cmd[-1] == str(work / "flowspark_driver.py")
    names = set(zipfile.ZipFile(work / "flow.zip").namelist())
    assert {f"{pkg}/__init__.py", f"{pkg}/flows.py", f"{pkg}/helpers.py"} <= names
    assert {"flowspark/__init__.py", "flowspark/cli.py", "flowspark/spark/batch/job.py"} <= names
    assert not any("__pycache__" in n for n in names)
    driver = (work / "flowspark_driver.py").read_text()
    assert (
        f"['run', '--runtime', 'spark', '--master', 'spark://10.0.0.1:7077', "
        f"\"{pkg}.flows:get_flow('in.txt', out='/data/out.txt')\", '--conf', 'spark.executor.memory=1g']"
    ) in driver
    # the driver's module-form import string resolves from the zip alone
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); from flowspark._importstr import locate_dataflow;"
            f"print(locate_dataflow(\"{pkg}.flows:get_flow('in.txt', out='y')\").flow_id)",
            str(work / "flow.zip"),
        ],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.stdout.strip() == "wc", check.stderr


def test_submit_project_dir(project, tmp_path):
    cwd, pkg = project
    (cwd / "tools").mkdir()
    (cwd / "tools" / "extra.py").write_text("X = 1\n")
    (cwd / ".venv").mkdir()
    (cwd / ".venv" / "junk.py").write_text("")
    venv = cwd / "env2"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("")
    (venv / "junk.py").write_text("")
    work = tmp_path / "w2"
    res = _cli(
        cwd, "submit", f"{pkg}/flows.py", "--master", "local[2]", "--project", ".", "--work-dir", str(work), "--dry-run"
    )
    assert res.returncode == 0, res.stderr
    names = set(zipfile.ZipFile(work / "flow.zip").namelist())
    assert {f"{pkg}/flows.py", "tools/extra.py"} <= names
    assert not any(n.startswith((".venv", "env2")) for n in names)
    cmd = shlex.split(res.stdout.strip())
    confs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"]
    assert f"spark.pyspark.python={sys.executable}" in confs


def test_submit_errors_one_line(project):
    cwd, pkg = project
    line = _one_error_line(_cli(cwd, "submit", f"{pkg}/flows.py:nah", "--master", "spark://127.0.0.1:7077"))
    assert "has no attribute 'nah'" in line
    port = _closed_port()
    line = _one_error_line(_cli(cwd, "submit", f"{pkg}/flows.py", "--master", f"spark://127.0.0.1:{port}"))
    assert "cannot reach the Spark master" in line
    line = _one_error_line(
        _cli(cwd, "submit", f"{pkg}/flows.py", "--master", "local", "--project", "nodir", "--dry-run")
    )
    assert "not a directory" in line
    other = cwd.parent / "elsewhere"
    other.mkdir()
    line = _one_error_line(
        _cli(cwd, "submit", f"{pkg}/flows.py", "--master", "local", "--project", str(other), "--dry-run")
    )
    assert "is not under --project" in line


def test_console_script_installed(project):
    exe = shutil.which("flowspark")
    if exe is None:
        pytest.skip("the flowspark console script is not on PATH")
    cwd, pkg = project
    res = subprocess.run([exe, "plan", f"{pkg}/flows.py"], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("dataflow 'wc': 4 steps")


UNBOUNDED = textwrap.dedent(
    """
    import flowspark.operators as op
    from flowspark.dataflow import Dataflow
    from flowspark.inputs import SimplePollingSource
    from flowspark.testing import TestingSink
    from datetime import timedelta
    class Tick(SimplePollingSource):
        def next_item(self):
            return 1
    flow = Dataflow("tick")
    op.output("out", op.input("inp", flow, Tick(timedelta(seconds=1))), TestingSink([]))

    def keyed():
        flow = Dataflow("tick")
        s = op.key_on("key", op.input("inp", flow, Tick(timedelta(seconds=1))), str)
        op.output("out", op.stateful_map("count", s, lambda n, x: ((n or 0) + 1, n)), TestingSink([]))
        return flow
    """
)


def test_streaming_flags_checked_before_spark_starts(project, tmp_path):
    pytest.importorskip("pyspark")
    cwd, pkg = project
    line = _one_error_line(_cli(cwd, "run", "--checkpoint", "ck", f"{pkg}/flows.py"))
    assert "every source of this flow is bounded" in line
    line = _one_error_line(_cli(cwd, "run", "--trigger", "available_now", f"{pkg}/flows.py"))
    assert "drop them" in line
    (tmp_path / "tickflow.py").write_text(UNBOUNDED)
    # Without the rule drain_sources a source that does not say it ends makes the run a stream.
    line = _one_error_line(_cli(tmp_path, "run", "--runtime", "spark", "--rules=-drain_sources", "tickflow.py"))
    assert "'tick.inp'" in line
    assert "needs --checkpoint DIR" in line


def test_cli_works_without_pyspark(project):
    cwd, pkg = project
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["pyspark"] = None  # as if pyspark were not installed
        from flowspark.cli import main
        assert main(["plan", "{pkg}/flows.py"]) == 0
        assert main(["run", "{pkg}/flows.py:get_flow(out='nospark.txt')"]) == 0
        assert "pyspark" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
        sys.exit(main(["plan", "{pkg}/flows.py", "--spark"]))
        """
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert (cwd / "nospark.txt").read_text().splitlines() == ["0:A", "1:B", "2:C"]
    assert res.stderr.strip().splitlines() == [
        "flowspark: error: `flowspark plan --spark` needs pyspark; install it with `pip install 'flowspark[spark]'`"
    ]


def test_run_dead_letter_option_in_memory(project):
    """`--dead-letter DIR`: a failing map sends its item to DIR (json here) and the run finishes."""
    cwd, _pkg = project
    (cwd / "in.txt").write_text("a\nboom\nc\n")
    (cwd / "poison.py").write_text(
        textwrap.dedent(
            """
            import flowspark.operators as op
            from flowspark.dataflow import Dataflow
            from flowspark.inputs import FileSource
            from flowspark.outputs import FileSink

            def check(line):
                if line == "boom":
                    raise ValueError("no boom")
                return ("k", line.upper())

            flow = Dataflow("p")
            op.output("out", op.map("check", op.input("inp", flow, FileSource("in.txt")), check), FileSink("out.txt"))
            """
        )
    )
    res = _cli(cwd, "run", "poison.py:flow")
    assert res.returncode == 1
    assert "ValueError: no boom" in res.stderr
    res = _cli(cwd, "run", "poison.py:flow", "--dead-letter", "dead", "--dead-letter-format", "json")
    assert res.returncode == 0, res.stderr
    assert (cwd / "out.txt").read_text().splitlines() == ["A", "C"]
    (batch,) = os.listdir(cwd / "dead")
    assert batch == "batch_id=1"
    rows = [json.loads(ln) for f in os.listdir(cwd / "dead" / batch) for ln in (cwd / "dead" / batch / f).open()]
    assert [(r["step_id"], r["error_type"], r["error_message"], r["item"]) for r in rows] == [
        ("p.check.flat_map_batch", "ValueError", "no boom", "'boom'")
    ]
    assert "1 item(s) went to the dead letter" in res.stderr


def test_submit_passes_the_streaming_state_options_to_the_driver(tmp_path):
    (tmp_path / "tickflow.py").write_text(UNBOUNDED)
    work = tmp_path / "work"
    args = ["submit", "tickflow.py:keyed", "--master", "spark://10.0.0.1:7077", "--work-dir", str(work), "--dry-run"]
    args += ["--checkpoint", "ck", "--state-layout", "chunk", "--state-ttl", "90", "--buckets", "8"]
    res = _cli(tmp_path, *args)
    assert res.returncode == 0, res.stderr
    driver = (work / "flowspark_driver.py").read_text()
    argv = driver[driver.index("['run'") :].split("\n")[0]
    assert "'--state-layout', 'chunk'" in argv
    assert "'--state-ttl', '90.0'" in argv
    assert "'--buckets', '8'" in argv
    assert f"'--checkpoint', {str(tmp_path / 'ck')!r}" in argv


def test_submit_refuses_streaming_options_for_a_bounded_flow(project):
    cwd, pkg = project
    args = ["submit", f"{pkg}/flows.py", "--master", "local", "--state-layout", "chunk", "--buckets", "4", "--dry-run"]
    line = _one_error_line(_cli(cwd, *args))
    assert "--buckets/--state-layout apply to flows with an unbounded source" in line
    assert "'wc' is bounded" in line
    assert "drop --buckets --state-layout" in line
    res = _cli(cwd, "submit", f"{pkg}/flows.py", "--master", "local", "--state-layout", "row")
    assert res.returncode == 2
    assert "argument --state-layout: invalid choice: 'row'" in res.stderr


def test_ctrl_c_runs_pysparks_handler_off_the_main_thread_and_stops_the_run():
    """The chained SIGINT handler (pyspark's: `cancelAllJobs`, then `KeyboardInterrupt`) runs in a thread of its own.

    In the main thread it would call the JVM over the py4j connection the main thread is
    blocked on (the job's `collect`), which py4j can refuse ("reentrant call").
    """
    import signal
    import threading

    from flowspark import cli

    on_main: list[bool] = []
    done = threading.Event()

    def pysparks_handler(signum, frame):
        on_main.append(threading.current_thread() is threading.main_thread())
        done.set()
        raise KeyboardInterrupt

    def run():
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("not reached: the interrupt stops the run")

    old = signal.signal(signal.SIGINT, pysparks_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            cli._interruptible(run)
        assert done.wait(5)
        assert on_main == [False]
        assert signal.getsignal(signal.SIGINT) is pysparks_handler  # restored after the run
    finally:
        signal.signal(signal.SIGINT, old)
