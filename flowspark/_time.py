"""The system clock every operator and runtime reads, with a hook to replace it.

Operators that use system time (`collect` timeouts, `enrich_cached` TTLs,
`SystemClock`, `EventClock`'s default `now_getter`, `notify_at` scheduling in the
runtimes) call `utc_now()`. Runtimes that run on a logical clock (the Spark
batch runtime, the local executor in `clock="logical"` mode) and tests install
their own getter with `use_clock`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Callable, Optional

_getter: Optional[Callable[[], datetime]] = None


def utc_now() -> datetime:
    """Return the current time (aware UTC), from the installed clock if any.

    Returns:
        The time.
    """
    g = _getter
    if g is None:
        return datetime.now(timezone.utc)
    return g()


@contextmanager
def use_clock(getter: Optional[Callable[[], datetime]]) -> Iterator[None]:
    """Install `getter` as the system clock inside the `with` block.

    Args:
        getter: Returns aware UTC datetimes; `None` restores the real clock.

    Yields:
        Nothing.
    """
    global _getter
    old = _getter
    _getter = getter
    try:
        yield
    finally:
        _getter = old
