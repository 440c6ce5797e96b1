"""A streaming run's listener, progress line, wait and stop.

The listener hands the progress of this run's query to `wait_for_run` (and prints the
progress line); `stop_between_batches` stops a query between micro-batches.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from flowspark.spark.compat import JavaQueryListener, lean_listener
from flowspark.spark.session import is_connect
from flowspark.spark.worker.codec import decode_task_error

if TYPE_CHECKING:
    from flowspark.spark.streaming.query import StreamingRun

__all__ = [
    "JavaListener",
    "Listener",
    "caught_up",
    "make_listener",
    "progress_line",
    "raise_query_error",
    "remove_listeners",
    "stop_between_batches",
    "wait_for_run",
]


def progress_line(p: Any, counts: Optional[tuple[int, int]] = None, dead: Optional[int] = None) -> str:
    """The per-micro-batch line: input, rate, state (keys, pending notifications, bytes), watermark.

    Args:
        p: Spark's progress report.
        counts: `(keys, pending notifications)` in state, from the keyed stages' reports.
        dead: With a dead letter, the rows it got in this micro-batch.

    Returns:
        The line.
    """
    ops = p.get("stateOperators") or []
    state_rows = sum(int(op.get("numRowsTotal", 0)) for op in ops)
    memory = sum(int(op.get("memoryUsedBytes", 0)) for op in ops)
    disk = sum(int((op.get("customMetrics") or {}).get("rocksdbSstFileSize", 0)) for op in ops)
    wm = (p.get("eventTime") or {}).get("watermark", "-")
    rate = p.get("processedRowsPerSecond") or 0.0
    state = f"state rows {state_rows}"
    if counts is not None:
        size = f"{_size(memory)} in memory" + (f", {_size(disk)} on disk" if disk else "")
        state = f"state {counts[0]} keys, {counts[1]} timers pending, {size} ({state_rows} state rows)"
    dl = "" if dead is None else f", {dead} to the dead letter"
    return (
        f"[flowspark] batch {p.get('batchId')}: {p.get('numInputRows', 0)} input rows{dl}, "
        f"{rate:.0f} rows/s, {state}, watermark {wm}"
    )


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def caught_up(p: dict[str, Any]) -> bool:
    """Whether a micro-batch's progress shows every source at the end of what it can read now.

    Each source's `endOffset` equals its `startOffset`: Spark found no new input for any
    source when it planned the batch, so with `available_now` every source has reached
    the end offset it had when the query started (a batch runs only to fire timeouts).
    A count of rows proves nothing: a batch that reads an empty file reads 0 rows, and a
    restarted query first replays the previous run's unfinished micro-batch with its old
    offsets; the caller therefore never takes a run's first micro-batch as the proof
    (with timers the tick source moves in a new query's first batch, and without timers
    Spark ends the query by itself).
    """
    sources = p.get("sources") or []
    return bool(sources) and all(
        s.get("startOffset") is not None and s.get("startOffset") == s.get("endOffset") for s in sources
    )


class Listener:
    """Prints the progress line and counts finished micro-batches of this run's query."""

    def __init__(self, run: StreamingRun, show: Optional[Callable[[str], None]]) -> None:
        self.run = run
        self.show = show
        self.cond = threading.Condition()
        self.last_batch = -1
        #: Rows the query's sink reported since the outbox was last read (`_deliver_new`).
        self.sink_rows = 0
        #: A micro-batch of this run found every source at the end of its input (`caught_up`).
        self.done = False
        #: Progress events of this run's query handed over so far.
        self.seen = 0
        #: Run ids whose termination was delivered.
        self.ended_runs: set[str] = set()
        self.early: list[dict[str, Any]] = []  # events seen before the query object was known

    def started(self) -> None:
        """Replay the events that arrived before `run.query` was set."""
        with self.cond:
            early, self.early = self.early, []
        for p in early:
            self.progress(p)

    def progress(self, p: dict[str, Any]) -> None:
        """Take a progress event: show its line, count it, and note whether the run is done (`caught_up`)."""
        query = self.run.query
        if query is None:
            with self.cond:
                self.early.append(p)
            return
        if p.get("runId") != str(query.runId):
            return  # another query of the same name (e.g. a late event of an earlier run)
        if self.show is not None:
            dead = self.run.dead_count(int(p.get("batchId", -1)))
            self.show(progress_line(p, self.run.counts(), dead))
        elif self.run._counts is not None:  # noqa: SLF001
            self.run.counts()  # saved for the next run
        with self.cond:
            self.run.batches += 1
            self.last_batch = max(self.last_batch, int(p.get("batchId", -1)))
            written = (p.get("sink") or {}).get("numOutputRows", -1)
            self.sink_rows += 1 if written is None or written < 0 else int(written)  # unknown counts as some
            if self.seen > 0 and caught_up(p):
                self.done = True
            self.seen += 1
            self.cond.notify_all()

    def terminated(self, run_id: str) -> None:
        """Take the termination of the query run `run_id`."""
        with self.cond:
            self.ended_runs.add(run_id)
            self.cond.notify_all()

    def ended(self, run_id: str) -> bool:
        """Whether the termination of the query run `run_id` was delivered (call with `cond` held)."""
        return run_id in self.ended_runs

    def drain(self, query: Any, timeout: float = 10.0) -> None:
        """Wait until the progress of the query's last micro-batch was delivered (events are asynchronous).

        Spark posts a run's events in order, its termination last: once that was delivered, every
        progress event of the run was too. A restart that found no new input ran no micro-batch,
        yet `lastProgress` names the next batch id (Spark reports it idle, with no progress event),
        so without that end the wait would last the whole `timeout`.
        """
        last = query.lastProgress
        if last is None:
            return
        run_id = str(query.runId)
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.last_batch < last["batchId"] and not self.ended(run_id) and time.monotonic() < deadline:
                self.cond.wait(0.05)


class JavaListener(JavaQueryListener):
    """The Java side of `make_listener`'s listener on a classic session, reading each event lean.

    pyspark's own bridge turns every progress event into a Python object field by field (a
    JVM round trip each, some resolving class names through the JVM's class path): measured,
    0.65 s of the listener thread's CPU over a 10-micro-batch run, on two cores. Here an event
    costs two calls: the progress as JSON, or the run id of a termination
    (`flowspark.spark.compat.JavaQueryListener`).
    """

    def __init__(self, lst: Listener, name: str) -> None:
        self.lst = lst
        self.name = name

    def progress_json(self, text: str) -> None:
        """Hand a progress event's JSON to the listener when it is of a query named `name`."""
        p = json.loads(text)
        if p.get("name") == self.name:
            self.lst.progress(p)

    def terminated(self, run_id: str) -> None:
        """Hand the run id of a terminated query run to the listener."""
        self.lst.terminated(run_id)


def make_listener(spark: Any, lst: Listener, name: str, lean: bool = True) -> Any:
    """A Spark listener handing the progress of the queries named `name` and every termination to `lst`.

    Through Spark Connect the client delivers events as JSON to the Python methods; on a classic
    session pyspark asks the listener for its Java side, which with `lean` (the rule
    `lean_listener`) is `JavaListener` (`flowspark.spark.compat.lean_listener`), else pyspark's
    own bridge.
    """
    from pyspark.sql.streaming import StreamingQueryListener

    java = JavaListener(lst, name)

    class L(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            java.progress_json(event.progress.json)

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            lst.terminated(str(event.runId))

    ours = lean_listener(spark, L, java) if lean else L()
    spark.streams.addListener(ours)
    return ours


def remove_listeners(spark: Any, query: Any, lst: Listener, ours: Any, theirs: Any) -> None:
    """Remove this run's listeners; on Spark Connect only once the query's end was delivered.

    pyspark's Connect client can deadlock in `removeListener` (Spark 4.3, seen after a
    query failed): removing the last listener holds the listener bus's lock while it
    joins the event thread, which waits for that lock to post an event still in flight
    (the query's termination). So the removal waits (10 s at most) until that event has
    reached `lst`; after it no event of this query can come.
    """
    if theirs is not None:
        spark.streams.removeListener(theirs)  # not the last listener: no join
    if query is not None and is_connect(spark):
        deadline = time.monotonic() + 10.0
        run_id = str(query.runId)
        with lst.cond:
            while not lst.ended(run_id) and time.monotonic() < deadline:
                lst.cond.wait(0.05)
    spark.streams.removeListener(ours)


def stop_between_batches(query: Any, timeout: float = 60.0) -> None:
    """Stop `query` between micro-batches (stopping mid-batch can fail in Spark 4.3).

    Waits until no trigger is running, or, when micro-batches run back to back (no-data
    batches for timeouts), until one just finished, and stops then.
    """
    deadline = time.monotonic() + timeout
    last = query.lastProgress
    first = last["batchId"] if last else None
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive", False):
            break
        last = query.lastProgress
        if last is not None and last["batchId"] != first:
            break
        time.sleep(0.002)
    try:
        query.stop()
    except Exception:  # noqa: BLE001,S110
        pass


def raise_query_error(sr: StreamingRun, e: BaseException) -> None:
    """Raise the flowspark error a failed query carries (set by a sink at the driver, or encoded by a task).

    A Kafka broker that did not answer gives one line naming the step and the broker
    (`flowspark.spark.io.kafka.broker_unreachable`), without Spark's Java stack trace.
    """
    from flowspark.spark.io.kafka import broker_unreachable

    for cause in (sr._error, e):  # noqa: SLF001
        lost = None if cause is None else broker_unreachable(sr.plan, cause)
        if lost is not None:
            raise lost from None
    if sr._error is not None:  # noqa: SLF001
        err = sr._error  # noqa: SLF001
        raise err from err.__cause__
    dec = decode_task_error(str(e))
    if dec is not None:
        raise dec from dec.__cause__
    raise e


def _await(sr: StreamingRun, query: Any, seconds: float) -> None:
    """`query.awaitTermination(seconds)`; a failed query raises the flowspark error it carries."""
    try:
        query.awaitTermination(seconds)
    except Exception as e:  # noqa: BLE001
        raise_query_error(sr, e)


def _deliver_new(sr: StreamingRun, query: Any, lst: Listener, seen: list[int]) -> None:
    """Spark Connect: hand over the outbox's micro-batches once a new one reported progress.

    Runs on the waiting thread, never in the listener's callback: a Connect call made
    from inside the listener's thread can wait forever on the server (seen with Spark
    4.3: `awaitTermination` and the outbox read both hung). A sink failing here stops
    the query and raises.
    """
    if not sr.connect:
        return
    with lst.cond:
        last, rows = lst.last_batch, lst.sink_rows
        lst.sink_rows = 0
    if last <= seen[0]:
        return
    seen[0] = last
    if rows == 0:
        return  # the micro-batches since the last read wrote nothing to the outbox
    try:
        sr.deliver()
    except BaseException:
        stop_between_batches(query)
        raise


def _slice(now: float, deadline: Optional[float], longest: float) -> float:
    """Seconds to wait: `longest`, or less when `deadline` comes first."""
    return longest if deadline is None else max(0.0, min(longest, deadline - now))


def wait_for_run(sr: StreamingRun, query: Any, lst: Listener, trigger: Optional[str], timeout: Optional[float]) -> None:
    """Wait for a run's query: with `available_now` until it is done (`caught_up`) or ended, else until stopped.

    Ctrl-C (SIGINT, in the main thread) and `timeout` stop the query between micro-batches;
    a failed query raises its flowspark error.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupted = False
    seen = [-1]  # the last micro-batch whose outputs were handed over (`_deliver_new`)
    old = None
    if threading.current_thread() is threading.main_thread():

        def on_int(_sig: int, _frm: Any) -> None:
            nonlocal interrupted
            interrupted = True

        old = signal.signal(signal.SIGINT, on_int)
    try:
        if trigger == "available_now":
            # With processing-time timeouts Spark runs no-data micro-batches forever, so the
            # query is stopped here: after the first micro-batch of this run whose sources all
            # stood at their end offsets (`caught_up`: everything available at the start was
            # read and committed; that batch also fired the notifications due in idle
            # buckets). Without timeouts the query ends by itself. The wait is on the listener's events (the
            # query is not polled: each poll is a JVM call and a progress JSON, and on two
            # cores the polling took about 1 s from a 10-micro-batch run); `isActive` is
            # asked once a second in case an event never comes.
            asked = time.monotonic()
            run_id = str(query.runId)
            while not interrupted:
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    break
                with lst.cond:
                    if not (lst.done or lst.ended(run_id)):
                        lst.cond.wait(_slice(now, deadline, 0.5))
                    done = lst.done or lst.ended(run_id)
                _deliver_new(sr, query, lst, seen)
                if done:
                    break
                if time.monotonic() - asked >= 1.0:
                    asked = time.monotonic()
                    if not query.isActive:
                        break
        else:
            while query.isActive and not interrupted:
                if deadline is not None and time.monotonic() > deadline:
                    break
                _await(sr, query, 0.2)
                _deliver_new(sr, query, lst, seen)
        if query.isActive:
            stop_between_batches(query)
        exc = query.exception()
        if exc is not None:
            raise_query_error(sr, exc)
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
    if interrupted:
        raise KeyboardInterrupt
