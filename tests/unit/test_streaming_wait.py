"""`run`'s wait for an `available_now` query: on the listener's events, without polling the query."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from flowspark.spark.streaming.listen import Listener, wait_for_run


class _Query:
    """A query that counts what the wait asks of it."""

    def __init__(self) -> None:
        self.runId = "run-1"  # noqa: N815 - pyspark's name
        self.active = True
        self.asked = 0  # isActive
        self.polled = 0  # lastProgress, awaitTermination
        self.stopped = False

    @property
    def isActive(self) -> bool:  # noqa: N802 - pyspark's name
        self.asked += 1
        return self.active

    @property
    def lastProgress(self) -> Any:  # noqa: N802 - pyspark's name
        self.polled += 1
        return None

    @property
    def status(self) -> dict:
        return {"isTriggerActive": False}

    def awaitTermination(self, seconds: float) -> None:  # noqa: N802 - pyspark's name
        self.polled += 1
        time.sleep(seconds)

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True
        self.active = False


def _setup() -> tuple[Any, _Query, Listener]:
    query = _Query()
    sr = SimpleNamespace(query=query, connect=False, _counts=None, batches=0)
    return sr, query, Listener(sr, None)  # type: ignore[arg-type]


def _progress(batch: int, rows: int, run_id: str = "run-1", moved: bool = True) -> dict:
    """A progress event; `moved`: the source's offsets moved in this micro-batch (new input)."""
    source = {"startOffset": {"logOffset": batch - 1}, "endOffset": {"logOffset": batch - (0 if moved else 1)}}
    return {
        "runId": run_id,
        "batchId": batch,
        "numInputRows": rows,
        "sink": {"numOutputRows": rows},
        "sources": [{**source, "numInputRows": rows}],
    }


def _later(delay: float, fn: Any) -> None:
    threading.Timer(delay, fn).start()


def test_the_wait_ends_at_the_first_micro_batch_whose_sources_stood_at_their_end_and_stops_the_query():
    sr, query, lst = _setup()

    def events() -> None:
        lst.progress(_progress(0, 5))
        lst.progress(_progress(0, 0, run_id="another-run", moved=False))  # not this query's: ignored
        time.sleep(0.15)
        lst.progress(_progress(1, 0))  # an empty file: no rows, but the offsets moved (more may follow)
        time.sleep(0.15)
        lst.progress(_progress(2, 3))
        time.sleep(0.3)
        lst.progress(_progress(3, 0, moved=False))

    _later(0.05, events)
    t0 = time.monotonic()
    wait_for_run(sr, query, lst, "available_now", 5.0)  # the timeout only bounds a failing test
    took = time.monotonic() - t0
    assert 0.5 < took < 1.5, took  # it waited for batch 3, and returned soon after it
    assert lst.last_batch == 3
    assert query.stopped  # the query (timers: Spark would go on with no-data batches) was stopped
    # Not polled: at most a check a second and the final ones; the stop reads lastProgress once.
    assert query.asked <= 4
    assert query.polled <= 1


def test_a_replayed_first_micro_batch_with_old_offsets_does_not_end_thewait_for_run():
    # A restarted query first replays the previous run's unfinished no-data micro-batch:
    # no rows and no offset moved, yet the files added since are still to be read.
    sr, query, lst = _setup()

    def events() -> None:
        lst.progress(_progress(7, 0, moved=False))  # the replay
        time.sleep(0.3)
        lst.progress(_progress(8, 40))  # the new files
        time.sleep(0.3)
        lst.progress(_progress(9, 0, moved=False))

    _later(0.05, events)
    t0 = time.monotonic()
    wait_for_run(sr, query, lst, "available_now", 5.0)  # the timeout only bounds a failing test
    assert 0.5 < time.monotonic() - t0 < 1.5
    assert lst.last_batch == 9
    assert query.stopped


def test_caught_up_needs_every_source_at_its_end():
    from flowspark.spark.streaming.listen import caught_up

    tick = {"startOffset": {"t": 1}, "endOffset": {"t": 1}}
    files = {"startOffset": {"logOffset": 2}, "endOffset": {"logOffset": 3}}
    assert caught_up({"sources": [tick, {**files, "endOffset": {"logOffset": 2}}]})
    assert not caught_up({"sources": [tick, files]})
    assert not caught_up({"sources": [{"startOffset": None, "endOffset": {"t": 0}}]})  # a new query's first batch
    assert not caught_up({"sources": []})


def test_the_wait_ends_when_the_querys_termination_is_delivered():
    sr, query, lst = _setup()

    def end() -> None:
        lst.progress(_progress(0, 5))
        query.active = False
        lst.terminated("another-run")  # another query's end: ignored
        time.sleep(0.3)
        lst.terminated("run-1")

    _later(0.05, end)
    t0 = time.monotonic()
    wait_for_run(sr, query, lst, "available_now", 5.0)  # the timeout only bounds a failing test
    assert 0.3 < time.monotonic() - t0 < 1.2
    assert not query.stopped  # it ended by itself
    assert query.polled == 0


def test_the_wait_asks_the_query_when_no_event_comes():
    sr, query, lst = _setup()
    _later(0.2, lambda: setattr(query, "active", False))  # ended, but its events were lost
    t0 = time.monotonic()
    wait_for_run(sr, query, lst, "available_now", 5.0)  # the timeout only bounds a failing test
    assert time.monotonic() - t0 < 2.5
    assert query.asked >= 1


def test_the_wait_ends_at_its_timeout():
    sr, query, lst = _setup()
    t0 = time.monotonic()
    wait_for_run(sr, query, lst, "available_now", 0.3)
    assert 0.25 < time.monotonic() - t0 < 1.0
    assert query.stopped


class _JString:
    def __init__(self, s: str) -> None:
        self.s = s

    def toString(self) -> str:  # noqa: N802 - Java's name
        return self.s


class _JEvent:
    """A JVM listener event as py4j shows it: only method calls."""

    def __init__(self, progress: dict | None = None, run_id: str = "") -> None:
        self._progress = progress
        self._run_id = run_id

    def progress(self) -> Any:
        import json

        return SimpleNamespace(json=lambda: json.dumps(self._progress))

    def runId(self) -> _JString:  # noqa: N802 - Java's name
        return _JString(self._run_id)


def test_the_java_side_of_the_listener_hands_this_flows_progress_and_every_end_to_thewait_for_run():
    from flowspark.spark.streaming.listen import JavaListener

    sr, query, lst = _setup()
    java = JavaListener(lst, "flowspark_f")
    java.onQueryProgress(_JEvent({**_progress(0, 7), "name": "flowspark_f"}))
    java.onQueryProgress(_JEvent({**_progress(1, 0, moved=False), "name": "another_query"}))  # not ours
    assert (lst.last_batch, lst.done, lst.sink_rows) == (0, False, 7)
    java.onQueryProgress(_JEvent({**_progress(1, 0, moved=False), "name": "flowspark_f"}))
    assert (lst.last_batch, lst.done) == (1, True)
    java.onQueryTerminated(_JEvent(run_id="run-1"))
    with lst.cond:
        assert lst.ended("run-1")


class _IdleRestart:
    """A restarted query that found no new input: Spark names the next batch, which ran nowhere."""

    runId = "run-2"  # noqa: N815 - pyspark's name
    lastProgress = {"batchId": 1, "numInputRows": 0}  # noqa: N815, RUF012 - pyspark's name


def test_the_drain_ends_at_the_runs_delivered_termination_not_at_its_timeout():
    lst = Listener(SimpleNamespace(query=None), None)
    threading.Timer(0.2, lst.terminated, args=("run-2",)).start()
    t0 = time.monotonic()
    lst.drain(_IdleRestart(), timeout=10.0)
    assert time.monotonic() - t0 < 5.0  # the termination came after 0.2 s: every progress event was in


def test_the_drain_waits_for_the_last_batchs_progress_until_its_timeout():
    lst = Listener(SimpleNamespace(query=None), None)
    t0 = time.monotonic()
    lst.drain(_IdleRestart(), timeout=0.5)  # neither the progress nor the termination comes
    assert time.monotonic() - t0 >= 0.5
