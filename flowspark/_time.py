"""The system clock every operator and runtime reads, with a hook to replace it.

Operators that use system time (`collect` timeouts, `enrich_cached` TTLs,
`SystemClock`, `EventClock`'s default `now_getter`, `notify_at` scheduling in the
runtimes) call `utc_now()`; users call it as `flowspark.now()`. Runtimes that run on
a logical clock (the Spark batch runtime, the local executor in `clock="logical"`
mode, a Spark streaming micro-batch) and tests install their own getter with `use_clock`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Callable, Optional

_getter: Optional[Callable[[], datetime]] = None


def utc_now() -> datetime:
    """Return "now" (aware UTC) as the running runtime sees it; users call it `flowspark.now()`.

    Write it where a Bytewax logic writes `datetime.now(timezone.utc)`, e.g. to compute
    what `notify_at()` returns. Outside a run it is the wall clock; in a stateful step's
    logic (`on_item`, `on_batch`, `on_notify`, `on_eof`, `notify_at`) it follows the clock
    the runtime injects: `run_main(clock="logical", start_time=t)` (starts at
    `t`, jumps to the next due notification when the flow is idle), `run_main(clock="fixed")`
    and a Spark batch job (one time for the whole run, `start_time`), a Spark streaming
    micro-batch (its processing time, or `flowspark.spark.run(..., clock=...)`), and a
    clock a test installs with `flowspark._time.use_clock`. The runtime compares
    `notify_at()` with the same clock, so a logic using it behaves the same everywhere.

    Returns:
        The time.

    Example:
        >>> from datetime import timezone
        >>> import flowspark
        >>> flowspark.now().tzinfo is timezone.utc
        True
    """
    g = _getter
    if g is None:
        return datetime.now(timezone.utc)
    return g()


#: The public name: `flowspark.now()`.
now = utc_now


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
