"""Connectors to the console (`bytewax.connectors.stdio` equivalents)."""

from flowspark.outputs import StdOutSink

__all__ = ["StdOutSink"]
