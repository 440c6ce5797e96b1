"""Rules on what a stage's ports and emits carry: `value_only_ports`, `unordered_emits`, `eof_only`."""

from __future__ import annotations

import dataclasses
from typing import Optional

from flowspark.spark.rules.book import BOTH, Rule, Work, mode

__all__ = ["EOF_ONLY", "UNORDERED_EMITS", "VALUE_ONLY_PORTS"]


def _keyed_only_ports(w: Work, sid: int) -> list[int]:
    """Ports of stage `sid` feeding a stateful step and read by keyed stages only."""
    out = []
    for p, port in enumerate(w.spec(sid).ports):
        readers = w.plan.readers((sid, p))
        if port.key_for and readers and all(isinstance(r, int) and w.stage(r).kind == "keyed" for r in readers):
            out.append(p)
    return out


def _check_value_only(w: Work, sid: int) -> Optional[str]:
    if not _keyed_only_ports(w, sid):
        return "no port of the stage is read by keyed stages only"
    return None


def _apply_value_only(w: Work, sid: int) -> None:
    ports = list(w.spec(sid).ports)
    for p in _keyed_only_ports(w, sid):
        ports[p] = dataclasses.replace(ports[p], value_only=True)
        for r in w.plan.readers((sid, p)):
            w.set(r, input_value_only=True)
    w.set(sid, ports=tuple(ports))


VALUE_ONLY_PORTS = Rule(
    "value_only_ports",
    "stage",
    BOTH,
    False,
    "a port read only by keyed stages carries each item's value alone (the key is in column k)",
    _check_value_only,
    _apply_value_only,
    frozenset({"source", "map", "keyed"}),
)


def _check_unordered(w: Work, sid: int) -> Optional[str]:
    for p in range(len(w.spec(sid).ports)):
        for r in w.plan.readers((sid, p)):
            if isinstance(r, int):
                return f"stage {r} reads port{p}"
            if r in w.plan.driver_readers():
                return f"{r} sees port{p} at the driver in order"
    return None


def _apply_unordered(w: Work, sid: int) -> None:
    chain = list(w.spec(sid).chain)
    chain[-1] = dataclasses.replace(chain[-1], regroup=False)
    w.set(sid, chain=tuple(chain))


UNORDERED_EMITS = Rule(
    "unordered_emits",
    "stage",
    BOTH,
    False,
    "the last step's emits keep their value's sequence instead of moving the key into it, "
    "when nobody reads their order across keys",
    _check_unordered,
    _apply_unordered,
)


def _check_eof_only(w: Work, sid: int) -> Optional[str]:
    if not any(ks.eof_only for ks in w.spec(sid).chain[1:]):
        return "no step after the first emits only at end of input"
    return None


EOF_ONLY = Rule(
    "eof_only",
    "stage",
    BOTH,
    False,
    "a step followed by one that emits only at end of input (fold_final, collect...) tags no emits",
    _check_eof_only,
    mode("eof_only"),
)
