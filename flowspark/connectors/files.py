"""Connectors for local text files (`bytewax.connectors.files` equivalents).

Example:
    >>> from flowspark.connectors.files import FileSource
    >>> from flowspark.inputs import FileSource as Same
    >>> FileSource is Same
    True
"""

from flowspark.inputs import CSVSource, DirSource, FileSource
from flowspark.outputs import DirSink, FileSink

__all__ = ["CSVSource", "DirSink", "DirSource", "FileSink", "FileSource"]
