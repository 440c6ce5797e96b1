"""The Spark compiler is pure (no session) and fuses steps into as few stages as possible."""

from __future__ import annotations

import threading

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkCompileError, FlowsparkTypeError
from flowspark.inputs import SimplePollingSource
from flowspark.spark import SparkSink, SparkSource, compile_flow
from flowspark.spark.batch.job import check_bounded, describe_stage
from flowspark.spark.rules.optimizer import Env, optimize
from flowspark.spark.rules.switches import rules_arg
from flowspark.testing import TestingSink, TestingSource


def keyed_flow():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([("a", 1)]))
    s = op.map("m", s, lambda x: x)
    k = op.key_on("k", s, lambda kv: kv[0])
    run = op.stateful_map("run", k, lambda st, v: (st, v))
    tot = op.fold_final("tot", run, lambda: 0, lambda a, v: a + 1)
    out = op.map_value("fmt", tot, str)
    op.output("out", out, TestingSink([]))
    return flow


def test_plan_fuses_stateless_runs_and_consecutive_stateful_steps():
    plan = compile_flow(keyed_flow())
    assert [st.kind for st in plan.stages] == ["source", "keyed"]
    src, keyed = plan.stages
    assert src.steps == ("f.inp", "f.m.flat_map_batch", "f.k.flat_map_batch")
    assert keyed.steps == ("f.run.stateful_batch", "f.tot.stateful_batch", "f.fmt.flat_map_batch")
    assert [s.step_id for s in keyed.spec.chain] == ["f.run.stateful_batch", "f.tot.stateful_batch"]
    assert src.spec.ports[0].key_for == "f.run.stateful_batch"
    text = plan.render(describe_stage)
    assert "repartition(k) -> sortWithinPartitions(k, seq) -> mapInArrow" in text
    assert "sink f.out: TestingSink (driver) <- stage1.port0" in text


def test_stateful_after_a_map_needs_a_new_shuffle():
    flow = Dataflow("f")
    k = op.key_on("k", op.input("inp", flow, TestingSource([1])), str)
    a = op.reduce_final("a", k, lambda x, y: x)
    b = op.reduce_final("b", op.map_value("mv", a, lambda v: v), lambda x, y: x)
    op.output("out", b, TestingSink([]))
    plan = compile_flow(flow)
    assert [st.kind for st in plan.stages] == ["source", "keyed", "keyed"]
    assert plan.stages[2].inputs[0][:2] == (1, 0)


def test_a_stream_with_two_consumers_is_not_fused_into_a_chain():
    flow = Dataflow("f")
    k = op.key_on("k", op.input("inp", flow, TestingSource([1])), str)
    a = op.reduce_final("a", k, lambda x, y: x)
    op.output("o1", a, TestingSink([]))
    op.output("o2", op.reduce_final("b", a, lambda x, y: x), TestingSink([]))
    plan = compile_flow(flow)
    assert [st.kind for st in plan.stages] == ["source", "keyed", "keyed"]


def test_merge_within_a_stage_is_fused_and_across_stages_is_a_union():
    flow = Dataflow("f")
    s = op.input("inp", flow, TestingSource([1]))
    b = op.branch("b", s, lambda x: x > 0)
    m = op.merge("m", op.map("x", b.trues, str), b.falses)
    other = op.input("inp2", flow, TestingSource([2]))
    m2 = op.merge("m2", m, other)
    op.output("out", m2, TestingSink([]))
    plan = compile_flow(flow)
    assert [st.kind for st in plan.stages] == ["source", "source", "map"]
    assert "f.m" in plan.stages[0].steps
    assert [(s, p) for s, p, _ in plan.stages[2].inputs] == [(0, 0), (1, 0)]
    # The merge tags each upstream and pads the shorter sequences.
    pads = [pad for _, _, pad in plan.stages[2].inputs]
    assert pads[0] == b"\0\0\0\0"  # index 0, already the longest
    assert pads[1] == b"\0\0\0\1" + b"\0" * 4  # index 1, one component (the inner merge's) shorter


def test_unpicklable_callable_fails_at_compile_time_naming_the_step():
    lock = threading.Lock()
    flow = Dataflow("f")
    s = op.map("locked", op.input("inp", flow, TestingSource([1])), lambda x: (lock, x)[1])
    op.output("out", s, TestingSink([]))
    with pytest.raises(FlowsparkCompileError, match="step 'f.locked.flat_map_batch': its mapper cannot be pickled"):
        compile_flow(flow)


def test_unbounded_source_is_refused():
    class Ticks(SimplePollingSource):
        def next_item(self):
            return 1

    from datetime import timedelta

    flow = Dataflow("f")
    op.output("out", op.input("inp", flow, Ticks(timedelta(seconds=1))), TestingSink([]))
    plan = compile_flow(flow)  # one plan for both lowerings; the batch lowering refuses it
    assert not plan.bounded
    with pytest.raises(FlowsparkCompileError, match="step 'f.inp': source Ticks does not say it ends") as info:
        check_bounded(plan)
    assert "run the flow with a checkpoint" in str(info.value)


def test_not_a_dataflow():
    with pytest.raises(FlowsparkTypeError, match="needs a Dataflow"):
        compile_flow("nope")


def test_spark_native_source_and_sink_in_plan():
    flow = Dataflow("f")
    s = op.input("inp", flow, SparkSource("parquet", "/nowhere"))
    op.output("out", s, SparkSink("parquet", "/nowhere/out"))
    plan = compile_flow(flow)
    assert plan.stages[0].spec.source == "native"
    assert plan.sinks[0].where == "native"


def test_bad_spark_source_and_sink_arguments():
    with pytest.raises(FlowsparkTypeError, match="format must be one of"):
        SparkSource("xml", "/x")
    with pytest.raises(FlowsparkTypeError, match="path must be a str"):
        SparkSink("parquet", None)  # type: ignore[arg-type]
    with pytest.raises(FlowsparkTypeError, match="mode must be one of"):
        SparkSink("parquet", "/x", mode="sometimes")


def test_compiler_module_needs_no_session():
    # Compiling never touches a SparkSession: the plan is data.
    from pyspark.sql import SparkSession  # noqa: TID251

    before = SparkSession.getActiveSession()
    compile_flow(keyed_flow())
    assert SparkSession.getActiveSession() is before


def batch_plan(flow, rules="all"):
    """The physical plan a batch job runs (no SparkSource columns: none is needed here)."""
    return optimize(compile_flow(flow), Env("batch", *rules_arg(rules)))


def test_keyed_ports_carry_only_the_value_unless_something_else_reads_them():
    plain = compile_flow(keyed_flow())
    assert not plain.stages[0].spec.ports[0].value_only  # the plain plan: no rule decided
    plan = batch_plan(keyed_flow())
    assert plan.decision("value_only_ports", "stage 0").applied
    src, keyed = plan.stages
    assert src.spec.ports[0].value_only
    assert keyed.spec.input_value_only
    off = batch_plan(keyed_flow(), "-value_only_ports")
    assert str(off.decision("value_only_ports", "stage 0")) == (
        "rule value_only_ports: not applied (switched off: rules='-value_only_ports')"
    )
    assert not off.stages[0].spec.ports[0].value_only
    assert not off.stages[1].spec.input_value_only

    flow = Dataflow("g")
    k = op.key_on("k", op.input("inp", flow, TestingSource(["a"])), lambda x: x)
    op.output("raw", k, TestingSink([]))  # the sink reads the keyed stream too
    op.output("out", op.stateful_map("run", k, lambda st, v: (st, v)), TestingSink([]))
    plan = batch_plan(flow)
    src, keyed = plan.stages
    assert str(plan.decision("value_only_ports", "stage 0")) == (
        "rule value_only_ports: not applied (no port of the stage is read by keyed stages only)"
    )
    assert src.spec.ports[0].key_for == "g.run.stateful_batch"
    assert not src.spec.ports[0].value_only
    assert not keyed.spec.input_value_only


def test_only_emits_whose_order_across_keys_is_seen_carry_the_key():
    # Inside a fused chain the next step has the same key: no key in the sequence.
    plan = batch_plan(keyed_flow())
    chain = plan.stages[1].spec.chain
    assert [ks.regroup for ks in chain] == [False, True]  # the last one reaches a TestingSink
    assert str(plan.decision("unordered_emits", "stage 1")) == (
        "rule unordered_emits: not applied (f.out sees port0 at the driver in order)"
    )

    def flow_to(sink_for):
        flow = Dataflow("g")
        k = op.key_on("k", op.input("inp", flow, TestingSource(["a1"])), lambda x: x[0])
        counts = op.stateful_map("run", k, lambda st, v: (st, v))
        sink_for(flow, counts)
        return batch_plan(flow)

    parquet = flow_to(lambda f, s: op.output("out", s, SparkSink("parquet", "/tmp/never-written")))
    assert [ks.regroup for ks in parquet.stages[1].spec.chain] == [False]
    assert parquet.decision("unordered_emits", "stage 1").applied
    inspected = flow_to(lambda f, s: op.output("out", op.inspect("i", s), SparkSink("parquet", "/tmp/x")))
    assert [ks.regroup for ks in inspected.stages[1].spec.chain] == [True]
    rekeyed = flow_to(
        lambda f, s: op.output(
            "out",
            op.stateful_map("again", op.key_on("k2", s, lambda kv: kv[1]), lambda st, v: (st, v)),
            SparkSink("parquet", "/tmp/x"),
        )
    )
    assert [[ks.regroup for ks in st.spec.chain] for st in rekeyed.stages if st.kind == "keyed"] == [[True], [False]]
