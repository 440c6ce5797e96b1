"""A key resumed from an earlier run's snapshot that no longer fits the step's code says so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import pytest

import flowspark.operators as op
from flowspark.dataflow import Dataflow
from flowspark.errors import FlowsparkRuntimeError
from flowspark.logic import StatefulAdapter
from flowspark.operators import StatefulLogic
from flowspark.recovery import RecoveryConfig, init_db_dir
from flowspark.runtime.driver import StepDriver, drive_states
from flowspark.testing import TestingSink, TestingSource, run_main

EARLIER = "written by an earlier run of the step"
EOF = TestingSource.EOF


def count_int(state: Optional[int], _v: Any) -> tuple[int, int]:
    """The step's first version: the state is an int."""
    n = (state or 0) + 1
    return n, n


def count_dict(state: Optional[dict[str, int]], v: Any) -> tuple[dict[str, int], int]:
    """The step's next version: the state is a dict (`dict(3)` raises on an old int state)."""
    st = dict(state or {})
    if v == "bad":
        msg = "bad value"
        raise ValueError(msg)
    st["n"] = st.get("n", 0) + 1
    return st, st["n"]


def _run(db: Path, items: list[Any], mapper: Any) -> list[Any]:
    flow = Dataflow("rec")
    out: list[Any] = []
    s = op.input("inp", flow, TestingSource(items))
    op.output("out", op.stateful_map("count", s, mapper), TestingSink(out))
    run_main(flow, recovery_config=RecoveryConfig(db))
    return out


@pytest.fixture
def db(tmp_path: Path) -> Path:
    init_db_dir(tmp_path / "db", 2)
    return tmp_path / "db"


def test_recovery_with_a_changed_state_shape_names_the_step_the_key_and_the_fix(db):
    items = [("a", 1), ("b", 1), ("a", 1), EOF(), ("a", 1)]  # a second run goes on after the EOF
    assert _run(db, items, count_int) == [("a", 1), ("b", 1), ("a", 2)]
    with pytest.raises(FlowsparkRuntimeError) as info:
        _run(db, items, count_dict)
    err = info.value
    # A RuntimeError caused by the TypeError, as on fresh state (and as Bytewax's BytewaxRuntimeError).
    assert type(err) is FlowsparkRuntimeError
    assert err.step_id == "rec.count.stateful_batch"
    assert err.key == "a"
    text = str(err)
    assert text.startswith("error in step 'rec.count.stateful_batch' for key 'a': TypeError: 'int' object is not")
    assert EARLIER in text
    assert "received int 2" in text
    assert "new recovery directory" in text
    assert "migrate it" in text
    assert type(err.__cause__) is TypeError
    assert str(err.__cause__) == "'int' object is not iterable"


def test_a_fresh_state_error_keeps_todays_text(db):
    with pytest.raises(FlowsparkRuntimeError) as info:
        _run(db, [("a", 1), ("a", "bad")], count_dict)
    assert str(info.value) == "error in step 'rec.count.stateful_batch' for key 'a': ValueError: bad value"


def test_a_resumed_key_fed_once_then_fails_as_today(db):
    items = [("a", 1), EOF(), ("a", 1), ("a", "bad")]
    assert _run(db, items, count_dict) == [("a", 1)]
    # Resumed (a fitting dict), one value mapped, then a bad value: an ordinary error.
    with pytest.raises(FlowsparkRuntimeError) as info:
        _run(db, items, count_dict)
    assert str(info.value) == "error in step 'rec.count.stateful_batch' for key 'a': ValueError: bad value"


def test_only_keys_resumed_from_the_store_get_the_advice(db):
    assert _run(db, [("old", 1), EOF(), ("new", "bad")], count_int) == [("old", 1)]
    with pytest.raises(FlowsparkRuntimeError) as info:
        _run(db, [("old", 1), EOF(), ("new", "bad")], count_dict)  # a key the store does not hold: fresh
    assert str(info.value) == "error in step 'rec.count.stateful_batch' for key 'new': ValueError: bad value"
    with pytest.raises(FlowsparkRuntimeError, match=re.escape(EARLIER)) as info:
        _run(db, [("old", 1), EOF(), ("new", 1), ("old", 1)], count_dict)
    assert info.value.key == "old"


class _Total(StatefulLogic[int, int, dict[str, int]]):
    def __init__(self, resume_state: Optional[dict[str, int]]) -> None:
        self.total = resume_state["total"] if resume_state is not None else 0

    def on_item(self, value: int) -> tuple[list[int], bool]:
        self.total += value
        return [self.total], StatefulLogic.RETAIN

    def snapshot(self) -> dict[str, int]:
        return {"total": self.total}


def test_a_builder_raising_on_an_old_snapshot(db, monkeypatch):
    def build(s: Any) -> Any:
        flow = Dataflow("rec")
        op.output("out", op.stateful("total", op.input("inp", flow, TestingSource([("a", 5)])), _Total), s)
        return flow

    out: list[Any] = []
    run_main(build(TestingSink(out)), recovery_config=RecoveryConfig(db))
    assert out == [("a", 5)]
    # The state shape changes: the builder now reads "sum".
    monkeypatch.setattr(_Total, "__init__", lambda self, rs: setattr(self, "total", rs["sum"] if rs else 0))
    with pytest.raises(FlowsparkRuntimeError) as info:
        run_main(build(TestingSink([])), recovery_config=RecoveryConfig(db))
    text = str(info.value)
    assert text.startswith("error in step 'rec.total.stateful_batch' for key 'a': KeyError: 'sum'")
    assert EARLIER in text
    assert "received dict {'total': 5}" in text
    assert type(info.value.__cause__) is KeyError


# -- the per-key driver alone ---------------------------------------------------------------


def _driver(fn: Any = None) -> StepDriver:
    def builder(state: Any) -> Any:
        if isinstance(state, int):
            msg = f"old snapshot {state}"
            raise ValueError(msg)
        return StatefulAdapter(_Total, _Total(state))

    batch_fn = None if fn is None else (lambda st, vs: _fold(fn, st, vs))
    return StepDriver("f.s", builder, batch_fn=batch_fn)


def _fold(fn: Any, st: Any, vs: list[Any]) -> tuple[Any, list[Any]]:
    out = []
    for v in vs:
        st, w = fn(st, v)
        out.append(w)
    return st, out


def test_driver_build_says_resumed_only_when_told():
    d = _driver()
    with pytest.raises(FlowsparkRuntimeError) as info:
        d.build("k", 3)
    assert str(info.value) == "error in step 'f.s' for key 'k': ValueError: old snapshot 3"
    with pytest.raises(FlowsparkRuntimeError, match=re.escape(EARLIER)) as info:
        d.build("k", 3, resumed=True)
    assert str(info.value).startswith("error in step 'f.s' for key 'k': ValueError: old snapshot 3; ")
    assert "received int 3" in str(info.value)
    assert d.resumed == {}


def test_driver_first_hook_after_a_resume_then_ordinary_errors():
    d = _driver()
    # The snapshot fits the builder; a str value then fails in on_item, the first hook call.
    logic = d.build("k", {"total": 1}, resumed=True)
    with pytest.raises(FlowsparkRuntimeError, match=re.escape(EARLIER)):
        d.feed("k", logic, ["x"])
    logic = d.build("k", {"total": 1}, resumed=True)
    assert d.feed("k", logic, [2]) == ([3], False)  # the first call returned: no longer resumed
    with pytest.raises(FlowsparkRuntimeError) as info:
        d.feed("k", logic, ["x"])
    assert EARLIER not in str(info.value)
    # feed_runs (the in-memory executor's path) clears it the same way.
    logics = {"k": d.build("k", {"total": 1}, resumed=True)}
    d.feed_runs(logics, [("k", 1)], [], {})
    with pytest.raises(FlowsparkRuntimeError) as info:
        d.feed_runs(logics, [("k", "x")], [], {})
    assert EARLIER not in str(info.value)
    # A fresh build of the key drops what an earlier build remembered.
    d.build("k", {"total": 1}, resumed=True)
    logic = d.build("k")
    with pytest.raises(FlowsparkRuntimeError) as info:
        d.feed("k", logic, ["x"])
    assert EARLIER not in str(info.value)


def test_bare_state_paths_take_a_per_key_resumed_flag():
    d = _driver(count_dict)
    for resumed in (False, True):
        with pytest.raises(FlowsparkRuntimeError) as info:
            d.map_state("k", [1], 7, resumed)
        assert (EARLIER in str(info.value)) is resumed
        assert type(info.value.__cause__) is TypeError
        assert not isinstance(info.value, TypeError)
        with pytest.raises(FlowsparkRuntimeError) as info:
            drive_states((d,), "k", [(b"", 1)], [7], resumed=resumed)
        assert (EARLIER in str(info.value)) is resumed
        assert "received int 7" in str(info.value) or not resumed
    # A fresh key of a resumed chain step (no state) fails as today.
    with pytest.raises(FlowsparkRuntimeError) as info:
        drive_states((d,), "k", [(b"", "bad")], [None], resumed=True)
    assert str(info.value) == "error in step 'f.s' for key 'k': ValueError: bad value"
