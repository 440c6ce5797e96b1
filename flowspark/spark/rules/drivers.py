"""Rules on how a stage drives its steps: `bare_state`, `one_step`, `mapper_line`, `flat_driver`, `values_driver`."""

from __future__ import annotations

from typing import Optional

from flowspark.spark.rules.book import BOTH, STREAM, Rule, Work, mode

__all__ = ["BARE_STATE", "FLAT_DRIVER", "MAPPER_LINE", "ONE_STEP", "VALUES_DRIVER"]


def _check_bare(w: Work, sid: int) -> Optional[str]:
    chain = w.spec(sid).chain
    plain = [ks.step_id for ks in chain if ks.batch_fn is None]
    if plain:
        return f"step {plain[0]!r} is not a function of its state (stateful_map)"
    if w.env.ttl:
        return "the run has a state_ttl"
    return None


BARE_STATE = Rule(
    "bare_state",
    "stage",
    STREAM,
    False,
    "stateful_map steps are driven on their bare states, without building and snapshotting a logic per key",
    _check_bare,
    mode("bare_state"),
)


def _check_one_step(w: Work, sid: int) -> Optional[str]:
    if len(w.spec(sid).chain) != 1:
        return "the stage chains several steps"
    if w.applied("bare_state", f"stage {sid}"):
        return "bare_state applies (its own path)"
    if w.env.ttl:
        return "the run has a state_ttl (the chain's bookkeeping keeps each step's last value time)"
    return None


ONE_STEP = Rule(
    "one_step",
    "stage",
    STREAM,
    False,
    "a keyed stage of one stateful step without a state_ttl drives each key's logic directly, without the "
    "bookkeeping of a chain of steps",
    _check_one_step,
    mode("one_step"),
)


def _check_line(w: Work, sid: int) -> Optional[str]:
    if "sink_fusion" not in w.spec(sid).modes:
        return "the stage does not write a sink's rows (sink_fusion)"
    if w.spec(sid).one_to_one_mappers() is None:
        return "the stage's steps after its entry are not one line of one-to-one maps"
    return None


MAPPER_LINE = Rule(
    "mapper_line",
    "stage",
    BOTH,
    False,
    "a stage writing a sink's rows whose steps are one line of one-to-one maps calls each mapper on the "
    "whole list of items, with no sequences",
    _check_line,
    mode("mapper_line"),
    frozenset({"source", "map", "keyed"}),
)


def _check_flat(w: Work, sid: int) -> Optional[str]:
    if not w.applied("bare_state", f"stage {sid}"):
        return "bare_state did not apply"
    if len(w.spec(sid).chain) != 1:
        return "the stage chains several steps"
    if "sink_fusion" not in w.spec(sid).modes:
        return "the stage does not write a sink's rows (sink_fusion)"
    if w.env.timers:
        return "the query has timers"
    if w.plan.dead_letter is not None:
        return "the run has a dead letter"
    return None


FLAT_DRIVER = Rule(
    "flat_driver",
    "stage",
    STREAM,
    False,
    "one stateful_map writing a sink's rows maps each key's values as a list, computing no sequences",
    _check_flat,
    mode("flat_driver"),
)


def _notifying(w: Work, sid: int) -> Optional[str]:
    """Why a stage's notifications need its values' sequences, or `None` (`values_driver`, batch and streaming)."""
    chain = w.spec(sid).chain
    notifying = [ks.step_id for ks in chain if ks.notifies]
    if notifying and len(chain) > 1:
        return f"step {notifying[0]!r} may ask for notifications, in a chain of several steps"
    if notifying and not w.applied("spark_keys", f"stage {sid}"):
        # Due notifications fire between a key's activations (after the values of the one that
        # follows), which the values' sequences tell apart; a SparkSource's rows are one
        # activation (what spark_keys reads).
        return (
            f"step {notifying[0]!r} may ask for notifications, which fire between the activations its values' "
            "sequences tell apart (spark_keys did not apply)"
        )
    return None


def _check_values(w: Work, sid: int) -> Optional[str]:
    spec = w.spec(sid)
    if w.env.target == "streaming":
        if not w.applied("one_step", f"stage {sid}"):
            return "one_step did not apply"
        if "sink_fusion" not in spec.modes:
            return "the stage does not write a sink's rows (sink_fusion)"
        why = _notifying(w, sid)
        if why is not None:
            return why
    elif w.applied("native_reduction", f"stage {sid}"):
        return "native_reduction applies (Spark aggregates the stage)"
    else:
        why = _notifying(w, sid)
        if why is not None:
            return why
        if "sink_fusion" not in spec.modes and not spec.chain[-1].eof_only:
            return (
                "the stage's emits need sequences: it does not write a sink's rows (sink_fusion) and its last step "
                "emits before end of input"
            )
    if w.plan.dead_letter is not None:
        return "the run has a dead letter (its entries carry sequences)"
    if w.env.routed:
        return "the query routes every stage's rows through one chain (their sequences order them)"
    return None


VALUES_DRIVER = Rule(
    "values_driver",
    "stage",
    BOTH,
    False,
    "a keyed stage whose values' sequences nobody reads drives each key's values as plain lists, without a "
    "dead letter: in a streaming query one_step writing a sink's rows, its step not notifying (or keyed by Spark); "
    "in a batch job a stage writing a sink's "
    "rows or whose last step emits only at end of input, its steps not notifying (or one step keyed by Spark)",
    _check_values,
    mode("values_driver"),
)
