"""Every optimizer rule against the reference: same output with the rule, without it and with none.

For each rule (`flowspark.spark.rules.optimizer.RULES`) a small flow where it applies runs on Spark
with every rule switched on (the decision record must say it applied), with that rule switched
off (`rules="-NAME"`) and with every rule switched off (`rules="none"`, the reference lowering),
and in memory (`run_main`). The four outputs must be equal per key: keys interleave in no order
on Spark, but within a key the items must come in the same order. Each item a stateful step
emits carries the values the key got so far, in order (`_seen`), so an output row tells the order
its key's values came in even when Spark's files give the rows in no order.

A batch run's decisions are read from the run itself (`explain=True` prints the physical plan it
runs) and from `flowspark.spark.tools.physical_plans`; a stream's from `StreamingRun.plan`.
"""

from __future__ import annotations

import contextlib
import io
import operator
import os
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

import pytest
from streaming_helpers import EndingListSource, ListSource

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.deadletter import DeadLetterDir
from flowspark.errors import FlowsparkRuntimeError, RecoveryError
from flowspark.spark import SparkSink, SparkSource, compile_flow, run
from flowspark.spark.rules.optimizer import RULES
from flowspark.spark.rules.switches import rule_names
from flowspark.spark.tools import physical_plans
from flowspark.testing import TestingSink, TestingSource, per_key, run_main

#: 45 events of 5 users; `at` names each event (the order a key's events came in shows in `seen`).
EVENTS = [{"user": f"u{(i * 7) % 5}", "v": i % 6, "at": f"e{i}"} for i in range(45)]
SCHEMA = "user STRING, v LONG, at STRING"
OUT_SCHEMA = "user STRING, n LONG, seen STRING"
#: A Python stream's partitions: `ListSource` reads 2 items per source batch.
PARTS = {"a": EVENTS[:20], "b": EVENTS[20:28], "c": EVENTS[28:]}


def _user(r):
    return r["user"]


def _at(r):
    return r["at"]


def _seen(state, at):
    n, seen = state or (0, "")
    state = (n + 1, f"{seen} {at}" if seen else at)
    return state, state


def _row(kv):
    user, (n, seen) = kv
    return {"user": user, "n": n, "seen": seen}


def _keep_all(acc, v):
    return [*acc, v]


def _seen_per_key(flow_id: str, src: Any) -> tuple[Dataflow, Any]:
    """`key_on` (a column) -> `map_value` (a column) -> `stateful_map`: `(flow, keyed counts stream)`."""
    flow = Dataflow(flow_id)
    keyed = op.key_on("key", op.input("inp", flow, src), _user)
    return flow, op.stateful_map("seen", op.map_value("at", keyed, _at), _seen)


# -- the flows: each `build(src, out)` -> flow; `out` is a list (a TestingSink) or an output directory


def _keyed(src: Any, out: Any) -> Dataflow:
    flow, counts = _seen_per_key("keyed", src)
    op.output("out", counts, TestingSink(out))
    return flow


def _eof(src: Any, out: Any) -> Dataflow:
    flow, counts = _seen_per_key("eof", src)
    op.output("out", op.fold_final("all", counts, list, _keep_all), TestingSink(out))
    return flow


def _reduce(src: Any, out: Any) -> Dataflow:
    """`key_on` (a column) -> `map_value` (a column) -> `reduce_final(operator.add)`: a Spark aggregate."""
    flow = Dataflow("reduce")
    keyed = op.key_on("key", op.input("inp", flow, src), _user)
    total = op.reduce_final("total", op.map_value("v", keyed, _v), operator.add)
    op.output("out", total, TestingSink(out))
    return flow


def _v(r):
    return r["v"]


def _total_row(kv):
    return {"user": kv[0], "n": kv[1]}


def _aggregated(src: Any, out: Any) -> Dataflow:
    """`_reduce`'s sum as a row, written to a SparkSink without a schema: inferred from the aggregated rows."""
    flow = Dataflow("aggregated")
    keyed = op.key_on("key", op.input("inp", flow, src), _user)
    total = op.reduce_final("total", op.map_value("v", keyed, _v), operator.add)
    rows = op.map("row", total, _total_row)
    op.output("out", rows, TestingSink(out) if isinstance(out, list) else SparkSink("parquet", out))
    return flow


def _two_sinks(src: Any, out: Any) -> Dataflow:
    """A count and a sum per user on two branches, each written to its own SparkSink (`concurrent_sinks`)."""
    flow = Dataflow("two_sinks")
    inp = op.input("inp", flow, src)
    counts = op.count_final("count", inp, _user)
    totals = op.reduce_final("total", op.map_value("v", op.key_on("key", inp, _user), _v), operator.add)
    for name, stream in (("counts", counts), ("totals", totals)):
        sink = TestingSink(out) if isinstance(out, list) else SparkSink("parquet", os.path.join(out, name))
        op.output(name, op.map(f"{name}_row", stream, _total_row), sink)
    return flow


def _to_rows(flow: Dataflow, counts: Any, out: Any, schema: Optional[str] = OUT_SCHEMA) -> Dataflow:
    rows = op.map("row", counts, _row)
    op.output("out", rows, TestingSink(out) if isinstance(out, list) else SparkSink("parquet", out, schema=schema))
    return flow


def _rows(src: Any, out: Any) -> Dataflow:
    return _to_rows(*_seen_per_key("rows", src), out)


class _SeenLogic(op.StatefulLogic):
    """`_seen` as a logic (not a function of its state: no `bare_state`) that may notify: the query has timers."""

    def __init__(self, resume: Any) -> None:
        self.state = resume

    def on_item(self, value: Any) -> Any:
        self.state, out = _seen(self.state, value)
        return [out], self.RETAIN

    def notify_at(self) -> Any:
        return None

    def snapshot(self) -> Any:
        return self.state


def _timed_rows(src: Any, out: Any) -> Dataflow:
    """`key_on` -> `map_value` -> `stateful` (`_SeenLogic`) -> `map` to a row: a keyed stage with timers."""
    flow = Dataflow("timed")
    keyed = op.key_on("key", op.input("inp", flow, src), _user)
    return _to_rows(flow, op.stateful("seen", op.map_value("at", keyed, _at), _SeenLogic), out)


def _rows_sampled(src: Any, out: Any) -> Dataflow:
    return _to_rows(*_seen_per_key("sampled", src), out, schema=None)


@dataclass(frozen=True)
class Flow:
    """A flow of this module, its inputs and how its output is read.

    Attributes:
        name: Its name (and the flow's id).
        build: `(source, out) -> Dataflow`.
        source: `parquet`: a SparkSource of a parquet file; `list`: a TestingSource; `python stream`:
            an unbounded `ListSource`; `python parts`: a `ListSource` whose partitions end without
            `is_bounded()` (a batch job drains them); `parquet stream`: a SparkSource of a stream of
            parquet files.
        spark_sink: Its output is a SparkSink writing parquet (else a TestingSink).
        outputs: The directories its SparkSinks write, under the run's output directory (several:
            each key's rows of all of them, compared in sorted order).
    """

    name: str
    build: Callable[[Any, Any], Dataflow]
    source: str
    spark_sink: bool
    outputs: tuple[str, ...] = ("",)

    @property
    def streaming(self) -> bool:
        return self.source.endswith("stream")


FLOWS = {
    f.name: f
    for f in (
        Flow("keyed", _keyed, "list", False),
        Flow("eof", _eof, "list", False),
        Flow("reduce", _reduce, "parquet", False),
        Flow("aggregated", _aggregated, "parquet", True),
        Flow("two_sinks", _two_sinks, "parquet", True, ("counts", "totals")),
        Flow("rows", _rows, "list", True),
        Flow("drained", _rows, "python parts", False),
        Flow("columns", _rows, "parquet", True),
        Flow("sampled", _rows_sampled, "parquet", True),
        Flow("python_stream", _rows, "python stream", True),
        Flow("parquet_stream", _rows, "parquet stream", True),
        Flow("timed_parquet_stream", _timed_rows, "parquet stream", True),
    )
}

#: `(rule, where it is decided, the flow it applies in)`: at least one per rule.
CASES = [
    ("drain_sources", "query", "drained"),
    ("value_only_ports", "stage 0", "keyed"),
    ("unordered_emits", "stage 1", "rows"),
    ("eof_only", "stage 1", "eof"),
    ("bare_state", "stage 1", "python_stream"),
    ("one_step", "stage 1", "timed_parquet_stream"),
    ("native_reduction", "stage 1", "reduce"),
    ("long_sums", "stage 1", "aggregated"),
    ("prefix_sample", "sink sampled.out", "sampled"),
    ("driver_prefix", "sink sampled.out", "sampled"),
    ("aggregate_sample", "sink aggregated.out", "aggregated"),
    ("native_rows", "sink aggregated.out", "aggregated"),
    ("concurrent_sinks", "query", "two_sinks"),
    ("spark_keys", "stage 1", "columns"),
    ("spark_keys", "stage 1", "parquet_stream"),
    ("value_mappers", "stage 1", "columns"),
    ("value_column", "stage 1", "columns"),
    ("schema_sampling", "sink sampled.out", "sampled"),
    ("sink_fusion", "sink rows.out", "columns"),
    ("sink_fusion", "sink rows.out", "python_stream"),
    ("mapper_line", "stage 1", "columns"),
    ("mapper_line", "stage 1", "python_stream"),
    ("flat_driver", "stage 1", "python_stream"),
    ("values_driver", "stage 1", "columns"),
    ("values_driver", "stage 1", "rows"),
    ("values_driver", "stage 1", "eof"),
    ("values_driver", "stage 1", "timed_parquet_stream"),
    ("ordered_source", "stage 1", "python_stream"),
    ("file_order", "stage 1", "parquet_stream"),
    ("file_order", "stage 1", "timed_parquet_stream"),
    ("lean_listener", "query", "python_stream"),
]


#: What an applied rule says of the case that held, in its case's flow (`rule NAME: applied (...)`).
NOTES = {
    "drain_sources": " (source(s) 'rows.inp' do not say they end: each partition is read until it ends "
    "(StopIteration); with a checkpoint the flow runs as a streaming query instead)",
    "concurrent_sinks": " (the writes share the Spark aggregate of stage 0 on 'user', persisted and materialized "
    "by its check job)",
}


def _decisions(text: str) -> dict[tuple[str, str], str]:
    """The decision lines of a rendered physical plan (`explain=True`): `(rule, where) -> line`."""
    out = {}
    where = ""
    for line in text.splitlines():
        if line.startswith("stage "):
            where = " ".join(line.split()[:2])
        elif line.startswith("sink "):
            where = line.split(":")[0]
        elif line.startswith("query ("):
            where = "query"
        elif line.startswith("    rule "):
            out[(line.split()[1].rstrip(":"), where)] = line.strip()
    return out


@dataclass
class Outcome:
    """One run of a flow: its output per key and every decision (`(rule, where) -> str(decision)`)."""

    output: dict[str, list[Any]]
    decisions: dict[tuple[str, str], str]


class Runs:
    """Runs each flow once per rules setting and input kind (the cases share them)."""

    def __init__(self, spark: Any, tmp: Any) -> None:
        self.spark = spark
        self.tmp = tmp
        self.done: dict[tuple[str, Optional[str]], Outcome] = {}
        self.parquet = str(tmp.mktemp("in") / "events.parquet")
        # One file: one partition, read in the list's order (the in-memory reference's).
        spark.createDataFrame(EVENTS, SCHEMA).coalesce(1).write.parquet(self.parquet)
        self.parquet_dir = str(tmp.mktemp("stream_in"))
        for f in range(3):
            part = spark.createDataFrame(EVENTS[f * 15 : (f + 1) * 15], SCHEMA).toPandas()
            part.to_parquet(os.path.join(self.parquet_dir, f"f{f:03d}.parquet"))
            # A file stream takes files in modification-time order: one second apart, the order written.
            os.utime(os.path.join(self.parquet_dir, f"f{f:03d}.parquet"), (1_700_000_000 + f,) * 2)

    def source(self, flow: Flow) -> Any:
        if flow.source == "list":
            return TestingSource(EVENTS)
        if flow.source == "parquet":
            return SparkSource("parquet", self.parquet)
        if flow.source == "python stream":
            return ListSource(PARTS, batch=2)
        if flow.source == "python parts":
            return EndingListSource(PARTS, batch=2)
        return SparkSource(
            "parquet", self.parquet_dir, schema=SCHEMA, options={"maxFilesPerTrigger": "1"}, streaming=True
        )

    def get(self, name: str, rules: Optional[str]) -> Outcome:
        """The outcome of flow `name` with `rules` (`None`: in memory, with `run_main`)."""
        if (name, rules) not in self.done:
            self.done[(name, rules)] = self._run(FLOWS[name], rules)
        return self.done[(name, rules)]

    def _run(self, flow: Flow, rules: Optional[str]) -> Outcome:
        if rules is None:
            out: list[Any] = []
            src = (
                EndingListSource(PARTS, batch=2, bounded=True)
                if flow.source.startswith("python")
                else TestingSource(EVENTS)
            )
            run_main(flow.build(src, out))
            return Outcome(_per_key(out, sort=len(flow.outputs) > 1) if flow.spark_sink else per_key(out), {})
        tag = f"{flow.name}_{rules.replace(',', '_')}"
        target: Any = str(self.tmp.mktemp(tag) / "out") if flow.spark_sink else []
        dataflow = flow.build(self.source(flow), target)
        if flow.streaming:
            sr = run(
                dataflow,
                spark=self.spark,
                checkpoint=str(self.tmp.mktemp(tag + "_chk")),
                trigger="available_now",
                progress=False,
                max_items=3,
                rules=rules,
            )
            assert sr is not None
            decisions = {(d.rule, d.where): str(d) for d in sr.plan.decisions}
        else:
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                assert run(dataflow, spark=self.spark, rules=rules, explain=True) is None
            decisions = _decisions(text.getvalue())
            again = flow.build(self.source(flow), target if flow.spark_sink else [])  # physical_plans writes nothing
            planned, _ = physical_plans(compile_flow(again), self.spark, rules=rules)
            assert {(d.rule, d.where): str(d) for d in planned.decisions} == decisions
        if flow.spark_sink:
            rows = [
                r.asDict() for o in flow.outputs for r in self.spark.read.parquet(os.path.join(target, o)).collect()
            ]
            return Outcome(_per_key(rows, sort=True), decisions)
        return Outcome(per_key(target), decisions)


def _per_key(rows: list[dict[str, Any]], sort: bool = False) -> dict[str, list[Any]]:
    """Rows `{"user", "n", "seen"}` (`seen` may be absent) per user: `(n, seen)` in order (`sort`: by `n`)."""
    out = per_key((r["user"], (r["n"], r.get("seen"))) for r in rows)
    return {k: sorted(v) for k, v in out.items()} if sort else out


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):
    return Runs(spark, tmp_path_factory)


def test_every_rule_has_a_case():
    assert sorted({rule for rule, _w, _f in CASES}) == sorted(rule_names())
    assert [r.name for r in RULES] == rule_names()


def _case(rule: str, where: str, flow: str) -> Any:
    """A case as a test's parameters: a stream's case is slow (each of its runs starts a query)."""
    marks = [pytest.mark.slow] if FLOWS[flow].streaming else []
    return pytest.param(rule, where, flow, marks=marks, id=f"{rule}-{flow}")


#: Rules whose switching off changes the lowering itself, each tested on its own: `drain_sources`
#: switched off makes the flow a streaming query, which needs a checkpoint
#: (`tests/spark/test_user_sources.py`).
LOWERING_RULES = {"drain_sources"}


@pytest.mark.parametrize(("rule", "where", "flow"), [_case(*c) for c in CASES if c[0] not in LOWERING_RULES])
def test_rule_gives_the_reference_output(runs, rule, where, flow):
    with_all = runs.get(flow, "all")
    assert with_all.decisions[(rule, where)] == f"rule {rule}: applied" + NOTES.get(rule, "")
    without = runs.get(flow, f"-{rule}")
    assert without.decisions[(rule, where)] == f"rule {rule}: not applied (switched off: rules='-{rule}')"
    reference = runs.get(flow, "none")
    assert not any(re.match(r"rule \S+: applied", d) for d in reference.decisions.values())
    in_memory = runs.get(flow, None)
    assert with_all.output == in_memory.output
    assert without.output == in_memory.output
    assert reference.output == in_memory.output
    assert sum(len(v) for v in in_memory.output.values()) == (
        {"eof": 5, "reduce": 5, "aggregated": 5, "two_sinks": 10}.get(flow, len(EVENTS))
    )


def test_flowspark_rules_none_in_the_environment_switches_every_rule_off(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWSPARK_RULES", "none")
    out = str(tmp_path / "out")
    sr = run(
        _rows(ListSource(PARTS, batch=2), out),
        spark=spark,
        checkpoint=str(tmp_path / "chk"),
        trigger="available_now",
        progress=False,
        max_items=3,
    )
    assert sr is not None
    assert {d.rule for d in sr.plan.decisions} == set(rule_names())
    for d in sr.plan.decisions:
        assert not d.applied
        assert d.reason in ("switched off: rules='none'", "only for batch jobs"), str(d)
    ref: list[Any] = []
    run_main(_rows(EndingListSource(PARTS, batch=2, bounded=True), ref))
    assert _per_key([r.asDict() for r in spark.read.parquet(out).collect()], sort=True) == _per_key(ref)

    text = io.StringIO()
    batch: list[Any] = []
    with contextlib.redirect_stdout(text):
        run(_keyed(TestingSource(EVENTS), batch), spark=spark, explain=True)
    decisions = _decisions(text.getvalue())
    assert "rule value_only_ports: not applied (switched off: rules='none')" in decisions.values()
    assert not any(d.endswith(": applied") for d in decisions.values())
    ref = []
    run_main(_keyed(TestingSource(EVENTS), ref))
    assert per_key(batch) == per_key(ref)


def test_a_switched_off_rule_says_so_in_the_plan(spark):
    flow = _keyed(TestingSource(EVENTS), [])
    plan, _ = physical_plans(compile_flow(flow), spark, rules="-value_only_ports,-eof_only")
    assert str(plan.decision("value_only_ports", "stage 0")) == (
        "rule value_only_ports: not applied (switched off: rules='-value_only_ports,-eof_only')"
    )
    assert str(plan.decision("eof_only", "stage 1")) == (
        "rule eof_only: not applied (switched off: rules='-value_only_ports,-eof_only')"
    )
    assert str(plan.decision("bare_state", "stage 1")) == "rule bare_state: not applied (only for streaming queries)"


def test_a_checkpoint_started_with_spark_keys_refuses_a_run_without_it(spark, tmp_path, runs):
    chk, src = str(tmp_path / "chk"), runs.source(FLOWS["parquet_stream"])
    opts = {"spark": spark, "checkpoint": chk, "trigger": "available_now", "progress": False}
    sr = run(_rows(src, str(tmp_path / "out")), **opts)
    assert sr is not None
    assert sr.plan.decision("spark_keys", "stage 1").applied
    with pytest.raises(RecoveryError, match=r"started with the rule 'spark_keys'.*rules='-spark_keys'"):
        run(_rows(src, str(tmp_path / "out2")), rules="-spark_keys", **opts)


def _planned(runs: Any, out_counts: str, out_totals: str, dead_letter: Any = None) -> Any:
    """The physical plan of `_two_sinks`-like flow writing `out_counts` and `out_totals` (no job writes)."""
    flow = Dataflow("two_dirs")
    inp = op.input("inp", flow, SparkSource("parquet", runs.parquet))
    op.output(
        "counts",
        op.map("counts_row", op.count_final("count", inp, _user), _total_row),
        SparkSink("parquet", out_counts),
    )
    totals = op.reduce_final("total", op.map_value("v", op.key_on("key", inp, _user), _v), operator.add)
    op.output("totals", op.map("totals_row", totals, _total_row), SparkSink("parquet", out_totals))
    plan, _ = physical_plans(compile_flow(flow).with_dead_letter(dead_letter), runs.spark)
    return plan.decision("concurrent_sinks", "query")


def test_concurrent_sinks_are_not_written_to_one_directory_nor_with_a_dead_letter(runs, tmp_path):
    same = _planned(runs, str(tmp_path / "out"), str(tmp_path / "out") + "/")
    assert str(same) == (
        f"rule concurrent_sinks: not applied (sinks two_dirs.counts and two_dirs.totals write to one directory "
        f"({tmp_path}/out and {tmp_path}/out))"
    )
    inner = _planned(runs, str(tmp_path / "out"), f"file://{tmp_path}/out/totals")
    assert not inner.applied
    assert inner.reason.startswith("sinks two_dirs.counts and two_dirs.totals write to one directory")
    dead = _planned(runs, str(tmp_path / "a"), str(tmp_path / "b"), DeadLetterDir(str(tmp_path / "dead")))
    assert str(dead) == (
        "rule concurrent_sinks: not applied "
        "(the run has a dead letter (it collects the sinks' misfits after the writes))"
    )
    assert _planned(runs, str(tmp_path / "a"), str(tmp_path / "b")).applied


@pytest.mark.parametrize("failure", ["directory exists", "row does not fit"])
def test_a_failing_concurrent_write_names_its_sink_and_the_other_write_completes(runs, tmp_path, failure):
    out = tmp_path / "out"
    (out / "totals").mkdir(parents=True)
    (out / "totals" / "kept.txt").write_text("not flowspark's")
    flow = Dataflow("two_sinks")
    inp = op.input("inp", flow, SparkSource("parquet", runs.parquet))
    counts = op.map("counts_row", op.count_final("count", inp, _user), _total_row)
    op.output("counts", counts, SparkSink("parquet", str(out / "counts")))
    totals = op.reduce_final("total", op.map_value("v", op.key_on("key", inp, _user), _v), operator.add)
    if failure == "directory exists":  # Spark refuses to start the write (mode="error")
        sink = SparkSink("parquet", str(out / "totals"), mode="error")
        message = "already exists"
    else:  # a task of the write fails on a row (an int where the schema says string)
        sink = SparkSink("parquet", str(out / "totals"), schema="user STRING, n STRING")
        message = "does not fit the sink's schema"
    op.output("totals", op.map("totals_row", totals, _total_row), sink)
    text = io.StringIO()
    with (
        contextlib.redirect_stdout(text),
        pytest.raises(FlowsparkRuntimeError, match=r"step 'two_sinks\.totals'") as ei,
    ):
        run(flow, spark=runs.spark, explain=True)
    assert "rule concurrent_sinks: applied" in text.getvalue()
    assert message in str(ei.value)
    # The failed write left no rows (Spark's commit protocol: the job's files are removed when it aborts).
    assert [f for f in os.listdir(out / "totals") if not f.startswith(".")] == (
        ["kept.txt"] if failure == "directory exists" else []
    )
    # The other write was waited for and ran to its end.
    counts_rows = {r["user"]: r["n"] for r in runs.spark.read.parquet(str(out / "counts")).collect()}
    assert counts_rows == {f"u{i}": 9 for i in range(5)}
    assert "_SUCCESS" in os.listdir(out / "counts")


class _NotifyLogic(op.StatefulLogic):
    """Emits per value, from a notification due as soon as a value came (a time in the past), and at EOF."""

    def __init__(self, resume: Any) -> None:
        self.seen: list[str] = resume or []
        self.waits = False

    def on_item(self, at: Any) -> Any:
        self.seen = [*self.seen, at]
        self.waits = True
        return [f"item {at}"], self.RETAIN

    def notify_at(self) -> Any:
        return _T0 - timedelta(days=1) if self.waits else None

    def on_notify(self) -> Any:
        self.waits = False
        return [f"notified after {' '.join(self.seen)}"], self.RETAIN

    def on_eof(self) -> Any:
        return [f"eof after {' '.join(self.seen)}"], self.RETAIN

    def snapshot(self) -> Any:
        return self.seen


_T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _notify_rows(src: Any, out: Any) -> Dataflow:
    flow = Dataflow("notify")
    keyed = op.key_on("key", op.input("inp", flow, src), _user)
    emits = op.stateful("st", op.map_value("at", keyed, _at), _NotifyLogic)
    rows = op.map("row", emits, lambda kv: {"user": kv[0], "x": kv[1]})
    op.output("out", rows, TestingSink(out) if isinstance(out, list) else SparkSink("parquet", out))
    return flow


def test_values_driver_drives_notifications_and_eof_as_the_reference_and_needs_one_activation_per_key(runs, tmp_path):
    """A logic that notifies and emits at EOF: the same rows with `values_driver` as without and in memory.

    A `SparkSource`'s rows are one activation, so in memory the reference is the list as one
    source batch; from a `TestingSource` (an activation per item) the rule does not apply.
    """
    spark = runs.spark
    outputs = {}
    for rules in ("all", "-values_driver", "none"):
        out = str(tmp_path / f"out_{rules.strip('-')}")
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            run(
                _notify_rows(SparkSource("parquet", runs.parquet), out),
                spark=spark,
                rules=rules,
                start_time=_T0,
                explain=True,
            )
        decision = _decisions(text.getvalue())[("values_driver", "stage 1")]
        assert decision.endswith(": applied") == (rules == "all"), decision
        outputs[rules] = sorted((r.user, r.x) for r in spark.read.parquet(out).collect())
    ref: list[Any] = []
    run_main(_notify_rows(TestingSource(EVENTS, batch_size=len(EVENTS)), ref), clock="fixed", start_time=_T0)
    want = sorted((r["user"], r["x"]) for r in ref)
    assert outputs["all"] == outputs["-values_driver"] == outputs["none"] == want
    assert ("u0", "notified after e0 e5 e10 e15 e20 e25 e30 e35 e40") in want
    assert ("u0", "eof after e0 e5 e10 e15 e20 e25 e30 e35 e40") in want

    plan, _ = physical_plans(compile_flow(_notify_rows(TestingSource(EVENTS), [])), spark)
    assert str(plan.decision("values_driver", "stage 1")) == (
        "rule values_driver: not applied (step 'notify.st.stateful_batch' may ask for notifications, which fire "
        "between the activations its values' sequences tell apart (spark_keys did not apply))"
    )
    got: list[Any] = []
    run(_notify_rows(TestingSource(EVENTS), got), spark=spark, start_time=_T0)
    ref = []
    run_main(_notify_rows(TestingSource(EVENTS), ref), clock="fixed", start_time=_T0)
    assert sorted(map(repr, got)) == sorted(map(repr, ref))
    assert sum(1 for r in ref if r["x"].startswith("notified after")) > 5  # between values, not only at the end


def _running(state, v):
    n = (state or 0) + 1
    return n, (n, v)


def _running_rows(src: Any, out: Any) -> Dataflow:
    flow = Dataflow("running")
    keyed = op.key_on("key", op.input("inp", flow, src), _user)
    counts = op.stateful_map("count", op.map_value("v", keyed, _v), _running)
    rows = op.map("row", counts, lambda kv: {"user": kv[0], "n": kv[1][0], "v": kv[1][1]})
    op.output("out", rows, TestingSink(out) if isinstance(out, list) else SparkSink("parquet", out))
    return flow


def test_prefix_sample_infers_the_schema_from_output_items_of_the_first_rows(runs, tmp_path, monkeypatch):
    """10,000 rows in two files: the sample is real output items (each key's first counts), read by a limit."""
    import flowspark.spark.batch.job as batch_lowering

    spark = runs.spark
    events = [{"user": f"u{i % 97}", "v": i} for i in range(10_000)]
    src = str(tmp_path / "in")
    for half in range(2):
        part = events[half * 5000 : (half + 1) * 5000]
        spark.createDataFrame(part, "user STRING, v LONG").coalesce(1).write.mode("append").parquet(src)
    samples: list[Any] = []

    def recording(*args: Any) -> Any:
        got = batch_lowering_prefix_sample(*args)
        samples.append(got)
        return got

    reads: list[Any] = []

    def recording_read(*args: Any) -> Any:
        got = batch_lowering_driver_prefix(*args)
        reads.append(got)
        return got

    batch_lowering_prefix_sample = batch_lowering.prefix_sample
    batch_lowering_driver_prefix = batch_lowering.driver_prefix
    monkeypatch.setattr(batch_lowering, "prefix_sample", recording)
    monkeypatch.setattr(batch_lowering, "driver_prefix", recording_read)
    ref: list[Any] = []
    run_main(_running_rows(TestingSource(events), ref))
    want = sorted((r["user"], r["n"], r["v"]) for r in ref)
    outputs = {}
    for rules in ("all", "-driver_prefix", "-prefix_sample", "none"):
        out = str(tmp_path / f"out_{rules.strip('-')}")
        plan, _ = physical_plans(compile_flow(_running_rows(SparkSource("parquet", src), out)), spark, rules=rules)
        assert plan.decision("prefix_sample", "sink running.out").applied == (rules in ("all", "-driver_prefix"))
        assert plan.decision("driver_prefix", "sink running.out").applied == (rules == "all")
        run(_running_rows(SparkSource("parquet", src), out), spark=spark, rules=rules)
        outputs[rules] = sorted((r.user, r.n, r.v) for r in spark.read.parquet(out).collect())
        assert dict(spark.read.parquet(out).dtypes) == {"user": "string", "n": "bigint", "v": "bigint"}
    assert outputs["all"] == outputs["-driver_prefix"] == outputs["-prefix_sample"] == outputs["none"] == want
    assert len(samples) == 2, "the rule's sampling runs once per run with the rule on"
    assert samples[0] is not None, "the first rows gave the sample (no fallback)"
    assert len(samples[0]) == 100
    reference = {(r["user"], r["n"], r["v"]) for r in ref}
    assert all((x["user"], x["n"], x["v"]) in reference for x in samples[0]), "sampled items are output items"
    # driver_prefix read the rows at the driver (no limit job), the same first rows as the limit.
    assert len(reads) == 1
    assert reads[0] is not None
    assert reads[0].num_rows == 4096
    assert samples[0] == samples[1]


def test_driver_prefix_reads_partition_0s_files_in_spark_order(runs, tmp_path, monkeypatch):
    """Small files packed into partition 0 (a low open cost): the rows are read across them, as Spark orders them."""
    import flowspark.spark.batch.job as batch_lowering

    spark = runs.spark
    src = str(tmp_path / "in")
    events = []
    for f, size in enumerate((900, 1500, 1200, 700)):  # distinct sizes: Spark reads the largest file first
        part = [{"user": f"u{(i * 7 + f) % 31}", "v": f * 10_000 + i} for i in range(size)]
        events.extend(part)
        spark.createDataFrame(part, "user STRING, v LONG").coalesce(1).write.mode("append").parquet(src)
    reads: list[Any] = []
    samples: list[Any] = []
    real_read, real_sample = batch_lowering.driver_prefix, batch_lowering.prefix_sample
    monkeypatch.setattr(batch_lowering, "driver_prefix", lambda *a: reads.append(real_read(*a)) or reads[-1])
    monkeypatch.setattr(batch_lowering, "prefix_sample", lambda *a: samples.append(real_sample(*a)) or samples[-1])
    confs = {"spark.sql.files.openCostInBytes": "1", "spark.sql.files.minPartitionNum": "1"}
    old = {c: spark.conf.get(c, None) for c in confs}
    for c, v in confs.items():
        spark.conf.set(c, v)
    try:
        outputs = {}
        for rules in ("all", "-driver_prefix"):
            out = str(tmp_path / f"out_{rules.strip('-')}")
            run(_running_rows(SparkSource("parquet", src), out), spark=spark, rules=rules)
            outputs[rules] = sorted(tuple(r) for r in spark.read.parquet(out).select("user", "n", "v").collect())
        df = spark.read.parquet(src)
        first = df.rdd.glom().first()  # partition 0's rows, in order
    finally:
        for c, v in old.items():
            if v is None:
                spark.conf.unset(c)
            else:
                spark.conf.set(c, v)
    assert len(reads) == 1
    assert reads[0] is not None
    assert reads[0].column("v").to_pylist() == [r.v for r in first][:4096]
    assert len({v // 10_000 for v in reads[0].column("v").to_pylist()}) >= 2, "read across files"
    assert samples[0] == samples[1]
    assert samples[0] is not None
    assert outputs["all"] == outputs["-driver_prefix"]
