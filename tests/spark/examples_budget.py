"""How many hypothesis examples a Spark property test draws: fewer in the default run, all when asked.

Each Spark example is a whole Spark job or streaming query (0.5-5 s), and the same equalities
are proven on fixed flows by the conformance suite and `test_rules.py`. The default run (the
README's test command, CI) draws half the examples, at least 2, plus every `@example`;
`FLOWSPARK_TEST_THOROUGH=1 python -m pytest tests/spark` draws all of them.
"""

from __future__ import annotations

import os

THOROUGH = os.environ.get("FLOWSPARK_TEST_THOROUGH", "") not in ("", "0")


def examples(n: int) -> int:
    """The number of examples to draw for a property whose full run draws `n`."""
    return n if THOROUGH else max(2, n // 2)
