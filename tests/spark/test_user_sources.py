"""User-written sources and sinks on Spark as `run_main` runs them (and as Bytewax 0.21.1 does).

A source that does not say it ends (no `is_bounded()`) runs without a checkpoint as a batch job
reading every partition until it ends (the rule `drain_sources`), with a checkpoint as a
streaming query; `DynamicSource` and `DynamicSink` get one instance per Spark partition with
`worker_index` / `worker_count`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkTypeError
from flowspark.inputs import (
    DynamicSource,
    FixedPartitionedSource,
    SimplePollingSource,
    StatefulSourcePartition,
    StatelessSourcePartition,
)
from flowspark.outputs import DynamicSink, StatelessSinkPartition
from flowspark.spark import compile_flow, run
from flowspark.spark.tools import physical_plans
from flowspark.testing import TestingSink, per_key, run_main

SIZES = {"a": 3, "b": 5, "c": 2}


class _Part(StatefulSourcePartition):
    def __init__(self, name: str, at: int) -> None:
        self.name, self.at = name, at

    def next_batch(self) -> list[Any]:
        if self.at >= SIZES[self.name]:
            raise StopIteration
        self.at += 1
        return [(self.name, self.at)]

    def snapshot(self) -> int:
        return self.at


class Counter(FixedPartitionedSource):
    """Three partitions counting 1..n, resumable from their position; no `is_bounded()`."""

    def list_parts(self) -> list[str]:
        return sorted(SIZES)

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _Part:
        return _Part(for_part, resume_state or 0)


def _running_sums(src: Any, out: list[Any]) -> Dataflow:
    flow = Dataflow("sums")
    sums = op.stateful_map("sum", op.input("inp", flow, src), lambda acc, v: ((acc or 0) + v,) * 2)
    op.output("out", sums, TestingSink(out))
    return flow


def test_a_partitioned_source_without_is_bounded_runs_to_its_end_as_run_main_runs_it(spark):
    want: list[Any] = []
    run_main(_running_sums(Counter(), want))
    assert want == [("a", 1), ("b", 1), ("c", 1), ("a", 3), ("b", 3), ("c", 3), ("a", 6), ("b", 6), ("b", 10)] + [
        ("b", 15)
    ]
    got: list[Any] = []
    flow = _running_sums(Counter(), got)
    assert run(flow, spark=spark) is None  # a batch job: it returned when every partition ended
    assert got == want
    plan, _ = physical_plans(compile_flow(flow), spark)
    decision = plan.decision("drain_sources", "query")
    assert decision.applied
    assert "'sums.inp' do not say they end" in decision.reason


def test_with_a_checkpoint_it_runs_as_a_stream_and_without_drain_sources_it_needs_one(spark, tmp_path):
    got: list[Any] = []
    ck = str(tmp_path / "ck")
    sr = run(_running_sums(Counter(), got), spark=spark, checkpoint=ck, trigger="available_now", progress=False)
    assert sr is not None
    want: list[Any] = []
    run_main(_running_sums(Counter(), want))
    assert per_key(got) == per_key(want)
    with pytest.raises(FlowsparkTypeError, match="checkpoint"):
        run(_running_sums(Counter(), []), spark=spark, rules="-drain_sources")


class _Span(StatelessSourcePartition):
    def __init__(self, worker_index: int, worker_count: int) -> None:
        self.items = [(f"w{worker_index}", (worker_index, worker_count, i)) for i in range(3)]

    def next_batch(self) -> list[Any]:
        if not self.items:
            raise StopIteration
        return [self.items.pop(0)]


class Workers(DynamicSource):
    """One partition per worker: three items naming `worker_index` and `worker_count`."""

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Span:
        return _Span(worker_index, worker_count)


class _FilePart(StatelessSinkPartition):
    def __init__(self, path: str) -> None:
        self.f = open(path, "a")  # noqa: SIM115

    def write_batch(self, items: list[Any]) -> None:
        for x in items:
            self.f.write(json.dumps(x) + "\n")

    def close(self) -> None:
        self.f.close()


class PerWorkerFiles(DynamicSink):
    """Each worker appends its items to `worker-INDEX-of-COUNT.jsonl` and closes it."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _FilePart:
        return _FilePart(os.path.join(self.directory, f"worker-{worker_index}-of-{worker_count}.jsonl"))


def _lines(directory: str) -> tuple[list[str], list[Any]]:
    names = sorted(os.listdir(directory))
    items = []
    for name in names:
        with open(os.path.join(directory, name)) as f:
            items.extend(tuple(json.loads(line)) for line in f)
    return names, items


def test_a_dynamic_source_and_sink_get_one_instance_per_spark_partition(spark, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    flow = Dataflow("dyn")
    op.output("out", op.input("inp", flow, Workers()), PerWorkerFiles(str(out)))
    assert run(flow, spark=spark) is None
    count = spark.sparkContext.defaultParallelism
    names, items = _lines(str(out))
    keys = sorted({k for k, _ in items})
    assert keys == sorted(f"w{i}" for i in range(count))  # one source instance per worker
    assert all(v[1] == count for _, v in items)  # each saw worker_count
    assert len(items) == 3 * count
    sinks = {n.removesuffix(".jsonl") for n in names}  # one sink instance per Spark partition it wrote
    total = {n.split("-of-")[1] for n in sinks}
    assert len(total) == 1
    assert sinks == {f"worker-{i}-of-{next(iter(total))}" for i in range(int(next(iter(total))))}
    mem = tmp_path / "mem"
    mem.mkdir()
    flow = Dataflow("dyn")
    op.output("out", op.input("inp", flow, Workers()), PerWorkerFiles(str(mem)))
    run_main(flow)
    assert _lines(str(mem)) == (["worker-0-of-1.jsonl"], [("w0", [0, 1, i]) for i in range(3)])


def _worker_counts(src: Any, got: list[Any], files: str) -> Dataflow:
    flow = Dataflow("dyn")
    s = op.input("inp", flow, src)
    counts = op.stateful_map("count", s, lambda n, v: ((n or 0) + 1, (v, (n or 0) + 1)))
    op.output("out", counts, TestingSink(got))
    op.output("files", s, PerWorkerFiles(files))
    return flow


def test_a_dynamic_source_and_sink_in_a_stream_get_one_instance_per_worker(spark, tmp_path):
    """Each run builds the source's partitions anew (no resume state), the state goes on: as bytewax 0.21.1
    recovers a DynamicSource (below, one worker: counts 1-3, then 4-6)."""
    count = spark.sparkContext.defaultParallelism
    ck = str(tmp_path / "ck")
    for run_no in range(2):
        files = tmp_path / f"files{run_no}"
        files.mkdir()
        got: list[Any] = []
        run(
            _worker_counts(Workers(), got, str(files)),
            spark=spark,
            checkpoint=ck,
            trigger="available_now",
            progress=False,
        )
        # Each worker's partition read its three items; the counts go on from the first run's state.
        want = {f"w{i}": [((i, count, j), 3 * run_no + j + 1) for j in range(3)] for i in range(count)}
        assert per_key(got) == want
        names, items = _lines(str(files))
        assert sorted(items) == sorted((f"w{i}", [i, count, j]) for i in range(count) for j in range(3))
        assert all(n.startswith("worker-") for n in names)
    if importlib.util.find_spec("bytewax") is None:
        return
    import bytewax.operators as bop
    from bytewax.dataflow import Dataflow as BDataflow
    from bytewax.inputs import DynamicSource as BDynamicSource
    from bytewax.inputs import StatelessSourcePartition as BPartition
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import TestingSink as BTestingSink
    from bytewax.testing import run_main as brun_main

    class BSpan(BPartition):
        def __init__(self, worker_index: int, worker_count: int) -> None:
            self.span = _Span(worker_index, worker_count)

        def next_batch(self) -> list[Any]:
            return self.span.next_batch()

    class BWorkers(BDynamicSource):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
            return BSpan(worker_index, worker_count)

    (tmp_path / "db").mkdir()
    init_db_dir(tmp_path / "db", 1)
    for run_no in range(2):
        bgot: list[Any] = []
        bflow = BDataflow("dyn")
        counts = bop.stateful_map(
            "count", bop.input("inp", bflow, BWorkers()), lambda n, v: ((n or 0) + 1, (v, (n or 0) + 1))
        )
        bop.output("out", counts, BTestingSink(bgot))
        brun_main(bflow, epoch_interval=timedelta(0), recovery_config=RecoveryConfig(tmp_path / "db"))
        assert bgot == [("w0", ((0, 1, j), 3 * run_no + j + 1)) for j in range(3)]


class Polls(SimplePollingSource[int]):
    """One type argument, as Bytewax's `SimplePollingSource[X]`; ends after three items."""

    def __init__(self) -> None:
        super().__init__(timedelta(0))
        self.n = 0

    def next_item(self) -> int:
        self.n += 1
        if self.n > 3:
            raise StopIteration
        return self.n


class _Paced(StatelessSourcePartition):
    """Bytewax's periodic_input example: `next_awake` from the system clock, 0.2 s apart."""

    def __init__(self) -> None:
        self.awake = datetime.now(timezone.utc)
        self.n = 0

    def next_awake(self) -> datetime:
        return self.awake

    def next_batch(self) -> list[int]:
        self.n += 1
        if self.n > 3:
            raise StopIteration
        self.awake = datetime.now(timezone.utc) + timedelta(milliseconds=200)
        return [self.n]


class Paced(DynamicSource):
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Paced:
        return _Paced()


def test_next_awake_is_read_against_the_system_clock_in_a_batch_job(spark):
    got: list[Any] = []
    flow = Dataflow("paced")
    op.output("out", op.input("inp", flow, Paced()), TestingSink(got))
    assert run(flow, spark=spark) is None  # returns: the job's fixed logical now does not hold it back
    assert sorted(got) == sorted([1, 2, 3] * spark.sparkContext.defaultParallelism)


def test_a_polling_source_with_one_type_argument_ends_on_spark(spark):
    got: list[Any] = []
    flow = Dataflow("polls")
    op.output("out", op.map("x10", op.input("inp", flow, Polls()), lambda x: x * 10), TestingSink(got))
    assert run(flow, spark=spark) is None
    assert got == [10, 20, 30]


MODULE = textwrap.dedent(
    """
    import flowspark.operators as op
    from flowspark.connectors.stdio import StdOutSink
    from flowspark.dataflow import Dataflow
    from flowspark.inputs import FixedPartitionedSource, StatefulSourcePartition

    class _Part(StatefulSourcePartition):
        def __init__(self, n, at):
            self.n, self.at = n, at or 0
        def next_batch(self):
            if self.at >= self.n:
                raise StopIteration()
            self.at += 1
            return [("k", self.at)]
        def snapshot(self):
            return self.at

    class Src(FixedPartitionedSource):
        def list_parts(self):
            return ["p"]
        def build_part(self, step_id, for_part, resume_state):
            return _Part(4, resume_state)

    flow = Dataflow("digits")
    s = op.stateful_map("sum", op.input("inp", flow, Src()), lambda a, v: ((a or 0) + v,) * 2)
    op.output("out", s, StdOutSink())
    """
)


@pytest.mark.slow
@pytest.mark.spark  # starts Spark in a subprocess
def test_a_module_whose_name_starts_with_a_digit_runs_in_memory_on_spark_and_in_bytewax(tmp_path):
    (tmp_path / "1digits.py").write_text(MODULE)
    want = "('k', 1)\n('k', 3)\n('k', 6)\n('k', 10)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for cmd in (["-m", "flowspark.run", "1digits"], ["-m", "flowspark", "run", "1digits", "--runtime", "spark"]):
        res = subprocess.run(
            [sys.executable, *cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout == want
    if importlib.util.find_spec("bytewax") is not None:
        (tmp_path / "2digits.py").write_text(MODULE.replace("flowspark", "bytewax"))
        res = subprocess.run(
            [sys.executable, "-m", "bytewax.run", "2digits"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout == want


FOREVER = textwrap.dedent(
    """
    import os
    import flowspark.operators as op
    from flowspark.connectors.stdio import StdOutSink
    from flowspark.dataflow import Dataflow
    from flowspark.inputs import DynamicSource, StatelessSourcePartition

    class _Part(StatelessSourcePartition):
        def __init__(self, marker):
            open(marker, "w").close()  # the task is reading
        def next_batch(self):
            return [1]

    class Forever(DynamicSource):
        def build(self, step_id, worker_index, worker_count):
            return _Part(os.environ["MARKER"] + str(worker_index))

    flow = Dataflow("forever")
    op.output("out", op.input("inp", flow, Forever()), StdOutSink())
    """
)


@pytest.mark.slow
@pytest.mark.spark  # starts Spark in a subprocess
@pytest.mark.parametrize("to", ["process", "group"])
def test_ctrl_c_stops_a_source_that_never_ends_cleanly(tmp_path, to):
    """SIGINT to the Python process, or to its process group as a terminal's Ctrl-C sends it (the JVM too)."""
    import signal
    import time

    (tmp_path / "forever.py").write_text(FOREVER)
    marker = str(tmp_path / "reading")
    env = {**os.environ, "MARKER": marker}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowspark", "run", "forever.py", "--runtime", "spark", "--no-progress"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=to == "group",
    )
    deadline = time.monotonic() + 240
    while not os.path.exists(marker + "0") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    if to == "group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    # The cancelled job's error is not reported as the run's. (Spark's Python worker daemon, in
    # the same process group, may print its own KeyboardInterrupt or BrokenPipe traceback.)
    assert "flowspark: interrupted" in err.splitlines()
    assert "flowspark: error" not in err
    assert out == ""  # nothing reached the sink: a batch job writes after its sources end
