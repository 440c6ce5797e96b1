"""The same names from bytewax 0.21.1 or flowspark, for tests that run one flow on both."""

from __future__ import annotations

from typing import Any


def lib(name: str) -> dict[str, Any]:
    """`op`, `Dataflow`, the file sources, the logic classes, `TestingSink`/`Source` (also as `Sink`/`Source`) and
    `run_main` of `"bytewax"` or `"flowspark"`."""
    if name == "bytewax":
        import bytewax.operators as op
        from bytewax.connectors.files import DirSource, FileSource
        from bytewax.dataflow import Dataflow
        from bytewax.operators import StatefulBatchLogic, StatefulLogic
        from bytewax.testing import TestingSink, TestingSource, run_main
    else:
        import flowspark.operators as op
        from flowspark.dataflow import Dataflow
        from flowspark.inputs import DirSource, FileSource
        from flowspark.operators import StatefulBatchLogic, StatefulLogic
        from flowspark.testing import TestingSink, TestingSource, run_main
    return {
        "op": op,
        "Dataflow": Dataflow,
        "DirSource": DirSource,
        "FileSource": FileSource,
        "StatefulBatchLogic": StatefulBatchLogic,
        "StatefulLogic": StatefulLogic,
        "TestingSink": TestingSink,
        "TestingSource": TestingSource,
        "Sink": TestingSink,
        "Source": TestingSource,
        "run_main": run_main,
    }
