"""flowspark: Bytewax-style stateful stream processing, run in memory or on Apache Spark."""

from flowspark._time import now

__version__ = "0.1.0"

__all__ = ["__version__", "now"]
