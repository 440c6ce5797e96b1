"""`settle_worker_heap`: once per Spark worker process, never outside a Spark task."""

from __future__ import annotations

import gc

import pytest

import flowspark.spark.worker.stage as stage


@pytest.fixture
def calls(monkeypatch):
    """The collector calls `settle_worker_heap` makes, recorded instead of made."""
    got: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *a: got.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: got.append("freeze"))
    monkeypatch.setattr(stage, "_SETTLED_PID", None)
    return got


def _in_task(monkeypatch, inside: bool) -> None:
    pyspark = pytest.importorskip("pyspark")
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: object() if inside else None))


def test_outside_a_spark_task_nothing_is_collected_or_frozen(calls, monkeypatch):
    _in_task(monkeypatch, False)
    stage.settle_worker_heap()
    with stage.task_gc():
        pass
    assert calls == []


def test_in_a_task_the_process_collects_then_freezes_once(calls, monkeypatch):
    _in_task(monkeypatch, True)
    stage.settle_worker_heap()
    assert calls == ["collect", "freeze"]
    with stage.task_gc():
        assert not gc.isenabled()  # task_gc pauses the collector as no_gc does
    stage.settle_worker_heap()
    assert calls == ["collect", "freeze"]


def test_a_forked_worker_settles_its_own_heap(calls, monkeypatch):
    import os

    _in_task(monkeypatch, True)
    stage.settle_worker_heap()
    monkeypatch.setattr(os, "getpid", lambda: -1)  # another process
    stage.settle_worker_heap()
    assert calls == ["collect", "freeze", "collect", "freeze"]
