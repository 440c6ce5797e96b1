"""Rules of streaming queries only: `ordered_source`, `file_order`, `lean_listener`."""

from __future__ import annotations

from typing import Any, Optional

from flowspark.spark.rules.book import STREAM, Rule, Work, mode, noop

__all__ = ["FILE_ORDER", "LEAN_LISTENER", "ORDERED_SOURCE"]


def _check_ordered(w: Work, sid: int) -> Optional[str]:
    if not w.applied("flat_driver", f"stage {sid}"):
        return "flat_driver did not apply"
    if w.applied("spark_keys", f"stage {sid}"):
        return "Spark keys the stage's rows (spark_keys)"
    st = w.stage(sid)
    if len(st.inputs) != 1 or st.inputs[0][2]:
        return "it reads a merge"
    src_id = st.inputs[0][0]
    src = w.stage(src_id)
    if src.kind != "source" or src.spec.source == "native":
        return "its input is not a Python source's stage"
    if len(src.spec.ports) != 1 or w.plan.readers((src_id, 0)) != [sid]:
        return f"stage {src_id}'s items go elsewhere too"
    if not all(o.kind == "map" and o.one_to_one for o in src.spec.ops):
        return f"a step of stage {src_id} is not one-to-one"
    return None


def _apply_ordered(w: Work, sid: int) -> None:
    w.add_mode(sid, "ordered_source")
    w.add_mode(w.stage(sid).inputs[0][0], "ordered_source")


ORDERED_SOURCE = Rule(
    "ordered_source",
    "stage",
    STREAM,
    False,
    "the Python source's read numbers each micro-batch's items in order (8 bytes instead of a sequence)",
    _check_ordered,
    _apply_ordered,
)


def _check_file_order(w: Work, sid: int) -> Optional[str]:
    # Sequences are read by nothing but a dead letter when the stage writes a sink's rows.
    if "sink_fusion" not in w.spec(sid).modes:
        return "the stage does not write a sink's rows (sink_fusion): its rows need sequences"
    if w.plan.dead_letter is not None:
        return "the run has a dead letter (its entries carry sequences)"
    ck = w.spec(sid).column_key
    if ck is None:
        return "spark_keys did not apply"
    if ck.source_stage not in w.env.file_streams:
        return "the source is not a parquet file stream with file and row indexes"
    return None


FILE_ORDER = Rule(
    "file_order",
    "stage",
    STREAM,
    False,
    "a parquet file stream's rows are ordered by Spark's file and row index, with no numbering pass",
    _check_file_order,
    mode("file_order"),
)


def _check_lean(w: Work, _subject: Any) -> Optional[str]:
    if not w.env.session:
        return "the session is known when the run starts; this plan was made without one"
    if w.env.connect:
        return "a Spark Connect session delivers events as JSON already"
    return None


LEAN_LISTENER = Rule(
    "lean_listener",
    "query",
    STREAM,
    False,
    "the progress listener reads each event as one JSON string from the JVM (classic sessions)",
    _check_lean,
    noop,
)
