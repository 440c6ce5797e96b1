"""Rules on who keys a SparkSource's rows, and how the keyed stage reads them.

`spark_keys`, `value_mappers`, `value_column`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from flowspark.spark.io.columns import ID_COLUMN
from flowspark.spark.plan.types import ColumnKey
from flowspark.spark.rules.book import BOTH, Rule, Work, mode

__all__ = ["SPARK_KEYS", "VALUE_COLUMN", "VALUE_MAPPERS", "column_key", "column_refusal"]


def column_key(w: Work, sid: int) -> ColumnKey | str:
    """The Spark-keyed form of keyed stage `sid` (`ColumnKey`), or why it has none."""
    st = w.stage(sid)
    if len(st.inputs) != 1:
        return "it reads several ports"
    src_id, port, _pad = st.inputs[0]
    src = w.stage(src_id)
    spec = w.spec(src_id)
    if src.kind != "source" or spec.source != "native":
        return "its input does not come straight from a SparkSource"
    if len(spec.ports) != 1 or w.plan.readers((src_id, port)) != [sid]:
        return f"stage {src_id}'s rows go elsewhere too"
    stream = spec.entry
    column = None
    for o in spec.ops:
        if o.ups != (stream,) or len(o.downs) != 1:
            return f"step {o.step_id!r} branches or merges"
        if o.kind == "map" and column is None and o.key_column is not None:
            column = o.key_column
        elif not (
            o.kind == "pass" or (o.kind == "map" and o.keeps in (("items",) if column is None else ("items", "key")))
        ):
            return f"step {o.step_id!r} is neither proven to keep the items nor a key_on proven to read a column"
        stream = o.downs[0]
    if column is None:
        return "no key_on is proven to read a column (row[column])"
    out = spec.ports[0].stream
    if stream != out:
        return "the key is not the last step of its source stage"
    return ColumnKey(column, src_id, spec.source_step, spec.source_index, spec.entry, tuple(spec.ops), out)


def column_refusal(w: Work, stage: int, column: str) -> Optional[str]:
    """Why Spark cannot key stage `stage`'s rows on `column` as `row[column]` would, or `None`."""
    cols = w.env.columns.get(stage)
    if cols is None:
        return "the SparkSource's columns are read with a session; this plan was made without one"
    names = [n for n, _t in cols]
    if names.count(column) != 1:
        return f"the DataFrame has {names.count(column)} columns named {column!r}"
    if ID_COLUMN in names:
        return f"the DataFrame has a column named {ID_COLUMN!r}"
    kind = dict(cols)[column]
    if kind != "string":
        return f"column {column!r} is {kind}, not string"
    return None


def _check_spark_keys(w: Work, sid: int) -> Optional[str]:
    if w.applied("native_reduction", f"stage {sid}"):
        return "Spark aggregates the stage (native_reduction)"
    ck = column_key(w, sid)
    if isinstance(ck, str):
        return ck
    why = column_refusal(w, ck.source_stage, ck.column)
    if why is not None:
        return why
    if w.env.routed:
        return "the query is routed (some stage has several readers)"
    if w.env.recorded.get("spark_keys") is False:
        return "the checkpoint was started without it"
    return None


def _apply_spark_keys(w: Work, sid: int) -> None:
    ck = column_key(w, sid)
    assert isinstance(ck, ColumnKey)
    w.set(sid, column_key=ck)
    w.add_mode(ck.source_stage, "keyed_by_spark")  # its Python pass is skipped


SPARK_KEYS = Rule(
    "spark_keys",
    "stage",
    BOTH,
    True,
    "Spark keys a SparkSource's rows on the key column, shuffles and sorts them natively, and the keyed "
    "stage runs the source's steps (one Python pass instead of two)",
    _check_spark_keys,
    _apply_spark_keys,
)


def _check_value_mappers(w: Work, sid: int) -> Optional[str]:
    if not w.applied("spark_keys", f"stage {sid}"):
        return "spark_keys did not apply"
    if w.plan.dead_letter is not None:
        return "the run has a dead letter (each refused item needs its sequence)"
    ck = w.spec(sid).column_key
    assert ck is not None
    first = ck.ops[0]
    if first.kind != "map" or first.key_column != ck.column:
        return f"step {first.step_id!r} comes before the key_on"
    for o in ck.ops[1:]:
        if o.kind != "pass" and not (o.kind == "map" and o.value_fn is not None):
            return f"step {o.step_id!r} after the key_on is not a map_value"
    return None


VALUE_MAPPERS = Rule(
    "value_mappers",
    "stage",
    BOTH,
    False,
    "a Spark-keyed stage whose key_on comes first and whose later steps are map_value builds its items as "
    "columns: keys as Spark gives them, each mapper called on the whole list of values",
    _check_value_mappers,
    mode("value_mappers"),
)


def _check_value_column(w: Work, sid: int) -> Optional[str]:
    if not w.applied("value_mappers", f"stage {sid}"):
        return "value_mappers did not apply"
    ck = w.spec(sid).column_key
    assert ck is not None
    col = ck.value_candidate
    if col is None:
        return "the step after the key is not a map_value proven to read a column"
    names = [n for n, _t in w.env.columns.get(ck.source_stage, ())]
    if names.count(col) != 1:
        return f"the DataFrame has {names.count(col)} columns named {col!r}"
    return None


def _apply_value_column(w: Work, sid: int) -> None:
    ck = w.spec(sid).column_key
    assert ck is not None
    w.set(sid, column_key=dataclasses.replace(ck, value_from=ck.value_candidate))


VALUE_COLUMN = Rule(
    "value_column",
    "stage",
    BOTH,
    False,
    "a Spark-keyed stage whose map_value reads one column reads that column's values, building no row dict",
    _check_value_column,
    _apply_value_column,
)
