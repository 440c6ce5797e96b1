"""Spark-side helpers of the `flowspark` command line.

- `open_session`: a SparkSession for a master URL and `--conf` settings, with a
  one-line `FlowsparkError` when a standalone master cannot be reached.
- `physical_plans`: Spark's formatted physical plan of every stage of a compiled
  plan, built without running any job.
- `Progress`: a background reporter of a bounded run's progress (stages and
  tasks done, rows read and written) from Spark's status store.
- `spark_error_line`: the one line worth showing of a Spark / Py4J exception.
- `read_state`: the per-key state of a streaming checkpoint (`flowspark state`).
"""

from __future__ import annotations

import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from flowspark.spark.compat import explain_string, stage_list
from flowspark.spark.session import MasterUnreachableError, check_master, open_session, quiet_logs

__all__ = [
    "MasterUnreachableError",
    "Progress",
    "check_master",
    "need_state_reader",
    "open_session",
    "physical_plans",
    "quiet_logs",
    "read_state",
    "spark_error_line",
]


_ROW_SCHEMA = "p int, k string, seq binary, v binary"


def physical_plans(
    plan: Any, spark: Any, mode: str = "formatted", rules: Any = None
) -> tuple[Any, list[tuple[int, str]]]:
    """Spark's physical plan of each stage's DataFrame, built by the batch job's own builder.

    No job runs to build them, except what a `SparkSource` needs to infer its schema.

    Args:
        plan: A `flowspark.spark.Plan` (the plain plan: `compile_flow`).
        spark: The SparkSession.
        mode: Spark's explain mode (`simple`, `extended`, `formatted`, `cost`, `codegen`).
        rules: The rules switched on (`flowspark.spark.rules.switches.rules_arg`).

    Returns:
        `(physical plan, [(stage id, plan text)])`; a stage whose steps run in the keyed stage
        reading it (the rule `spark_keys`) has no DataFrame of its own and no entry.
    """
    from flowspark.spark.batch.job import build_dataframes
    from flowspark.spark.rules.switches import rules_arg

    physical, dfs = build_dataframes(plan, spark, rules_arg(rules, "flowspark plan"))
    return physical, [(sid, explain_string(spark, df, mode)) for sid, df in sorted(dfs.items())]


def _fmt(n: int) -> str:
    return f"{n:,}"


class Progress:
    """Print a bounded run's progress every `interval` seconds while it runs.

    Lines look like `flowspark: 12s stages 3/5 done (1 running, tasks 7/8) rows read 10,000 written 9,000`;
    stages are Spark stages of the jobs started since the reporter began. On a
    terminal the line is redrawn in place; elsewhere (a log file) a line is
    printed when the counts change. Nothing is printed before a Spark stage
    starts, nor for runs shorter than `delay` seconds.

    Args:
        spark: The SparkSession.
        stream: Where to print (default `sys.stderr`).
        interval: Seconds between lines.
        delay: Seconds before the first line.
    """

    def __init__(self, spark: Any, stream: Optional[TextIO] = None, interval: float = 2.0, delay: float = 2.0) -> None:
        self.spark = spark
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.delay = delay
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._first_stage: Optional[int] = None
        self._start = 0.0
        self._printed = False
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last: dict[str, int] = {}
        self._last_time = 0.0
        #: Off a terminal, an unchanged line is repeated only after this many seconds.
        self.quiet_repeat = 30.0
        from flowspark.spark.session import is_connect

        #: Spark Connect: no status store to read; the server reports stages to a progress handler.
        self._connect = spark is not None and is_connect(spark)
        self._connect_stages: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def _on_connect_progress(self, stages: Any, inflight_tasks: int, operation_id: Any, done: bool) -> None:
        """Spark Connect's progress handler: the server reports the stages of each running operation."""
        with self._lock:
            for st in stages or ():
                self._connect_stages[(operation_id, st.stage_id)] = [
                    st.num_tasks,
                    st.num_completed_tasks,
                    st.num_bytes_read,
                    bool(st.done),
                ]
            if done:  # the operation ended: none of its stages still runs
                for (op, _sid), row in self._connect_stages.items():
                    if op == operation_id:
                        row[1], row[3] = row[0], True

    def _connect_snapshot(self) -> dict[str, int]:
        counts = dict.fromkeys(("stages", "done", "running", "tasks", "tasks_done", "bytes_read"), 0)
        with self._lock:
            stages = [tuple(row) for row in self._connect_stages.values()]
        for tasks, tasks_done, read, done in stages:
            counts["stages"] += 1
            counts["done"] += done
            counts["running"] += not done
            counts["tasks"] += tasks
            counts["tasks_done"] += tasks_done
            counts["bytes_read"] += read
        return counts

    def _stages(self) -> list[Any]:
        return stage_list(self.spark)

    def snapshot(self) -> dict[str, int]:
        """Count stages, tasks and rows of the stages started since the reporter began.

        Returns:
            `stages`, `done`, `running`, `tasks`, `tasks_done`, `rows_read`, `rows_written`.
            Through Spark Connect the server reports no row counts: `bytes_read` (input
            bytes) comes instead of `rows_read` and `rows_written`.
        """
        if self._connect:
            return self._connect_snapshot()
        counts = dict.fromkeys(("stages", "done", "running", "tasks", "tasks_done", "rows_read", "rows_written"), 0)
        for s in self._stages():
            if self._first_stage is not None and s.stageId() < self._first_stage:
                continue
            status = s.status().toString()
            if status == "SKIPPED":
                continue
            counts["stages"] += 1
            counts["done"] += status == "COMPLETE"
            counts["running"] += status == "ACTIVE"
            counts["tasks"] += s.numTasks()
            counts["tasks_done"] += s.numCompleteTasks()
            counts["rows_read"] += s.inputRecords() + s.shuffleReadRecords()
            counts["rows_written"] += s.outputRecords() + s.shuffleWriteRecords()
        return counts

    def line(self, counts: dict[str, int], elapsed: float) -> str:
        """Format one progress line.

        Args:
            counts: A `snapshot()`.
            elapsed: Seconds since the start.

        Returns:
            The line.

        Example:
            >>> p = Progress(None, stream=sys.stderr)
            >>> c = {"stages": 5, "done": 3, "running": 1, "tasks": 8, "tasks_done": 7,
            ...      "rows_read": 10000, "rows_written": 9000}
            >>> p.line(c, 12.3)
            'flowspark: 12s stages 3/5 done (1 running, tasks 7/8) rows read 10,000 written 9,000'
        """
        head = (
            f"flowspark: {elapsed:.0f}s stages {counts['done']}/{counts['stages']} done "
            f"({counts['running']} running, tasks {counts['tasks_done']}/{counts['tasks']}) "
        )
        if "bytes_read" in counts:  # Spark Connect
            return head + f"input {_fmt(counts['bytes_read'])} bytes"
        return head + f"rows read {_fmt(counts['rows_read'])} written {_fmt(counts['rows_written'])}"

    def _emit(self, final: bool = False) -> None:
        try:
            counts = self.snapshot()
        except Exception:  # noqa: BLE001 - progress must never break a run
            return
        now = time.monotonic()
        if not counts["stages"]:
            return
        if not self._tty and not final and counts == self._last and now - self._last_time < self.quiet_repeat:
            return
        self._last, self._last_time = counts, now
        text = self.line(counts, now - self._start)
        if self._tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._printed = True

    def _loop(self) -> None:
        if self._stop.wait(self.delay):
            return
        while True:
            self._emit()
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Progress:
        """Start reporting."""
        if self._connect:
            self.spark.registerProgressHandler(self._on_connect_progress)
        try:
            stages = self._stages()
            self._first_stage = max((s.stageId() for s in stages), default=-1) + 1
        except Exception:  # noqa: BLE001
            self._first_stage = None
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="flowspark-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Stop reporting; print a last line if any was printed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._connect:
            self.spark.removeProgressHandler(self._on_connect_progress)
        if self._printed and exc_type is None:
            self._emit(final=True)


_JAVA_EXC = re.compile(r"(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)(?::\s*)?")


_PY_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(?::\s*(.*))?$")


def _python_worker_error(text: str) -> Optional[str]:
    """The exception line of the first Python traceback in `text` (a Python worker's failure), or None."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("Traceback (most recent call last)")), None)
    if start is None:
        return None
    for ln in lines[start + 1 :]:
        s = ln.strip()
        if ln.startswith((" ", "\t")) or not s:
            continue
        m = _PY_EXC.match(s)
        if m:
            name = m.group(1).rsplit(".", 1)[-1]
            msg = (m.group(2) or "").strip()
            line = f"a Spark Python worker failed: {name}: {msg}" if msg else f"a Spark Python worker failed: {name}"
            if name == "ModuleNotFoundError":
                line += (
                    "; the workers cannot import the flow's code: use `flowspark submit` (ships it) or put its "
                    "directory on PYTHONPATH for the workers"
                )
            return line
    return None


def spark_error_line(err: BaseException) -> str:
    r"""The one line of a Spark, Py4J or Java exception a user needs.

    Args:
        err: The exception.

    Returns:
        Its first meaningful line, without Java class prefixes and stack frames.

    Example:
        >>> e = RuntimeError("An error occurred while calling o12.load.\n: java.io.FileNotFoundException: "
        ...                  "/x (No such file)\n\tat java.base/java.io.FileInputStream.open0(Native Method)")
        >>> spark_error_line(e)
        'FileNotFoundException: /x (No such file)'
        >>> e = RuntimeError("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
        ...                  '  File "w.py", line 3, in f\nModuleNotFoundError: No module named \'flows\'\n')
        >>> spark_error_line(e)[:74]
        "a Spark Python worker failed: ModuleNotFoundError: No module named 'flows'"
    """
    text = str(err)
    py = _python_worker_error(text)
    if py is not None:
        first = py
    else:
        lines = [ln.strip() for ln in text.splitlines()]
        lines = [ln.lstrip(": ").strip() for ln in lines if ln and not ln.startswith("at ")]
        lines = [ln for ln in lines if not ln.startswith("An error occurred while calling")]
        first = lines[0] if lines else type(err).__name__
        m = _JAVA_EXC.match(first)
        if m:
            cls = m.group(0).rstrip(": ").rsplit(".", 1)[-1]
            rest = first[m.end() :].strip()
            first = f"{cls}: {rest}" if rest else cls
    if len(first) > 400:
        first = first[:397] + "..."
    return first


def need_state_reader(checkpoint: str) -> None:
    """Refuse to read `checkpoint`'s state on a pyspark without Spark's `statestore` reader (before 4.0).

    Raises:
        FlowsparkCompileError: One line: the checkpoint, what is missing, what to run instead (a
            checkpoint a 3.5 stream wrote is read by pyspark 4's reader).
    """
    from flowspark.spark.versions import STATE_READER, newer, require

    require(STATE_READER, f"flowspark state {checkpoint}", f"read it with {newer(STATE_READER)}")


def read_state(
    spark: Any, checkpoint: str, batch_id: Optional[int] = None, sizes: Optional[dict[str, int]] = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read the keyed state of a streaming checkpoint with Spark's `statestore` reader.

    The checkpoint must have been written by `flowspark.spark.streaming`: its
    `flowspark.json` names the flow and the chain of stateful steps, and the
    state store of Spark's checkpoint (`<checkpoint>/query`) holds, in the bucket layout, one row
    per bucket whose value is the pickled `{key: (snapshots, notify_at, run)}` (`snapshots[i]` is
    `None` or `(snapshot,)`, `(snapshot, last value time)` with a state TTL, for the i-th
    stateful step; `run`: the writing run's token, absent in entries of older versions); in
    the key layout, one `MapState` row per key plus each bucket's hot tier; in the chunk layout,
    `MapState` rows of many keys each plus each bucket's hot tier.

    Args:
        spark: The SparkSession.
        checkpoint: The checkpoint directory.
        batch_id: Read the state as of this micro-batch (default the last committed one).
        sizes: A dict to receive `"bytes"`: the bytes of the pickled state rows read (the
            entries as Spark's state store holds them, without its own keys and overhead).

    Returns:
        `(meta, table)`: the parsed `flowspark.json`, and `{key: (snapshots, notify_at[, run])}`
        over every bucket (snapshots unpickled, so the flow's modules must be importable).

    Raises:
        FlowsparkError: The directory is not a flowspark streaming checkpoint, or holds no state yet.
    """
    import json

    from flowspark.errors import FlowsparkError
    from flowspark.spark.streaming.ckfs import files, is_local, join

    fs = files(checkpoint, spark)
    if not fs.isdir(checkpoint):
        msg = f"checkpoint {checkpoint!r} is not a directory; give the --checkpoint DIR of a streaming run"
        raise FlowsparkError(msg)
    meta_path = join(checkpoint, "flowspark.json")
    if not fs.exists(meta_path):
        msg = (
            f"{checkpoint!r} is not a flowspark streaming checkpoint (no flowspark.json); give the --checkpoint "
            "DIR of a `flowspark run` streaming run"
        )
        raise FlowsparkError(msg)
    meta = json.loads(fs.read_text(meta_path))
    if not meta.get("stateful_steps"):
        return meta, {}
    # Where flowspark.spark.streaming points Spark's checkpointLocation.
    query = str(Path(checkpoint, "query").resolve()) if is_local(checkpoint) else join(checkpoint, "query")
    if not any(name.isdigit() for name in fs.listdir(join(query, "commits"))):
        msg = f"checkpoint {checkpoint!r} has no committed micro-batch yet, so no state to read"
        raise FlowsparkError(msg)
    if not fs.isdir(join(query, "state")):
        return meta, {}
    need_state_reader(checkpoint)
    # Spark's RocksDB state reader asks the driver's StateStoreCoordinator, which a session has once its
    # StreamingQueryManager exists: a session that never ran a stream has none (pyspark 4.2.0 then fails
    # with CANNOT_LOAD_STATE_STORE, "Cannot find endpoint: ...StateStoreCoordinator").
    _ = spark.streams
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    read = [0]

    def blob_of(value: Any) -> Optional[bytes]:
        blob = _first_binary(value)
        read[0] += len(blob) if blob is not None else 0
        return blob

    table = _layout_state(reader, query, meta.get("state_layout"), blob_of)
    if sizes is not None:
        sizes["bytes"] = read[0]
    return meta, table


def _layout_state(reader: Any, query: str, layout: Optional[str], blob_of: Callable[[Any], Any]) -> dict[str, Any]:
    """`{key: entry}` of a checkpoint's state store in its layout (`blob_of`: a state row's pickled bytes)."""
    import pickle

    if layout == "key":
        return _key_layout_state(reader, query, blob_of)
    if layout == "chunk":
        return _chunk_layout_state(reader, query, blob_of)
    rows = reader.load(query).select("value").collect()
    table: dict[str, Any] = {}
    for row in rows:
        blob = blob_of(row["value"])
        if blob is None:
            continue
        table.update(pickle.loads(blob))  # noqa: S301 - our own checkpoint
    return table


def _key_layout_state(reader: Any, path: str, blob_of: Callable[[Any], Any]) -> dict[str, Any]:
    """`{key: entry}` of a key-layout checkpoint: the per-key `MapState` rows, then the buckets' hot tiers (newer)."""
    import pickle

    from flowspark.spark.streaming.keylayout import ENTRIES, META

    table: dict[str, Any] = {}
    for row in reader.option("stateVarName", ENTRIES[0]).load(path).collect():
        # The value is (entry) or, with Spark's TTL on the rows, ((entry), ttlExpirationMs).
        key, blob = row["user_map_key"][ENTRIES[1].split()[0]], blob_of(row["user_map_value"])
        if blob is not None:
            table[key] = pickle.loads(blob)  # noqa: S301 - our own checkpoint
    for row in reader.option("stateVarName", META[0]).load(path).select("value").collect():
        blob = blob_of(row["value"])
        if blob is not None:
            hot = pickle.loads(blob).get("hot", {})  # noqa: S301 - our own checkpoint
            table.update({key: ent for key, (ent, _in_map) in hot.items()})
    return table


def _chunk_layout_state(reader: Any, path: str, blob_of: Callable[[Any], Any]) -> dict[str, Any]:
    """`{key: entry}` of a chunk-layout checkpoint: the chunks' keys, then the buckets' hot tiers."""
    import pickle

    from flowspark.spark.streaming.chunklayout import CHUNKS
    from flowspark.spark.streaming.keylayout import META

    table: dict[str, Any] = {}
    for row in reader.option("stateVarName", CHUNKS[0]).load(path).select("user_map_value").collect():
        blob = blob_of(row["user_map_value"])
        if blob is not None:
            table.update(pickle.loads(blob))  # noqa: S301 - our own checkpoint
    for row in reader.option("stateVarName", META[0]).load(path).select("value").collect():
        blob = blob_of(row["value"])
        if blob is not None:
            table.update(pickle.loads(blob).get("hot", {}))  # noqa: S301 - our own checkpoint
    return table


def _first_binary(value: Any) -> Optional[bytes]:
    """The first binary field of a (possibly nested) state row: the bucket's pickled table."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (tuple, list)):
        for v in value:
            found = _first_binary(v)
            if found is not None:
                return found
    return None


def streaming_physical_plans(
    flow: Any, spark: Any, buckets: int, mode: str = "formatted", rules: Any = None, layout: Optional[str] = None
) -> tuple[Any, list[tuple[int, str]]]:
    """Spark's plan of each stage of a streaming flow, built by the streaming run's own builder.

    Nothing starts: the streaming DataFrames are built and explained only.

    Args:
        flow: A `Dataflow` with an unbounded source.
        spark: The SparkSession.
        buckets: State buckets of the keyed stage.
        mode: Spark's explain mode.
        rules: The rules switched on (`flowspark.spark.rules.switches.rules_arg`).
        layout: The state layout (`flowspark.spark.streaming.state.LAYOUTS`); default a new
            checkpoint's.

    Returns:
        `(physical plan, [(stage id, plan text)])` (a new query's choices).
    """
    from flowspark.spark.rules.switches import rules_arg
    from flowspark.spark.streaming import StreamingRun, compile_streaming, needs_timers
    from flowspark.spark.streaming.checkpoint import check_meta, untimed_choice
    from flowspark.spark.streaming.lowering import layouts_here
    from flowspark.spark.streaming.state import LAYOUTS

    plan = compile_streaming(flow)
    chosen = layout or layouts_here(LAYOUTS)[0]
    # A new query's choices, recorded in a throwaway checkpoint (never the temp folder itself,
    # nor a checkpoint of the user's: building the DataFrames records and reads its flags).
    with tempfile.TemporaryDirectory(prefix="flowspark-plan-") as scratch:
        steps = [ks.step_id for ks in plan.keyed_steps()]
        check_meta(scratch, plan.flow_id, buckets, steps, needs_timers(plan))
        options = {
            "checkpoint": scratch,
            "buckets": buckets,
            "clock": None,
            "max_items": 100_000,
            "timers": needs_timers(plan),
            "rules": rules_arg(rules, "flowspark plan"),
            "layout": chosen,
            "untimed": untimed_choice(chosen, needs_timers(plan), ttl=False),
        }
        sr = StreamingRun(plan, spark, options)
        sr.build()
        return sr.plan, [(sid, explain_string(spark, df, mode)) for sid, df in sorted(sr.dfs.items())]
