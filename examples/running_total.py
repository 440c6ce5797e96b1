"""Running total of purchase amounts per user (`stateful_map`).

Input: purchases with a `user` and an `amount` in currency units ("12.50"), from
a CSV file (default `examples/data/purchases.csv`) or a list of dicts. Output:
after every purchase, `(user, total_so_far)`, each user's in input order; across
users, Bytewax's order (each source batch grouped by user, users sorted: the
sample file is one batch).

Amounts are summed as integer cents, so totals are exact.

Run it:

    python examples/running_total.py
    python -m flowspark.run examples/running_total.py
    python -m flowspark.run "examples/running_total.py:get_flow('other.csv')"
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any, Optional

import flowspark.operators as op
from flowspark.dataflow import Dataflow, Stream
from flowspark.inputs import CSVSource
from flowspark.outputs import StdOutSink
from flowspark.testing import TestingSource, run_main

DATA = Path(__file__).parent / "data" / "purchases.csv"


def read_purchases(flow: Dataflow, path: Any, purchases: Optional[list[Any]]) -> Stream[dict[str, Any]]:
    """Where the purchases come from: a list of dicts if given, else the CSV file."""
    if purchases is not None:
        return op.input("inp", flow, TestingSource(purchases))
    return op.input("inp", flow, CSVSource(path))


def to_cents(purchase: dict[str, Any]) -> tuple[str, int]:
    """`{"user": "alice", "amount": "12.50"}` -> `("alice", 1250)`."""
    cents = Decimal(str(purchase["amount"])) * 100
    if cents != cents.to_integral_value():
        msg = f"amount {purchase['amount']!r} has more than 2 decimals (purchase {purchase!r})"
        raise ValueError(msg)
    return str(purchase["user"]), int(cents)


def add_to_total(total: Optional[int], cents: int) -> tuple[int, float]:
    """stateful_map mapper: state is the total in cents; emits the total in currency units."""
    total = (total or 0) + cents
    return total, total / 100


def get_flow(path: Any = DATA, purchases: Optional[list[Any]] = None, sink: Any = None) -> Dataflow:
    """Build the flow.

    Args:
        path: CSV file with `user,amount` columns.
        purchases: Use these dicts instead of the file.
        sink: Where to write `(user, total)` (default: standard output).
    """
    flow = Dataflow("running_total")
    s = read_purchases(flow, path, purchases)
    keyed = op.map("to_cents", s, to_cents)
    totals = op.stateful_map("running_total", keyed, add_to_total)
    op.output("out", totals, sink if sink is not None else StdOutSink())
    return flow


flow = get_flow()

if __name__ == "__main__":
    run_main(flow)
