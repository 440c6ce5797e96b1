"""The rule `native_reduction`: built-in reductions of a SparkSource's columns run as Spark aggregates.

Every case compares the Spark batch run with every rule on, with `rules="none"` (the Python
pass) and the in-memory executor (`run_main` over the same rows): same `(key, value)` per key,
same Python types (an `int` sum beyond 2**63 stays exact), same error naming the step.
"""

from __future__ import annotations

import contextlib
import io
import operator
from typing import Any, Callable

import pytest
from examples_budget import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import flowspark.operators as op
from flowspark import reducers
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.spark import SparkSink, SparkSource, compile_flow, run
from flowspark.spark.tools import physical_plans
from flowspark.testing import TestingSink, TestingSource, run_main

SCHEMA = "user STRING, amount LONG, name STRING, price DOUBLE"
#: The outputs of `_flow`, in order.
OUTS = ("count", "total", "top", "low", "fold_sum", "fold_count", "fold_min_name", "max_name")


def _user(r):
    return r["user"]


def _amount(r):
    return r["amount"]


def _name(r):
    return r["name"]


def _price(r):
    return r["price"]


def _flow(src: Any, outs: dict[str, list[Any]], only: tuple[str, ...] = OUTS) -> Dataflow:
    """Every recognised reduction over one source: two keys' worth of branches, one output each.

    `only` names the outputs to build, with just the steps they need (`count` keys the input itself).
    """
    flow = Dataflow("native")
    s = op.input("inp", flow, src)
    if set(only) != {"count"}:
        k = op.key_on("key", s, _user)
        amounts = op.map_value("amount", k, _amount)
        names = op.map_value("name", k, _name)
    steps: dict[str, Callable[[], Any]] = {
        "count": lambda: op.count_final("count", s, _user),
        "total": lambda: op.reduce_final("total", amounts, operator.add),
        "top": lambda: op.max_final("top", amounts),
        "low": lambda: op.reduce_final("low", amounts, min),
        "fold_sum": lambda: op.fold_final("fold_sum", amounts, reducers.zero, reducers.sum),
        "fold_count": lambda: op.fold_final("fold_count", names, reducers.zero, reducers.count),
        "fold_min_name": lambda: op.fold_final("fold_min_name", names, reducers.nothing, reducers.min),
        "max_name": lambda: op.reduce_final("max_name", names, max),
    }
    for name in only:
        op.output(f"out_{name}", steps[name](), TestingSink(outs.setdefault(name, [])))
    return flow


def _parquet(spark: Any, tmp: Any, rows: list[dict[str, Any]], schema: str = SCHEMA) -> str:
    path = str(tmp / f"in{len(list(tmp.iterdir()))}")
    spark.createDataFrame(rows, schema).coalesce(1).write.parquet(path)
    return path


def _on_spark(spark: Any, build: Any, path: str, rules: str, **options: Any) -> tuple[dict[str, Any], str]:
    """The outputs (each as `{key: value}`, checked one per key) and the rendered decisions of a batch run."""
    outs: dict[str, list[Any]] = {}
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        run(build(SparkSource("parquet", path), outs), spark=spark, rules=rules, explain=True, **options)
    return _by_key(outs), text.getvalue()


def _by_key(outs: dict[str, list[Any]]) -> dict[str, Any]:
    got = {}
    for name, items in outs.items():
        got[name] = dict(items)
        assert len(got[name]) == len(items), f"{name}: several items for one key"
        got[name] = {k: (type(v).__name__, v) for k, v in got[name].items()}
    return got


def _in_memory(build: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    outs: dict[str, list[Any]] = {}
    run_main(build(TestingSource(rows), outs))
    return _by_key(outs)


_LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "user": st.sampled_from(["a", "b", "é", "z\u00ff", "\U0001f600", "B"]),
            "amount": st.one_of(_LONG, st.sampled_from([2**63 - 1, -(2**63), 0, -1])),
            "name": st.text(alphabet="aAzé\u00ff\u0100\U0001f600 ", max_size=4),
            "price": st.just(1.5),
        }
    ),
    max_size=30,
)


@pytest.mark.slow
@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_ROWS)
@example(rows=[])
@example(rows=[{"user": "a", "amount": 2**63 - 1, "name": "x", "price": 1.5}] * 3)
def test_reductions_equal_the_python_pass_and_run_main(spark, tmp_path, rows):
    path = _parquet(spark, tmp_path, rows)
    native, text = _on_spark(spark, _flow, path, "all")
    assert text.count("rule native_reduction: applied") == len(OUTS)
    reference, text = _on_spark(spark, _flow, path, "none")
    assert "rule native_reduction: applied" not in text
    expected = _in_memory(_flow, rows)
    assert native == expected
    assert reference == expected


def test_sums_beyond_64_bits_stay_python_ints(spark, tmp_path):
    rows = [{"user": "a", "amount": 2**63 - 1, "name": "x", "price": 1.5}] * 4 + [
        {"user": "b", "amount": -(2**63), "name": "y", "price": 1.5}
    ] * 3
    path = _parquet(spark, tmp_path, rows)
    native, text = _on_spark(spark, _flow, path, "all")
    assert text.count("rule long_sums: applied") == 2  # total, fold_sum: LONG sums that overflow, then decimals
    assert native["total"] == {"a": ("int", 4 * (2**63 - 1)), "b": ("int", -3 * 2**63)}
    assert native == _in_memory(_flow, rows)
    decimals, text = _on_spark(spark, _flow, path, "-long_sums")
    assert "rule long_sums: not applied (switched off: rules='-long_sums')" in text
    assert decimals == native


def test_a_sum_back_within_64_bits_after_an_overflow_is_exact(spark, tmp_path):
    """A LONG sum that leaves 64 bits on the way (Spark adds in any order) is computed again as a decimal."""
    rows = [{"user": "a", "amount": a, "name": "x", "price": 1.5} for a in (2**63 - 1, 2**63 - 1, -(2**63), 5)]
    path = _parquet(spark, tmp_path, rows)
    got, _text = _on_spark(spark, _amount_sum, path, "all")
    assert got["total"] == {"a": ("int", 2**63 - 1 - 1 + 5)}
    assert got == _in_memory(_amount_sum, rows)


def _big(r):
    return r["amount"] > 2


def _as_row(kv):
    if kv[0] == "boom":
        raise ValueError(kv)
    return {"user": kv[0], "n": kv[1]}


def _rows_flow(src: Any, out: str) -> Dataflow:
    """A count per user, filtered, as rows of a parquet SparkSink without a schema (inferred from 100 items)."""
    flow = Dataflow("sampled")
    counts = op.count_final("count", op.input("inp", flow, src), _user)
    big = op.filter("big", counts, lambda kv: kv[1] > 2)
    op.output("out", op.map("row", big, _as_row), SparkSink("parquet", out))
    return flow


@pytest.mark.parametrize("few", [False, True])
def test_a_sink_without_schema_infers_it_from_the_aggregated_rows(spark, tmp_path, few):
    """The check job's first rows give the sample; when too few pass the filter, the sampling job runs."""
    n = 3 if few else 4  # few: most users are counted 3 times and filtered out
    rows = [{"user": f"u{i:03d}", "amount": i, "name": "x", "price": 1.5} for i in range(600) for _ in range(n)]
    rows += [{"user": f"z{i}", "amount": 0, "name": "x", "price": 1.5} for i in range(5) for _ in range(4)]
    path = _parquet(spark, tmp_path, rows)
    expected: list[Any] = []
    run_main(_map_to_list(rows, expected))
    for rules in ("all", "none"):
        out = str(tmp_path / f"out-{rules}")
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            run(_rows_flow(SparkSource("parquet", path), out), spark=spark, rules=rules, explain=True)
        if rules == "all":
            assert "rule aggregate_sample: applied" in text.getvalue()
        got = sorted((r.user, r.n) for r in spark.read.parquet(out).collect())
        assert got == sorted((x["user"], x["n"]) for x in expected)
        assert spark.read.parquet(out).schema == spark.createDataFrame(expected[:100]).schema


def _map_to_list(rows: list[dict[str, Any]], out: list[Any]) -> Dataflow:
    flow = Dataflow("sampled")
    counts = op.count_final("count", op.input("inp", flow, TestingSource(rows)), _user)
    big = op.filter("big", counts, lambda kv: kv[1] > 2)
    op.output("out", op.map("row", big, _as_row), TestingSink(out))
    return flow


def test_a_step_failing_on_the_sampled_rows_names_the_step(spark, tmp_path):
    rows = [{"user": u, "amount": 1, "name": "x", "price": 1.5} for u in ("a", "boom", "c") for _ in range(3)]
    path = _parquet(spark, tmp_path, rows)
    expected = _error(lambda: run_main(_map_to_list(rows, [])))
    assert "sampled.row" in expected
    for rules in ("all", "none"):
        out = str(tmp_path / f"out-{rules}")
        assert _error(
            lambda o=out, r=rules: run(_rows_flow(SparkSource("parquet", path), o), spark=spark, rules=r)
        ) == (expected)


def _sum_flow(flow_id: str, step: str, value: Callable[[Any], Any]) -> Callable[[Any, dict[str, list[Any]]], Dataflow]:
    """A flow builder: `reduce_final(operator.add)` per user of `value(row)` (a `map_value` named `step`)."""

    def build(src: Any, outs: dict[str, list[Any]]) -> Dataflow:
        flow = Dataflow(flow_id)
        keyed = op.key_on("key", op.input("inp", flow, src), _user)
        total = op.reduce_final("total", op.map_value(step, keyed, value), operator.add)
        op.output("out", total, TestingSink(outs.setdefault("total", [])))
        return flow

    return build


_float_sum = _sum_flow("floats", "price", _price)
_amount_sum = _sum_flow("amounts", "amount", _amount)
_computed = _sum_flow("computed", "double", lambda r: 2 * r["amount"])


ROWS = [{"user": f"u{i % 3}", "amount": i - 4, "name": f"n{i}", "price": 0.25 * i} for i in range(10)]


def test_a_float_sum_needs_the_opt_in(spark, tmp_path):
    path = _parquet(spark, tmp_path, ROWS)
    got, text = _on_spark(spark, _float_sum, path, "all")
    assert (
        "rule native_reduction: not applied (column 'price' is double: a float sum may differ from Python's "
        "(addition order, NaN, -0.0); run with float_reductions=True to accept that)"
    ) in text
    assert got == _in_memory(_float_sum, ROWS)
    opted, text = _on_spark(spark, _float_sum, path, "all", float_reductions=True)
    assert "rule native_reduction: applied" in text
    assert opted == got  # quarters add exactly in any order


def test_a_value_that_is_not_a_column_keeps_the_python_pass(spark, tmp_path):
    path = _parquet(spark, tmp_path, ROWS)
    got, text = _on_spark(spark, _computed, path, "all")
    assert (
        "rule native_reduction: not applied (its values are not one column: no single map_value proven to read "
        "one (row[column]))"
    ) in text
    assert got == _in_memory(_computed, ROWS)


def _error(fn: Any) -> str:
    with pytest.raises(FlowsparkRuntimeError) as info:
        fn()
    return str(info.value)


def _error_or_none(fn: Any) -> str | None:
    try:
        fn()
    except FlowsparkRuntimeError as e:
        return str(e)
    return None


@pytest.mark.parametrize("column", ["amount", "user"])
def test_a_null_gives_the_in_memory_result_or_error(spark, tmp_path, column):
    rows = [dict(r) for r in ROWS]
    rows[4][column] = None
    path = _parquet(spark, tmp_path, rows)
    # Several branches fail on the null. In memory the first in step order is reported; on Spark,
    # whichever task fails first: any one of the errors a branch alone gives in memory.
    expected = {_error_or_none(lambda name=name: run_main(_flow(TestingSource(rows), {}, (name,)))) for name in OUTS}
    expected.discard(None)
    assert _error(lambda: run_main(_flow(TestingSource(rows), {}))) in expected
    assert len(expected) > 1, expected
    assert all(e.startswith("error in step 'native.") for e in expected), expected
    assert _error(lambda: run(_flow(SparkSource("parquet", path), {}), spark=spark)) in expected
    assert _error(lambda: run(_flow(SparkSource("parquet", path), {}), spark=spark, rules="none")) in expected


def test_a_lone_null_per_key_is_emitted_as_none(spark, tmp_path):
    rows = [{"user": "a", "amount": None, "name": "x", "price": 1.0}]
    path = _parquet(spark, tmp_path, rows)
    got, _text = _on_spark(spark, _amount_sum, path, "all")
    assert got == _in_memory(_amount_sum, rows)
    assert got["total"] == {"a": ("NoneType", None)}


def test_flowspark_plan_shows_the_aggregate(spark, tmp_path):
    path = _parquet(spark, tmp_path, ROWS)
    plan, _ = physical_plans(compile_flow(_flow(SparkSource("parquet", path), {})), spark)
    text = str(plan)
    assert text.count("rule native_reduction: applied") == len(OUTS)
    assert "rule spark_keys: not applied (Spark aggregates the stage (native_reduction))" in text
    from flowspark.spark.batch.describe import describe_stage

    assert "groupBy('user').agg(sum('amount')" in plan.render(describe_stage)


def _pair(kv):
    return {"user": kv[0], "n": kv[1]}


def _count_sum_rows(src: Any, outs: dict[str, Any]) -> Dataflow:
    """Count and sum per user, each mapped by `_pair` to `outs[name]`: a list (TestingSink) or a SparkSink."""
    flow = Dataflow("pairs")
    s = op.input("inp", flow, src)
    keyed = op.key_on("key", s, _user)
    streams = {
        "count": op.count_final("count", s, _user),
        "total": op.reduce_final("total", op.map_value("amount", keyed, _amount), operator.add),
    }
    for name, stream in streams.items():
        out = outs[name]
        sink = TestingSink(out) if isinstance(out, list) else out
        op.output(f"out_{name}", op.map(f"{name}_row", stream, _pair), sink)
    return flow


@pytest.mark.parametrize("schema", [None, "user STRING, n LONG", "user STRING, n INT"])
def test_a_pair_mapped_to_a_dict_is_written_from_the_aggregate(spark, tmp_path, schema):
    """`native_rows`: the aggregate's columns renamed; a column type other than the aggregate's keeps the map."""
    rows = [{"user": f"u{i % 7}", "amount": i * 3 - 50, "name": "x", "price": 1.5} for i in range(60)]
    path = _parquet(spark, tmp_path, rows)
    expected: dict[str, list[Any]] = {"count": [], "total": []}
    run_main(_count_sum_rows(TestingSource(rows), expected))
    for rules in ("all", "-native_rows", "none"):
        dirs = {name: str(tmp_path / f"{name}-{rules}") for name in expected}
        sinks = {name: SparkSink("parquet", d, schema=schema) for name, d in dirs.items()}
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            run(_count_sum_rows(SparkSource("parquet", path), sinks), spark=spark, rules=rules, explain=True)
        if rules == "all":
            assert text.getvalue().count("rule native_rows: applied") == 2
        for name, d in dirs.items():
            df = spark.read.parquet(d)
            assert sorted((r.user, r.n) for r in df.collect()) == sorted((x["user"], x["n"]) for x in expected[name])
            want = schema or "n BIGINT, user STRING"  # inferred: pyspark sorts a dict's names
            assert df.schema.simpleString() == spark.createDataFrame([], want).schema.simpleString()


def test_a_sum_beyond_64_bits_in_a_long_column_fails_as_without_the_rules(spark, tmp_path):
    rows = [{"user": "a", "amount": 2**63 - 1, "name": "x", "price": 1.5}] * 2
    path = _parquet(spark, tmp_path, rows)
    errors = []
    for rules in ("all", "none"):
        sinks = {name: SparkSink("parquet", str(tmp_path / f"{name}-{rules}")) for name in ("count", "total")}
        errors.append(
            _error(lambda s=sinks, r=rules: run(_count_sum_rows(SparkSource("parquet", path), s), spark=spark, rules=r))
        )
    assert errors[0] == errors[1]
    assert "pairs.out_total" in errors[0]
