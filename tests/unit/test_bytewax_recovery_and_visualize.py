"""Bytewax's recovery (backup interval, inconsistent partitions), visualize, Ctrl-C.

As in `test_bytewax_api_tracing_cli.py`, a test runs the same user code on bytewax 0.21.1 and on
flowspark where it can (`api` fixture, `@differential`). The recovery cases are ported from
Bytewax's `pytests/test_recovery.py` (v0.21.1).
"""

import importlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import pytest

import flowspark.recovery
import flowspark.visualize
from flowspark.errors import RecoveryError
from tests.unit.test_bytewax_api_tracing_cli import Api, _api, differential

ZERO_TD = timedelta(seconds=0)
FIVE_TD = timedelta(seconds=5)


@pytest.fixture(params=["bytewax", "flowspark"])
def api(request: Any) -> Api:
    if request.param == "bytewax" and importlib.util.find_spec("bytewax") is None:
        pytest.skip("bytewax 0.21.1 is not installed")
    return _api(request.param)


# =====================================================================================
# Recovery
# =====================================================================================


def _keep_max(max_val: Optional[int], new_val: int) -> tuple[int, int]:
    max_val = max(max_val or 0, new_val)
    return (max_val, max_val)


def _add(total: Optional[int], v: int) -> tuple[int, int]:
    total = (total or 0) + v
    return (total, total)


def _stateful_flow(api: Api, inp: list[Any], out: list[Any], fn: Any = _keep_max) -> Any:
    flow = api.Dataflow("test_df")
    s = api.op.input("inp", flow, api.testing.TestingSource(inp))
    s = api.op.stateful_map("max", s, fn)
    api.op.output("out", s, api.testing.TestingSink(out))
    return flow


def test_inconsistent_partitions_error_is_importable_like_bytewax() -> None:
    from flowspark.recovery import InconsistentPartitionsError, MissingPartitionsError, NoPartitionsError

    assert issubclass(InconsistentPartitionsError, RecoveryError)
    assert issubclass(InconsistentPartitionsError, ValueError)  # as bytewax's
    assert {"InconsistentPartitionsError", "MissingPartitionsError", "NoPartitionsError"} <= set(
        flowspark.recovery.__all__
    )
    assert (NoPartitionsError.__name__, MissingPartitionsError.__name__) == (
        "NoPartitionsError",
        "MissingPartitionsError",
    )


def test_reset_partition_with_zero_backup_interval_is_inconsistent_like_bytewax(api: Api, tmp_path: Path) -> None:
    """Bytewax's `test_inconsistent_parts`: the other partitions already deleted epoch 0's state."""
    api.recovery.init_db_dir(tmp_path, 3)
    config = api.recovery.RecoveryConfig(str(tmp_path), backup_interval=ZERO_TD)
    for i in range(3):
        shutil.copy(tmp_path / f"part-{i}.sqlite3", tmp_path / f"part-{i}.run0")
    inp = [("a", 4), ("b", 4), api.testing.TestingSource.ABORT(), ("a", 1), ("b", 5)]
    out: list[Any] = []
    flow = _stateful_flow(api, inp, out)
    api.testing.run_main(flow, epoch_interval=ZERO_TD, recovery_config=config)
    assert out == [("a", 4), ("b", 4)]

    out.clear()
    shutil.copy(tmp_path / "part-0.run0", tmp_path / "part-0.sqlite3")
    with pytest.raises(api.recovery.InconsistentPartitionsError) as err:
        api.testing.run_main(flow, epoch_interval=ZERO_TD, recovery_config=config)
    assert out == []
    assert "too old to resume from epoch" in str(err.value)
    if api.name == "flowspark":
        assert "partitions [0] of 3" in str(err.value)


def test_continuation_with_delayed_backup_like_bytewax(api: Api, tmp_path: Path) -> None:
    """Bytewax's `test_continuation_with_delayed_backup`: backups delayed by two epochs change no output."""
    api.recovery.init_db_dir(tmp_path, 1)
    config = api.recovery.RecoveryConfig(str(tmp_path), backup_interval=FIVE_TD * 2)
    eof = api.testing.TestingSource.EOF()
    out: list[Any] = []
    flow = api.Dataflow("test_df")
    s = api.op.input("inp", flow, api.testing.TestingSource([0, eof, 1, eof, 2, eof, 3, eof, 4]))
    api.op.output("out", s, api.testing.TestingSink(out))
    for want in ([0], [1], [2], [3], [4], []):
        out.clear()
        api.testing.run_main(flow, epoch_interval=FIVE_TD, recovery_config=config)
        assert out == want


def _epochs_kept(db: Path) -> list[int]:
    with sqlite3.connect(db / "part-0.sqlite3") as con:
        return sorted(r[0] for r in con.execute("SELECT DISTINCT epoch FROM snaps"))


@pytest.mark.parametrize(
    ("backup", "kept"),
    [
        (None, [4]),
        (ZERO_TD, [4]),
        (timedelta(seconds=4), [3, 4]),
        (FIVE_TD * 2, [2, 3, 4]),
        (timedelta(seconds=11), [1, 2, 3, 4]),
    ],
)
def test_backup_interval_keeps_that_many_superseded_epochs(tmp_path: Path, backup: Any, kept: list[int]) -> None:
    """backup_interval / epoch_interval, rounded up, epochs of snapshots survive GC (Bytewax's count)."""
    api = _api("flowspark")
    api.recovery.init_db_dir(tmp_path, 1)
    config = api.recovery.RecoveryConfig(tmp_path, backup_interval=backup)
    eof = api.testing.TestingSource.EOF()
    out: list[Any] = []
    flow = _stateful_flow(api, [("a", 1), eof, ("a", 2), eof, ("a", 3), eof, ("a", 4)], out, _add)
    for _ in range(4):
        api.testing.run_main(flow, epoch_interval=FIVE_TD, recovery_config=config)
    assert out == [("a", 1), ("a", 3), ("a", 6), ("a", 10)]
    assert _epochs_kept(tmp_path) == kept


def _older_backup_runs(
    api: Api, db: Path, backup: timedelta, parts: int, saved_after: int, restored_before: int
) -> Any:
    """Six continuations; partition 0 restored from a copy taken after run `saved_after`."""
    db.mkdir()
    api.recovery.init_db_dir(db, parts)
    config = api.recovery.RecoveryConfig(str(db), backup_interval=backup)
    eof = api.testing.TestingSource.EOF()
    inp = [("a", 1), eof, ("b", 2), eof, ("a", 3), eof, ("b", 4), eof, ("a", 5), eof, ("b", 6)]
    out: list[Any] = []
    flow = _stateful_flow(api, inp, out, _add)
    runs = []
    for run in range(1, 7):
        if run == restored_before:
            shutil.copy(db / "backup-0", db / "part-0.sqlite3")
        out.clear()
        try:
            api.testing.run_main(flow, epoch_interval=FIVE_TD, recovery_config=config)
        except api.recovery.InconsistentPartitionsError:
            runs.append("inconsistent")
            return runs
        runs.append(list(out))
        if run == saved_after:
            shutil.copy(db / "part-0.sqlite3", db / "backup-0")
    return runs


@differential
@pytest.mark.parametrize(("parts", "saved_after", "restored_before"), [(2, 1, 3), (3, 2, 4)])
def test_resume_from_a_partition_restored_from_an_older_backup_like_bytewax(
    tmp_path: Path, parts: int, saved_after: int, restored_before: int
) -> None:
    """Within the backup interval, a partition one epoch behind the others is resumed from its epoch."""
    args = (timedelta(seconds=10), parts, saved_after, restored_before)
    bw = _older_backup_runs(_api("bytewax"), tmp_path / "bw", *args)
    fs = _older_backup_runs(_api("flowspark"), tmp_path / "fs", *args)
    assert fs == bw
    # The run after the restore replays the input since the restored partition's epoch.
    assert fs[restored_before - 1] == fs[restored_before - 2]


def test_restored_partition_older_than_the_backup_interval_is_inconsistent(tmp_path: Path) -> None:
    """Two epochs behind with one epoch of backup: the state of its epoch is gone from the others.

    Bytewax 0.21.1 does not always notice (it resumes from where its own progress records,
    spread over the partitions, happen to point; see docs/porting.md).
    """
    api = _api("flowspark")
    runs = _older_backup_runs(api, tmp_path / "one", FIVE_TD, 2, 1, 4)
    assert runs == [[("a", 1)], [("b", 2)], [("a", 4)], "inconsistent"]
    # With two epochs of backup it resumes from the restored epoch: `b` and `a` again.
    runs = _older_backup_runs(api, tmp_path / "two", FIVE_TD * 2, 2, 1, 4)
    assert runs == [[("a", 1)], [("b", 2)], [("a", 4)], [("b", 2)], [("a", 4)], [("b", 6)]]


def test_zero_backup_interval_with_a_zero_epoch_interval_keeps_nothing_extra(tmp_path: Path) -> None:
    assert flowspark.recovery.epochs_per(ZERO_TD, ZERO_TD) == 0
    assert flowspark.recovery.epochs_per(ZERO_TD, FIVE_TD) is None  # keep everything, as bytewax
    assert flowspark.recovery.epochs_per(FIVE_TD, timedelta(seconds=12)) == 3


@differential
def test_rescale_gives_bytewax_outputs(tmp_path: Path) -> None:
    """Bytewax's `test_rescale`: 3, 5 then 1 workers resume one store (flowspark also with one worker throughout)."""
    results = {}
    for name, workers in (("bytewax", (3, 5, 1)), ("flowspark", (3, 5, 1)), ("flowspark-1", (1, 1, 1))):
        api = _api(name.split("-")[0])
        db = tmp_path / name
        db.mkdir()
        api.recovery.init_db_dir(db, 3)
        config = api.recovery.RecoveryConfig(str(db))
        eof = api.testing.TestingSource.EOF()
        inp = [("a", 4), ("b", 4), eof, ("a", 1), ("b", 5), eof, ("a", 8), ("b", 1)]
        out: list[Any] = []
        flow = _stateful_flow(api, inp, out)
        runs = []
        for w in workers:
            out.clear()
            api.testing.cluster_main(
                flow, addresses=[], proc_id=0, epoch_interval=ZERO_TD, recovery_config=config, worker_count_per_proc=w
            )
            runs.append(list(out))
        results[name] = runs
    want = [[("a", 4), ("b", 4)], [("a", 4), ("b", 5)], [("a", 8), ("b", 5)]]
    assert results["flowspark"] == results["flowspark-1"] == results["bytewax"] == want


def test_backup_interval_must_be_a_timedelta(api: Api, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="backup interval must be a `datetime.timedelta`"):
        api.recovery.RecoveryConfig(str(tmp_path), backup_interval=5)


# =====================================================================================
# visualize
# =====================================================================================


def _nested_flow(api: Api) -> Any:
    @api.dataflow.operator
    def add_one(step_id: str, up: api.dataflow.Stream) -> api.dataflow.Stream:  # type: ignore[name-defined]
        return api.op.map("add", api.op.map("inner", up, lambda x: x), lambda x: x + 1)

    flow = api.Dataflow("eg")
    s = api.op.input("inp", flow, api.testing.TestingSource([1, 2]))
    b = api.op.branch("br", add_one("plus", s), lambda x: x > 1)
    m = api.op.merge("mg", b.trues, api.op.map("dbl", b.falses, lambda x: 2 * x))
    k = api.op.key_on("key", m, str)
    j = api.op.join("j", k, api.op.key_on("k2", api.op.input("inp2", flow, api.testing.TestingSource([1])), str))
    api.op.inspect("insp", j)
    api.op.output("out", j, api.testing.TestingSink([]))
    return flow


@differential
def test_to_json_is_bytewax_rendered_dataflow() -> None:
    bw = json.loads(_api("bytewax").visualize.to_json(_nested_flow(_api("bytewax"))))
    fs = json.loads(flowspark.visualize.to_json(_nested_flow(_api("flowspark"))))
    assert fs["typ"] == "RenderedDataflow"
    assert (fs["typ"], fs["flow_id"]) == (bw["typ"], bw["flow_id"])
    # Same operators, ports and links at the top; a custom operator is nested the same way.
    # (Stream ids name the innermost step that made a stream, e.g. `key_on`'s map in bytewax
    # and its flat_map_batch in flowspark, so they are compared where composites agree.)
    assert [st["step_id"] for st in fs["substeps"]] == [st["step_id"] for st in bw["substeps"]]

    def links(st: dict[str, Any]) -> Any:
        ins = [(p["typ"], p["port_name"], p["port_id"], p["from_port_ids"]) for p in st["inp_ports"]]
        return st["op_type"], st["step_name"], ins, [(p["port_name"], p["port_id"]) for p in st["out_ports"]]

    assert [links(st) for st in fs["substeps"]] == [links(st) for st in bw["substeps"]]
    plus = next(st for st in fs["substeps"] if st["step_id"] == "eg.plus")
    assert plus == next(st for st in bw["substeps"] if st["step_id"] == "eg.plus")
    assert plus["substeps"][0]["inp_ports"][0]["from_port_ids"] == ["eg.plus.up"]


@differential
def test_to_json_of_a_flow_built_alike_is_byte_for_byte_bytewax() -> None:
    def flow(api: Api) -> Any:
        f = api.Dataflow("eg")
        b = api.op.branch("br", api.op.input("inp", f, api.testing.TestingSource([1])), lambda x: x > 1)
        m = api.op.merge("mg", b.trues, api.op.map("dbl", b.falses, lambda x: 2 * x))
        api.op.output("out", m, api.testing.TestingSink([]))
        return f

    assert flowspark.visualize.to_json(flow(_api("flowspark"))) == _api("bytewax").visualize.to_json(
        flow(_api("bytewax"))
    )


@differential
def test_to_mermaid_is_bytewax_text() -> None:
    bw = _api("bytewax").visualize.to_mermaid(_nested_flow(_api("bytewax")))
    fs = flowspark.visualize.to_mermaid(_nested_flow(_api("flowspark")))
    assert fs == bw
    assert 'eg.br -- "falses → up" --> eg.dbl' in fs


def test_visualize_cli_prints_bytewax_formats(tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(
        "import flowspark.operators as op\nfrom flowspark.dataflow import Dataflow\n"
        "from flowspark.testing import TestingSource, TestingSink\n"
        "flow = Dataflow('eg')\nop.output('out', op.input('inp', flow, TestingSource([1])), TestingSink([]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(flowspark.__file__).parents[1])}

    def cli(*args: str) -> str:
        res = subprocess.run(
            [sys.executable, "-m", "flowspark.visualize", "flows.py", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert cli() == (
        'flowchart TD\nsubgraph "eg (Dataflow)"\neg.inp["inp (input)"]\neg.out["out (output)"]\n'
        'eg.inp -- "down → up" --> eg.out\nend\n'
    )
    doc = json.loads(cli("-o", "json"))
    assert doc["typ"] == "RenderedDataflow"
    assert doc["substeps"][1]["inp_ports"][0]["from_port_ids"] == ["eg.inp.down"]


# =====================================================================================
# Ctrl-C
# =====================================================================================

_SIGINT_FLOW = """
from pathlib import Path
import {lib}.operators as op
from {lib}.dataflow import Dataflow
from {lib}.inputs import DynamicSource, StatelessSourcePartition
from {lib}.outputs import DynamicSink, StatelessSinkPartition

class _Count(StatelessSourcePartition):
    def __init__(self):
        self.n = 0
    def next_batch(self):
        self.n += 1
        return [self.n]

class Counter(DynamicSource):
    def build(self, step_id, worker_index, worker_count):
        return _Count()

class _Lines(StatelessSinkPartition):
    def __init__(self, path):
        self.f = open(path, "w")
    def write_batch(self, items):
        for x in items:
            self.f.write(f"{{x}}\\n")
    def close(self):
        self.f.write("closed\\n")
        self.f.close()

class Lines(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _Lines(Path("out.txt"))

flow = Dataflow("sig")
op.output("out", op.input("inp", flow, Counter()), Lines())
"""


def _interrupt(lib: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run an unbounded flow, SIGINT it once its sink has written to out.txt."""
    (tmp_path / "flow.py").write_text(textwrap.dedent(_SIGINT_FLOW.format(lib=lib)))
    env = {**os.environ, "PYTHONPATH": str(Path(flowspark.__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", f"{lib}.run", "flow:flow"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    out = tmp_path / "out.txt"
    deadline = time.monotonic() + 60
    while not (out.exists() and out.stat().st_size > 0):  # poll; the sink's buffer reached the disk
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the flow wrote nothing within 60 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), out.read_text().splitlines()


@pytest.mark.parametrize("lib", ["bytewax", "flowspark"])
def test_ctrl_c_raises_keyboard_interrupt_and_keeps_what_the_sink_wrote(lib: str, tmp_path: Path) -> None:
    if lib == "bytewax" and importlib.util.find_spec("bytewax") is None:
        pytest.skip("bytewax 0.21.1 is not installed")
    res, lines = _interrupt(lib, tmp_path)
    assert "KeyboardInterrupt" in res.stderr
    # The sink was closed: everything written before the interrupt is there, in order.
    assert lines[-1] == "closed"
    assert lines[:-1] == [str(i) for i in range(1, len(lines))]
    assert len(lines) > 1
    if lib == "flowspark":
        # KeyboardInterrupt itself is what ends the process (bytewax 0.21.1 chains it under a
        # BytewaxRuntimeError when the signal lands in user code, exiting with 1).
        assert res.stderr.rstrip().splitlines()[-1] == "KeyboardInterrupt"
        assert res.returncode == -signal.SIGINT
        assert "interrupted" not in res.stderr


def test_keyboard_interrupt_in_run_main_closes_sinks_and_propagates() -> None:
    api = _api("flowspark")

    closed: list[str] = []

    class Sink(api.testing.TestingSink):  # type: ignore[name-defined,misc]
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
            part = super().build(step_id, worker_index, worker_count)
            write = part.write_batch

            def write_batch(items: list[int]) -> None:
                for x in items:
                    if x == 3:
                        raise KeyboardInterrupt
                    write([x])

            part.write_batch = write_batch
            part.close = lambda: closed.append(step_id)
            return part

    out: list[Any] = []
    flow = api.Dataflow("ki")
    api.op.output("out", api.op.input("inp", flow, api.testing.TestingSource([1, 2, 3, 4])), Sink(out))
    with pytest.raises(KeyboardInterrupt):
        api.testing.run_main(flow)
    assert out == [1, 2]
    assert closed == ["ki.out"]
