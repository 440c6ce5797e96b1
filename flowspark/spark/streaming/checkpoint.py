"""The checkpoint's own metadata: what a streaming checkpoint belongs to and how it was lowered.

`<checkpoint>/flowspark.json` records the flow id, the stateful step ids, the
bucket count, whether the query runs with timers, the state layout (`check_layout`),
and the schemas inferred for sinks given none (`pin_schema`: a restart writes rows
of the same schema). A restart with another flow, another bucket count, another
state layout, or a flow needing timers on a timer-less checkpoint is refused
with `RecoveryError` (keys would land in other buckets, or Spark would reject
the changed query).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from flowspark.errors import RecoveryError
from flowspark.spark.streaming.ckfs import files, join

__all__ = [
    "RATE_TICKS",
    "COUNTS_FILE",
    "META_FILE",
    "check_flag",
    "check_layout",
    "check_meta",
    "check_recorded",
    "check_sink_log",
    "check_untimed",
    "untimed_choice",
    "load_counts",
    "pin_schema",
    "pinned_schemas",
    "recorded_buckets",
    "save_counts",
]

#: File in the checkpoint directory recording what the checkpoint belongs to.
META_FILE = "flowspark.json"
#: The choice (in `flowspark.json`) of a key or chunk layout query run in time mode "None" (`check_untimed`).
UNTIMED = "untimed_state"
#: The choice (in `flowspark.json`) of the stream of ticks that fires timers: Spark's
#: `rate-micro-batch` source (`True`, where Python streaming sources lack what the tick source
#: needs) or flowspark's Python tick source (`False`; every checkpoint started before the
#: choice was recorded). A query's sources are part of its checkpoint: the choice stays.
RATE_TICKS = "rate_ticks"
#: The layout of a checkpoint whose query ran before layouts were recorded.
LEGACY_LAYOUT = "bucket"
#: File in the checkpoint directory with the last counts of keys and pending notifications
#: per bucket (the progress line's; informational: rewritten after every micro-batch).
COUNTS_FILE = "flowspark_state_counts.json"


def check_meta(checkpoint: str, flow_id: str, buckets: int, steps: list[str], timers: bool = True) -> bool:
    """Create or check `<checkpoint>/flowspark.json`; return whether the query runs with timers.

    `timers` is what this flow needs (`False` when no stateful step can ask for a
    notification). A checkpoint keeps the choice it was made with (the query's
    sources and timeout mode must not change across restarts); one written before
    the choice was recorded ran with timers.
    """
    path = join(checkpoint, META_FILE)
    meta = {"flow_id": flow_id, "buckets": buckets, "stateful_steps": steps, "timers": timers, "version": 1}
    if files(checkpoint).exists(path):
        return _check_recorded_meta(checkpoint, _read(path), flow_id, buckets, steps, timers)
    _write(path, meta)
    return timers


def recorded_buckets(checkpoint: str) -> Optional[int]:
    """The bucket count recorded in a checkpoint's `flowspark.json`, or `None` (a new checkpoint)."""
    path = join(checkpoint, META_FILE)
    if not files(checkpoint).exists(path):
        return None
    buckets = _read(path).get("buckets")
    return buckets if isinstance(buckets, int) else None


def _check_recorded_meta(
    checkpoint: str, old: dict[str, Any], flow_id: str, buckets: Optional[int], steps: list[str], timers: bool
) -> bool:
    """Refuse a run that does not fit the recorded `flowspark.json`; return the recorded timers choice."""
    if old.get("flow_id") != flow_id or old.get("stateful_steps") != steps:
        msg = (
            f"checkpoint {checkpoint!r} belongs to dataflow {old.get('flow_id')!r} with stateful steps "
            f"{old.get('stateful_steps')}; this is dataflow {flow_id!r} with {steps}; use another checkpoint "
            "directory, or delete this one to start over (a file SparkSink's output directory keeps the log of "
            "the query that wrote it: start it over too, with a new output path or clear_outputs=True)"
        )
        raise RecoveryError(msg)
    if buckets is not None and old.get("buckets") != buckets:
        msg = (
            f"checkpoint {checkpoint!r} was written with buckets={old.get('buckets')}; received "
            f"buckets={buckets}; the bucket count is fixed for a checkpoint's lifetime (keys would land "
            "in other buckets and lose their state): pass the old value or start a new checkpoint"
        )
        raise RecoveryError(msg)
    old_timers = old.get("timers", True)
    if timers and not old_timers:
        msg = (
            f"checkpoint {checkpoint!r} was written by a query without timers (no stateful step could ask "
            "for a notification); this flow's stateful steps can; start a new checkpoint"
        )
        raise RecoveryError(msg)
    return bool(old_timers)


def check_layout(checkpoint: str, layout: Optional[str], layouts: tuple[str, ...]) -> str:
    """Record the state layout of a new checkpoint, or check it against the recorded one.

    Args:
        checkpoint: The checkpoint directory (`check_meta` ran).
        layout: The layout asked for, or `None`: the recorded one (a new checkpoint gets
            `layouts[0]`).
        layouts: The known layouts, the default first.

    Returns:
        The layout the query runs with.

    Raises:
        RecoveryError: The checkpoint was written with another layout than the one asked for.
    """
    path = join(checkpoint, META_FILE)
    meta = _read(path)
    recorded = _recorded_layout(checkpoint, meta)
    if recorded is None:
        chosen = layout or layouts[0]
        meta["state_layout"] = chosen
        _write(path, meta)
        return chosen
    _check_recorded_layout(checkpoint, recorded, layout)
    return recorded


def _recorded_layout(checkpoint: str, meta: dict[str, Any]) -> Optional[str]:
    """The layout a checkpoint's query ran with; `None` while no query ran (the layout is still free)."""
    if not files(checkpoint).exists(join(checkpoint, "query")):
        return None
    recorded = meta.get("state_layout")
    # a query that ran before layouts were recorded used the bucket layout (then the only one)
    return LEGACY_LAYOUT if recorded is None else str(recorded)


def _check_recorded_layout(checkpoint: str, recorded: str, layout: Optional[str]) -> None:
    if layout is not None and layout != recorded:
        msg = (
            f"checkpoint {checkpoint!r} keeps its state in the {recorded!r} layout; received "
            f"state_layout={layout!r}. The layout is fixed for a checkpoint's lifetime: pass "
            f"state_layout={recorded!r} (or leave it out), or start a new checkpoint directory"
        )
        raise RecoveryError(msg)


def check_recorded(
    checkpoint: str,
    flow_id: str,
    buckets: Optional[int],
    steps: list[str],
    timers: bool,
    layout: Optional[str],
    layouts: tuple[str, ...],
    ttl: bool = False,
) -> None:
    """Refuse, without writing anything, what `check_meta`, `check_layout` and `check_untimed` would refuse.

    For callers that check a run before starting a SparkSession (the `flowspark` command);
    a checkpoint without `flowspark.json` passes (it is new).

    Args:
        checkpoint: The checkpoint directory.
        flow_id: The flow's id.
        buckets: The bucket count asked for, or `None` (the recorded one).
        steps: The flow's stateful step ids.
        timers: Whether the flow needs timers.
        layout: The state layout asked for, or `None`.
        layouts: The known layouts, the default first.
        ttl: Whether the run has a `state_ttl`.

    Raises:
        RecoveryError: The checkpoint belongs to another flow, bucket count, timers choice or
            layout, or its state rows have no TTL while the run has a `state_ttl`.
    """
    path = join(checkpoint, META_FILE)
    if not files(checkpoint).exists(path):
        return
    meta = _read(path)
    _check_recorded_meta(checkpoint, meta, flow_id, buckets, steps, timers)
    recorded = _recorded_layout(checkpoint, meta)
    if recorded is not None:
        _check_recorded_layout(checkpoint, recorded, layout)
        _check_untimed(checkpoint, bool(meta.get(UNTIMED, False)), ttl)


def untimed_choice(layout: str, timers: bool, ttl: bool) -> bool:
    """Whether a new checkpoint's query runs untimed (see `check_untimed`): a key or chunk layout, no timers, no TTL.

    Args:
        layout: The layout the query runs with.
        timers: Whether the query runs with timers.
        ttl: Whether the run has a `state_ttl`.

    Returns:
        The choice.
    """
    return layout != "bucket" and not timers and not ttl


def check_untimed(checkpoint: str, layout: str, timers: bool, ttl: bool) -> bool:
    """Record whether a new checkpoint's key or chunk layout query runs untimed, or return the recorded choice.

    Untimed: transformWithStateInPandas in time mode "None" with `MapState` rows without a
    TTL, for a query with no timers and no `state_ttl` (Spark then plans no processing-time
    work and runs no no-data micro-batches). Spark stores a row's TTL with the row, so the
    choice is the checkpoint's for its lifetime; a checkpoint whose query ran before the
    choice was recorded ran timed.

    Args:
        checkpoint: The checkpoint directory (`check_meta` and `check_layout` ran).
        layout: The layout the query runs with.
        timers: Whether the query runs with timers (the recorded choice).
        ttl: Whether the run has a `state_ttl`.

    Returns:
        Whether the query runs untimed.

    Raises:
        RecoveryError: The checkpoint's query ran untimed and this run has a `state_ttl`.
    """
    untimed = check_flag(checkpoint, UNTIMED, untimed_choice(layout, timers, ttl))
    _check_untimed(checkpoint, untimed, ttl)
    return untimed


def _check_untimed(checkpoint: str, untimed: bool, ttl: bool) -> None:
    if untimed and ttl:
        msg = (
            f"checkpoint {checkpoint!r} was written by a query without state_ttl, whose state rows carry no "
            "TTL; received a state_ttl. Spark keeps a state row's TTL choice for the checkpoint's lifetime: "
            "run without state_ttl, or start a new checkpoint directory with it"
        )
        raise RecoveryError(msg)


def recorded_flag(checkpoint: str, name: str) -> Optional[bool]:
    """The lowering choice `name` a checkpoint's query ran with, or `None` for a checkpoint whose query never ran.

    A checkpoint whose query ran before the choice was recorded ran without it (`False`).

    Args:
        checkpoint: The checkpoint directory (`check_meta` ran).
        name: The choice's name in `flowspark.json` (a shape rule of `flowspark.spark.rules.optimizer`).

    Returns:
        The choice, or `None`.
    """
    if not files(checkpoint).exists(join(checkpoint, "query")):
        return None
    return bool(_read(join(checkpoint, META_FILE)).get(name, False))


def check_flag(checkpoint: str, name: str, wanted: bool) -> bool:
    """Record a lowering choice of a new checkpoint, or return the one recorded.

    A choice that changes the query's shape (e.g. Spark keying a source's rows itself,
    `spark_keys`) stays what the checkpoint started with; a checkpoint whose query ran
    before the choice was recorded keeps the old lowering (`False`).

    Args:
        checkpoint: The checkpoint directory (`check_meta` ran).
        name: The choice's name in `flowspark.json`.
        wanted: What this run would choose.

    Returns:
        The choice the query runs with.
    """
    path = join(checkpoint, META_FILE)
    meta = _read(path)
    ran = files(checkpoint).exists(join(checkpoint, "query"))
    if ran:
        return bool(meta.get(name, False))
    meta[name] = wanted
    _write(path, meta)
    return wanted


def pinned_schemas(checkpoint: str) -> dict[str, str]:
    """The sink schemas pinned in `<checkpoint>/flowspark.json`: `{output step id: schema as JSON}`.

    Args:
        checkpoint: The checkpoint directory.

    Returns:
        The schemas (Spark's `StructType.json()`); empty when none was pinned.
    """
    path = join(checkpoint, META_FILE)
    if not files(checkpoint).exists(path):
        return {}
    return dict(_read(path).get("sink_schemas", {}))


def pin_schema(checkpoint: str, step_id: str, schema_json: str) -> None:
    """Record the schema inferred for a sink given none, so every later micro-batch and restart uses it.

    Args:
        checkpoint: The checkpoint directory (its `flowspark.json` exists: `check_meta` ran).
        step_id: The output step's id.
        schema_json: The schema (Spark's `StructType.json()`).
    """
    path = join(checkpoint, META_FILE)
    meta = _read(path)
    meta.setdefault("sink_schemas", {})[step_id] = schema_json
    _write(path, meta)


def load_counts(checkpoint: str) -> dict[str, tuple[int, int]]:
    """The state counts saved by the last run: `{"stage:bucket": (keys, pending notifications)}`.

    Args:
        checkpoint: The checkpoint directory.

    Returns:
        The counts; empty when none were saved.
    """
    path = join(checkpoint, COUNTS_FILE)
    if not files(checkpoint).exists(path):
        return {}
    return {k: (int(v[0]), int(v[1])) for k, v in _read(path).items()}


def save_counts(checkpoint: str, counts: dict[str, tuple[int, int]]) -> None:
    """Save the state counts (see `load_counts`).

    Args:
        checkpoint: The checkpoint directory.
        counts: The counts.
    """
    _write(join(checkpoint, COUNTS_FILE), dict(counts))


def _read(path: str) -> Any:
    return json.loads(files(path).read_text(path))


def _write(path: str, meta: dict[str, object]) -> None:
    files(path).write_text(path, json.dumps(meta))


def _batch_ids(fs: Any, log: str) -> list[int]:
    """The micro-batch ids a Spark log directory holds (files `N`, or `N.compact` in a sink's log)."""
    if not fs.isdir(log):
        return []
    ids = []
    for name in fs.listdir(log):
        head = name[: -len(".compact")] if name.endswith(".compact") else name
        if head.isdigit():
            ids.append(int(head))
    return ids


def check_sink_log(checkpoint: str, step_id: str, path: str, clear: bool = False, spark: Optional[Any] = None) -> bool:
    """Refuse a file sink whose output directory holds another query's micro-batch log.

    Spark's file sink skips every micro-batch whose id its directory's `_spark_metadata`
    log already holds (exactly once across restarts of one query). A new checkpoint (or one
    that never planned those ids) on such a directory would commit its micro-batches and
    write nothing. So when the log holds a micro-batch id past the last one this checkpoint
    planned (its `offsets` log; a micro-batch written but not committed is planned), the run
    is refused before any micro-batch runs, or with `clear` the directory is emptied and
    the query starts it over.

    Args:
        checkpoint: The query's checkpoint directory (`DIR`; Spark's logs under `DIR/query`).
        step_id: The output step writing `path` (named in the error).
        path: The sink's directory.
        clear: Delete the directory (the other query's files and log) instead of refusing.
        spark: The session whose file systems open a URI (default the active classic one).

    Returns:
        Whether the directory was cleared.

    Raises:
        RecoveryError: The directory holds another query's log and `clear` is false.
    """
    fs = files(path, spark)
    written = _batch_ids(fs, join(path, "_spark_metadata"))
    if not written:
        return False
    planned = _batch_ids(files(checkpoint, spark), join(checkpoint, "query", "offsets"))
    last = max(planned, default=-1)
    if max(written) <= last:
        return False
    if clear:
        fs.rmtree(path)
        return True
    mine = "planned none" if last < 0 else f"planned micro-batches up to {last}"
    msg = (
        f"output step {step_id!r}: {path!r} holds the output of another streaming query (its _spark_metadata log "
        f"has micro-batches up to {max(written)}; checkpoint {checkpoint!r} {mine}), and Spark's file sink would "
        "skip those micro-batch ids and write nothing; write to a new output path, or pass clear_outputs=True "
        "(flowspark run --clear-outputs) to delete that directory and start it over"
    )
    raise RecoveryError(msg)
