"""flowspark: Bytewax-style stateful stream processing, run in memory or on Apache Spark."""

__version__ = "0.1.0"

__all__ = ["__version__"]
