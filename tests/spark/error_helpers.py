"""Exceptions a step raises in the error tests (module level: importable by Spark's Python workers)."""

from __future__ import annotations

import threading


class Boom(Exception):
    """A user's own exception class."""


class LockedBoom(Exception):
    """An exception that cannot be pickled (it holds a lock)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def boom_on_2(x: int) -> int:
    """Raise `Boom` for item 2."""
    if x == 2:
        msg = f"kaboom on {x}"
        raise Boom(msg)
    return x


def locked_boom_on_2(x: int) -> int:
    """Raise `LockedBoom` for item 2."""
    if x == 2:
        msg = f"kaboom on {x}"
        raise LockedBoom(msg)
    return x
