"""Building dataflows: step id rules, nesting, Stream helpers, run-time validation."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream, operator
from flowspark.errors import (
    DuplicateStepError,
    FlowsparkBuildError,
    FlowsparkError,
    FlowsparkRuntimeError,
    FlowsparkTypeError,
    IncompleteDataflowError,
    StreamScopeError,
)
from flowspark.testing import TestingSink, TestingSource, run_main


def _ident(x):
    return x


@pytest.fixture
def flow():
    return Dataflow("f")


@pytest.fixture
def inp(flow):
    return op.input("inp", flow, TestingSource([1, 2, 3]))


# -- step id rules ----------------------------------------------------------


def test_duplicate_step_id_is_rejected_with_full_id(inp):
    op.map("m", inp, _ident)
    with pytest.raises(DuplicateStepError, match=r"'f\.m' already exists"):
        op.map("m", inp, _ident)


def test_duplicate_step_id_is_a_value_error(inp):
    with pytest.raises(ValueError, match="unique"):
        op.filter("inp", inp, bool)


def test_same_id_in_different_parents_is_allowed(flow, inp):
    @operator
    def twice(step_id, up):
        return op.map("m", op.map("m_first", up, _ident), _ident)

    a = twice("one", inp)
    b = twice("two", inp)
    out: list = []
    op.output("out", op.merge("both", a, b), TestingSink(out))
    run_main(flow)
    assert sorted(out) == [1, 1, 2, 2, 3, 3]


def test_duplicate_inside_composite_names_the_nested_id(inp):
    @operator
    def bad(step_id, up):
        a = op.map("x", up, _ident)
        return op.map("x", a, _ident)

    with pytest.raises(DuplicateStepError, match=r"'f\.outer\.x' already exists"):
        bad("outer", inp)


def test_step_id_with_period_fails_naming_full_id(inp):
    with pytest.raises(FlowsparkBuildError, match=r"step 'f\.a\.b' .*can't contain any periods.*'a_b'"):
        op.map("a.b", inp, _ident)


def test_step_id_with_period_inside_composite_names_full_id(inp):
    @operator
    def comp(step_id, up):
        return op.map("x.y", up, _ident)

    with pytest.raises(FlowsparkBuildError, match=r"step 'f\.c\.x\.y'"):
        comp("c", inp)


def test_empty_step_id_fails(inp):
    with pytest.raises(FlowsparkBuildError, match=r"step 'f\.' .*must not be empty"):
        op.map("", inp, _ident)


@pytest.mark.parametrize("bad", [3, None, b"x", ("a",)])
def test_non_str_step_id_fails_with_type_error(inp, bad):
    with pytest.raises(FlowsparkTypeError, match=r"must be a `str`; received") as info:
        op.map(bad, inp, _ident)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, FlowsparkError)
    assert "(operator 'map')" in str(info.value)
    assert "f." in str(info.value)


@pytest.mark.parametrize(("bad", "err"), [("a.b", FlowsparkBuildError), ("", FlowsparkBuildError), (1, TypeError)])
def test_flow_id_rules(bad, err):
    with pytest.raises(err):
        Dataflow(bad)


def test_missing_stream_argument_is_a_type_error():
    with pytest.raises(FlowsparkTypeError, match=r"'up' argument must be a `Stream`; received \[1, 2\] of type list"):
        op.map("m", [1, 2], _ident)


def test_operator_requires_step_id_parameter():
    with pytest.raises(TypeError, match="step_id"):

        @operator
        def nope(up):
            return up


def test_operator_bad_arguments_are_type_errors(inp):
    with pytest.raises(FlowsparkTypeError, match="'map'"):
        op.map("m", inp)


# -- nesting ----------------------------------------------------------------


def test_user_composite_ids_are_nested(flow, inp):
    @operator
    def add_then_double(step_id, up):
        assert step_id == "f.calc"
        a = op.map("add", up, lambda x: x + 1)
        return op.map("double", a, lambda x: x * 2)

    out: list = []
    op.output("out", add_then_double("calc", inp), TestingSink(out))
    graph = flow.graph()
    ids = [n.step_id for n in graph.nodes]
    assert ids == ["f.inp", "f.calc.add.flat_map_batch", "f.calc.double.flat_map_batch", "f.out"]
    comps = {c.step_id: c for c in graph.composites}
    assert comps["f.calc"].name == "add_then_double"
    assert comps["f.calc"].substeps == ("f.calc.add", "f.calc.double")
    assert comps["f.calc"].ups == ("f.inp.down",)
    assert comps["f.calc"].downs == ("f.calc.double.flat_map_batch.down",)
    assert comps["f.calc.add"].name == "map"
    run_main(flow)
    assert out == [4, 6, 8]


def test_composite_inside_composite(flow, inp):
    @operator
    def inner(step_id, up):
        return op.map("m", up, _ident)

    @operator
    def outer(step_id, up):
        return inner("in", up)

    out: list = []
    op.output("out", outer("out_c", inp), TestingSink(out))
    assert "f.out_c.in.m.flat_map_batch" in [n.step_id for n in flow.graph().nodes]
    run_main(flow)
    assert out == [1, 2, 3]


def test_inspect_receives_fully_qualified_step_id(flow, inp):
    seen = []

    @operator
    def comp(step_id, up):
        return op.inspect("look", up, lambda sid, x: seen.append((sid, x)))

    comp("c", inp)
    run_main(flow)
    assert seen == [("f.c.look", 1), ("f.c.look", 2), ("f.c.look", 3)]


# -- Stream -----------------------------------------------------------------


def test_stream_then_chains_operators(flow, inp):
    out: list = []
    s = inp.then(op.map, "double", lambda x: x * 2).then(op.filter, "big", predicate=lambda x: x > 2)
    assert isinstance(s, Stream)
    s.then(op.output, "out", TestingSink(out))
    run_main(flow)
    assert out == [4, 6]
    assert "f.double.flat_map_batch" in [n.step_id for n in flow.graph().nodes]


def test_stream_flow(flow, inp):
    assert inp.flow() is flow
    assert op.map("m", inp, _ident).flow() is flow


def test_stream_of_another_dataflow_is_rejected(inp):
    other = Dataflow("g")
    foreign = op.input("inp2", other, TestingSource([1]))
    with pytest.raises(FlowsparkBuildError, match=r"step 'f\.m'.*'g\.inp2\.down' belongs to another dataflow"):
        op.merge("m", inp, foreign)


def test_stream_of_another_dataflow_in_join_is_rejected(inp):
    other = Dataflow("g")
    a = op.key_on("k", inp, str)
    b = op.key_on("k", op.input("i", other, TestingSource([1])), str)
    with pytest.raises(FlowsparkBuildError, match="another dataflow"):
        op.join("j", a, b)


# -- run-time validation ----------------------------------------------------


def test_flow_without_input_fails_at_run_main():
    flow = Dataflow("empty")
    with pytest.raises(
        FlowsparkRuntimeError, match=r"'empty' has no input step.*at least one input.*op\.input"
    ) as info:
        run_main(flow)
    # As Bytewax: a RuntimeError that is not a ValueError, caused by a ValueError.
    assert not isinstance(info.value, ValueError)
    assert isinstance(info.value.__cause__, IncompleteDataflowError)
    with pytest.raises(FlowsparkBuildError, match=r"'empty' has no input step"):
        flow.validate()


def test_flow_without_output_fails_at_run_main(flow, inp):
    op.map("m", inp, _ident)
    with pytest.raises(FlowsparkRuntimeError, match=r"'f' has no output or inspect step.*at least one output") as info:
        run_main(flow)
    assert isinstance(info.value.__cause__, IncompleteDataflowError)


def test_flow_with_only_inspect_runs(flow, inp, capsys):
    op.inspect("look", inp)
    run_main(flow)
    assert capsys.readouterr().out == "f.look: 1\nf.look: 2\nf.look: 3\n"


def test_run_main_rejects_non_dataflow():
    with pytest.raises(FlowsparkTypeError, match="Dataflow"):
        run_main("flow")


# -- no pyspark on the import path ------------------------------------------


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_does_not_load_pyspark():
    res = _run_python(
        """
        import sys
        import flowspark, flowspark.operators, flowspark.testing, flowspark.dataflow, flowspark.recovery
        bad = sorted(m for m in sys.modules if m == "pyspark" or m.startswith("pyspark."))
        print("LOADED", bad)
        """
    )
    assert res.returncode == 0, res.stderr
    assert "LOADED []" in res.stdout


def test_import_and_run_with_pyspark_blocked():
    res = _run_python(
        """
        import sys
        sys.modules["pyspark"] = None
        import flowspark
        import flowspark.operators as op
        from flowspark.dataflow import Dataflow
        from flowspark.testing import TestingSource, TestingSink, run_main
        flow = Dataflow("f")
        out = []
        s = op.stateful_map("c", op.input("i", flow, TestingSource([("a", 1), ("a", 2)])),
                            lambda s, v: ((s or 0) + v, (s or 0) + v))
        op.output("o", s, TestingSink(out))
        run_main(flow)
        print("OUT", out)
        """
    )
    assert res.returncode == 0, res.stderr
    assert "OUT [('a', 1), ('a', 3)]" in res.stdout


# -- Bytewax's stream scoping rule ------------------------------------------------------


def test_a_stream_nested_in_a_list_argument_is_inconsistent_scoping(flow):
    @operator
    def merge_list(step_id: str, up: Stream, others: list) -> Stream:
        return op.merge("merge", up, *others)

    inp1 = op.input("inp1", flow, TestingSource([]))
    inp2 = op.input("inp2", flow, TestingSource([]))
    with pytest.raises(
        StreamScopeError, match=r"step 'f\.ml\.merge': inconsistent stream scoping; stream 'f\.inp2\.down'"
    ):
        merge_list("ml", inp1, [inp2])
    assert isinstance(StreamScopeError("x"), AssertionError)


def test_streams_passed_as_arguments_or_built_inside_may_be_used_in_sub_operators(flow):
    @operator
    def merge_all(step_id: str, up: Stream, *more: Stream) -> Stream:
        doubled = op.map("double", up, lambda x: 2 * x)
        return op.merge("merge", doubled, *more)

    out: list = []
    s = merge_all("ma", op.input("a", flow, TestingSource([1])), op.input("b", flow, TestingSource([5])))
    op.output("out", s, TestingSink(out))
    run_main(flow)
    assert sorted(out) == [2, 5]


def test_a_stream_captured_from_outside_an_operator_is_inconsistent_scoping(flow):
    outer = op.input("outer", flow, TestingSource([]))

    @operator
    def sneaky(step_id: str, up: Stream) -> Stream:
        return op.merge("merge", up, outer)

    with pytest.raises(StreamScopeError, match="inconsistent stream scoping"):
        sneaky("s", op.input("inp2", flow, TestingSource([])))


@pytest.mark.parametrize("call", [lambda: op.map("m", 1, _ident), lambda: op.merge("m", 1, 2)], ids=["arg", "varargs"])
def test_a_non_stream_for_a_stream_parameter_says_it_must_be_a_stream(call):
    with pytest.raises(FlowsparkTypeError, match="must be a `Stream`"):
        call()
