"""Whether a path names a local directory (no pyspark needed: the CLI checks paths before a session starts)."""

from __future__ import annotations

from urllib.parse import urlparse

__all__ = ["is_local"]


def is_local(path: str, schemes: tuple[str, ...] = ("", "file")) -> bool:
    """Whether `path` is a local path: its scheme is one of `schemes` (default none or `file:`).

    Example:
        >>> is_local("/data/chk"), is_local("file:///data/chk"), is_local("s3a://b/chk"), is_local("dbfs:/chk")
        (True, True, False, False)
    """
    return urlparse(path).scheme in schemes or (len(path) > 1 and path[1] == ":")  # C:\\... on Windows
